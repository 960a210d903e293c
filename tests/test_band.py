"""The error band (dsim.metrics.band): the documented rule, computed by hand on tiny tables, and the
band as it reaches summary.json, capacity.json and plans."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import t as student_t

import dsim
from dsim.latency.credibility import BAND_COLUMNS, validation_rows
from dsim.metrics.band import (LEVEL, MIN_STAGES, WIDEN, Deployment, band_for, conformal, load_regime,
                               offered_load)

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "data" / "real"


def _row(run, gpu, err, stage="s", model="roofline", study="zero-shot", profiled="1", kind="dense", gen="v1",
         load=0.4, overloaded="0"):
    r = {"latency_model": model, "study": study, "run": run, "gpu": gpu, "gpu_profiled": profiled, "kind": kind,
         "generation": gen, "stage": stage, "load": str(load), "overloaded": overloaded}
    # each column its own error (err x 1, x 1.5, x 2, ...), so reading one column for another shows
    r.update({c: str(err * (1 + 0.5 * i)) for i, c in enumerate(BAND_COLUMNS)})
    return r


def _dep(gpu="H100-SXM", **kw):
    base = dict(latency_model="roofline", gpu=gpu, gpu_profiled=True, kind="dense", generation="v1",
                regime="moderate")
    base.update(kw)
    return Deployment(**base)


def test_conformal_ranks_by_hand():
    errs = [0.01 * i for i in range(-9, 10)]                     # 19 errors: ranks 2 and 18
    assert conformal(errs) == (errs[1], errs[17])
    assert conformal(errs[:9]) == (errs[0], errs[8])             # 9: ranks 1 and 9 (the fewest with both)
    assert conformal(errs[:8]) is None                           # 8: no upper rank at 80 %
    assert LEVEL == 0.8 and MIN_STAGES == 9


def test_band_from_a_tiny_table_by_hand():
    errs = [-0.06, -0.04, -0.02, -0.01, 0.0, 0.01, 0.03, 0.05, 0.08, 0.12]   # 10 stages over 5 runs
    rows = [_row(f"run{i // 2}", "H100-SXM", e, stage=str(i)) for i, e in enumerate(errs)]
    rows.append(_row("other", "A100-80GB", 0.5))                # another GPU: not similar, not used
    b = band_for(_dep(), rows)
    assert b.validated and b.runs == 5 and b.stages == 10 and not b.reasons
    # robust prediction interval on x = log(real / sim) = -log(1 + e), by hand (TPOT p50 is column 4: x 3)
    x = np.array([-math.log(1 + 3 * e) for e in errs])
    centre = np.median(x)
    spread = 1.4826 * np.median(np.abs(x - centre))
    half = student_t.ppf(0.9, 9) * spread * math.sqrt(1 + 1 / 10)
    lo, hi = b.relative["tpot_p50_err"]
    assert lo == pytest.approx(math.exp(centre - half) - 1, abs=1e-12)
    assert hi == pytest.approx(math.exp(centre + half) - 1, abs=1e-12)
    # the conformal rule, kept for the coverage study's comparison: the real value is sim / (1 + e)
    c = band_for(_dep(), rows, method="conformal")
    n, a = 10, 1 - LEVEL
    e = sorted(errs)
    e_lo, e_hi = e[math.floor((n + 1) * a / 2) - 1], e[math.ceil((n + 1) * (1 - a / 2)) - 1]
    assert c.relative["e2e_mean_err"] == pytest.approx((1 / (1 + e_hi) - 1, 1 / (1 + e_lo) - 1), abs=1e-12)


def test_unprofiled_gpu_is_outside_the_validated_range_and_wider():
    errs = [-0.06, -0.04, -0.02, -0.01, 0.0, 0.01, 0.03, 0.05, 0.08, 0.12]
    rows = [_row(f"run{i // 2}", "H100-SXM", e, stage=str(i)) for i, e in enumerate(errs)]
    inside = band_for(_dep(), rows)
    out = band_for(_dep(gpu="L40S", gpu_profiled=False), rows)
    assert not out.validated and any("no validated run on L40S" in r for r in out.reasons)
    assert "outside the validated range" in out.statement()
    for c in BAND_COLUMNS:   # level 4 (every stage): symmetric about 0, then log-ratios x WIDEN
        (lo0, hi0), (lo1, hi1) = inside.relative[c], out.relative[c]
        m = max(abs(math.log1p(lo0)), abs(math.log1p(hi0)))
        assert (math.log1p(lo1), math.log1p(hi1)) == pytest.approx((-WIDEN * m, WIDEN * m))


def test_unseen_engine_generation_and_overload_are_flagged():
    errs = [-0.05 + 0.01 * i for i in range(12)]
    rows = [_row(f"run{i % 4}", "H100-SXM", e, stage=str(i)) for i, e in enumerate(errs)]
    old = band_for(_dep(generation="v0"), rows)
    assert not old.validated and old.reasons == ["engine generation v0 was not in any validated run"]
    assert band_for(_dep(overloaded=True), rows) is None            # no overloaded stage validated
    rows.append(_row("hot", "H100-SXM", 4.0, overloaded="1"))
    hot = band_for(_dep(overloaded=True), rows)
    assert not hot.validated and any("past the knee" in r for r in hot.reasons)
    assert hot.relative["e2e_mean_err"][0] < -0.9                     # the real run can be 5x faster, squared


def test_t_quantile_matches_scipy():
    from dsim.metrics.band import t_quantile
    for df in (1, 2, 3, 8, 9, 14, 30, 101):
        for p in (0.9, 0.975):
            assert t_quantile(p, df) == pytest.approx(float(student_t.ppf(p, df)), rel=1e-12)


def test_load_regime_and_offered_load():
    assert offered_load(10, 2.0, 100) == pytest.approx(0.2)
    assert [load_regime(x) for x in (0.1, 0.3, 0.9, None)] == ["light", "moderate", "heavy", None]


def test_held_out_errors_of_a_calibration_make_the_band():
    errs = [-0.03, -0.02, -0.01, 0.0, 0.0, 0.01, 0.01, 0.02, 0.04]          # 9: enough for its own band
    b = band_for(_dep(calibrated=True, held_out={"tpot_p50_err": errs}), validation_rows())
    x = np.array([-math.log1p(e) for e in errs])
    c = np.median(x)
    half = student_t.ppf(0.9, 8) * 1.4826 * np.median(np.abs(x - c)) * math.sqrt(1 + 1 / 9)
    assert b.relative["tpot_p50_err"] == pytest.approx((math.expm1(c - half), math.expm1(c + half)))
    assert b.basis == "this calibration's held-out errors" and b.validated and b.runs is None
    few = band_for(_dep(calibrated=True, held_out={"tpot_p50_err": errs[:3]}), validation_rows())
    assert "3 errors, 9 needed" in few.basis and few.basis.startswith("calibrated roofline")
    moved = band_for(_dep(gpu="A100-80GB", calibrated=True, held_out={"tpot_p50_err": errs}, fitted_on="H100-SXM"),
                     validation_rows())
    assert not moved.validated and moved.reasons == ["calibrated on H100-SXM, run on A100-80GB"] and moved.widened


def test_summary_carries_the_band_of_the_packaged_table():
    res = dsim.run(ROOT / "scenarios" / "quickstart.yaml", overrides=["workload.num_requests=200"])
    s = res.summary
    eb = s["error_band"]
    assert eb["level"] == LEVEL and eb["deployment"]["gpu"] == "H100-SXM" and eb["validated"]
    # the deployment by hand: quickstart is a dense model on H100, the newest engine, and its load is
    # rate x mean E2E / max_num_seqs
    from dsim.config.generations import generation_for
    load = s["stability"]["offered_requests_per_s"] * s["latency_ms"]["e2e"]["mean"] / 1e3 / 256
    dep = Deployment("roofline", "H100-SXM", True, "dense", generation_for(None).name,
                     "light" if load < 0.25 else "moderate" if load < 0.6 else "heavy")
    assert eb["deployment"]["load_regime"] == dep.regime
    want = band_for(dep, validation_rows())
    for c, (lo, hi) in want.relative.items():
        assert eb["relative"][c] == pytest.approx([lo, hi], abs=1e-6)
    lo, hi = want.relative["tpot_p50_err"]
    p50 = s["latency_ms"]["tpot"]["p50"]
    assert s["latency_ms"]["tpot"]["band"]["p50"] == pytest.approx([p50 * (1 + lo), p50 * (1 + hi)], rel=1e-6)
    assert s["metrics"]["p50_tpot_band_ms"] == s["latency_ms"]["tpot"]["band"]["p50"]
    assert "80% band on the real value" in eb["statement"]


def test_unprofiled_gpu_run_says_outside():
    res = dsim.run(ROOT / "scenarios" / "quickstart.yaml",
                   overrides=["workload.num_requests=100", "hardware=L40S"])
    eb = res.summary["error_band"]
    assert eb["validated"] is False and "outside the validated range" in eb["statement"]
    assert eb["deployment"]["gpu_curves_measured"] is False


def test_latency_scale_slows_every_step():
    a = dsim.run(ROOT / "scenarios" / "quickstart.yaml", overrides=["workload.num_requests=100",
                                                                     "workload.rate=1"])
    b = dsim.run(ROOT / "scenarios" / "quickstart.yaml", overrides=["workload.num_requests=100",
                                                                     "workload.rate=1", "latency.scale=1.5"])
    # at 1 req/s nothing queues: every decode step is 1.5x, so is TPOT
    assert b.summary["latency_ms"]["tpot"]["p50"] == pytest.approx(1.5 * a.summary["latency_ms"]["tpot"]["p50"],
                                                                    rel=0.02)


def test_capacity_holds_three_ordered_loads(tmp_path):
    rec = dsim.capacity(ROOT / "scenarios" / "quickstart.yaml", ["tpot_p99_ms=12"],
                        overrides=["workload.num_requests=300"], out=tmp_path / "cap", seeds=2)
    b = rec["band"]
    assert b["available"] and b["step_scale"]["optimistic"] < 1 < b["step_scale"]["pessimistic"]
    # searched, not clamped: a faster step carries more load, a slower one less
    assert b["optimistic"]["value"] > rec["max_rate"] > b["pessimistic"]["value"] and b["ordered"]
    assert len(rec["seed_spread"]["values"]) == 2
    saved = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    assert saved["band"]["pessimistic"]["value"] == b["pessimistic"]["value"]
    assert "error band" in (tmp_path / "cap" / "capacity.md").read_text()


def test_plan_marks_and_conservative(tmp_path):
    from dsim.explore.plan import plan
    space = tmp_path / "space.yaml"
    space.write_text("tensor_parallel_size: [1, 2]\nreplicas: auto\n")
    kw = dict(space=str(space), gpus=2, slos=["tpot_p99_ms=8.5"], overrides=["workload.num_requests=200"])
    loose = plan(ROOT / "scenarios" / "quickstart.yaml", **kw)
    assert loose["best"]["tensor_parallel_size"] == 1 and loose["best"]["pessimistic_pass"] is False
    strict = plan(ROOT / "scenarios" / "quickstart.yaml", conservative=True, **kw)
    assert strict["best"]["tensor_parallel_size"] == 2 and strict["best"]["pessimistic_pass"] is True


@pytest.mark.skipif(not SHARED.is_dir(), reason="needs ../shared/data/real (the shared real runs)")
def test_coverage_study_on_a_slice_of_the_shared_runs(tmp_path):
    out = tmp_path / "cov.json"
    run = SHARED / "llmservingsim-vllm" / "RTX4090_Llama-3.1-8B"
    subprocess.run([sys.executable, str(ROOT / "experiments" / "band_coverage.py"), "--json", str(out),
                    "--recompute", str(run)], check=True, capture_output=True, timeout=600)
    res = json.loads(out.read_text())
    rec = res["recomputed"]
    assert rec, "the run's stages were scored"
    for r in rec:          # the packaged errors are what the code computes today
        assert r["recomputed"] == pytest.approx(r["packaged"], abs=2e-5)
    assert all(0.0 <= t["coverage"] <= 1.0 for t in res["loro"])


def test_a_calibrated_scenario_uses_its_own_held_out_errors():
    from dsim.calibrate.command import held_out_errors
    loro = [{"held_out": "a", "errors": [("s0", "e2e mean", 0.01), ("s0", "ttft p90", 0.5), ("s0", "tpot p50", -0.02)]},
            {"held_out": "b", "errors": [("s0", "tpot p50", 0.03), ("s1", "tpot p50", 0.0)]}]
    held = held_out_errors(loro)
    assert held == {"e2e_mean_err": [0.01], "tpot_p50_err": [-0.02, 0.03, 0.0]}      # ttft p90: no band column
    res = dsim.run(ROOT / "scenarios" / "quickstart.yaml", overrides=[
        "workload.num_requests=100", "latency.fitted_on=H100-SXM",
        "latency.held_out_errors={tpot_p50_err: [-0.02, 0.03, 0.0, 0.01, -0.01, 0.02, 0.0, 0.01, -0.02]}"])
    eb = res.summary["error_band"]
    assert eb["basis"] == "this calibration's held-out errors" and eb["deployment"]["calibrated"]
    assert set(eb["relative"]) == {"tpot_p50_err"}
    with pytest.raises(dsim.ConfigError, match=r"latency.held_out_errors.tpot_p50_err\[0\]"):
        dsim.run(ROOT / "scenarios" / "quickstart.yaml", overrides=["latency.held_out_errors={tpot_p50_err: [nan]}"])


def test_a_model_kind_no_run_had_draws_on_the_extrapolation_pool():
    errs = [-0.05 + 0.01 * i for i in range(12)]
    rows = [_row(f"run{i % 4}", "H100-SXM", e, stage=str(i)) for i, e in enumerate(errs)]
    rows += [_row("rtx_a", "RTX4090", 0.2, profiled="0"), _row("rtx_b", "RTXPRO6000", -0.3, profiled="0"),
             _row("rtx_c", "RTXPRO6000", 0.1, profiled="0")]
    dense, fp8 = band_for(_dep(), rows), band_for(_dep(kind="quantized"), rows)
    assert dense.validated and not fp8.validated and not fp8.widened
    assert fp8.reasons == ["quantized models were not in any validated run"]
    assert "RTX4090, RTXPRO6000" in fp8.basis and fp8.stages == 3
    x = np.array([-math.log(1 + e) for e in (0.2, -0.3, 0.1)])       # robust interval, then symmetric about 0
    c = np.median(x)
    half = student_t.ppf(0.9, 2) * 1.4826 * np.median(np.abs(x - c)) * math.sqrt(1 + 1 / 3)
    m = max(abs(c - half), abs(c + half))
    assert fp8.relative["e2e_mean_err"] == pytest.approx((math.expm1(-m), math.expm1(m)))


def test_scale_reaches_pools_with_their_own_latency_and_dp_ranks():
    from dsim.explore.capacity import scale_overrides
    scn = dsim.load_scenario(ROOT / "scenarios" / "hetero_fleet.yaml", overrides=[
        "cluster.clusters[1].pools[0].latency={model: roofline, scale: 2}"])
    assert scale_overrides(scn, 1.5) == ["latency.scale=1.5", "cluster.clusters[1].pools[0].latency.scale=3"]
    quiet = ["workload.rate=0.05", "workload.num_requests=20"]        # one request at a time: no batching
    base = dsim.run(ROOT / "scenarios" / "dp_ep_moe.yaml", overrides=quiet)
    slow = dsim.run(ROOT / "scenarios" / "dp_ep_moe.yaml", overrides=quiet + ["latency.scale=1.5"])
    assert slow.summary["latency_ms"]["tpot"]["p50"] == pytest.approx(
        1.5 * base.summary["latency_ms"]["tpot"]["p50"], rel=0.03)


def test_fleet_band_keeps_every_pool():
    res = dsim.run(ROOT / "scenarios" / "hetero_fleet.yaml", overrides=[
        "workload.classes[0].num_requests=80", "workload.classes[1].num_requests=20",
        "cluster.clusters[1].pools[0].latency={model: blackbox, beta: [6000, 0.05, 20]}"])
    eb = res.summary["error_band"]
    assert eb["validated"] is False and any("never validated" in r for r in eb["reasons"])
    assert len(eb["pools"]) == len(res.fleet.pools) and any(not p["validated"] for p in eb["pools"].values())


def test_run_sets_the_other_validated_models_beside_its_answer():
    over = ["workload.num_requests=100"]
    res = dsim.run(ROOT / "scenarios" / "quickstart.yaml", overrides=over, compare_models=True)
    ms = res.summary["model_spread"]
    assert ms["scenario_model"] == "roofline" and set(ms["models"]) == set(ms["validated_models"]) - {"roofline"}
    # each model's numbers are that model's own run, not the scenario's
    phys = dsim.run(ROOT / "scenarios" / "quickstart.yaml", overrides=over + ["latency={model: physics}"])
    assert ms["models"]["physics"]["tpot_p50_ms"] == phys.summary["latency_ms"]["tpot"]["p50"]
    assert ms["models"]["physics"]["tpot_p50_ms"] != res.summary["latency_ms"]["tpot"]["p50"]
    assert "error" in ms["models"]["vidur"]            # vidur has no profile of Llama-3.1-8B's shapes


def test_pareto_points_are_named():
    from dsim.explore.plan import front_labels
    pts = [{"tensor_parallel_size": 1, "replicas": 2, "engine.max_num_seqs": 64,
            "efficiency_output_tokens_per_s_per_user": 130.0, "efficiency_output_tokens_per_s_per_gpu": 2400.0},
           {"tensor_parallel_size": 1, "replicas": 2, "engine.max_num_seqs": 256,
            "efficiency_output_tokens_per_s_per_user": 130.0, "efficiency_output_tokens_per_s_per_gpu": 2400.0},
           {"tensor_parallel_size": 2, "replicas": 1, "engine.max_num_seqs": 64,
            "efficiency_output_tokens_per_s_per_user": 180.0, "efficiency_output_tokens_per_s_per_gpu": 1250.0}]
    labels = front_labels(["tensor_parallel_size", "engine.max_num_seqs", "replicas", "gpus"], pts)
    assert labels == {(130.0, 2400.0): "TP1 x2\nmax_num_seqs=64\n(+1 more with the same numbers)",
                      (180.0, 1250.0): "TP2 x1\nmax_num_seqs=64"}
