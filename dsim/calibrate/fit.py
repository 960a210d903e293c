"""Fitting latency coefficients from real data (seed 000 section 5, seed 003's two stages).

Stage 1 (step level, from vLLM step traces): the unified5 betas by non-negative least squares on
relative error over its five basis functions; the physics betas by Ridge (non-negative) with
configuration-stratified cross-validation over (lambda, preemption-EMA gamma).  Cleaning: warm-up
steps dropped per replica, steps without rich snapshots dropped (attention work needs each chunk's
context, so chunked prefill cannot be fitted from batch counts), preemption steps down-weighted,
outliers (|relative residual| > 5 MADs of a first fit) dropped before the final fit.
Alpha from journey events: API delay (QUEUED - ARRIVED), output-token overhead (FIRST_RESPONSE -
FIRST_TOKEN), departure overhead (DEPARTED - FINISHED).

Stage 2 (system level, simulator in the loop) is `dsim calibrate`'s (dsim.calibrate.calibrate.stage2):
Nelder-Mead over the five betas and a0 within their physical ranges, on E2E mean, TTFT p50/p90 and
TPOT p50 of the non-overloaded stages, with the runs simulated in parallel by joblib.  Overloaded
runs are left out of the loss; `dsim.calibrate.cliff.saturation_cliff` checks them (the rate where
TTFT exceeds 3x its low-load value, by bisection).
"""
from __future__ import annotations

import datetime as _dt
import logging
from pathlib import Path

import numpy as np
import yaml

from ..config.errors import ConfigError
from .vllm_traces import alpha_table, beta_table, read_otlp

from ..latency.unified5 import SPEC_VERSION as SPEC
WARMUP_STEPS = 5
OUTLIER_MADS = 5.0
PREEMPT_WEIGHT = 0.25


# ---- cleaning --------------------------------------------------------------------------------------
def clean_steps(rows, warmup: int = WARMUP_STEPS):
    """Keep rich, non-empty, post-warm-up steps; weight preemption steps down.  Returns (rows, weights, report)."""
    seen: dict = {}
    kept, w = [], []
    rep = {"steps": len(rows), "warmup": 0, "not_rich": 0, "empty": 0, "preemption_steps": 0}
    for r in rows:
        n = seen.get(r.replica, 0)
        seen[r.replica] = n + 1
        if n < warmup:
            rep["warmup"] += 1
            continue
        if r.shape.prefill_tokens + r.shape.decode_tokens == 0 or r.duration_s <= 0:
            rep["empty"] += 1
            continue
        if not r.rich:
            rep["not_rich"] += 1
            continue
        kept.append(r)
        if r.shape.num_preempted:
            rep["preemption_steps"] += 1
            w.append(PREEMPT_WEIGHT)
        else:
            w.append(1.0)
    if not kept:
        raise ConfigError("traces", None, "rich-mode step traces (step.REQUEST_SNAPSHOT) after cleaning: "
                          f"{rep}", show_value=False)
    return kept, np.asarray(w), rep


def _nnls_relative(X: np.ndarray, y: np.ndarray, w: np.ndarray):
    from scipy.optimize import nnls
    s = np.sqrt(w) / y
    beta, _ = nnls(X * s[:, None], y * s)
    return beta


def _metrics(pred, y) -> dict:
    rel = (pred - y) / y
    ss = float(((y - y.mean()) ** 2).sum())
    return {"mape": float(np.mean(np.abs(rel))), "median_ape": float(np.median(np.abs(rel))),
            "r2": 1 - float(((y - pred) ** 2).sum()) / ss if ss else None, "rows": int(y.size)}


def _drop_outliers(X, y, w, fit):
    b = fit(X, y, w)
    rel = (X @ b - y) / y
    med = np.median(rel)
    mad = np.median(np.abs(rel - med)) or 1e-12
    keep = np.abs(rel - med) <= OUTLIER_MADS * 1.4826 * mad
    return keep


# ---- unified5 ---------------------------------------------------------------------------------------
def unified5_design(rows, step_model):
    """Basis matrix (us) and target (us) with the un-fitted all-to-all term taken out of the target."""
    X = np.array([step_model.basis(r.shape) for r in rows], dtype=float)
    y = np.array([r.duration_s * 1e6 for r in rows])
    if step_model._a2a_us_per_tok:
        y = y - step_model._a2a_us_per_tok * np.array([r.shape.total_tokens for r in rows])
    return X, y


def fit_unified5(rows, models: dict) -> dict:
    """``models``: replica -> Unified5Model (each replica's model, device, TP).  Returns beta + metrics."""
    kept, w, rep = clean_steps(rows)
    parts = [unified5_design([r], models[r.replica]) for r in kept]
    X = np.vstack([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    keep = _drop_outliers(X, y, w, _nnls_relative)
    rep["outliers"] = int((~keep).sum())
    beta = _nnls_relative(X[keep], y[keep], w[keep])
    rep.update(_metrics(X[keep] @ beta, y[keep]))
    return {"beta": [float(b) for b in beta], "fit": rep}


def fit_alpha(arows) -> dict:
    """unified5 alpha [a0 queue entry, a1 after the last token, a2 per output token] in us (medians:
    the API delay of a real server has a heavy right tail from tokenisation stalls)."""
    def med(v):
        v = [x for x in v if x is not None]
        return float(np.median(v)) * 1e6 if v else 0.0
    if not arows:
        raise ConfigError("traces", None, "journey events (ARRIVED, QUEUED, ...) to fit alpha", show_value=False)
    a2 = med(a.token_overhead_s for a in arows)
    # DEPARTED - FINISHED holds the last token's output overhead too (FINISHED is the step end)
    return {"alpha": [med(a.api_delay_s for a in arows), max(0.0, med(a.departure_s for a in arows) - a2), a2],
            "fit": {"requests": len(arows)}}


# ---- physics ----------------------------------------------------------------------------------------
GAMMAS = (0.1, 0.3, 0.5, 0.8)
LAMBDAS = (1e-8, 1e-6, 1e-4, 1e-2)


def physics_design(rows, models: dict, gamma: float):
    """16 beta features per step, the preemption EMA re-run per replica with this gamma."""
    from ..latency.physics import beta_features
    ema: dict = {}
    X = []
    for r in rows:
        m = models[r.replica]
        e = ema.get(r.replica, 0.0)
        e = gamma * (r.shape.num_preempted / max(1, r.shape.running)) + (1 - gamma) * e
        ema[r.replica] = e
        m.ema = e
        X.append(beta_features(m.cfg, m.beta_input(r.shape)))
    return np.asarray(X, float), np.array([r.duration_s for r in rows])


def relative_design(X, y, w):
    """The matrix and target the Ridge fit solves: rows weighted by sqrt(w) / y (relative error),
    columns divided by their largest |value| (``scale``; 1 for an all-zero column)."""
    s = np.sqrt(w) / y
    scale = np.abs(X).max(axis=0)
    scale[scale == 0] = 1.0
    return X / scale * s[:, None], y * s, scale


def _ridge_relative(X, y, w, lam):
    from sklearn.linear_model import Ridge
    Z, t, scale = relative_design(X, y, w)
    m = Ridge(alpha=lam, fit_intercept=False, positive=True, solver="lbfgs", max_iter=5000)
    m.fit(Z, t)
    return m.coef_ / scale


def fit_physics(rows, models: dict, groups=None) -> dict:
    """Ridge with CV over (lambda, gamma): folds are configurations (model x hardware x TP) when there
    are several, else contiguous time blocks (hold-out by time, not random)."""
    kept, w, rep = clean_steps(rows)
    cfg_of = groups or {r.replica: r.replica for r in kept}
    labels = np.array([cfg_of[r.replica] for r in kept])
    uniq = sorted(set(labels))
    if len(uniq) > 1:
        folds = [labels == u for u in uniq]
        rep["cv"] = f"leave-one-configuration-out over {len(uniq)} configurations"
    else:
        idx = np.arange(len(kept))
        folds = [(idx * 5 // len(kept)) == k for k in range(5)]
        rep["cv"] = "5 contiguous time blocks"
    best = None
    for g in GAMMAS:
        X, y = physics_design(kept, models, g)
        for lam in LAMBDAS:
            errs = []
            for test in folds:
                if test.all() or not test.any():
                    continue
                b = _ridge_relative(X[~test], y[~test], w[~test], lam)
                errs.append(np.mean(np.abs((X[test] @ b - y[test]) / y[test])))
            score = float(np.mean(errs))
            if best is None or score < best[0]:
                best = (score, g, lam)
    score, g, lam = best
    X, y = physics_design(kept, models, g)
    beta = _ridge_relative(X, y, w, lam)
    rep.update(_metrics(X @ beta, y))
    rep.update({"cv_mape": score, "lambda": lam})
    return {"beta": [float(b) for b in beta], "gamma": g, "fit": rep}


# ---- building models for the traced replicas ---------------------------------------------------------
def replica_contexts(tr, base: dict | None):
    """LatencyContext per traced replica: from the base scenario, else the resource attributes dsim
    writes (dsim.model, dsim.hardware, dsim.tensor_parallel_size), KV blocks from the step summaries."""
    from ..config.engine import load_engine
    from ..config.hardware import load_device
    from ..config.model import load_model
    from ..config.schema.base import parse
    from ..config.schema.engine import EngineSection
    from ..latency.base import LatencyContext
    base = base or {}
    out = {}
    for rep, attrs in tr.resources.items():
        model = base.get("model") or attrs.get("dsim.model")
        hw = base.get("hardware") or attrs.get("dsim.hardware")
        if not model or not hw:
            raise ConfigError("--scenario", None, f"model and hardware for replica {rep!r} (the traces do not "
                              "name them)", show_value=False)
        eng = dict(base.get("engine") or {})
        if "tensor_parallel_size" not in eng and attrs.get("dsim.tensor_parallel_size"):
            eng["tensor_parallel_size"] = int(attrs["dsim.tensor_parallel_size"])
        steps = tr.steps.get(rep) or {}
        blocks = next((s["summary"].get("kv.blocks_total_gpu") for s in steps.values() if s["summary"]), None)
        m = load_model(model, "model")
        d = load_device(hw, "hardware")
        e = load_engine(parse(EngineSection, eng, "engine"), "engine")
        m = m.with_kv_cache_dtype(e.kv_cache_dtype)
        out[rep] = LatencyContext(m, d, e, int(blocks or e.kv_blocks(m, d)))
    return out


def _step_models(ctxs: dict, kind: str) -> dict:
    from ..config.schema.latency import parse_latency
    from ..latency.registry import build_latency
    out = {}
    for rep, ctx in ctxs.items():
        step, _, _ = build_latency(parse_latency({"model": kind}), ctx)
        out[rep] = step
    return out


# ---- files and CLI -----------------------------------------------------------------------------------
def write_coeffs(path: Path, kind: str, result: dict, trained_on: dict) -> None:
    head = f"{kind}_coefficients"
    body = {"spec_version": SPEC, "trained_on": trained_on, "method": result["method"],
            "training_date": _dt.date.today().isoformat(), "fit": result["fit"]}
    if kind == "physics":
        body.update({"gamma": result["gamma"], "alpha_coefficients": result["alpha"],
                     "beta_coefficients": result["beta"]})
        doc = {"physics_coefficients": body}
    else:
        body.update({"beta": result["beta"], "alpha": result["alpha"]})
        doc = {head: body}
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(f"# dsim fit --model {kind}; use with latency: {{model: {kind}, coefficients: {path.name}}}\n"
                       + yaml.safe_dump(doc, sort_keys=False))
        tmp.replace(path)
    except OSError as e:
        if tmp.exists():
            tmp.unlink()
        raise ConfigError("--out", str(path), f"a writable file ({e.strerror})") from None


def fit_traces(paths, kind: str, base: dict | None = None) -> tuple[dict, dict]:
    """Stage 1 on OTLP trace files.  Returns (result, trained_on)."""
    tr = read_otlp(paths)
    rows = beta_table(tr)
    ctxs = replica_contexts(tr, base)
    arows = alpha_table(tr, rows)
    from .diagnostics import config_label, fit_diagnostics
    groups = {rep: config_label(c) for rep, c in ctxs.items()}
    models = _step_models(ctxs, kind)
    if kind == "unified5":
        res = fit_unified5(rows, models)
        res["alpha"] = fit_alpha(arows)["alpha"]
        res["method"] = "NNLS on relative step-time error over the five unified5 basis functions"
    else:
        res = fit_physics(rows, models, groups)
        res["alpha"] = _physics_alpha(arows, models)
        res["method"] = "Ridge (non-negative) on relative step-time error, CV over lambda and EMA gamma"
    res["fit"]["requests"] = len(arows)
    res["diagnostics"] = fit_diagnostics(kind, rows, arows, ctxs, models, groups, res)
    res["fit"]["effective_df"] = round(res["diagnostics"]["degrees_of_freedom"]["beta"]["df"], 4)
    trained = {"data": [str(p) for p in paths],
               "models": sorted({c.model.name for c in ctxs.values()}),
               "hardware": sorted({c.device.name for c in ctxs.values()}),
               "tp": sorted({c.engine.tensor_parallel_size for c in ctxs.values()})}
    if len(trained["hardware"]) == 1:
        trained["hardware"] = trained["hardware"][0]
    return res, trained


def physics_alpha_design(arows, models):
    """The 11 physics alpha features of each request at queue time, and its API delay (s)."""
    from ..latency.physics import AlphaInput, alpha_features
    X, y = [], []
    for a in arows:
        c = models[a.replica].cfg
        free = (1 - a.kv_usage) * c.total_kv_blocks_gpu * c.block_bytes * c.kv_shards
        X.append(alpha_features(c, AlphaInput(a.running, a.waiting, a.kv_usage, a.prompt_tokens, 0.0, free, 0.0)))
        y.append(a.api_delay_s)
    return np.asarray(X, float).reshape(len(X), 11), np.asarray(y, float)


def _physics_alpha(arows, models) -> list:
    """Alpha: non-negative least squares of the API delay on the 11 physics alpha features."""
    from scipy.optimize import nnls
    if not arows:
        return [0.0] * 11
    coef, _ = nnls(*physics_alpha_design(arows, models))
    return [float(v) for v in coef]


def _is_trace(p: Path) -> bool:
    if not p.is_file() or p.suffix not in (".json", ".jsonl"):
        return False
    with p.open() as f:
        return '"resourceSpans"' in f.read(4096)


def fit_cli(args) -> int:
    from ..config.scenario import read_scenario_file
    from .realrun import load_real
    base = read_scenario_file(args.scenario) if args.scenario else None
    traces = [p for p in args.runs if _is_trace(Path(p))]
    real = [p for p in args.runs if p not in traces]
    from ..config.limits import MAX_EVALS, MAX_JOBS, MAX_SEED, check_flag
    check_flag("--max-evals", args.max_evals, 1, MAX_EVALS)
    check_flag("--jobs", args.jobs, 1, MAX_JOBS)
    check_flag("--seed", getattr(args, "seed", None), 0, MAX_SEED)
    from .residual import check_args
    check_args(args.model, traces, getattr(args, "residual", None))
    if traces:
        res, trained = fit_traces(traces, args.model, base)
        print(f"stage 1: {res['fit']['rows']} steps, MAPE {res['fit']['mape']:.2%}, beta {res['beta']}")
        from .diagnostics import console_lines
        for line in console_lines(res["diagnostics"]):
            print(f"stage 1 {line}")
    else:
        if args.model != "unified5":
            raise ConfigError("runs", args.runs, "OTLP step traces (*.otlp.jsonl) for a physics fit")
        from ..latency.unified5 import Unified5Model
        res = {"beta": list(Unified5Model.BETA), "alpha": list(Unified5Model.ALPHA_US), "fit": {},
               "method": "seed 003 published coefficients as the starting point"}
        trained = {"data": []}
    if real:
        if args.model != "unified5":
            raise ConfigError("--refine", True, "--model unified5 (stage 2 refines unified5's beta and a0)")
        from .calibrate import UNIFIED5, stage2
        runs = [load_real(p) for p in real]
        lat = {"model": "unified5", "beta": list(res["beta"]), "alpha": list(res["alpha"])}
        s2 = stage2(runs, base, (), 42, lat, UNIFIED5, args.max_evals, args.jobs, log=logging.getLogger(__name__).info)
        res["beta"], res["alpha"] = s2["latency"]["beta"], s2["latency"]["alpha"]
        res["fit"]["stage2"] = {"runs": [r.name for r in runs], "loss_start": s2["loss_start"], "loss": s2["loss"],
                                "evaluations": s2["evaluations"], "converged": s2["converged"],
                                "loss_definition": "mean |log(sim/real)| over E2E mean, TTFT p50/p90, TPOT p50 "
                                                   "of the non-overloaded stages (as dsim calibrate)"}
        res["method"] += "; then Nelder-Mead with dsim in the loop on real runs (dsim calibrate's stage 2)"
        trained["data"] = list(trained.get("data", [])) + [r.path for r in runs]
        print(f"stage 2: loss {s2['loss_start']:.4f} -> {s2['loss']:.4f} in {s2['evaluations']} simulations")
        _stage2_diagnostics(res, UNIFIED5, {"model": "unified5", "beta": res["beta"], "alpha": res["alpha"]},
                            s2["targets"])
    if getattr(args, "residual", None):
        from .residual import fit_residual, write_residual
        resid, val = fit_residual(traces, res, base)
        write_residual(args.residual, resid, val, {"coefficients": str(args.out), **trained})
        res["fit"]["residual"] = {"path": str(args.residual), **val}
        print(f"residual: MAPE held out ({val['how']}) {val['mape_physics']:.2%} physics -> "
              f"{val['mape_with_residual']:.2%} with the residual; wrote {args.residual}")
    write_coeffs(Path(args.out), args.model, res, trained)
    report = Path(args.out).with_suffix(".report.json")
    _write_report(report, {"model": args.model, "method": res["method"], "trained_on": trained, "fit": res["fit"],
                           "beta": res["beta"], "alpha": res["alpha"], "diagnostics": res.get("diagnostics")})
    print(f"wrote {args.out} and {report}")
    return 0


def _stage2_diagnostics(res: dict, space, lat: dict, targets: int) -> None:
    """Stage 2's df and sign review, added to (or, without traces, making) ``res['diagnostics']``."""
    from .diagnostics import calibrate_diagnostics, console_lines
    d2 = calibrate_diagnostics(None, None, "unified5", space, lat, targets,
                               why="the per-sample criteria need step traces (OTLP), not run aggregates")
    if res.get("diagnostics"):
        d = res["diagnostics"]
        d["degrees_of_freedom"]["stage2"] = d2["degrees_of_freedom"]["stage2"]
        d["signs"]["stage2"] = d2["signs"]["stage2"]
        d["note"] = "the stage-1 diagnostics describe the step-trace fit; stage 2 then moved the coefficients"
        lines = [ln for ln in console_lines(d2) if "(stage2)" in ln or ln.startswith("signs")]
    else:
        res["diagnostics"] = d2
        lines = console_lines(d2)
    for line in lines:
        print(f"stage 2 {line}")


def _write_report(path: Path, doc: dict) -> None:
    from ..metrics.writers import to_json
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(to_json(doc))
        tmp.replace(path)
    except OSError as e:
        if tmp.exists():
            tmp.unlink()
        raise ConfigError("--out", str(path), f"a writable file ({e.strerror})") from None
