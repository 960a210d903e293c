"""The plan's screen validated by simulation (--screen-check), for the one-pool and the P/D planner."""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest


import dsim
from dsim.explore import plan as plan_mod
from dsim.explore import plan_pd as pd_mod
from dsim.explore import screen_pd
from dsim.explore.capacity import parse_slos, probe
from dsim.explore.early_stop import certain_miss_count
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
        assert row["pass"] == c["check_pass"]
        if c["check_early_stopped"]:                # stopped once certain to fail: the full run fails
            assert not row["pass"] and c["check_p99_ttft_ms"] is None
        else:
            assert row["p99_ttft_ms"] == c["check_p99_ttft_ms"]
    assert [c["check_early_stopped"] for c in sampled] == [True, False, False, False]
    assert "3 of 4 sampled pruned candidates pass in simulation (the screen pruned them wrongly)" in \
        plan_mod.plan_line(res)
    md = (tmp_path / "p" / "plan.md").read_text()
    assert "## Screen check" in md and "3 would have met the SLOs" in md
    # off: nothing sampled, no clause
    res0 = plan_mod.plan(CONST, {"tensor_parallel_size": [1]}, gpus=4, slos=["ttft_p99_ms=200"], screen_check=0,
                         band=False)
    assert res0["screen_check"]["sampled"] == 0 and "screen check" not in plan_mod.plan_line(res0)


def test_pd_screen_check_simulates_the_sample(tmp_path, monkeypatch):
    honest = screen_pd.screen_rows

    def strict(*a):
        return [{**r, "screen": "pruned", "reason": "too strict"} for r in honest(*a)]

    monkeypatch.setattr(screen_pd, "screen_rows", strict)
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
        assert row["pass"] == c["check_pass"]
        if not c["check_early_stopped"]:
            assert row["p99_tpot_ms"] == c["check_p99_tpot_ms"]
    assert f"screen check: {chk['would_pass']} of 6 sampled" in pd_mod.plan_line(res)
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["screen_check"]["would_pass"] == chk["would_pass"]
    assert "check_pass" in (tmp_path / "p" / "candidates.csv").read_text().splitlines()[0]


@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_certain_miss_count_settles_the_percentile_whatever_the_rest_do(q):
    """The early stop's rule against numpy's percentile: with that many values above the bound among at
    most W, every possible final set (any size n in [count, W], any other values) has its q-quantile
    above the bound; one fewer does not settle it for every set."""
    rng = np.random.default_rng(5)
    bound = 500.0
    for window in (2, 3, 10, 99, 100, 101, 1000, 5542):
        need = certain_miss_count(window, q)
        assert 1 <= need <= window
        for _ in range(30):
            n = int(rng.integers(need, window + 1))
            over = int(rng.integers(need, n + 1))
            x = np.concatenate([rng.uniform(0, bound, n - over), bound * (1 + 2e-9) + rng.exponential(50, over)])
            assert np.percentile(x, 100 * q) > bound, (window, n, over)
        if need >= 2:                            # one fewer: all the others at 0 and n = window passes
            x = np.concatenate([np.zeros(window - need + 1), np.full(need - 1, bound * (1 + 1e-6))])
            lo = math.floor(q * (window - 1))
            assert np.sort(x)[lo] <= bound


def _replicas(n: int) -> list:
    return ["cluster=" + json.dumps({"router": "jsq", "pools": [{"name": "main", "replicas": n}]})]


def test_early_stop_only_stops_runs_that_fail_and_changes_nothing_else():
    slos = parse_slos(["ttft_p99_ms=200"])
    one = _replicas(1)                              # 80 req/s of capacity for 150: TTFT grows without bound
    full, quick = probe(CONST, one, slos, 0.1, None), probe(CONST, one, slos, 0.1, None, True)
    assert not full["pass"] and full["p99_ttft_ms"] > 200
    assert quick["early_stopped"] and not quick["pass"] and quick["stopped_at_s"] < full["duration"] / 2
    assert "p99_ttft_ms > 200 whatever the others do" in quick["reasons"][0]
    for reps in (2, 3):                               # passing runs: the same row, to the last digit
        ov = _replicas(reps)
        a, b = probe(CONST, ov, slos, 0.1, None), probe(CONST, ov, slos, 0.1, None, True)
        assert a["pass"] and a == b



def test_early_stop_threshold_is_sharp_on_a_real_run():
    """Bounds set from a run's own window TTFTs: with one request fewer above the bound than the rule
    needs, the run goes to its end (the same row as without the watch); with exactly as many, it stops."""
    ov = ["workload.num_requests=600", "workload.rate=30"]
    led = dsim.run(QUICK, overrides=ov).requests
    arr = led.col("arrival")
    t0, t1 = arr.min(), arr.max()
    win = (arr >= t0 + 0.1 * (t1 - t0)) & (arr <= t1)
    ttft = np.sort(((led.col("t_first_token") - arr) * 1e3)[win]).tolist()
    need = certain_miss_count(int(win.sum()), 0.99)
    assert ttft[-need - 1] < ttft[-need] < ttft[-need + 1]            # distinct values around the cut
    settled = parse_slos([f"ttft_p99_ms={ttft[-need - 1] * (1 - 1e-6)!r}"])   # need values above it
    unsettled = parse_slos([f"ttft_p99_ms={ttft[-need]!r}"])                    # need - 1 above it
    a, b = probe(QUICK, ov, unsettled, 0.1, None), probe(QUICK, ov, unsettled, 0.1, None, True)
    assert not b.get("early_stopped") and a == b
    c = probe(QUICK, ov, settled, 0.1, None, True)
    assert c["early_stopped"] and f"{need} of the {int(win.sum())} window requests" in c["reasons"][0]
    assert not probe(QUICK, ov, settled, 0.1, None)["pass"]


def test_early_stopped_candidates_are_reported_and_never_chosen(tmp_path, monkeypatch):
    """A screen that keeps everything: the family's first simulation (1 replica for 150 req/s) is stopped
    early and reported so; the plan climbs to 2 replicas, which pass and are chosen."""
    honest = plan_mod.screen_family

    def lenient(scn, w, replicas, slos):
        return [{**r, "screen": "kept", "reason": ""} for r in honest(scn, w, replicas, slos)]

    monkeypatch.setattr(plan_mod, "screen_family", lenient)
    res = plan_mod.plan(CONST, {"tensor_parallel_size": [1]}, gpus=4, slos=["ttft_p99_ms=200"], screen_check=0,
                        band=False, out=tmp_path / "p")
    sims = {c["replicas"]: c for c in res["rows"] if "pass" in c}
    assert sorted(sims) == [1, 2]
    assert sims[1]["early_stopped"] and not sims[1]["pass"] and sims[1]["stopped_at_s"] > 0
    assert res["best"]["replicas"] == 2 and not res["best"].get("early_stopped")
    assert res["early_stopped"] == 1 and "(1 stopped early)" in plan_mod.plan_line(res)
    assert json.loads((tmp_path / "p" / "plan.json").read_text())["early_stopped"] == 1
    with open(tmp_path / "p" / "candidates.csv") as f:
        first = next(csv.DictReader(f))
    assert (first["replicas"], first["early_stopped"]) == ("1", "true")


def test_why_not_best_names_what_each_runner_up_lost_on():
    from dsim.explore.plan import why_not_best
    top = [{"score": 2.0, "gpus": 4, "pessimistic_pass": True}, {"score": 1.5, "gpus": 2},
           {"score": 2.0, "gpus": 6}, {"score": 2.0, "gpus": 4, "pessimistic_pass": False}]
    why_not_best(top, "score", "good req/GPU-s")
    assert [c["why_not_best"] for c in top] == [
        "", "good req/GPU-s 1.5 vs 2 (-25.0 %)", "the same good req/GPU-s on more GPUs (6 vs 4)",
        "a tie with the best (same score and GPUs; listed after it in a fixed order); also misses the SLOs at the "
        "pessimistic end of its band"]
