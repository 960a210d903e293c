"""Calibration diagnostics from seed 000's training pipeline, for ``dsim fit`` and ``dsim calibrate``
(and the pass marks of ``dsim cosim``):

* effective degrees of freedom, trace(Z (Z'Z + lambda I)^-1 Z') = sum d^2 / (d^2 + lambda) over the
  singular values d of the design matrix Z the fit solves (Iteration 2 review, recommendation 8).
  The non-negative fits (Ridge with ``positive=True``, NNLS) are linear only on their active set, the
  coefficients the bound leaves above 0, so the trace is taken over those columns; with lambda = 0
  (NNLS, least squares) it is their rank;
* the v1 acceptance criteria (Iteration 9, Implementation Note 4): within-config MAPE < 25 % for
  alpha and < 15 % for beta on every configuration, cross-config (leave-one-configuration-out) MAPE
  < 40 % / < 25 %, and the coefficient signs (prefill compute, decode weight and fixed overhead > 0,
  bias >= 0);
* a sign review of every coefficient, naming the zeros: pinned by the bound (the fit would make them
  negative) or never exercised (the feature is 0 in every row);
* regime-split MAPE (Iteration 2, "Regime-specific evaluation");
* the temporal hold-out (Iteration 1, validation a): fit on the first 80 % of each trace, by time,
  report MAPE on the last 20 %;
* the end-to-end pass marks of ``dsim cosim`` (Iteration 10): KS < 0.15 and median error < 20 %.
"""
from __future__ import annotations

import numpy as np

from ..config.errors import ConfigError
from ..report.cosim import acceptance_line, pct as _pct

KS_PASS = 0.15            # Iteration 10, End-to-End Validation Protocol: KS statistic < 0.15 per metric
MEDIAN_PASS = 0.20        # ... and median relative error < 20 % per metric
HOLDOUT = 0.2             # Iteration 1, validation (a): the last 20 % of each trace

# Iteration 9, Implementation Note 4 (provisional v1 acceptance criteria): (side, kind, threshold)
ACCEPTANCE = (("beta", "within", 0.15), ("beta", "cross", 0.25), ("alpha", "within", 0.25), ("alpha", "cross", 0.40))
SIDE = {"beta": "beta (step time)", "alpha": "alpha (dsim: delay before the queue)"}
KIND = {"within": "within-config MAPE (must pass for each training configuration)",
        "cross": "cross-config MAPE (must pass for leave-one-configuration-out validation)"}
# Note 4's "physically plausible": prefill compute > 0, decode weight > 0, fixed overhead > 0, bias >= 0
NOTE4 = "seed 000 Note 4"
COST, FREE = "a time cost", "a correction, either sign"
PHYSICS_BETA = ((">0", NOTE4), (">=0", COST), (">0", NOTE4), (">=0", COST), (">=0", COST), ("any", FREE),
                ("any", FREE), (">=0", COST), (">=0", COST), ("any", FREE), (">0", NOTE4), (">=0", COST),
                (">=0", COST), (">=0", COST), ("any", FREE), (">=0", NOTE4))
PHYSICS_ALPHA = ((">=0", COST), (">=0", COST), (">=0", COST), (">=0", NOTE4), (">=0", COST), (">=0", COST),
                 ("<=0", "a cache hit shortens the wait"), (">=0", COST), (">=0", COST), ("any", FREE), (">=0", COST))
U5_BETA_NAMES = ("prefill_compute", "decode_compute", "memory", "per_layer", "per_sequence")
U5_BETA = ((">0", NOTE4), (">=0", COST), (">0", NOTE4 + " (weight reading)"), (">0", NOTE4 + " (fixed overhead)"),
           (">=0", COST))
# the stage-2 parameters of dsim calibrate (calibrate.SPACES)
PARAM_SIGN = {"host.step_us": (">0", NOTE4 + " (fixed overhead)"), "compute_efficiency": (">0", NOTE4),
              "memory_efficiency": (">0", NOTE4), "beta.0,1,3": (">0", NOTE4 + " (compute scale)"),
              "beta.2,4": (">0", NOTE4 + " (memory scale)"), "beta.15": (">=0", NOTE4 + " (bias)"),
              "beta.0": (">0", NOTE4), "beta.2": (">0", NOTE4), "beta.3": (">0", NOTE4 + " (fixed overhead)")}


# ---- degrees of freedom ------------------------------------------------------------------------------
def hat_trace(Z, lam: float) -> float:
    """trace(Z (Z'Z + lam I)^-1 Z') from Z's singular values; lam = 0: the rank of Z."""
    Z = np.asarray(Z, float)
    if Z.size == 0:
        return 0.0
    d = np.linalg.svd(Z, compute_uv=False)
    if lam > 0:
        return float(np.sum(d ** 2 / (d ** 2 + lam)))
    return float(np.sum(d > d.max() * max(Z.shape) * np.finfo(float).eps)) if d.max() > 0 else 0.0


def fit_df(Z, coef_scaled, lam: float, method: str) -> dict:
    """Effective degrees of freedom of a non-negative linear fit of Z, on its active set."""
    active = np.asarray(coef_scaled) > 0
    return {"df": hat_trace(Z[:, active], lam), "lambda": lam, "active": int(active.sum()),
            "coefficients": int(len(active)), "rows": int(Z.shape[0]), "method": method,
            "computed_on": "the columns with a coefficient above 0 (the fit is linear in them; the ones "
                           "held at 0 by the bound do not move with the data)"}


def zero_reasons(Z, t, coef_scaled) -> list:
    """Per coefficient at exactly 0: 'pinned' when the objective falls as it goes negative (the bound
    holds it), 'no data' for a column of zeros, else 'optimum'; None for the others."""
    r = np.asarray(t) - Z @ coef_scaled
    g = Z.T @ r                      # minus half the gradient of ||t - Z b||^2 (+ lam ||b||^2 at b_j = 0)
    tol = 1e-6 * np.linalg.norm(Z, axis=0) * (np.linalg.norm(r) or 1.0)
    out = []
    for j, c in enumerate(coef_scaled):
        if c != 0:
            out.append(None)
        elif not np.any(Z[:, j]):
            out.append("no data")
        else:
            out.append("pinned" if g[j] < -tol[j] else "optimum")
    return out


# ---- signs ---------------------------------------------------------------------------------------------
def sign_review(names, values, expected, zeros=None, bounds=None) -> list:
    """One row per coefficient: its value, expected sign, and the verdict.  ``zeros`` from
    ``zero_reasons``; ``bounds``: per coefficient None or (side, bound value) of a fitted range it
    sits at (a value at a lower bound of 0 counts as 0)."""
    rows = []
    for j, (name, v) in enumerate(zip(names, values)):
        want, why = expected[j]
        z = zeros[j] if zeros else None
        b = bounds[j] if bounds else None
        at_zero = b is not None and b == ("lower", 0.0)
        x = 0.0 if at_zero else v
        ok = {">0": x > 0, ">=0": x >= 0, "<=0": x <= 0, "any": True}[want]
        if at_zero:
            note = "0: pinned at its lower bound 0"
        elif v == 0 and z == "pinned":
            note = "0: pinned by the positivity bound (the unconstrained fit wants it negative)"
        elif v == 0 and z == "no data":
            note = "0: not exercised (the feature is 0 in every row)"
        elif v == 0:
            note = "0 at the optimum"
        else:
            note = "positive" if v > 0 else "negative"
        if b and not at_zero:
            note += f"; at its {b[0]} bound {b[1]:g}"
        rows.append({"coefficient": name, "value": float(v), "expected": want, "why": why,
                     "plausible": bool(ok), "note": note})
    return rows


def signs_acceptance(reviews: dict) -> dict:
    """Note 4's sign criterion over the reviews (fit name -> sign_review rows)."""
    checked = [(f"{k}.{r['coefficient']}", r) for k, rows in reviews.items() for r in rows
               if r["why"].startswith(NOTE4)]
    bad = [n for n, r in checked if not r["plausible"]]
    return {"criterion": "coefficient signs", "applies_to": "alpha and beta", "threshold": None,
            "metric": "prefill compute, decode weight, fixed overhead > 0 and bias >= 0 (the manual review of "
                      "Note 4, automated)", "values": {n: r["value"] for n, r in checked},
            "worst": None, "passed": (not bad) if checked else None, "failed": bad,
            "not_evaluated": None if checked else "no coefficient of Note 4's list is fitted"}


def range_review(space, lat) -> list:
    """Sign review of stage-2 parameters (each searched in [lo, hi]): which sit at a bound."""
    from .calibrate import get_value
    vals = [get_value(lat, p.name) for p in space]
    bounds = []
    for p, v in zip(space, vals):
        eps = 1e-3 * (p.hi - p.lo)
        bounds.append(("lower", p.lo) if v <= p.lo + eps else ("upper", p.hi) if v >= p.hi - eps else None)
    return sign_review([p.name for p in space], vals, [PARAM_SIGN.get(p.name, (">=0", COST)) for p in space],
                       bounds=bounds)


# ---- errors --------------------------------------------------------------------------------------------
def ape(pred, y):
    """|pred - y| / y, NaN where y <= 0 (no relative error)."""
    y = np.asarray(y, float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(y > 0, np.abs(np.asarray(pred, float) - y) / np.where(y > 0, y, 1.0), np.nan)


def by_group(err, groups, mask=None) -> dict:
    """Mean of the finite errors per group (over ``mask``)."""
    m = np.isfinite(err) if mask is None else (np.isfinite(err) & mask)
    return {str(g): float(np.mean(err[m & (groups == g)])) for g in sorted(set(groups[m]))}


def time_cut(times, groups, frac: float = HOLDOUT) -> np.ndarray:
    """True for the samples in the last ``frac`` of their group's time span (first to last sample)."""
    times, groups = np.asarray(times, float), np.asarray(groups)
    out = np.zeros(len(times), bool)
    for g in set(groups):
        m = groups == g
        t = times[m]
        out[m] = t >= t.min() + (1 - frac) * (t.max() - t.min()) if t.max() > t.min() else False
    return out


def _cut(t0: float, t1: float, frac: float = HOLDOUT) -> float:
    return t0 + (1 - frac) * (t1 - t0)


def regimes(err, labels: dict, definition: str, held=None) -> dict:
    """MAPE per regime; ``labels``: regime name -> mask; ``held``: (errors, mask) of the hold-out fit."""
    out = {"definition": definition}
    for name, m in labels.items():
        e = err[m & np.isfinite(err)]
        row = {"rows": int(e.size), "mape": float(e.mean()) if e.size else None}
        if held is not None:
            he, hm = held
            h = he[m & hm & np.isfinite(he)]
            row.update({"held_out_rows": int(h.size), "held_out_mape": float(h.mean()) if h.size else None})
        out[name] = row
    return out


def criterion(side: str, kind: str, values, metric: str) -> dict:
    """One acceptance row; ``values``: configuration -> MAPE, or the reason it was not evaluated."""
    thr = dict(((s, k), t) for s, k, t in ACCEPTANCE)[(side, kind)]
    row = {"criterion": KIND[kind].split(" (")[0], "applies_to": SIDE[side], "threshold": thr, "metric": metric,
           "scope": KIND[kind].split(" (")[1].rstrip(")")}
    if isinstance(values, str) or not values:
        return {**row, "values": {}, "worst": None, "passed": None,
                "not_evaluated": values if isinstance(values, str) else "no held-out rows"}
    worst = max(values.values())
    return {**row, "values": values, "worst": worst, "passed": bool(worst < thr), "not_evaluated": None}


def replay_pass(c: dict) -> dict:
    """Iteration 10's pass mark of one metric of a replay: KS < 0.15 and |median error| < 20 %."""
    ks, med = c.get("ks"), (c.get("error") or {}).get("p50")
    out = {"ks": {"value": ks, "threshold": KS_PASS, "passed": None if ks is None else bool(ks < KS_PASS)},
           "median_error": {"value": med, "threshold": MEDIAN_PASS,
                            "passed": None if med is None else bool(abs(med) < MEDIAN_PASS)}}
    parts = (out["ks"]["passed"], out["median_error"]["passed"])
    out["passed"] = None if None in parts else all(parts)
    return out


# ---- dsim fit (step traces) ----------------------------------------------------------------------------
def fit_diagnostics(kind: str, rows, arows, ctxs: dict, models: dict, groups: dict, res: dict) -> dict:
    """Every diagnostic of a ``dsim fit`` on step traces (``res``: fit_unified5 / fit_physics + alpha)."""
    from . import fit as F
    kept, w, _ = F.clean_steps(rows)
    reps = np.array([r.replica for r in kept])
    cfg = np.array([groups[r.replica] for r in kept])
    t_end = np.array([r.t_end for r in kept])
    test = time_cut(t_end, reps)
    cut = {rp: float(t_end[(reps == rp) & test].min()) if ((reps == rp) & test).any() else np.inf
           for rp in set(reps)}
    train_raw = [r for r in rows if r.t_end < cut.get(r.replica, np.inf)]
    beta = np.asarray(res["beta"], float)
    if kind == "physics":
        lam = res["fit"]["lambda"]
        X, y = F.physics_design(kept, models, res["gamma"])
        Z, tz, scale = F.relative_design(X, y, w)
        keep = np.ones(len(kept), bool)
        names, expect = _physics_names()[0], PHYSICS_BETA
        method = "Ridge (non-negative) on relative step-time error"

        def refit(raw):
            r = F.fit_physics(raw, models, groups)
            return F.physics_design(kept, models, r["gamma"])[0] @ np.asarray(r["beta"])
        pre, dec = X[:, :2] @ beta[:2], X[:, 2:5] @ beta[2:5]
        split = "prefill terms (prefill_linear + prefill_attention) vs decode terms (decode_weights + " \
                "decode_attention + kv_read) of the fitted step time"
    else:
        lam = 0.0
        parts = [F.unified5_design([r], models[r.replica]) for r in kept]
        X, y = np.vstack([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
        keep = F._drop_outliers(X, y, w, F._nnls_relative)
        s = np.sqrt(w) / y
        Z, tz, scale = X * s[:, None], y * s, np.ones(X.shape[1])
        names, expect = U5_BETA_NAMES, U5_BETA
        method = "NNLS on relative step-time error (lambda 0: the rank of the active columns)"

        def refit(raw):
            return X @ np.asarray(F.fit_unified5(raw, models)["beta"])
        pre, dec = beta[0] * X[:, 0], beta[1] * X[:, 1] + beta[2] * X[:, 2]
        split = "prefill compute term vs decode compute + memory terms of the fitted step time"
    Zk = Z[keep]
    out = {"degrees_of_freedom": {"beta": {**fit_df(Zk, beta * scale, lam, method),
                                           "rows_per_configuration": _counts(cfg[keep])}}}
    err = np.where(keep, ape(X @ beta, y), np.nan)
    b_hold, b_pair = _holdout(refit, train_raw, err, y, cfg, test, keep)
    b_loco = _loco(lambda u: refit([r for r in rows if groups[r.replica] != u]), cfg, y, keep)
    signs = {"beta": sign_review(names, beta, expect, zero_reasons(Zk, tz[keep], beta * scale))}
    out["regimes"] = {"beta": regimes(err, {"prefill-dominated": pre > dec, "decode-dominated": pre <= dec},
                                      split + "; a step is prefill-dominated when the prefill terms are larger",
                                      b_pair)}
    hold = {"fraction": HOLDOUT, "split": "per trace (replica), steps ending in the last 20 % of its time span",
            "beta": b_hold}
    metric_b = "MAPE of the step time (cleaned steps)"
    acc = [criterion("beta", "within", b_hold["mape"] or b_hold.get("not_evaluated") or "no held-out steps",
                     metric_b + ", temporal hold-out, per configuration"),
           criterion("beta", "cross", b_loco, metric_b + ", each configuration predicted by a fit on the others")]
    if arows:
        a = _alpha_diagnostics(kind, arows, ctxs, models, groups, res)
        out["degrees_of_freedom"]["alpha"] = a["df"]
        out["regimes"]["alpha"] = a["regimes"]
        signs["alpha"] = a["signs"]
        hold["alpha"] = a["holdout"]
        loco_a = a["loco"]
        acc += [criterion("alpha", "within", a["holdout"]["mape"] or "no held-out requests", a["metric"]
                          + ", temporal hold-out, per configuration"),
                criterion("alpha", "cross", a["loco"], a["metric"] + ", each configuration predicted by a fit "
                          "on the others")]
    else:
        loco_a = "the traces have no journey events"
        acc += [criterion("alpha", k, loco_a, "") for k in ("within", "cross")]
    acc.append(signs_acceptance(signs))
    out.update({"acceptance": acc, "signs": signs, "temporal_holdout": hold,
                "in_sample": {"beta": by_group(err, cfg)},
                "leave_one_config_out": {"beta": b_loco, "alpha": loco_a}})
    return out


def _physics_names():
    from ..latency.physics import ALPHA_NAMES, BETA_NAMES
    return BETA_NAMES, ALPHA_NAMES


def _counts(labels) -> dict:
    return {str(u): int((labels == u).sum()) for u in sorted(set(labels))}


def _holdout(refit, train_raw, err, y, cfg, test, keep):
    """Refit on the training part and score the held-out rows: (summary, (errors, test mask))."""
    try:
        e = ape(refit(train_raw), y)
    except ConfigError as ex:
        return {"mape": {}, "not_evaluated": str(ex)}, None
    m = test & keep
    return ({"rows_fitted": int((~test & keep).sum()), "rows_held_out": int(m.sum()),
             "mape": by_group(e, cfg, m), "in_sample_mape": by_group(err, cfg, ~test)}, (e, m))


def _loco(fit_without, cfg, y, keep):
    """configuration -> MAPE of a fit on the other configurations; a reason with one configuration."""
    uniq = sorted(set(cfg))
    if len(uniq) < 2:
        return f"one configuration ({uniq[0]}): nothing to leave out"
    out = {}
    for u in uniq:
        try:
            e = ape(fit_without(u), y)
        except ConfigError:
            continue
        out[str(u)] = float(np.nanmean(e[(cfg == u) & keep]))
    return out


def _alpha_diagnostics(kind, arows, ctxs, models, groups, res) -> dict:
    """dsim's alpha is the delay before queueing (ARRIVED -> HANDOFF_TO_CORE), the target it fits."""
    from scipy.optimize import nnls

    from . import fit as F
    y = np.array([a.api_delay_s for a in arows], float)
    reps = np.array([a.replica for a in arows])
    cfg = np.array([groups[a.replica] for a in arows])
    test = time_cut([a.t_arrival for a in arows], reps)
    if kind == "physics":
        X, _ = F.physics_alpha_design(arows, models)
        coef = np.asarray(res["alpha"], float)

        def fit(m):
            return X @ nnls(X[m], y[m])[0]
        pred = X @ coef
        df = fit_df(X, coef, 0.0, "NNLS of the API delay on the 11 alpha features (lambda 0: the rank of the "
                                  "active columns)")
        signs = sign_review(_physics_names()[1], coef, PHYSICS_ALPHA, zero_reasons(X, y, coef))
    else:
        def fit(m):
            return np.full(len(y), np.median(y[m]))
        pred = fit(np.ones(len(y), bool))
        df = {"df": 1.0, "lambda": 0.0, "active": 1, "coefficients": 1, "rows": int(len(y)),
              "method": "median of the API delay (a0): one parameter"}
        signs = sign_review(("a0_api_delay", "a1_last_token", "a2_per_token"), res["alpha"],
                            ((">=0", NOTE4 + " (bias)"), (">=0", COST), (">=0", COST)))
    err = ape(pred, y)
    e_hold = ape(fit(~test), y) if (~test).any() and test.any() else np.full(len(y), np.nan)
    uniq = sorted(set(cfg))
    loco = (f"one configuration ({uniq[0]}): nothing to leave out" if len(uniq) < 2 else
            {str(u): float(np.nanmean(ape(fit(cfg != u), y)[cfg == u])) for u in uniq})
    run = np.array([a.running for a in arows], float)
    mns = np.array([ctxs[a.replica].engine.max_num_seqs for a in arows], float)
    s = np.minimum(1.0, run / np.maximum(mns, 1e-6))
    m = np.clip([a.kv_usage for a in arows], 0.0, 1.0)
    g = s + m - s * m
    return {"df": df, "signs": signs, "loco": loco,
            "metric": "MAPE of the API delay (ARRIVED -> HANDOFF_TO_CORE, the time dsim's alpha adds before "
                      "queueing; the seed's SCHEDULED - QUEUED is simulated, not fitted), requests with a delay > 0",
            "holdout": {"rows_fitted": int((~test).sum()), "rows_held_out": int(test.sum()),
                        "mape": by_group(e_hold, cfg, test), "in_sample_mape": by_group(err, cfg)},
            "regimes": regimes(err, {"ungated (g = 0)": g == 0, "gated (g > 0)": g > 0},
                               "congestion gate g = s + m - s*m at queue time (s = running / max_num_seqs, m = KV "
                               "usage): g = 0 zeroes the 7 gated alpha features", (e_hold, test))}


# ---- dsim calibrate ------------------------------------------------------------------------------------
def config_label(ctx) -> str:
    """A configuration, as the seed's cross-config validation means it: model x GPU x TP."""
    return f"{ctx.model.name}|{ctx.device.name}|tp{ctx.engine.tensor_parallel_size}"


def calibrate_diagnostics(prob, ctxs, kind: str, space, fitted: dict, n_targets: int, why: str | None = None,
                          stage1_used: bool = True, optimizer: str = "nelder-mead") -> dict:
    """Diagnostics of ``dsim calibrate``: stage 1 (roofline decode-window regression) when it ran,
    and the sign/bound review of the stage-2 parameters.  ``why``: what to say when stage 1 did not run."""
    method = {"nelder-mead": "Nelder-Mead", "bayesian": "Bayesian optimisation (optuna TPE)"}.get(
        optimizer, optimizer.replace("-", " "))
    stage2 = {"method": f"{method} with dsim in the loop", "parameters": len(space), "targets": n_targets,
              "note": "no hat matrix: the parameters are searched on aggregate metrics; df is at most the "
                      "number of parameters"}
    signs = {"stage2": range_review(space, fitted)}
    out = {"degrees_of_freedom": {"stage2": stage2}, "signs": signs}
    why = why or ("stage 1 runs for --latency-model roofline only" if kind != "roofline" else
                  "no run has 8 decode windows to fit (per-request first/last token times; with --holdout, "
                  "windows that ended before the first held-out arrival): stage 1 did not run")
    alpha_why = ("dsim calibrate fits no per-request alpha model: a0 is a stage-2 parameter fitted on TTFT "
                 "aggregates (and not at all on engine-clock runs)")
    if prob is None:
        out["acceptance"] = [criterion("beta", k, why, "") for k in ("within", "cross")] + \
            [criterion("alpha", k, alpha_why, "") for k in ("within", "cross")] + [signs_acceptance(signs)]
        out["stage1"] = why
        return out
    cfg_of = [config_label(ctxs[i]) for i in prob.index]
    cfg = np.array([cfg_of[i] for i in prob.run])
    train0 = ~prob.held_out
    sol, _ = prob.solve()
    free = sol.active_mask == 0
    J = sol.jac[:, free]
    out["degrees_of_freedom"]["stage1"] = {
        "df": hat_trace(J, 0.0), "lambda": 0.0, "active": int(free.sum()), "coefficients": 4,
        "rows": int(train0.sum()), "rows_per_configuration": _counts(cfg[train0]),
        "method": "robust (Huber) least squares on relative error of each request's mean decode step time",
        "computed_on": "the Jacobian at the solution over the parameters not at a bound (no ridge penalty: "
                       "the trace of the linearised hat matrix is their number when they are identifiable)",
        "at_bound": [n for n, f in zip(prob.NAMES, free) if not f],
        "used_by_stage2": stage1_used}
    err = np.where(train0, ape(prob.predict(sol.x), prob.y), np.nan)
    # a window's target is the mean of its steps: fitted are the windows whose steps all lie in the first
    # 80 % of the run's time (first arrival to last token), held out the windows that end after that
    cut = np.array([_cut(prob.arrival[prob.run == k].min(), prob.last[prob.run == k].max())
                    for k in range(len(prob.names))])
    test = train0 & (prob.last >= cut[prob.run])
    fitted = train0 & ~test
    hold = {"fraction": HOLDOUT, "split": "per run, by time: fitted on the decode windows that ended in the first "
                                          "80 % of the run (first arrival to last token), scored on those that "
                                          "ended in the last 20 % (no fitted target holds a step of that part)",
            "rows_fitted": int(fitted.sum()), "rows_held_out": int(test.sum())}
    e_hold = np.full(len(prob.y), np.nan)
    if test.any() and fitted.sum() > 4:
        e_hold = ape(prob.predict(prob.solve(fitted)[0].x), prob.y)
    hold.update({"mape": by_group(e_hold, cfg, test), "in_sample_mape": by_group(err, cfg, ~test)})
    uniq = sorted(set(cfg))
    if len(uniq) < 2:
        loco = f"one configuration ({uniq[0]}): nothing to leave out"
    else:
        loco = {}
        for u in uniq:
            if (train0 & (cfg != u)).sum() > 4:
                s, _ = prob.solve(train0 & (cfg != u))
                loco[str(u)] = float(np.nanmean(ape(prob.predict(s.x), prob.y)[(cfg == u) & train0]))
    dec, pf = prob.split(sol.x)
    values = [1e6 * sol.x[0], 1e6 * sol.x[1], 1 / sol.x[2], 1 / sol.x[3]]
    # the fitted parameters are the host costs and the inverse efficiencies (bounds [1, 20])
    bounds = [None if a == 0 else (("lower", 0.0) if a < 0 else ("upper", np.inf)) if i < 2 else
              (("upper", 1.0) if a < 0 else ("lower", 0.05)) for i, a in enumerate(sol.active_mask)]
    signs["stage1"] = sign_review(prob.NAMES, values, [PARAM_SIGN.get(n, (">=0", COST)) for n in prob.NAMES],
                                  bounds=bounds)
    metric = "MAPE of each request's mean decode step time (stage 1 windows)"
    share = pf[train0] / np.maximum(pf + dec, 1e-300)[train0]
    out["regimes"] = {"beta": regimes(err, {"prefill-dominated": pf > dec, "decode-dominated": pf <= dec},
                                      "a window is prefill-dominated when the fitted GPU time of its steps that "
                                      "carry a prefill exceeds that of its decode-only steps (that share: median "
                                      f"{np.median(share):.2f}, max {share.max():.2f})", (e_hold, test))}
    out["temporal_holdout"] = {"beta": hold}
    out["leave_one_config_out"] = {"beta": loco}
    out["in_sample"] = {"beta": by_group(err, cfg)}
    out["acceptance"] = [criterion("beta", "within", hold["mape"] or "no held-out windows",
                                   metric + ", temporal hold-out, per configuration"),
                         criterion("beta", "cross", loco, metric + ", each configuration predicted by a fit on "
                                                                   "the others")] + \
        [criterion("alpha", k, alpha_why, "") for k in ("within", "cross")] + [signs_acceptance(signs)]
    return out


# ---- text ----------------------------------------------------------------------------------------------
def console_lines(d: dict) -> list:
    """The diagnostics in a few printed lines."""
    out = []
    for side, x in d["degrees_of_freedom"].items():
        if "df" in x:
            out.append(f"effective degrees of freedom ({side}): {x['df']:.2f} of {x.get('coefficients', '?')} "
                       f"coefficients ({x.get('active', '?')} active), {x['rows']} rows, lambda {x.get('lambda', 0):g}")
        else:
            out.append(f"effective degrees of freedom ({side}): n/a, {x['method']}: {x['parameters']} parameters "
                       f"on {x['targets']} targets")
    out += ["acceptance (seed 000 Iteration 9 Note 4): " + acceptance_line(a) for a in d["acceptance"]]
    zeros = [f"{k}.{r['coefficient']} ({r['note']})" for k, rows in d["signs"].items() for r in rows
             if r["value"] == 0 or "bound" in r["note"]]
    if zeros:
        out.append("signs: at 0 or a bound: " + "; ".join(zeros))
    for side, reg in d.get("regimes", {}).items():
        out.append(f"regimes ({side}): " + ", ".join(f"{k} {_pct(v['mape'])} ({v['rows']})" for k, v in reg.items()
                                                      if k != "definition"))
    return out


def markdown_lines(d: dict) -> list:
    """A report.md section."""
    out = ["## Diagnostics (seed 000 training pipeline)", "", "| fit | effective df | coefficients (active) | rows | "
           "lambda | how |", "|---|---|---|---|---|---|"]
    for side, x in d["degrees_of_freedom"].items():
        if "df" in x:
            out.append(f"| {side} | {x['df']:.2f} | {x.get('coefficients', '')} ({x.get('active', '')}) | {x['rows']} "
                       f"| {x.get('lambda', 0):g} | {x['method']}; on {x.get('computed_on', '')} |")
        else:
            out.append(f"| {side} | n/a | {x['parameters']} | {x['targets']} targets | | {x['method']}: {x['note']} |")
    out += ["", "Acceptance criteria (seed 000 Iteration 9, Implementation Note 4, provisional):", "",
            "| criterion | applies to | threshold | value (worst configuration) | verdict | metric |",
            "|---|---|---|---|---|---|"]
    for a in d["acceptance"]:
        verdict = "not evaluated: " + str(a["not_evaluated"]) if a["passed"] is None else \
            ("passed" if a["passed"] else "**FAILED**")
        thr = "" if a["threshold"] is None else f"< {a['threshold']:.0%}"
        vals = ", ".join(f"{k} {_pct(v)}" for k, v in a["values"].items()) if a["threshold"] is not None else ""
        out.append(f"| {a['criterion']} | {a['applies_to']} | {thr} | {vals} | {verdict} | {a['metric']} |")
    out += ["", "Coefficient signs:", "", "| fit | coefficient | value | expected | why | verdict |",
            "|---|---|---|---|---|---|"]
    for side, rows in d["signs"].items():
        out += [f"| {side} | {r['coefficient']} | {r['value']:.4g} | {r['expected']} | {r['why']} | "
                f"{'ok' if r['plausible'] else '**implausible**'}: {r['note']} |" for r in rows]
    for side, reg in d.get("regimes", {}).items():
        out += ["", f"Regimes ({side}): {reg['definition']}.", "", "| regime | rows | MAPE | held-out rows | "
                "held-out MAPE |", "|---|---|---|---|---|"]
        out += [f"| {k} | {v['rows']} | {_pct(v['mape'])} | {v.get('held_out_rows', '')} | "
                f"{_pct(v.get('held_out_mape'))} |" for k, v in reg.items() if k != "definition"]
    return out + [""]
