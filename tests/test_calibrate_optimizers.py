"""dsim calibrate --optimizer (stage 2's optimiser) and --evaluate (seed 003 Part 7's system-level report)."""
from types import SimpleNamespace

import numpy as np
import pytest
from test_calibrate import U5_ALPHA, U5_BETA, u5_scenario

import dsim
from dsim.calibrate import system
from dsim.calibrate.cliff import Cliff
from dsim.calibrate.calibrate import UNIFIED5, evaluate, loss_of, stage2
from dsim.calibrate.realrun import read_generic
from dsim.config.errors import ConfigError


@pytest.fixture(scope="module")
def truth_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("real")
    truth = [b * 1.4 for b in U5_BETA]
    dsim.run(u5_scenario(150, latency={"model": "unified5", "beta": truth, "alpha": U5_ALPHA}), tmp / "real")
    cols = {"arrival_s": "arrival_s", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens",
            "first_token_s": "first_token_s", "last_token_s": "completion_s"}
    return read_generic(tmp / "real" / "requests.csv", cols, model="meta-llama/Llama-3.1-8B",
                        hardware="H100-SXM", engine={"max_num_seqs": 64, "max_num_batched_tokens": 512})


@pytest.mark.parametrize("opt", ["differential-evolution", "dual-annealing"])
def test_global_optimisers_spend_exactly_the_budget_and_improve(truth_run, opt):
    # a start inside every parameter's range (as start_latency makes it), so the search starts exactly there
    lat0 = {"model": "unified5", "beta": [max(b, p.lo) for b, p in zip(U5_BETA, UNIFIED5)], "alpha": U5_ALPHA}
    s2 = stage2([truth_run], None, (), 42, lat0, UNIFIED5, max_evals=20, optimizer=opt)
    assert s2["optimizer"] == opt and s2["evaluations"] == 20
    nm = stage2([truth_run], None, (), 42, lat0, UNIFIED5, max_evals=1)
    assert s2["loss_start"] == nm["loss_start"]          # the same start point, tried first
    assert s2["loss"] <= s2["loss_start"]
    # the result is the best point simulated: replaying it gives its loss
    assert loss_of(evaluate([truth_run], None, (), 42, s2["latency"])) == pytest.approx(s2["loss"], abs=1e-12)
    again = stage2([truth_run], None, (), 42, lat0, UNIFIED5, max_evals=20, optimizer=opt)
    assert again["latency"] == s2["latency"]          # seeded: the same search


def test_unknown_optimiser_is_a_config_error(truth_run):
    with pytest.raises(ConfigError, match="--optimizer"):
        stage2([truth_run], None, (), 42, {"model": "unified5", "beta": U5_BETA, "alpha": U5_ALPHA}, UNIFIED5, 5,
               optimizer="simplex")


def _stage(name, e2e, ttft, overloaded=False):
    return {"stage": name, "overloaded": overloaded,
            "metrics": {"e2e": {"error": {"mean": e2e}}, "ttft": {"error": {"mean": ttft[0], "p50": ttft[1],
                                                                            "p90": ttft[2]}}}}


def test_system_report_by_hand(monkeypatch):
    runs = [SimpleNamespace(name="a", scenario={"workload": {"type": "trace"}}, stages=[]),
            SimpleNamespace(name="b", scenario={"workload": {"type": "staged"}},
                            stages=[SimpleNamespace(rate=8.0, overloaded=False), SimpleNamespace(rate=20.0, overloaded=True)])]
    reps = [{"stages": [_stage("all", 0.10, (0.2, -0.5, 0.3))]},
            {"stages": [_stage("s0", -0.20, (0.1, 0.1, 1.4)), _stage("s1", 5.0, (9.0, 9.0, 9.0), overloaded=True)]}]
    monkeypatch.setattr("dsim.calibrate.cliff.saturation_cliff",
                        lambda run, lat, *a: Cliff(16.0, 15.8, 0.05, 9, True))
    rep = system.system_report(runs, reps, {"model": "roofline"})
    assert rep["e2e_mape"]["value"] == pytest.approx(0.15) and rep["e2e_mape"]["stages"] == 2
    assert rep["e2e_mape"]["pass"] is False                      # 15 % is not < 15 %
    assert rep["ttft_worst"]["value"] == pytest.approx(1.4) and rep["ttft_worst"]["where"] == "b s0 ttft p90"
    assert rep["ttft_worst"]["pass"] is False                    # the overloaded stage's 900 % is not counted
    (c,) = rep["cliffs"]                                         # only the staged run with an overload
    assert (c["real_above_rps"], c["real_at_most_rps"], c["sim_cliff_rps"], c["pass"]) == (8.0, 20.0, 16.0, True)
    monkeypatch.setattr("dsim.calibrate.cliff.saturation_cliff",
                        lambda run, lat, *a: Cliff(30.0, 29.5, 0.05, 9, True))
    assert system.system_report(runs, reps, {})["cliffs"][0]["pass"] is False      # 30 > 1.2 x 20
    lines = system.markdown_lines(rep)
    assert any("FAIL" in x and "E2E" in x for x in lines) and any("16 req/s" in x for x in lines)
