"""The saturation cliff by bisection and stage 2's cliff penalty (seed 003 Part 4, "Cliff detection")."""
import math

import pytest

from dsim.calibrate import cliff
from dsim.calibrate.calibrate import Param, evaluate, loss_of, stage2
from dsim.calibrate.runs import RealRun, Stage
from dsim.config.errors import ConfigError

# a blackbox step of exactly STEP_US whatever the batch (engine generation v1: no host costs on top),
# N output tokens, at most B requests running: a request holds a slot for N steps, so the deployment
# completes B requests per N steps, B / (N x step) = 4 req/s.  Constant-rate arrivals do not queue below it.
B, N, STEP_US = 4, 20, 50000.0
CAPACITY = B / (N * STEP_US * 1e-6)


def staged_run(stages, name="synthetic", real=None):
    scn = {"model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
           "engine": {"max_num_seqs": B, "max_num_batched_tokens": 512},
           "workload": {"type": "staged", "stage_arrivals": "constant", "prompt_tokens": 64, "output_tokens": N,
                        "stages": [{"rate": r, "duration_s": 60.0} for r, _ in stages]}}
    st = [Stage(f"s{i}", 60.0 * i, 60.0 * (i + 1), dict(real or {}), rate=r, overloaded=o)
          for i, (r, o) in enumerate(stages)]
    return RealRun(name, "generic", "-", scn, st)


def blackbox(step_us=STEP_US):
    return {"model": "blackbox", "beta": [step_us, 0.0, 0.0], "alpha": [0.0, 0.0, 0.0]}


def test_bisect_rate_on_a_known_threshold_within_the_hand_counted_calls():
    calls = []

    def over(r):
        calls.append(r)
        return r >= 3.7
    lo, hi, n = cliff.bisect_rate(over, 0.5, [2.0, 6.0], rtol=0.01, budget=20)
    assert lo < 3.7 <= hi and hi - lo <= 0.01 * hi
    # 2 probes, then the bracket [2, 6] (ratio 3) halved in log space until hi/lo <= 1/0.99:
    # ln 3 / 2^k <= -ln 0.99  ->  k = 7
    k = math.ceil(math.log2(math.log(3) / -math.log(0.99)))
    assert n == len(calls) == 2 + k
    # nothing overloaded: the rate doubles until the budget is spent, no cliff claimed
    lo, hi, n = cliff.bisect_rate(lambda r: False, 1.0, [2.0], budget=5)
    assert (lo, hi, n) == (32.0, None, 5)          # 2, then 4, 8, 16, 32


def test_cliff_bisection_finds_the_hand_computed_capacity():
    run = staged_run([(2.0, False), (6.0, True)])
    c = cliff.saturation_cliff(run, blackbox(), duration_s=60.0, rtol=0.02)
    assert c.below <= CAPACITY <= c.rate and c.rate - c.below <= 0.02 * c.rate and c.converged
    assert c.low_ttft_s == pytest.approx(STEP_US * 1e-6, rel=1e-6)      # one step at low load
    # the low rate, the real bracket's two rates, then ln 3 / 2^k <= -ln 0.98: k = 6
    assert c.simulations == len(c.probes) == 1 + 2 + 6
    assert [p[2] for p in c.probes[:3]] == [False, False, True]
    again = cliff.saturation_cliff(run, blackbox(), duration_s=60.0, rtol=0.02)
    assert again == c                                                     # deterministic
    # twice the step time halves the capacity: the bisection follows it
    slow = cliff.saturation_cliff(run, blackbox(2 * STEP_US), duration_s=60.0, rtol=0.02)
    assert slow.below <= CAPACITY / 2 <= slow.rate


def test_penalty_is_zero_inside_the_margin_and_the_log_distance_outside():
    def at(rate, below=None):
        return cliff.Cliff(rate, below if below is not None else (rate or 0) * 0.99, 0.05, 5, True)
    br = (2.0, 6.0)                                       # band [1.6, 7.2] with the 20 % margin
    assert cliff.penalty(at(1.6), br) == 0 and cliff.penalty(at(7.2), br) == 0 and cliff.penalty(at(4.0), br) == 0
    assert cliff.penalty(at(9.0), br) == pytest.approx(math.log(9.0 / 7.2))
    assert cliff.penalty(at(1.0), br) == pytest.approx(math.log(1.6 / 1.0))
    assert cliff.penalty(at(None, below=10.0), br) == pytest.approx(math.log(10.0 / 7.2))   # none found up to 10
    assert cliff.penalty(at(None, below=5.0), br) == 0     # budget spent inside the band: nothing known against it
    assert cliff.penalty(at(0.1), (0.0, 4.0)) == 0          # no stage kept up: only the upper side binds


def test_stage2_loss_adds_the_cliff_penalty_of_the_overloaded_staged_run():
    real = {"ttft": {"p50": 60.0, "p90": 90.0}, "e2e": {"mean": 1100.0}, "tpot": {"p50": 52.0}}
    ok = staged_run([(2.0, False)], "ok", real)
    # real failure onset between 8 and 12 req/s: the simulated 4 req/s is below 0.8 x 8
    over = staged_run([(8.0, False), (12.0, True)], "over")
    space = (Param("beta.0", 10000.0, 100000.0),)
    plain = stage2([ok, over], None, (), 42, blackbox(), space, max_evals=2)
    pen = stage2([ok, over], None, (), 42, blackbox(), space, max_evals=2, cliff_weight=2.0)
    start = cliff.cliff_penalty([ok, over], None, (), 42, blackbox(), 2.0)
    assert start["per_run"]["over"] > math.log(6.4 / 4.2)     # the cliff lies near 4 req/s, at most ~4.1
    assert pen["loss_start"] == pytest.approx(plain["loss_start"] + start["value"], abs=1e-12)
    assert plain["loss_start"] == pytest.approx(loss_of(evaluate([ok], None, (), 42, blackbox())), abs=1e-12)
    assert pen["cliff_penalty"]["start"] == start and pen["cliff_penalty"]["weight"] == 2.0
    assert "cliff_penalty" not in plain
    with pytest.raises(ConfigError, match="--cliff-penalty"):
        stage2([ok], None, (), 42, blackbox(), space, max_evals=2, cliff_weight=1.0)


def test_cliff_penalty_flag_is_a_weight(capsys):
    from dsim.cli import main
    assert main(["calibrate", "never-read", "--cliff-penalty", "-1"])     # checked before any run is read == 2
    assert "--cliff-penalty" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--optimizer", "bayesian"], ["--latency-model", "blackbox"]])
def test_bayesian_without_optuna_is_refused_before_any_run_is_read(argv, tmp_path, monkeypatch, capsys):
    """Checked up front (it was found only after stage 1 and the first stage-2 simulation)."""
    import sys
    from dsim.cli import main
    monkeypatch.setitem(sys.modules, "optuna", None)                  # import optuna -> ImportError
    assert main(["calibrate", str(tmp_path / "never-read"), *argv, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "--optimizer" in err and "optuna" in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


def test_cliff_penalty_is_the_weighted_mean_over_the_overloaded_staged_runs():
    """Two runs: one whose real onset (8 to 12 req/s) lies far above the simulated ~4 req/s, one whose
    onset (3 to 5 req/s) holds it: the term is weight x the mean of (log(6.4 / cliff), 0)."""
    far = staged_run([(8.0, False), (12.0, True)], "far")
    near = staged_run([(3.0, False), (5.0, True)], "near")
    got = cliff.cliff_penalty([far, near, staged_run([(2.0, False)], "ok")], None, (), 42, blackbox(), 3.0)
    assert set(got["per_run"]) == {"far", "near"} and got["per_run"]["near"] == 0.0
    assert got["per_run"]["far"] > math.log(6.4 / 4.2)
    assert got["value"] == pytest.approx(3.0 * got["per_run"]["far"] / 2, rel=1e-12)
