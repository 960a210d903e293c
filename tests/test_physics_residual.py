"""The opt-in GBDT residual on top of the physics step time (seed 000 Iteration 6, Refinement 6)."""
import copy
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

import dsim
from dsim.calibrate import residual as R
from dsim.config.errors import ConfigError
from dsim.latency.base import BatchShape
from dsim.latency.physics import DEFAULT_COEFFS, load_coefficients
from dsim.latency.residual import PhysicsResidual, Tree, load_residual

ROOT = Path(__file__).resolve().parents[1]
# the known nonlinearity: a step scheduling more than half the token budget (physics feature 5,
# batch_utilization) takes 1.5 x the physics time; the physics model is linear in that feature
JUMP = PhysicsResidual(0.0, 1.0, (Tree((5, -2, -2), (0.5, -2.0, -2.0), (1, -1, -1), (2, -1, -1),
                                       (0.0, 0.0, math.log(1.5))),), 16, None)


# under pytest-xdist (`-n auto --dist loadgroup`) this module's tests share one
# worker, so its module-scoped fixture (truth traces) runs once, not once per worker
pytestmark = pytest.mark.xdist_group("test_physics_residual")


def physics_scenario(seed, n, residual=None):
    s = yaml.safe_load((ROOT / "scenarios" / "trace_roundtrip.yaml").read_text())
    s["seed"], s["workload"]["num_requests"] = seed, n
    s["latency"] = {"model": "physics", **({"residual": str(residual)} if residual else {})}
    return s


@pytest.fixture(scope="module")
def truth_traces(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resid")
    R.write_residual(tmp / "truth.json", JUMP, {}, {})
    paths = []
    for seed in (3, 4):
        p = tmp / f"t{seed}.otlp.jsonl"
        dsim.run(physics_scenario(seed, 60, tmp / "truth.json"), vllm_traces=True).write_vllm_traces(p)
        paths.append(p)
    return tmp, paths


def test_exported_trees_predict_exactly_as_scikit_learn_and_round_trip(tmp_path):
    g = np.random.default_rng(0)
    X = g.uniform(0, 2, size=(200, 16))
    y = np.exp(np.where(X[:, 3] > 1.0, 0.4, -0.1) + 0.05 * X[:, 7] ** 2)
    m = R.fit_trees(X, y, np.ones(200), np.ones(200))
    r = R.export(m, [1.0] * 16)
    assert max(abs(r(x) - p) for x, p in zip(X, m.predict(X))) < 1e-12
    R.write_residual(tmp_path / "r.json", r, {"mape_physics": 0.1}, {"data": []})
    back = load_residual(tmp_path / "r.json")
    assert back.trees == r.trees and back.beta == r.beta and back(X[0]) == r(X[0])
    again = R.export(R.fit_trees(X, y, np.ones(200), np.ones(200)), [1.0] * 16)
    assert again.trees == r.trees                                      # seeded: the same trees


def test_residual_multiplies_the_physics_step_and_is_read_from_latency_residual(tmp_path):
    from dsim.config.scenario import load_scenario
    from dsim.config.schema.latency import parse_latency
    from dsim.latency.registry import build_latency
    R.write_residual(tmp_path / "jump.json", JUMP, {}, {})
    s_on = load_scenario(physics_scenario(3, 5, tmp_path / "jump.json"))
    s_off = load_scenario(physics_scenario(3, 5))
    from dsim.latency.base import LatencyContext

    def step(s, shape):
        ctx = LatencyContext(s.model, s.device, s.engine, s.engine.kv_blocks(s.model, s.device))
        model, _, desc = build_latency(parse_latency(s.raw["latency"]), ctx)
        return model.gpu.step_time(shape) if hasattr(model, "gpu") else model.step_time(shape), desc
    big = BatchShape(prefill_tokens=400, num_prefill=1, prefill_attn_pairs=400 * 401 // 2, num_sampled=1, running=1)
    small = BatchShape(prefill_tokens=100, num_prefill=1, prefill_attn_pairs=100 * 101 // 2, num_sampled=1, running=1)
    (on_big, desc), (off_big, _) = step(s_on, big), step(s_off, big)
    assert on_big == pytest.approx(1.5 * off_big, rel=1e-12)            # 400 / 512 > half the budget
    assert step(s_on, small)[0] == step(s_off, small)[0]                 # 100 / 512: exp(0) = 1
    assert desc["residual"].endswith("jump.json")
    # fitted on top of other coefficients: said in the manifest's description
    R.write_residual(tmp_path / "other.json", PhysicsResidual(0.0, 1.0, JUMP.trees, 16, (1.0,) * 16), {}, {})
    _, d2 = step(load_scenario(physics_scenario(3, 5, tmp_path / "other.json")), small)
    assert "other physics coefficients" in d2["warning"]


def test_bad_residual_files_and_flags_are_config_errors(tmp_path):
    p = tmp_path / "bad.json"
    doc = {"physics_residual": dict(JUMP.to_dict())}
    doc["physics_residual"]["trees"][0]["left"] = [5, -1, -1]          # a child outside the tree
    p.write_text(json.dumps(doc))
    with pytest.raises(ConfigError, match=r"latency.residual: physics_residual.trees\[0\]\[node 0\]"):
        load_residual(p)
    bad = copy.deepcopy(doc)
    bad["physics_residual"]["n_features"] = 11
    p.write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="n_features"):
        load_residual(p)
    p.write_text("{not json")
    with pytest.raises(ConfigError, match="JSON"):
        load_residual(p)
    with pytest.raises(ConfigError, match="--model physics"):
        R.check_args("unified5", ["t.otlp.jsonl"], "r.json")
    with pytest.raises(ConfigError, match="OTLP step traces"):
        R.check_args("physics", [], "r.json")
    s = physics_scenario(3, 5, tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="latency.residual"):
        dsim.run(s)


def test_fit_residual_reduces_the_held_out_error_of_a_known_nonlinearity(truth_traces, tmp_path, monkeypatch):
    """dsim fit --residual on two runs' traces: leave one run out, each run's steps predicted by the
    physics fit and the residual of the other run; the scenario then reads it with its coefficients."""
    from dsim.cli import main
    from dsim.config.scenario import load_scenario
    from dsim.config.schema.latency import parse_latency
    from dsim.latency.base import LatencyContext
    from dsim.latency.registry import build_latency
    tmp, paths = truth_traces
    base = physics_scenario(3, 60)
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    # stage 1's result: the coefficients the traces were simulated with (the residual then has exactly
    # the jump to learn in sample); each validation fold refits the betas (Ridge, this lambda and gamma)
    beta = list(load_coefficients(DEFAULT_COEFFS).beta)
    res = {"beta": beta, "gamma": 0.3, "alpha": [0.0] * 11,
           "fit": {"lambda": 1e-6, "rows": 0, "mape": 0.0}, "method": "Ridge", "diagnostics": None}
    # stage 1 itself is tested elsewhere (and takes ~20 s): the CLI's residual path is what is tested here
    monkeypatch.setattr("dsim.calibrate.fit.fit_traces", lambda *a: (res, {"data": [str(p) for p in paths]}))
    monkeypatch.setattr("dsim.calibrate.diagnostics.console_lines", lambda d: [])
    rc = main(["fit", *map(str, paths), "--model", "physics", "--scenario", str(tmp_path / "base.yaml"),
               "--out", str(tmp_path / "p.yaml"), "--residual", str(tmp_path / "r.json")])
    assert rc == 0
    r = load_residual(tmp_path / "r.json")
    assert r.beta == tuple(res["beta"])
    val = json.loads((tmp_path / "p.report.json").read_text())["fit"]["residual"]
    assert val["how"].startswith("leave one run out over 2")
    for fold in val["folds"].values():                # held out: each run predicted by a fit on the other
        assert fold["mape_with_residual"] < 0.5 * fold["mape_physics"]
    assert val["mape_physics"] > 0.005                # the linear model cannot take the jump
    assert val["mape_in_sample_with_residual"] < 0.05 * val["mape_in_sample_physics"]
    assert val["rows"] > 1000 and val["mape_in_sample_physics"] > 0.05          # the jump: x1.5 on ~20 % of steps
    lat = {"model": "physics", "coefficients": str(tmp_path / "p.yaml"), "residual": str(tmp_path / "r.json")}
    s = load_scenario(dict(base, latency=lat))
    ctx = LatencyContext(s.model, s.device, s.engine, s.engine.kv_blocks(s.model, s.device))
    _, _, desc = build_latency(parse_latency(lat), ctx)
    assert "other physics coefficients" not in (desc.get("warning") or "")


def test_two_runs_replicas_of_one_name_are_read_apart(truth_traces):
    """Two trace files of separate runs both name their replica the same: their steps (ids 0, 1, ...)
    must not overwrite each other, as they did before."""
    from dsim.calibrate.vllm_traces import beta_table, read_otlp
    _, paths = truth_traces
    each = [read_otlp([p]) for p in paths]
    assert list(each[0].steps) == list(each[1].steps)                     # the same replica name
    both = read_otlp(paths)
    assert len(both.steps) == 2 and len(beta_table(both)) == sum(len(beta_table(t)) for t in each)
    assert len(both.journeys) == sum(len(t.journeys) for t in each)


def test_compiled_leaf_sum_equals_the_walk_bit_for_bit_and_deep_trees_are_walked():
    from dsim.latency import residual as L
    g = np.random.default_rng(1)
    X = g.uniform(0, 2, size=(300, 16))
    y = np.exp(np.where(X[:, 3] > 1.0, 0.4, -0.1) + 0.05 * X[:, 7] ** 2 - 0.2 * (X[:, 11] < 0.3))
    r = R.export(R.fit_trees(X, y, np.ones(300), np.ones(300)), [1.0] * 16)
    assert r._sum != r._walk
    for x in X:
        xf = np.asarray(x, dtype=np.float32).tolist()
        assert r._sum(xf) == r._walk(xf)                               # same float sum, same order
    # a chain deeper than COMPILE_DEPTH: walked, same answer as a hand count
    n = L.COMPILE_DEPTH + 5
    # node i < n: x0 <= 0.5 goes on to node i + 1, else to leaf n + 1 + i (value i + 2); leaf n is 1.0
    chain = Tree((0,) * n + (-2,) * (n + 1), (0.5,) * n + (-2.0,) * (n + 1),
                 tuple(i + 1 if i < n else -1 for i in range(n)) + (-1,) * (n + 1),
                 tuple(n + 1 + i if i < n else -1 for i in range(n)) + (-1,) * (n + 1),
                 (0.0,) * n + (1.0,) + tuple(float(i + 2) for i in range(n)))
    deep = PhysicsResidual(0.0, 1.0, (chain,), 16, None)
    assert deep._sum == deep._walk
    assert deep([0.0] * 16) == 1.0 and deep([1.0] + [0.0] * 15) == 2.0
