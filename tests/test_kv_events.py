"""vLLM's KV cache events (kv_events.jsonl): the reader's figures on a file built by hand, dsim's own
events read back (the simulator's resident-block peak exactly, results unchanged by recording), and
`dsim cosim` comparing a run's file with its replay's events."""
import json
import shutil
from pathlib import Path

import pytest

import dsim
from dsim.calibrate.kvevents import read_kv_events
from dsim.cli import main
from dsim.config.errors import ConfigError
from dsim.serving.kvcache import KVCache

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "kv_events" / "constructed.jsonl"
SHIPPED_IPERF = ROOT / "examples" / "real" / "h100-llama-2-7b-tp1-general"
# two short stages of the shipped inference-perf run (100-prompt pool, shared system prompts)
SHORT = ["workload.stages[0].duration_s=6", "workload.stages[1].duration_s=4"]


def test_reader_figures_of_a_constructed_file_by_hand():
    """The fixture's six batches (tests/fixtures/kv_events/README.md), worked out by hand.
    GPU resident after each batch: t=100: {1,2,3} = 3; t=101: +4 (4, the peak) -1 = 3;
    t=103: -2, and 99 unknown = 2; t=104: 3 again while resident (not a store) = 2; t=106: clear = 0;
    t=107: 7, 8 (no medium field: GPU) = 2.  Mean = (3x1 + 3x2 + 2x1 + 2x2 + 0x1) / 7 s = 15/7.
    CPU: 5, 6 stored at t=103, cleared at t=106: 2 x 3 s / 7 s = 6/7."""
    st = read_kv_events(FIXTURE, n_requests=3)
    assert (st["batches"], st["span_s"], st["block_size"], st["out_of_order_batches"]) == (6, 7.0, 16, 0)
    assert st["other_events"] == {"TransferCompleted": 1}
    gpu, cpu = st["media"]["GPU"], st["media"]["CPU"]
    assert (gpu["stored_blocks"], gpu["removed_blocks"], gpu["cleared"]) == (6, 2, 1)
    assert (gpu["peak_resident_blocks"], gpu["final_resident_blocks"]) == (4, 2)
    assert gpu["mean_resident_blocks"] == pytest.approx(15 / 7, rel=1e-12)
    assert (gpu["stored_again"], gpu["removed_unknown"]) == (1, 1)
    assert gpu["stores_per_request"] == 2.0 and gpu["evictions_per_request"] == pytest.approx(2 / 3)
    assert (cpu["stored_blocks"], cpu["peak_resident_blocks"], cpu["final_resident_blocks"]) == (2, 2, 0)
    assert cpu["mean_resident_blocks"] == pytest.approx(6 / 7, rel=1e-12)
    assert read_kv_events(FIXTURE)["media"]["GPU"]["stores_per_request"] is None


@pytest.mark.parametrize("line,where", [
    ("{not json", ":2"),
    ('[1.0, "x"]', ":2: events"),
    ('[1.0, [["BlockStored", [1]]]]', ":2: events[0]"),
    ('[true, []]', ":2: ts"),
    ('{"events": []}', ":2"),
    ("[" * 100000 + "]" * 100000, ":2"),             # deeper than Python's stack: was a RecursionError
])
def test_a_bad_line_is_a_path_and_line_qualified_error(tmp_path, line, where):
    p = tmp_path / "kv_events.jsonl"
    p.write_text('[0.0, [["AllBlocksCleared"]], 0]\n' + line + "\n")
    with pytest.raises(ConfigError) as e:
        read_kv_events(p)
    assert str(e.value).startswith(f"{p}{where}")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(ConfigError, match="at least one event batch"):
        read_kv_events(tmp_path / "empty.jsonl")


def _shared_prefix_scenario(**engine):
    return {"seed": 4, "model": "meta-llama/Llama-2-7b-hf", "hardware": "H100-SXM",
            "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048, **engine},
            "workload": {"type": "staged", "stage_arrivals": "poisson", "stages": [{"rate": 8, "duration_s": 12}],
                         "shared_prefix": {"num_groups": 6, "users_per_group": 4, "system_prompt_len": 200,
                                           "multi_turn": True, "max_context_tokens": 4096},
                         "prompt_tokens": 150, "output_tokens": 60},
            "output": {"plots": False}}


def test_dsims_events_read_back_give_its_own_peak_and_leave_results_unchanged(tmp_path, monkeypatch):
    """A run with output.kv_events, its file read back: the peak of resident blocks is the pool's
    own (len(cached), watched at every register and eviction, independently of the recorder), so
    are the stores, evictions and the final count; the run's requests are those of a run without."""
    seen = {"peak": 0, "stored": 0, "evicted": 0}
    reg, ev = KVCache.register, KVCache._evict

    def watch_register(self, h, parent=None):
        ok = reg(self, h, parent)
        seen["stored"] += ok
        seen["peak"] = max(seen["peak"], len(self.cached))
        return ok

    def watch_evict(self, key):
        ev(self, key)
        seen["evicted"] += 1
    monkeypatch.setattr(KVCache, "register", watch_register)
    monkeypatch.setattr(KVCache, "_evict", watch_evict)
    scn = _shared_prefix_scenario(num_gpu_blocks=150)        # small: the cache fills and evicts
    scn["output"]["kv_events"] = True
    res = dsim.run(scn, tmp_path / "on")
    st = read_kv_events(tmp_path / "on" / "kv_events.jsonl", res.summary["requests"]["submitted"])["media"]
    assert set(st) == {"GPU"}
    gpu = st["GPU"]
    assert seen["evicted"] > 100 and seen["peak"] > 100                 # the case is not trivial
    assert gpu["peak_resident_blocks"] == seen["peak"] <= 150
    assert (gpu["stored_blocks"], gpu["removed_blocks"]) == (seen["stored"], seen["evicted"])
    assert gpu["final_resident_blocks"] == len(res.instance.kv.cached)
    assert gpu["stored_again"] == gpu["removed_unknown"] == 0
    del scn["output"]["kv_events"]
    dsim.run(scn, tmp_path / "off")
    assert (tmp_path / "on" / "requests.csv").read_bytes() == (tmp_path / "off" / "requests.csv").read_bytes()
    assert not (tmp_path / "off" / "kv_events.jsonl").exists()


def test_cosim_compares_a_runs_kv_events_with_its_replays(tmp_path, capsys):
    """A run folder with kv_events.jsonl: cosim reads it and the replay's own events.  When the file
    is the replay's own (dsim wrote it), peak, mean and evictions agree exactly; a replay with a
    smaller KV pool shows a lower peak; the cosim printout and cosim.md carry the figures."""
    from dsim.calibrate.cosim import simulate_run
    from dsim.calibrate.kvevents import real_requests
    from dsim.calibrate.realrun import load_real
    from dsim.metrics.kv_events import write_jsonl
    folder = tmp_path / "run"
    shutil.copytree(SHIPPED_IPERF, folder)
    run = load_real(folder)
    res, _ = simulate_run(run, overrides=SHORT, kv_events=True)
    (kv,) = [kv for _, kv in res.kv_logs]
    with open(folder / "kv_events.jsonl", "w") as f:
        write_jsonl(f, kv.log, kv.block_size)
    assert main(["cosim", str(folder), "--out", str(tmp_path / "c"), "--no-plots"]
                + [a for s in SHORT for a in ("--set", s)]) == 0
    out = capsys.readouterr().out
    assert "KV cache (GPU, from kv_events.jsonl" in out and "peak_resident_blocks real" in out
    rep = json.loads((tmp_path / "c" / "cosim.json").read_text())["kv_cache"]
    c = rep["compared"]
    for k in ("peak_resident_blocks", "mean_resident_blocks", "evictions"):
        assert c[k]["real"] == c[k]["sim"] and (c[k]["error"] in (0.0, None)), k
    assert c["peak_resident_blocks"]["real"] > 50
    n_real = real_requests(run)              # the real run's own count (its full stages), by design
    assert c["stores_per_request"]["real"] == pytest.approx(rep["real"]["media"]["GPU"]["stored_blocks"] / n_real)
    assert "## KV cache" in (tmp_path / "c" / "cosim.md").read_text()
    small = main(["cosim", str(folder), "--out", str(tmp_path / "s"), "--no-plots", "--set",
                  "engine.num_gpu_blocks=60"] + [a for s in SHORT for a in ("--set", s)])
    assert small == 0
    c2 = json.loads((tmp_path / "s" / "cosim.json").read_text())["kv_cache"]["compared"]
    assert c2["peak_resident_blocks"]["sim"] <= 60 < c2["peak_resident_blocks"]["real"]
    assert c2["peak_resident_blocks"]["error"] < -0.2
