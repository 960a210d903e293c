"""The plan's screen validated by simulation (--screen-check), for the one-pool and the P/D planner."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsim
from dsim.explore import plan as plan_mod
from dsim.explore import plan_pd as pd_mod
from dsim.explore.capacity import parse_slos, probe
from dsim.explore.plan import plan_slo_section
from dsim.explore.screen_check import sample_pruned

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
PD_SPACE = str(ROOT / "scenarios" / "spaces" / "pd_small.yaml")

# every step 10 ms, 8 sequences, 10 output tokens: one replica completes at most 80 req/s (test_explore.py)
CONST = {"name": "const", "seed": 3, "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
         "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 2048},
         "latency": {"model": "blackbox", "beta": [10000, 0, 0], "alpha": [0, 0, 0]},
         "workload": {"type": "constant", "rate": 150, "num_requests": 1200, "prompt_tokens": 16,
                      "output_tokens": 10}}


def test_sample_is_deterministic_and_skips_unfit_rows():
    rows = [{"screen": "pruned", "i": i, "_unfit": i % 5 == 0} for i in range(40)] + [{"screen": "kept", "i": 99}]
    a, b = sample_pruned(rows, 6, 7), sample_pruned(rows, 6, 7)
    assert [r["i"] for r in a] == [r["i"] for r in b] and len(a) == 6
    assert all(r["screen"] == "pruned" and not r["_unfit"] for r in a)
    assert [r["i"] for r in a] == sorted(r["i"] for r in a)
    assert sample_pruned(rows, 0, 7) == [] and len(sample_pruned(rows, 1000, 7)) == 32


def test_honest_screen_prunes_nothing_that_passes(tmp_path):
    """On the closed-form deployment the screen is exact (80 req/s per replica): the sampled pruned
    candidates (fewer than 2 replicas for 150 req/s) all fail when simulated."""
    res = plan_mod.plan(CONST, {"tensor_parallel_size": [1]}, gpus=4, slos=["ttft_p99_ms=200"], screen_check=4,
                        band=False, out=tmp_path / "p")
    chk = res["screen_check"]
    assert chk["sampled"] == 1 and chk["would_pass"] == 0          # 1 replica is the only pruned count
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["screen_check"] == chk
    assert "screen check: 0 of 1 sampled pruned candidates pass" in dsim.explore.plan.plan_line(res)


def test_too_strict_screen_is_caught_by_simulating_the_sample(tmp_path, monkeypatch):
    """A screen that prunes every candidate (as a wrong margin would): the check simulates the sample
    and finds the ones that pass; each sampled row's numbers are a real probe's."""
    honest = plan_mod.screen_family

    def strict(scn, w, replicas, slos):
        return [{**r, "screen": "pruned", "reason": "too strict"} for r in honest(scn, w, replicas, slos)]

    monkeypatch.setattr(plan_mod, "screen_family", strict)
    res = plan_mod.plan(CONST, {"tensor_parallel_size": [1]}, gpus=4, slos=["ttft_p99_ms=200"], screen_check=4,
                        band=False, out=tmp_path / "p")
    assert res["best"] is None and res["simulated"] == 0
    chk = res["screen_check"]
    assert chk["sampled"] == 4 and chk["would_pass"] == 3               # 2, 3 and 4 replicas carry 150 req/s
    sampled = [c for c in res["rows"] if "check_pass" in c]
    assert [c["replicas"] for c in sampled if c["check_pass"]] == [2, 3, 4]
    for c in sampled:
        row = probe(CONST, c["_ovs"] + [f"{plan_mod.REPLICAS_KEY}={c['replicas']}"], parse_slos(["ttft_p99_ms=200"]),
                    0.1, None)
        assert (row["pass"], row["p99_ttft_ms"]) == (c["check_pass"], c["check_p99_ttft_ms"])
    assert "3 of 4 sampled pruned candidates pass in simulation (the screen pruned them wrongly)" in \
        plan_mod.plan_line(res)
    md = (tmp_path / "p" / "plan.md").read_text()
    assert "## Screen check" in md and "3 would have met the SLOs" in md
    # off: nothing sampled, no clause
    res0 = plan_mod.plan(CONST, {"tensor_parallel_size": [1]}, gpus=4, slos=["ttft_p99_ms=200"], screen_check=0,
                         band=False)
    assert res0["screen_check"]["sampled"] == 0 and "screen check" not in plan_mod.plan_line(res0)


def test_pd_screen_check_simulates_the_sample(tmp_path, monkeypatch):
    honest = pd_mod.screen_candidate

    def strict(scn, w, slos, pre=None):
        return {**honest(scn, w, slos, pre), "screen": "pruned", "reason": "too strict"}

    monkeypatch.setattr(pd_mod, "screen_candidate", strict)
    slos = ["ttft_p99_ms=300", "tpot_p99_ms=12"]
    load = ["workload.rate=150", "workload.num_requests=800"]
    res = pd_mod.plan_pd(QUICK, PD_SPACE, gpus=4, slos=slos, overrides=load, screen_check=6, out=tmp_path / "p")
    chk = res["screen_check"]
    assert res["simulated"] == 0 and chk["sampled"] == 6 and chk["would_pass"] >= 1
    sampled = [c for c in res["rows"] if "check_pass" in c]
    assert sum(c["check_pass"] for c in sampled) == chk["would_pass"]
    user = load + ["slo=" + json.dumps(plan_slo_section(dsim.load_scenario(QUICK).raw.get("slo"), parse_slos(slos)),
                                       sort_keys=True)]
    for c in sampled[:2] + [next(c for c in sampled if c["check_pass"])]:
        row = probe(QUICK, user + [c["_ov"]], parse_slos(slos), 0.1, None)
        assert (row["pass"], row["p99_tpot_ms"]) == (c["check_pass"], c["check_p99_tpot_ms"])
    assert f"screen check: {chk['would_pass']} of 6 sampled" in pd_mod.plan_line(res)
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["screen_check"]["would_pass"] == chk["would_pass"]
    assert "check_pass" in (tmp_path / "p" / "candidates.csv").read_text().splitlines()[0]
