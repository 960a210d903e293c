"""Fit the physics model's default coefficients on the real H100 runs, term by term.

    python experiments/fit_physics.py [--iters 5] [--stage-cap 150] [--dry-run]        # fit, ~15 min
    python experiments/fit_physics.py --evaluate FILE [--structure prior] [--candidates] [--json OUT]

No step-level traces exist in ../shared/data/real/, so the seed's Ridge fit on per-step targets
cannot run.  The targets are inference-perf's per-stage mean TTFT, TPOT and E2E of the nine H100
runs that are not overloaded (general, codegen, roleplay of Llama-2-7B TP1, Mixtral-8x7B TP2 and
Llama-2-70B TP4; the reasoning runs lost most requests to time-outs).  Each coefficient group
below is a fitted parameter with a physical range; the terms held at 0 and why are in
docs/latency-models.md ("Default coefficients, term by term").

Method (Gauss-Newton with dsim in the loop): run dsim on every run with the current coefficients
while recording every step's 16 beta features and every request's 11 alpha features.  A step
time is beta . F plus the host layer's time, so a request's TTFT, TPOT and E2E are, to first
order, linear in the coefficients: the time it spends in each step, as a share of that step,
times the step's features (a longer step delays every request inside it).  Bounded linear least
squares of the relative error on those sensitivities gives the next coefficients; dsim runs again
at them and the loop repeats, keeping the iterate whose simulated error is lowest.  The queueing
response to slower steps is outside the linearisation; the re-simulation corrects it.

``--evaluate``: full-length replay at a coefficient file, then leave-one-run-out: for each run, the
bounded linear fit is solved again on the other runs' sensitivities at the file's values and the
left-out run is simulated (full length) at the result.  ``--structure prior`` reads the file as the
previous four-scale prior (the shipped defaults before this fit), for the before/after comparison.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml
from scipy.optimize import lsq_linear

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cosim_real as C  # noqa: E402
from dsim.calibrate.cosim import simulate_run  # noqa: E402
from dsim.calibrate.realrun import load_real  # noqa: E402
from dsim.latency import physics as P  # noqa: E402

OUT = C.ROOT / "dsim" / "latency" / "coefficients" / "physics_default.yaml"
H100 = C.REAL / "inference-perf-h100"
PROFILES = ("general", "codegen", "roleplay")
METRICS = ("ttft", "tpot", "e2e")

# group name -> (coefficients it sets: ("b"|"a", index), lower bound, upper bound, start, typical size);
# one Gauss-Newton step moves a group by at most half of max(|value|, typical size) (trust region)
GROUPS = {
    "compute_scale": ((("b", 0), ("b", 1), ("b", 3)), 1.0, 20.0, 1.2, 1.0),     # 1 / achieved share of peak FLOP/s
    "memory_scale": ((("b", 2), ("b", 4)), 1.0, 20.0, 1.2, 1.0),                 # 1 / achieved share of HBM GB/s
    "tp_comm_scale": ((("b", 8),), 1.0, 20.0, 1.0, 4.0),                         # 1 / achieved share of NVLink GB/s
    "token_cost_s": ((("b", 5),), 0.0, 0.5, 0.0, 2e-3),    # seconds per full token budget (non-GEMM kernels)
    "moe_dispatch_s": ((("b", 7),), 0.0, 0.05, 0.0, 1e-3),  # seconds per step with every expert active
    "mixed_step_s": ((("b", 14),), 0.0, 0.05, 0.0, 1e-3),  # seconds per step mixing prefill and decode
    "step_bias_s": ((("b", 15),), 0.0, 0.05, 5e-4, 5e-4),  # seconds per step (launch, sync, sampling)
    "queue_bias_s": ((("a", 3),), 0.0, 0.2, 0.02, 0.01),   # seconds from arrival to the waiting queue
}
# candidates the leave-one-run-out decides on (each added alone to the groups above)
CANDIDATES = {
    "prefill_mix_s": ((("b", 6),), 0.0, 0.05, 0.0, 1e-3),
    "gqa_s": ((("b", 9),), 0.0, 0.05, 0.0, 1e-3),
    "small_step_s": ((("b", 10),), 0.0, 0.05, 0.0, 1e-3),
    "tokenize_scale": ((("a", 2),), 0.0, 10.0, 0.0, 0.5),
}
# the four-scale prior the previous defaults were fitted with (compute scale not bounded by the peak)
PRIOR = {
    "compute_scale": ((("b", 0), ("b", 1), ("b", 3)), 0.1, 20.0, 1.0, 1.0),
    "memory_scale": ((("b", 2), ("b", 4)), 0.1, 20.0, 1.0, 1.0),
    "step_bias_s": ((("b", 15),), 0.0, 0.05, 5e-4, 5e-4),
    "queue_bias_s": ((("a", 3),), 0.0, 0.2, 0.02, 0.01),
}
# physical values of the terms that are not fitted: the feature is already a time at the link's rate
FIXED_BETA = {8: 1.0, 12: 1.0, 13: 1.0}


def runs() -> list:
    return sorted(p.name for p in H100.iterdir() if any(p.name.endswith(x) for x in PROFILES))


def coefficients(groups: dict, p) -> tuple[list, list]:
    alpha, beta = [0.0] * P.N_ALPHA, [0.0] * P.N_BETA
    for i, v in FIXED_BETA.items():
        beta[i] = v
    for (members, *_), v in zip(groups.values(), p):
        for side, i in members:
            (beta if side == "b" else alpha)[i] = float(v)
    return alpha, beta


def write(path, groups, p, trained_on, method) -> None:
    alpha, beta = coefficients(groups, p)
    doc = {"physics_coefficients": {
        "spec_version": "1.0", "trained_on": trained_on, "method": method, "gamma": 0.3,
        "alpha_coefficients": [float(f"{v:.6g}") for v in alpha],
        "beta_coefficients": [float(f"{v:.6g}") for v in beta]}}
    Path(path).write_text("# Physics-normalized model coefficients (seed 000 Observation G format).\n"
                          "# Written by experiments/fit_physics.py; units: seconds per feature unit.\n"
                          "# Each term's fit or reason for 0: docs/latency-models.md.\n"
                          + yaml.safe_dump(doc, sort_keys=False))


class Recorder:
    """Wraps PhysicsModel for one simulation: every step's beta features, every request's alpha features."""

    def __enter__(self):
        self.step, self.delay = P.PhysicsModel.step_time, P.PhysicsModel.delay
        step, delay = self.step, self.delay

        def rec_step(model, b):
            t = step(model, b)
            if b.prefill_tokens + b.decode_tokens:
                model.__dict__.setdefault("rec", []).append(
                    (P.beta_features(model.cfg, model.beta_input(b)), t))
            return t

        def rec_delay(model, request, state=None):
            d = delay(model, request, state)
            c = model.cfg
            if state is None:
                a = P.AlphaInput(0, 0, 0.0, request.prompt_len, 0.0,
                                 c.total_kv_blocks_gpu * c.block_bytes * c.kv_shards, model.ema)
            else:
                free = state.kv_total_blocks - state.kv_used_blocks
                a = P.AlphaInput(state.running, state.waiting, state.kv_used_blocks / max(1, state.kv_total_blocks),
                                 request.prompt_len, state.prefix_hit_tokens / max(1, request.prompt_len),
                                 free * c.block_size * c.kv_bytes_per_token, model.ema)
            model.__dict__.setdefault("arec", {})[request.rid] = P.alpha_features(c, a)
            return d

        P.PhysicsModel.step_time, P.PhysicsModel.delay = rec_step, rec_delay
        return self

    def __exit__(self, *exc):
        P.PhysicsModel.step_time, P.PhysicsModel.delay = self.step, self.delay


CAP = {"s": None}          # stage length cap (s) of the fit's simulations (None: full length)


def simulate(name: str, alpha, beta):
    """dsim on one real run: rows of (metric, real mean s, sim mean s, sensitivity 27-vector)."""
    run = load_real(H100 / name)
    if CAP["s"]:
        run = run.shortened(CAP["s"])
    with tempfile.TemporaryDirectory() as td:
        f = Path(td) / "c.yaml"
        doc = {"physics_coefficients": {"spec_version": "1.0", "gamma": 0.3,
                                        "alpha_coefficients": alpha, "beta_coefficients": beta}}
        f.write_text(yaml.safe_dump(doc))
        with Recorder():
            res, _ = simulate_run(run, None, [], 42, {"model": "physics", "coefficients": str(f)})
    (rep,) = list(res.fleet.replicas())
    model = getattr(rep.inst.step_model, "gpu", rep.inst.step_model)
    log = rep.inst.log
    feats = np.array([x for x, _ in model.rec])
    dur = np.asarray(log.dur)
    t1 = np.asarray(log.t_end)
    if len(feats) != len(dur):
        raise RuntimeError(f"{name}: {len(feats)} recorded steps for {len(dur)} logged")
    dens = feats / np.maximum(dur, 1e-12)[:, None]                 # features per second of the step
    cum = np.vstack([np.zeros(P.N_BETA), np.cumsum(feats, axis=0)])
    t0 = t1 - dur

    def integral(t):
        """sum over steps of (share of the step before t) x features: d(time to t) / d beta."""
        k = np.searchsorted(t1, t, side="left")                    # first step ending at or after t
        out = cum[k].copy()
        inside = (k < len(t1)) & (t > t0[np.minimum(k, len(t1) - 1)])
        kk = k[inside]
        out[inside] += (t[inside] - t0[kk])[:, None] * dens[kk]
        return out

    rows = []
    for st in run.stages:
        reqs = [r for r in res.requests if st.t0 <= r.arrival < st.t1 and r.t_completion is not None]
        if not reqs:
            continue
        arr = np.array([r.arrival for r in reqs])
        q = np.array([r.t_queued for r in reqs])
        first = np.array([r.t_first_token for r in reqs])
        last = np.array([r.t_last_token for r in reqs])
        n = np.array([r.n_out for r in reqs], dtype=float)
        afe = np.array([model.arec[r.rid] for r in reqs])
        iq, i1, il = integral(q), integral(first), integral(last)
        zero_a = np.zeros((len(reqs), P.N_ALPHA))
        per = {"ttft": (first - arr, np.hstack([afe, i1 - iq])),
               "e2e": (last - arr, np.hstack([afe, il - iq]))}
        multi = n > 1
        per["tpot"] = ((last - first)[multi] / (n[multi] - 1),
                       np.hstack([zero_a, il - i1])[multi] / (n[multi] - 1)[:, None])
        for m in METRICS:
            real = st.real.get(m, {}).get("mean")
            if real is None or not np.isfinite(real):
                continue
            sim, sens = per[m]
            rows.append((name, st.name if hasattr(st, "name") else str(st.t0), m, real / 1e3,
                         float(sim.mean()), sens.mean(axis=0)))
    return rows


def design(rows, groups, p):
    """Relative residual (sim + J (theta - theta0)) / real - 1 as A x - y, x the group values."""
    alpha, beta = coefficients(groups, p)
    theta0 = np.array(alpha + beta)
    G = np.zeros((P.N_ALPHA + P.N_BETA, len(groups)))
    for j, (members, *_) in enumerate(groups.values()):
        for side, i in members:
            G[i if side == "a" else P.N_ALPHA + i, j] = 1.0
    fixed = theta0 - G @ np.asarray(p, dtype=float)
    A = np.array([sens @ G / real for *_, real, _, sens in rows])
    y = np.array([1.0 - (sim + sens @ (fixed - theta0)) / real for *_, real, sim, sens in rows])
    return A, y


def mape(rows) -> float:
    return float(np.mean([abs(sim / real - 1) for *_, real, sim, _ in rows]))


def simulate_all(names, groups, p) -> dict:
    alpha, beta = coefficients(groups, p)
    return {n: simulate(n, alpha, beta) for n in names}


def solve(rows, groups, p_now, trust=True):
    """The next group values: bounded linear least squares, within the trust region around ``p_now``."""
    A, y = design(rows, groups, p_now)
    lo, hi = [], []
    for (_, a, b, _, typ), v in zip(groups.values(), p_now):
        r = 0.5 * max(abs(v), typ) if trust else np.inf
        lo.append(max(a, v - r))
        hi.append(min(b, v + r))
    return np.clip(lsq_linear(A, y, bounds=(lo, hi), method="bvls").x, lo, hi)    # bvls may return -1e-19


def gauss_newton(names, groups, p, iters, say=print, sims=None):
    """Returns (best group values, their per-run rows, history of (values, MAPE))."""
    sims = sims or simulate_all(names, groups, p)
    best = (p, sims, mape([r for n in names for r in sims[n]]))
    hist = [(list(p), best[2])]
    say(f"  start MAPE {best[2]:.4f}  " + _fmt(groups, p))
    for _ in range(iters):
        p_new = solve([r for n in names for r in best[1][n]], groups, best[0])
        sims_new = simulate_all(names, groups, p_new)
        e = mape([r for n in names for r in sims_new[n]])
        hist.append((list(p_new), e))
        say(f"  iterate MAPE {e:.4f}  " + _fmt(groups, p_new))
        if e < best[2]:
            best = (p_new, sims_new, e)
        elif np.allclose(p_new, best[0], rtol=1e-3, atol=1e-7):
            break
        else:       # the linearisation overshot: halve the step once and stop if that does not help
            p_half = (np.asarray(best[0]) + p_new) / 2
            sims_h = simulate_all(names, groups, p_half)
            e_h = mape([r for n in names for r in sims_h[n]])
            hist.append((list(p_half), e_h))
            say(f"  half step MAPE {e_h:.4f}")
            if e_h >= best[2]:
                break
            best = (p_half, sims_h, e_h)
    return best[0], best[1], hist


def _fmt(groups, p) -> str:
    return " ".join(f"{k}={v:.4g}" for k, v in zip(groups, p))


def loro(names, groups, p_full, sims_full, say=print) -> dict:
    """Leave-one-run-out: one trust-region Gauss-Newton step of the fit without the run, from
    ``p_full`` on the other runs' sensitivities, then the left-out run simulated at the result.  (An
    unbounded linear solve extrapolates past where the linearisation holds: compute scales of 6-12
    and an overloaded replay.)"""
    out = {}
    for held in names:
        p = solve([r for n in names if n != held for r in sims_full[n]], groups, p_full)
        alpha, beta = coefficients(groups, p)
        rows = simulate(held, alpha, beta)
        out[held] = {"mape": mape(rows), "values": [float(v) for v in p],
                     "errors": {f"{st} {m}": sim / real - 1 for _, st, m, real, sim, _ in rows}}
        say(f"  LORO {held}: MAPE {out[held]['mape']:.4f}  " + _fmt(groups, p))
    return out


def linear_loro(names, groups, p, sims) -> float:
    """Leave-one-run-out on the sensitivities at ``p`` (no re-simulation): a cheap screen for a term."""
    errs = []
    for held in names:
        x = solve([r for n in names if n != held for r in sims[n]], groups, p, trust=False)
        A, y = design(sims[held], groups, p)
        errs += list(np.abs(A @ x - y))
    return float(np.mean(errs))


def values_of(path, groups) -> list:
    """The group values a coefficient file holds (checked: the structure reproduces the file)."""
    c = P.load_coefficients(path)
    p = [(c.beta if members[0][0] == "b" else c.alpha)[members[0][1]] for members, *_ in groups.values()]
    alpha, beta = coefficients(groups, p)
    if not (np.allclose(alpha, c.alpha) and np.allclose(beta, c.beta)):
        raise SystemExit(f"{path} is not of this structure")
    return p


def held_out_gpus(path) -> dict:
    """Per-stage mean errors on the RTX runs (other GPUs, per-request arrivals): never fitted."""
    lat = {"model": "physics", "coefficients": str(path)}
    out = {}
    for name in C.LSS:
        for run, _, m, real, sim in C.lss_run(name, lat, []):
            out[f"{run} {m}"] = sim["mean"] / real["mean"] - 1
    return out


def evaluate_file(path, structure, candidates, say=print) -> dict:
    """Full-length replay of the nine runs at a coefficient file, the leave-one-run-out of its
    structure from there, and the RTX runs."""
    CAP["s"] = None
    groups = PRIOR if structure == "prior" else GROUPS
    names = runs()
    p = values_of(path, groups)
    sims = simulate_all(names, groups, p)
    rows = [r for n in names for r in sims[n]]
    out = {"file": str(path), "structure": structure, "values": dict(zip(groups, map(float, p))),
           "mape": mape(rows), "errors": {n: {f"{st} {m}": sim / real - 1 for _, st, m, real, sim, _ in sims[n]} for n in names}}
    say(f"{path}: in-sample MAPE {out['mape']:.4f}")
    if candidates:
        out["linear_loro"] = {"none": linear_loro(names, groups, p, sims)}
        for name, g in CANDIDATES.items():
            out["linear_loro"][name] = linear_loro(names, dict(groups, **{name: g}), list(p) + [0.0], sims)
        say("linear LORO: " + " ".join(f"{k} {v:.4f}" for k, v in out["linear_loro"].items()))
    lo = loro(names, groups, p, sims, say)
    out["loro"] = lo
    out["loro_mape"] = float(np.mean([abs(e) for v in lo.values() for e in v["errors"].values()]))   # over rows
    say(f"leave-one-run-out MAPE {out['loro_mape']:.4f}")
    out["rtx"] = held_out_gpus(path)
    out["rtx_mape"] = float(np.mean([abs(v) for v in out["rtx"].values()]))
    say(f"RTX runs (never fitted) MAPE {out['rtx_mape']:.4f}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--stage-cap", type=float, default=150.0, help="stage length (s) of the fit's simulations")
    ap.add_argument("--evaluate", metavar="COEFFS", help="evaluate a coefficient file instead of fitting")
    ap.add_argument("--structure", choices=("physics", "prior"), default="physics")
    ap.add_argument("--candidates", action="store_true", help="screen the candidate terms (linearised LORO)")
    ap.add_argument("--json", help="write the evaluation here")
    ap.add_argument("--dry-run", action="store_true", help="do not write the coefficient file")
    ap.add_argument("--start", metavar="COEFFS", help="start the fit from a coefficient file of this structure")
    a = ap.parse_args(argv)
    if a.evaluate:
        res = evaluate_file(a.evaluate, a.structure, a.candidates)
        if a.json:
            import json
            Path(a.json).write_text(json.dumps(res, indent=1))
        return
    CAP["s"] = a.stage_cap
    names = runs()
    groups = GROUPS
    p0 = values_of(a.start, groups) if a.start else [g[3] for g in groups.values()]
    print(f"{len(groups)} groups on {len(names)} runs, stages cut to {a.stage_cap:g} s")
    p, sims, hist = gauss_newton(names, groups, p0, a.iters)
    fit_mape = mape([r for n in names for r in sims[n]])
    print(f"fit MAPE {fit_mape:.4f}  " + _fmt(groups, p))
    for n in names:
        print(f"  {n}: " + " ".join(f"{m} {sim / real - 1:+.1%}" for _, _, m, real, sim, _ in sims[n]))
    if a.dry_run:
        return
    trained_on = {
        "hardware": "H100-SXM",
        "data": "shared/data/real/inference-perf-h100: " + ", ".join(names),
        "vllm_version": "0.15.1", "tp": [1, 2, 4],
        "models": ["meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf", "mistralai/Mixtral-8x7B-v0.1"],
        "training_date": _dt.date.today().isoformat(),
        "loss": "mean |sim/real - 1| of per-stage mean TTFT, TPOT, E2E ("
                + (f"stages cut to {a.stage_cap:g} s)" if a.stage_cap else "full-length stages)"),
        "train_mape": round(fit_mape, 4),
        "iterations": len(hist),
        "fitted": {k: float(f"{v:.6g}") for k, v in zip(groups, p)},
    }
    write(OUT, groups, p, trained_on, "Gauss-Newton with dsim in the loop on bounded physical groups "
                                      "(experiments/fit_physics.py)")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
