"""dsim calibrate --latency-model blackbox: BLIS's coefficients by Bayesian optimisation (seed 000,
"Existing Modeling Approaches", Approach 1), with optuna's TPE."""
import pytest

import dsim
from dsim.calibrate.calibrate import (blackbox_reading, blackbox_space, evaluate, loss_of, space_for, stage2,
                                     start_latency)
from dsim.calibrate.command import replica_context
from dsim.calibrate.runs import RealRun, Stage, quantiles
from dsim.metrics.measures import ledger_latencies

pytest.importorskip("optuna")

# b0 per step, b1 per prefill token, b2 per decode token; a0 before queueing (a1, a2 as the start has them)
TRUTH = {"model": "blackbox", "beta": [9000.0, 40.0, 150.0], "alpha": [20000.0, 0.97, 0.0]}
STAGES = ((3.0, 10.0), (9.0, 10.0))        # two loads: batches of different sizes separate b0 from b2


@pytest.fixture(scope="module")
def truth_run():
    """A staged 'real' run whose per-stage aggregates are dsim's own with TRUTH (seed 42, as replayed)."""
    scn = {"model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM", "seed": 42,
           "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 512},
           "workload": {"type": "staged", "prompt_tokens": {"dist": "uniform", "low": 100, "high": 1500},
                        "output_tokens": {"dist": "uniform", "low": 20, "high": 200},
                        "stages": [{"rate": r, "duration_s": d} for r, d in STAGES]}}
    led = dsim.run(dict(scn, latency=TRUTH, output={"plots": False})).requests
    arr, stages, t0 = led.col("arrival"), [], 0.0
    for i, (rate, d) in enumerate(STAGES):
        lat = ledger_latencies(led, (arr >= t0) & (arr < t0 + d) & led.present("t_completion"))
        real = {"ttft": quantiles(lat["ttft_ms"]), "tpot": quantiles(lat["tpot_ms"]), "e2e": quantiles(lat["e2e_ms"])}
        stages.append(Stage(f"s{i}", t0, t0 + d, real, rate=rate))
        t0 += d
    return RealRun("blackbox-truth", "generic", "-", scn, stages)


def test_the_search_box_is_the_roofline_reading_of_the_replica(truth_run):
    ctx = replica_context(truth_run)
    b0, b1, b2 = blackbox_reading(ctx)
    m, d = ctx.model, ctx.device
    assert b0 == pytest.approx(m.layer_weight_bytes() / d.hbm_bytes_s * 1e6)        # dense: every weight, once
    assert b1 == b2 == pytest.approx(m.flops_per_token_linear / d.peak_flops * 1e6)
    space = space_for("blackbox", ctx)
    assert [p.name for p in space] == ["beta.0", "beta.1", "beta.2", "alpha.0"] and all(p.log for p in space)
    assert (space[0].lo, space[0].hi) == pytest.approx((b0, 30 * b0)) and space[2].lo == pytest.approx(0.01 * b2)
    assert space == blackbox_space((b0, b1, b2))
    start = start_latency("blackbox", ctx)
    assert start["beta"] == pytest.approx([2 * b0, 2 * b1, 2 * b2])
    assert all(p.lo <= t <= p.hi for p, t in zip(space, TRUTH["beta"] + TRUTH["alpha"][:1]))


def test_bayesian_optimisation_recovers_the_step_coefficients_deterministically(truth_run):
    ctx = replica_context(truth_run)
    space, start = space_for("blackbox", ctx), start_latency("blackbox", ctx)
    assert loss_of(evaluate([truth_run], None, (), 42, TRUTH)) == 0.0      # the replay of the truth is exact
    s2 = stage2([truth_run], None, (), 42, start, space, 40, optimizer="bayesian")
    assert s2["optimizer"] == "bayesian" and s2["evaluations"] == 40 and not s2["converged"]
    assert s2["loss"] < 0.25 * s2["loss_start"]
    b0, b1, _ = s2["latency"]["beta"]
    # the step's fixed cost and the prefill token's cost set TPOT and TTFT: recovered; b2 and a0 move the
    # aggregates less (documented), so they are not asserted
    assert b0 == pytest.approx(TRUTH["beta"][0], rel=0.10) and b1 == pytest.approx(TRUTH["beta"][1], rel=0.05)
    # the result is the best point simulated; the same seed searches the same points
    assert loss_of(evaluate([truth_run], None, (), 42, s2["latency"])) == pytest.approx(s2["loss"], abs=1e-12)
    a = stage2([truth_run], None, (), 42, start, space, 8, optimizer="bayesian")
    b = stage2([truth_run], None, (), 42, start, space, 8, optimizer="bayesian")
    assert a["latency"] == b["latency"] and a["loss"] == b["loss"]
    c = stage2([truth_run], None, (), 7, start, space, 8, optimizer="bayesian")
    assert c["latency"] != a["latency"]                                   # another seed, another search


def test_bayesian_without_optuna_says_how_to_install_it(monkeypatch):
    import sys

    from dsim.calibrate.bayes import _optuna
    from dsim.config.errors import ConfigError
    monkeypatch.setitem(sys.modules, "optuna", None)           # import optuna -> ImportError
    with pytest.raises(ConfigError, match=r"dsim\[calibrate\]"):
        _optuna()
