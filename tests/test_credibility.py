"""Which latency model to believe: experimental models say so with their measured zero-shot error,
and coefficients that claim more than the GPU's peak are named."""
import csv
from importlib import resources

import pytest
from helpers import scenario

import dsim
from dsim.latency.credibility import beyond_peak, credibility_warnings, zero_shot_mape


def _warnings(**latency):
    res = dsim.run(scenario(latency=latency, workload={"type": "poisson", "rate": 5, "num_requests": 20,
                                                       "prompt_tokens": 100, "output_tokens": 4}))
    return " ".join(res.summary.get("warnings", []))


def test_the_default_model_carries_no_credibility_warning():
    assert "experimental" not in _warnings(model="roofline") and "not physical" not in _warnings(model="roofline")


def test_shipped_unified5_is_experimental_and_its_seed_coefficients_exceed_the_peak():
    w = _warnings(model="unified5")
    assert "latency.model=unified5 is experimental" in w
    assert "b1 = 0.393 runs at 2.5x the GPU's peak FLOP/s" in w


def test_own_coefficients_are_not_called_experimental_but_are_checked_against_the_peak():
    w = _warnings(model="unified5", beta=[1.2, 1.1, 1.05, 60.0, 10.0])
    assert w == ""
    w = _warnings(model="unified5", beta=[1.2, 1.1, 0.5, 60.0, 10.0])
    assert "experimental" not in w and "b3 = 0.5 runs at 2x the GPU's peak HBM bandwidth" in w


def test_beyond_peak_names_only_multipliers_below_one():
    assert beyond_peak("unified5", [1.0, 1.0, 1.0, 0.1, 0.1]) == []     # b4, b5 are times, not multipliers
    assert len(beyond_peak("physics", [0.5, 2, 0.9, 3, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0])) == 2
    assert beyond_peak("roofline", [0.1]) == []


def test_zero_shot_error_is_the_shipped_tables_mean():
    """Recomputed here from the CSV the package ships (written by experiments/validation.py)."""
    f = resources.files("dsim").joinpath("data", "validation_errors.csv")
    if not f.is_file():
        pytest.skip("validation_errors.csv not generated")
    rows = [r for r in csv.DictReader(f.read_text().splitlines())
            if r["latency_model"] == "physics" and r["overloaded"] == "0" and r["tpot_p50_err"]]
    assert rows, "physics has validation rows"
    want = sum(abs(float(r["tpot_p50_err"])) for r in rows) / len(rows)
    assert zero_shot_mape("physics")["tpot_p50"] == pytest.approx(want)
    assert f"TPOT p50 {want:.0%}" in credibility_warnings("physics")[0]


def _physics_run(**extra):
    import dsim
    scn = {"name": "ng", "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM", "latency": {"model": "physics"},
           "workload": {"type": "poisson", "rate": 5, "num_requests": 20, "prompt_tokens": 100, "output_tokens": 8},
           **extra}
    return [w for w in dsim.run(scn).summary.get("warnings", []) if "was not built for" in w]


@pytest.mark.parametrize("extra,feature", [
    ({"speculation": {"mode": "fused"}}, "speculative decoding"),
    ({"engine": {"pipeline_parallel_size": 2}}, "pipeline parallelism"),
])
def test_physics_outside_its_design_is_flagged_in_the_report(extra, feature):
    """The physics model's design scoped out speculative decoding, EP and PP: a run that uses one
    says so; the same run without it does not."""
    got = _physics_run(**extra)
    assert len(got) == 1 and feature in got[0]
    assert _physics_run() == []


def test_outside_design_names_only_what_is_used():
    from dsim.latency.credibility import outside_design
    assert outside_design("roofline", speculation=True, pipeline=4, expert_parallel=True) == []
    got = outside_design("physics", speculation=False, pipeline=1, expert_parallel=True)
    assert len(got) == 1 and "expert parallelism" in got[0]
