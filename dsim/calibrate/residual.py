"""``dsim fit --model physics --residual OUT.json``: a gradient-boosted correction on top of the physics
step time (seed 000 Iteration 6, Refinement 6: the v2 path), fitted on vLLM step traces.

Target: log(real / physics) per cleaned step (the ``dsim fit`` cleaning and weights), features: the
16 physics step features the simulator computes (dsim.latency.physics.beta_features).  Model:
scikit-learn's GradientBoostingRegressor (squared error, depth 3, 100 trees, learning rate 0.1, no
subsampling, ``random_state`` fixed: deterministic), exported to dsim's tree JSON
(dsim.latency.residual).  Validation: leave one run (trace file) out, each fold refitting the physics
betas (the fit's lambda and gamma) and the residual on the other runs, MAPE on the held-out run with
and without the residual; with one trace file, five contiguous time blocks instead.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..config.errors import ConfigError
from ..latency.physics import BETA_NAMES
from ..latency.residual import PhysicsResidual, Tree

N_TREES, DEPTH, RATE = 100, 3, 0.1
MIN_STEP = 1e-6          # PhysicsModel.MIN_STEP: the physics time is never below it


def design(paths, base, gamma: float):
    """Features (16 per cleaned step), real step times (s), weights and the run index of each row."""
    from .fit import _step_models, clean_steps, physics_design, replica_contexts
    from .vllm_traces import beta_table, read_otlp
    X, y, w, run = [], [], [], []
    for i, p in enumerate(paths):
        tr = read_otlp([p])
        kept, wi, _ = clean_steps(beta_table(tr))
        Xi, yi = physics_design(kept, _step_models(replica_contexts(tr, base), "physics"), gamma)
        X.append(Xi), y.append(yi), w.append(wi), run.append(np.full(len(yi), i))
    return np.vstack(X), np.concatenate(y), np.concatenate(w), np.concatenate(run)


def physics_time(X, beta) -> np.ndarray:
    return np.maximum(X @ np.asarray(beta, float), MIN_STEP)


def fit_trees(X, y, phys, w, seed: int = 0):
    """The scikit-learn model of log(y / phys) (init 0: every term is a tree, so the export is exact)."""
    from sklearn.ensemble import GradientBoostingRegressor
    m = GradientBoostingRegressor(loss="squared_error", n_estimators=N_TREES, max_depth=DEPTH, learning_rate=RATE,
                                  subsample=1.0, init="zero", random_state=seed)
    m.fit(X, np.log(y / phys), sample_weight=w)
    return m


def export(model, beta) -> PhysicsResidual:
    """dsim's tree form of a fitted GradientBoostingRegressor (public ``tree_`` arrays only)."""
    trees = []
    for est in model.estimators_[:, 0]:
        t = est.tree_
        trees.append(Tree(tuple(int(f) for f in t.feature), tuple(float(v) for v in t.threshold),
                          tuple(int(c) for c in t.children_left), tuple(int(c) for c in t.children_right),
                          tuple(float(v) for v in t.value[:, 0, 0])))
    return PhysicsResidual(0.0, float(model.learning_rate), tuple(trees), len(BETA_NAMES),
                           tuple(float(b) for b in beta))


def _mape(pred, y) -> float:
    return float(np.mean(np.abs(pred - y) / y))


def validate(X, y, w, run, lam: float, seed: int = 0) -> dict:
    """Held-out MAPE of the physics step time with and without the residual, per fold."""
    from .fit import _ridge_relative
    runs = np.unique(run)
    if len(runs) > 1:
        folds = [(f"run {int(r)}", run == r) for r in runs]
        how = f"leave one run out over {len(runs)} trace files"
    else:
        idx = np.arange(len(y))
        folds = [(f"block {k}", idx * 5 // len(y) == k) for k in range(5)]
        how = "one trace file: 5 contiguous time blocks, each held out in turn"
    out = {}
    for name, test in folds:
        if test.all() or not test.any():
            continue
        beta = _ridge_relative(X[~test], y[~test], w[~test], lam)
        phys_tr, phys_te = physics_time(X[~test], beta), physics_time(X[test], beta)
        m = fit_trees(X[~test], y[~test], phys_tr, w[~test], seed)
        with_r = phys_te * np.exp(m.predict(X[test]))
        out[name] = {"rows": int(test.sum()), "mape_physics": _mape(phys_te, y[test]),
                     "mape_with_residual": _mape(with_r, y[test])}
    mean = {k: float(np.mean([f[k] for f in out.values()])) for k in ("mape_physics", "mape_with_residual")}
    return {"folds": out, "how": how, **mean}


def fit_residual(paths, res: dict, base=None, seed: int = 0) -> tuple[PhysicsResidual, dict]:
    """The residual on top of the physics fit ``res`` (``fit.fit_traces``'s result), and its validation."""
    X, y, w, run = design(paths, base, res["gamma"])
    val = validate(X, y, w, run, res["fit"]["lambda"], seed)
    phys = physics_time(X, res["beta"])
    m = fit_trees(X, y, phys, w, seed)
    resid = export(m, res["beta"])
    val["mape_in_sample_physics"] = _mape(phys, y)
    val["mape_in_sample_with_residual"] = _mape(phys * np.exp(m.predict(X)), y)
    val["rows"] = int(len(y))
    val["model"] = f"GradientBoostingRegressor(depth {DEPTH}, {N_TREES} trees, learning rate {RATE}, seed {seed})"
    return resid, val


def write_residual(path, resid: PhysicsResidual, validation: dict, trained_on: dict) -> None:
    """The residual JSON (one line per tree; atomically)."""
    import json
    body = resid.to_dict()
    trees = body.pop("trees")
    body.update(trained_on=trained_on, validation=validation)
    head = json.dumps({"physics_residual": body}, sort_keys=False)
    text = head[:-2] + ', "trees": [\n' + ",\n".join(json.dumps(t) for t in trees) + "\n]}}\n"
    p = Path(path)
    tmp = p.with_name(p.name + ".tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(text)
        tmp.replace(p)
    except OSError as e:
        if tmp.exists():
            tmp.unlink()
        raise ConfigError("--residual", str(path), f"a writable file ({e.strerror})") from None


def check_args(model: str, traces, residual) -> None:
    if residual is None:
        return
    if model != "physics":
        raise ConfigError("--residual", residual, "--model physics (the residual corrects the physics step time)")
    if not traces:
        raise ConfigError("--residual", residual, "OTLP step traces among the inputs (it is fitted per step)")
