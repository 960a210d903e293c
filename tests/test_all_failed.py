"""`dsim capacity` and `dsim plan` (one pool, prefill/decode) when no candidate can run at all: a non-zero
exit with one line that says why (docs/explore.md: 0 answer, 1 every point failed, 2 user error)."""
from __future__ import annotations

from pathlib import Path

import yaml

from dsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
BIG = ["--set", "model=meta-llama/Llama-3.1-70B-Instruct", "--set", "workload.num_requests=50", "--quiet"]
NO_FIT = "needs 141.1 GB of weights per GPU on H100-SXM"       # 70B in 16 bits on one 80 GB GPU


def _space(tmp_path, doc) -> str:
    f = tmp_path / "space.yaml"
    f.write_text(yaml.safe_dump(doc))
    return str(f)


def test_capacity_of_a_scenario_that_cannot_run_stops_at_the_first_probe(tmp_path, capsys):
    """It used to bisect 40 probes down to 3.6e-11 req/s and name the last probe's rate error."""
    code = main(["capacity", QUICK, "--slo", "ttft_p99_ms=500", "--out", str(tmp_path / "c"), *BIG])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("dsim: error: engine.gpu_memory_utilization")
    assert NO_FIT in err and not (tmp_path / "c").exists()


def test_capacity_whose_every_probe_failed_exits_1_with_the_cause(tmp_path, capsys):
    q = str(ROOT / "scenarios" / "router_comparison.yaml")
    code = main(["capacity", q, "--slo", "ttft_p99_ms=500", "--vary", "cluster.pools[0].replicas", "--target-rate",
                 "5", "--out", str(tmp_path / "c"), *BIG])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("dsim capacity: every probe failed") and NO_FIT in err


def test_plan_where_no_candidate_fits_exits_1(tmp_path, capsys):
    space = _space(tmp_path, {"tensor_parallel_size": [1], "replicas": "auto"})
    code = main(["plan", QUICK, "--gpus", "2", "--space", space, "--slo", "ttft_p99_ms=500",
                 "--out", str(tmp_path / "p"), *BIG])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("dsim plan: every candidate failed (2)")
    assert NO_FIT in err


def test_pd_plan_where_no_candidate_fits_exits_1(tmp_path, capsys):
    space = _space(tmp_path, {"disaggregated": {"prefill": {"hardware": ["H100-SXM"]},
                                                "decode": {"hardware": ["H100-SXM"]}}})
    code = main(["plan", QUICK, "--gpus", "3", "--space", space, "--slo", "ttft_p99_ms=500",
                 "--out", str(tmp_path / "p"), *BIG])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and err.startswith("dsim plan: every candidate failed (3)")
    assert NO_FIT in err


def test_plan_with_one_candidate_that_fits_is_an_answer(tmp_path, capsys):
    """TP1 does not fit, TP2 does (and is simulated): the plan has an answer, exit 0."""
    space = _space(tmp_path, {"tensor_parallel_size": [1, 2], "replicas": [1]})
    code = main(["plan", QUICK, "--gpus", "2", "--space", space, "--slo", "ttft_p99_ms=5000", "--screen-check", "0",
                 "--no-band", "--set", "workload.rate=2", "--out", str(tmp_path / "p"), *BIG])
    assert code == 0, capsys.readouterr().err


def test_pd_plan_whose_budget_admits_no_candidate_exits_1(tmp_path, capsys):
    """One GPU cannot hold a prefill and a decode replica: the plan has no candidate at all (it
    used to exit 0, as if 'none fits the budget' were an answer)."""
    space = str(ROOT / "scenarios" / "spaces" / "pd_small.yaml")
    assert main(["plan", QUICK, "--gpus", "1", "--space", space, "--slo", "ttft_p99_ms=500", "--quiet",
                 "--set", "workload.num_requests=20", "--out", str(tmp_path / "p")]) == 1
    assert "no candidate fits the budget" in capsys.readouterr().err
