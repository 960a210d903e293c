"""vLLM's conventions: summary.json carries `vllm bench serve`'s remaining keys, `dsim run --export
vllm-bench` writes its --save-detailed JSON (and `dsim cosim` replays it with ~0 error),
`num_gpu_blocks_override` is accepted, requests.csv names the e2e column e2el_ms."""
import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest

from dsim.cli import main
from dsim.config.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
# `vllm bench serve --save-result --save-detailed` keys (vllm/benchmarks/serve.py)
BENCH_KEYS = {"date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
              "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
              "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
              "total_token_throughput", "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors",
              "max_output_tokens_per_s", "max_concurrent_requests", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms",
              "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms"}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    assert main(["run", QUICK, "--set", "workload.num_requests=200", "--out", str(tmp / "run"), "--no-plots",
                 "--quiet", "--export", "vllm-bench", str(tmp / "bench.json")]) == 0
    return tmp


def test_export_has_vllm_bench_keys_and_consistent_per_request_lists(exported):
    d = json.loads((exported / "bench.json").read_text())
    assert BENCH_KEYS <= set(d)
    n = d["num_prompts"]
    assert n == 200 and all(len(d[k]) == n for k in ("input_lens", "output_lens", "ttfts", "itls", "errors"))
    assert (d["model_id"], d["request_rate"], d["burstiness"], d["max_concurrency"]) == \
        ("meta-llama/Llama-3.1-8B", 20, 1.0, None)
    rows = list(csv.DictReader(open(exported / "run" / "requests.csv")))
    for row, ttft, gaps, n_out in zip(rows, d["ttfts"], d["itls"], d["output_lens"]):
        assert len(gaps) == n_out - 1 == int(row["output_tokens"]) - 1
        assert ttft * 1e3 == pytest.approx(float(row["ttft_ms"]), abs=1e-5)
        assert (ttft + sum(gaps)) * 1e3 == pytest.approx(float(row["e2el_ms"]), abs=1e-3)
    summ = json.loads((exported / "run" / "summary.json").read_text())["metrics"]
    assert d["p99_ttft_ms"] == pytest.approx(summ["p99_ttft_ms"], rel=1e-9) and d["failed"] == summ["failed"] == 0
    # itls are the replica's real step gaps (not evenly spread): their p99 matches dsim's own ITL p99
    itl = np.concatenate([np.asarray(g) for g in d["itls"]]) * 1e3
    assert np.percentile(itl, 99) == pytest.approx(summ["p99_itl_ms"], rel=0.02)
    assert d["max_concurrent_requests"] == summ["max_concurrent_requests"]
    assert d["max_output_tokens_per_s"] == pytest.approx(summ["max_output_tokens_per_s"], rel=0.02)


def test_cosim_replays_the_export_with_zero_error(exported, capsys):
    out = exported / "co"
    assert main(["cosim", str(exported / "bench.json"), "--scenario", QUICK, "--out", str(out), "--no-plots"]) == 0
    rep = json.loads((out / "cosim.json").read_text())
    assert "arrivals replayed exactly from the file's start_times" in rep["notes"]
    for st in rep["stages"]:
        for m, c in st["metrics"].items():
            assert c["mape"] < 1e-3, (m, c["mape"])
    assert rep["mean_mape"] < 1e-3


def test_summary_peaks_follow_vllm_definitions(exported):
    summ = json.loads((exported / "run" / "summary.json").read_text())["metrics"]
    rows = list(csv.DictReader(open(exported / "run" / "requests.csv")))
    arr = np.array([float(r["arrival_s"]) for r in rows])
    comp = np.array([float(r["completion_s"]) for r in rows])
    t0 = arr.min()
    conc = np.zeros(int(math.ceil(comp.max() - t0)) + 1)
    for a, c in zip(arr, comp):                   # vLLM: active in every second from send to completion
        conc[int(a - t0):int(c - t0) + 1] += 1
    assert summ["max_concurrent_requests"] == conc.max()
    assert summ["total_output_tokens"] / summ["duration"] < summ["max_output_tokens_per_s"]


def test_export_refuses_an_unknown_format(tmp_path, capsys):
    assert main(["run", QUICK, "--out", str(tmp_path / "o"), "--export", "csv", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.startswith("dsim: error: --export: got 'csv'")
    assert not (tmp_path / "o").exists()


def test_num_gpu_blocks_override_is_vllms_name_for_num_gpu_blocks(tmp_path, capsys):
    from dsim import load_scenario
    assert load_scenario(QUICK, ["engine.num_gpu_blocks_override=500"]).engine.num_gpu_blocks == 500
    with pytest.raises(ConfigError, match=r"^engine\.num_gpu_blocks_override: .*only one of"):
        load_scenario(QUICK, ["engine.num_gpu_blocks_override=500", "engine.num_gpu_blocks=400"])
    assert main(["run", QUICK, "--set", "engine.num_gpu_blocks_override=0", "--out", str(tmp_path / "o")]) == 2
    assert "engine.num_gpu_blocks_override" in capsys.readouterr().err


def test_requests_csv_names_e2el_ms_and_keeps_e2e_ms_as_an_alias(exported):
    rows = list(csv.DictReader(open(exported / "run" / "requests.csv")))
    assert all(r["e2el_ms"] == r["e2e_ms"] != "" for r in rows)
    from dsim.metrics.writers import ALIASES, COLUMNS
    assert ALIASES == {"e2e_ms": "e2el_ms"} and COLUMNS.index("e2el_ms") + 1 == COLUMNS.index("e2e_ms")


def test_peaks_of_a_run_spanning_more_seconds_than_memory_holds():
    """A run whose latencies are 1e12 s (a fuzzed network latency) allocated one bucket per second:
    14.9 GiB and an OOM kill. Only the buckets where something changes are counted now."""
    import numpy as np

    from dsim.metrics.vllm_bench import peaks

    class Ledger:
        cols = {"arrival": np.array([0.0, 0.5, 1e12]), "t_completion": np.array([10.2, 1e12 + 3.5, 2e15]),
                "t_first_token": np.array([0.1, 0.6, 1e12 + 1]), "t_last_token": np.array([10.1, 1e12 + 3, 2e15]),
                "n_out": np.array([11, 2, 1])}

        def blocks(self, size=None):            # a block a row: the pieces' sums are the whole's
            return [(0, 1), (1, 2), (2, 3)]

        def present(self, k, lo=0, hi=None):
            return np.ones(3, dtype=bool)[lo:hi]

        def col(self, k, lo=0, hi=None):
            return self.cols[k][lo:hi]
    p = peaks(Ledger())
    # by hand: bucket 0 holds both first tokens (0.1, 0.6) plus request 0's spread 1 token/s x 0.9 s
    assert p["max_output_tokens_per_s"] == pytest.approx(2.9)
    assert p["max_concurrent_requests"] == 2           # requests 0 and 1 overlap in buckets 0-10
