"""`dsim calibrate`: fit a deployment's latency model from the real runs a user has.

Stage 1 (per-request runs): each request's decode window gives its mean step time and, from the
other requests' windows, the batch it ran in (dsim.calibrate.windows).  A robust regression of
step time on those physical features separates the host cost per step, the host cost per
running sequence, the HBM efficiency (weights and KV read once per step share it) and the
compute efficiency of interleaved prefills.  Stage 2: Nelder-Mead with the simulator in the
loop on E2E mean, TTFT p50/p90 and TPOT p50 of every run, started from stage 1 (or from the
engine generation's defaults when the runs carry aggregates only).  A result faster than the
hardware allows (a decode step below one read of the weights, prefill above peak FLOP/s) is
refused.  Output: a complete scenario (``calibrated.yaml``) and a report of the errors before
and after, with leave-one-run-out errors when two or more runs are given.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np

from ..config.errors import ConfigError
from .cliff import MARGIN, cliff_penalty, real_bracket
from .runs import RealRun

MAX_WINDOW_PREFILLS = 2_000_000      # (window, prefill) pairs stage 1 holds in memory (x GEMM kinds)
TARGETS = (("e2e", "mean"), ("ttft", "p50"), ("ttft", "p90"), ("tpot", "p50"))


@dataclass(frozen=True)
class Param:
    """One fitted scalar: where it lives in the ``latency`` mapping and its physical range."""
    name: str
    lo: float
    hi: float
    log: bool = False       # Bayesian optimisation proposes it log-uniformly (lo > 0): it spans decades


ROOFLINE = (Param("compute_efficiency", 0.05, 1.0), Param("memory_efficiency", 0.05, 1.0),
            Param("host.step_us", 0.0, 50000.0), Param("host.per_seq_us", 0.0, 5000.0),
            Param("alpha.0", 0.0, 200000.0))
UNIFIED5 = tuple(Param(f"beta.{i}", lo, hi) for i, (lo, hi) in
                 enumerate(((1.0, 20.0), (1.0, 20.0), (1.0, 20.0), (0.0, 2000.0), (0.0, 2000.0)))) \
    + (Param("alpha.0", 0.0, 200000.0),)
# physics: the four scales its default coefficients were fitted with (compute terms, memory terms,
# a fixed time per step, a fixed time before queueing), so the fit stays a scaled physical prior
PHYSICS = (Param("beta.0,1,3", 1.0, 20.0), Param("beta.2,4", 1.0, 20.0), Param("beta.15", 0.0, 0.05),
           Param("alpha.3", 0.0, 0.2))
# blackbox (BLIS, seed 000 Approach 1): b0, b1, b2 and a0, microseconds, searched log-uniformly (by
# Bayesian optimisation unless told otherwise) within multiples of their roofline reading
# (``blackbox_reading``): a step no faster than one read of the weights at peak bandwidth, a prefill
# token no faster than its FLOPs at peak, a decode token's marginal cost from 1 % of that up (in a
# memory-bound step it is mostly hidden), each at most 30 x.  ``BLACKBOX`` is the space of a
# replica whose reading is (1000, 10, 10) us; ``blackbox_space`` gives a replica's own.
BLACKBOX_BOX = ((1.0, 30.0), (1.0, 30.0), (0.01, 30.0))
A0_RANGE = (1.0, 200000.0)


def blackbox_space(reading) -> tuple:
    """b0, b1, b2 within BLACKBOX_BOX x their roofline ``reading``, then a0, all log-uniform."""
    box = [Param(f"beta.{i}", lo * r, hi * r, True) for i, ((lo, hi), r) in enumerate(zip(BLACKBOX_BOX, reading))]
    return tuple(box) + (Param("alpha.0", *A0_RANGE, True),)


def blackbox_reading(ctx) -> list:
    """[one read of the active weights at peak HBM bandwidth, one token's linear FLOPs at peak (x 2: b1
    and b2)], microseconds, for a replica of ``ctx``."""
    m, d, tp = ctx.model, ctx.device, ctx.engine.tensor_parallel_size
    per_token = m.flops_per_token_linear / tp / d.peak_flops * 1e6
    return [m.layer_weight_bytes(m.experts_per_token if m.is_moe else None) / tp / d.hbm_bytes_s * 1e6,
            per_token, per_token]


BLACKBOX = blackbox_space((1000.0, 10.0, 10.0))
SPACES = {"roofline": ROOFLINE, "unified5": UNIFIED5, "physics": PHYSICS, "blackbox": BLACKBOX}


def space_for(kind: str, ctx) -> tuple:
    """The stage-2 parameters of ``kind`` for a replica of ``ctx``."""
    return blackbox_space(blackbox_reading(ctx)) if kind == "blackbox" else SPACES[kind]


DEFAULT_OPTIMIZER = {"blackbox": "bayesian"}      # the others: nelder-mead from a physical start


def get_value(lat: dict, name: str) -> float:
    """A fitted scalar; ``beta.0,1,3`` names one value shared by several coefficients."""
    head, _, rest = name.partition(".")
    if head in ("alpha", "beta"):
        return float(lat[head][int(rest.split(",")[0])])
    if head == "host":
        return float(lat.get("host", {}).get(rest, 0.0))
    return float(lat[name])


def set_value(lat: dict, name: str, v: float) -> None:
    head, _, rest = name.partition(".")
    if head in ("alpha", "beta"):
        for i in rest.split(","):
            lat[head][int(i)] = float(v)
    elif head == "host":
        lat.setdefault("host", {})[rest] = float(v)
    else:
        lat[name] = float(v)


def start_latency(kind: str, ctx) -> dict:
    """The complete latency mapping a replica of ``ctx`` uses by default (every fitted key explicit)."""
    if kind == "roofline":
        gen = ctx.engine.generation
        from ..latency.roofline import RooflineModel
        lat = {"model": "roofline", **RooflineModel.DEFAULTS, "alpha": list(gen.alpha_us),
               "host": {"step_us": gen.host.step_us, "per_seq_us": gen.host.per_seq_us}}
    elif kind == "unified5":
        from ..latency.unified5 import Unified5Model
        lat = {"model": "unified5", "beta": [max(b, p.lo) for b, p in zip(Unified5Model.BETA, UNIFIED5)],
               "alpha": list(Unified5Model.ALPHA_US)}
    elif kind == "physics":
        from ..latency.physics import DEFAULT_COEFFS, load_coefficients
        c = load_coefficients(DEFAULT_COEFFS)
        lat = {"model": "physics", "beta": list(c.beta), "alpha": list(c.alpha)}
        for p in PHYSICS:           # the shipped prior is below the physical floor in places: start at it
            set_value(lat, p.name, min(max(get_value(lat, p.name), p.lo), p.hi))
    elif kind == "blackbox":
        # twice the roofline reading (half the peak rates): only the first point of the search
        lat = {"model": "blackbox", "beta": [2.0 * r for r in blackbox_reading(ctx)],
               "alpha": list(ctx.engine.generation.alpha_us)}
    else:
        raise ConfigError("--latency-model", kind, "roofline, unified5, physics or blackbox")
    return lat


# ---- stage 1: step time from per-request decode windows --------------------------------------------
def window_terms(run: RealRun, ctx) -> dict | None:
    """Per decode window of ``run``: its mean step time and the physical terms of its steps as the
    roofline costs them at unit multipliers (per GEMM kind and for attention: seconds of memory
    traffic and of compute on the device's GEMM efficiency curves; launch floors and TP
    communication as known time), and each prefill that
    completed inside it (its FLOP time), so the fit can cost a prefill step as the roofline does,
    max(memory, decode + prefill compute), instead of averaging compute over the window.  None
    without per-request first/last token times or with fewer than 8 windows to fit.

    Requests marked ``held_out`` in the token times (``dsim cosim --holdout``) are left out entirely,
    and the windows that end after the first held-out arrival are marked ``held_out`` (their batch
    may include held-out requests): no held-out measurement enters the fit, as target or feature."""
    from .windows import decode_windows
    t = run.meta.get("token_times")
    if not t:
        return None
    arrival = list(t.get("arrival_s") or t["first_s"])          # the token times' clock
    stop = np.inf
    if any(t.get("held_out") or ()):
        held = np.asarray(t["held_out"], bool)
        if "arrival_s" not in t:
            raise ConfigError(run.path, None, "arrival times on the token clock to hold requests out",
                              show_value=False)
        stop = float(np.min(np.asarray(t["arrival_s"], float)[held]))
        t = {k: [x for x, h in zip(v, held) if not h] for k, v in t.items()
             if isinstance(v, list) and len(v) == len(held)}
        arrival = [a for a, h in zip(arrival, held) if not h]
    w = decode_windows(t["first_s"], t["last_s"], t["prompt"], t["output"])
    if len(w.tpot_s) < 8:
        return None
    from ..latency.collectives import all_reduce_terms
    from ..latency.roofline import ATTN_COMPUTE, ATTN_MEMORY, RooflineModel
    m, d, e = ctx.model, ctx.device, ctx.engine
    tp = e.tensor_parallel_size
    roof = RooflineModel(m, d, tp, moe_fused=e.moe_fused_kernel)   # unit multipliers: this device's GEMM curves
    kv_s = m.kv_bytes_per_token / m.kv_shards(tp) / (d.hbm_bytes_s * ATTN_MEMORY)    # s per KV token
    pair_s = m.attn_flops_per_pair / tp / (d.peak_flops * ATTN_COMPUTE)               # s per attended pair
    # decode steps of each window: per GEMM kind (compute s, memory s) at the window's mean batch,
    # attention as one more kind
    dc, dm, floor = roof.gemm_terms(w.batch, w.batch)
    comp = np.column_stack([dc, pair_s * w.ctx_sum])
    mem = np.column_stack([dm, kv_s * (w.ctx_sum + w.batch)])
    # the prefill steps inside each window: first tokens that came in (first, last] of it; first tokens
    # closer together than a tenth of the median step came from one step, which costs their summed tokens
    f = np.asarray(t["first_s"], float)
    new = np.asarray(t["prompt"], float) - np.asarray(t.get("cached") or np.zeros(len(f)), float)
    order = np.argsort(f, kind="stable")
    fs, pf = f[order], new[order]
    group = np.concatenate([[0], np.cumsum(np.diff(fs) > 0.1 * float(np.median(w.tpot_s)))])
    g_time = fs[np.searchsorted(group, np.arange(group[-1] + 1))]
    g_tok, g_pairs = np.bincount(group, pf), np.bincount(group, pf * (pf + 1) / 2)
    g_seqs = np.bincount(group)
    first = f[w.index]
    last = np.asarray(t["last_s"], float)[w.index]
    lo, hi = np.searchsorted(g_time, first, side="right"), np.searchsorted(g_time, last, side="right")
    count = hi - lo
    if int(count.sum()) > MAX_WINDOW_PREFILLS:
        raise ConfigError(run.path, None, f"at most {MAX_WINDOW_PREFILLS} (window, prefill step) pairs in "
                          f"stage 1 (this run has {int(count.sum())}); calibrate on a shorter slice", show_value=False)
    owner = np.repeat(np.arange(len(count)), count)
    which = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count) + np.repeat(lo, count)
    # a prefill step: the window's decoders plus the prefill tokens, sampling one token per sequence
    b_o, ctx_o, tok = w.batch[owner], w.ctx_sum[owner], g_tok[which]
    pc, pm, _ = roof.gemm_terms(b_o + tok, b_o + g_seqs[which])
    pf_comp = np.column_stack([pc, pair_s * (ctx_o + g_pairs[which])])
    pf_mem = np.column_stack([pm, kv_s * (ctx_o + b_o + tok)])
    known = floor.copy()                  # GEMM launch floors: the same in every step
    if tp > 1:          # the all-reduce the roofline adds, per step (the engine's algorithm and links)
        fixed, coef, bw = all_reduce_terms(d, tp, e.all_reduce_algorithm)
        known += 2 * m.num_layers * (fixed + coef * w.batch * m.hidden_size * m.bytes_per_param / bw)
    if int((last < stop).sum()) < 8:
        return None
    return {"tpot": w.tpot_s, "batch": w.batch, "mem": mem, "comp": comp, "known": known,
            "steps": w.steps, "prefills": count.astype(float), "owner": owner, "pf_comp": pf_comp,
            "pf_mem": pf_mem, "held_out": last >= stop, "arrival": np.asarray(arrival, float)[w.index],
            "first": first, "last": last}


class Stage1:
    """Stage 1's regression problem over the decode windows of every run with per-request token times:
    each window's mean step time modelled from the physical terms of its steps (see ``stage1``).
    ``run`` (index into ``names``), ``arrival``, ``first``/``last`` (token times) and ``held_out``
    are per window."""
    LO, HI = [0.0, 0.0, 1.0, 1.0], [np.inf, np.inf, 20.0, 20.0]
    NAMES = ("host.step_us", "host.per_seq_us", "memory_efficiency", "compute_efficiency")

    def __init__(self, parts, overlap: float):
        self.names = [n for n, _ in parts]
        shift = np.cumsum([0] + [len(t["tpot"]) for _, t in parts[:-1]])
        # a dense and an MoE model have different GEMM kinds (router, experts): zero columns cost nothing
        # in the per-kind sum, so every run's term tables are padded to the widest
        width = {k: max(t[k].shape[1] for _, t in parts) for k in ("mem", "comp", "pf_mem", "pf_comp")}

        def col(t, k):
            a = t[k]
            return np.pad(a, ((0, 0), (0, width[k] - a.shape[1]))) if k in width else a
        cat = {k: np.concatenate([col(t, k) + (s if k == "owner" else 0) for s, (_, t) in zip(shift, parts)])
               for k in parts[0][1]}
        self.y = cat["tpot"] - cat["known"]
        self.batch, self.mem, self.comp, self.steps = cat["batch"], cat["mem"], cat["comp"], cat["steps"]
        self.prefills = cat["prefills"]
        self.plain = np.maximum(self.steps - self.prefills, 0.0)
        self.owner, self.pf_comp, self.pf_mem = cat["owner"], cat["pf_comp"], cat["pf_mem"]
        self.held_out, self.arrival = cat["held_out"].astype(bool), cat["arrival"]
        self.first, self.last = cat["first"], cat["last"]
        self.run = np.repeat(np.arange(len(parts)), [len(t["tpot"]) for _, t in parts])
        self.serial = 1.0 - float(overlap)

    def gpu(self, tm, tc):     # per GEMM kind (and attention), summed: the roofline's step
        return (np.maximum(tm, tc) + self.serial * np.minimum(tm, tc)).sum(axis=-1)

    def split(self, c):
        """Per window: (GPU time of its decode-only steps, GPU time of its steps with a prefill), summed."""
        with_pf = self.gpu(c[2] * self.pf_mem, c[3] * self.pf_comp)
        return (self.plain * self.gpu(c[2] * self.mem, c[3] * self.comp),
                np.bincount(self.owner, with_pf, minlength=len(self.y)))

    def predict(self, c):
        dec, pf = self.split(c)
        return c[0] + c[1] * self.batch + (dec + pf) / np.maximum(self.plain + self.prefills, 1.0)

    def solve(self, train=None):
        """Huber regression on relative error over the windows in ``train`` (default: all not held out)."""
        from scipy.optimize import least_squares
        train = ~self.held_out if train is None else train
        y = self.y[train]

        def resid(c):
            return (self.predict(c)[train] - y) / y
        sol = least_squares(resid, np.array([2e-4, 1e-5, 1.25, 1.25]), loss="huber", f_scale=0.05,
                            bounds=(self.LO, self.HI), x_scale=[1e-3, 1e-5, 1.0, 1.0])
        return sol, resid(sol.x)


def stage1_problem(runs, ctxs, lat: dict) -> Stage1 | None:
    """None unless the latency model is the roofline and a run has per-request first/last token times."""
    if lat["model"] != "roofline":
        return None
    parts, index = [], []
    for i, (r, c) in enumerate(zip(runs, ctxs)):
        if (t := window_terms(r, c)) is not None:
            parts.append((r.name, t))
            index.append(i)
    if not parts:
        return None
    prob = Stage1(parts, lat.get("overlap", 1.0))
    prob.index = index           # position in ``runs`` of each part
    return prob


def stage1(runs, ctxs, lat: dict, prob: Stage1 | None = None) -> dict | None:
    """Robust regression of each request's mean decode step time on its window's batch, jointly over
    every run with per-request timestamps (roofline): one host step cost, per-sequence cost, HBM and
    compute efficiency for all of them.  A window's steps are its decode-only steps plus one step per
    prefill that completed inside it, each costed max(memory, compute) as the roofline costs it.
    The KV read (growing with each window's context) separates the HBM efficiency from the host step
    within one run; runs of models with different weight sizes on one GPU and engine add leverage.
    Windows of held-out requests (``dsim cosim --holdout``) are not fitted.  ``prob``: the problem
    ``stage1_problem`` built, if already built.  None when no run has per-request first/last token times."""
    prob = prob if prob is not None else stage1_problem(runs, ctxs, lat)
    if prob is None:
        return None
    sol, r = prob.solve()
    train = ~prob.held_out
    dof = max(1, int(train.sum()) - 4)
    try:
        cov = np.linalg.pinv(sol.jac.T @ sol.jac) * float(r @ r) / dof
        se = np.sqrt(np.clip(np.diag(cov), 0, None))
    except np.linalg.LinAlgError:
        se = np.full(4, np.nan)
    c = sol.x
    batch = prob.batch[train]
    return {"requests": int(train.sum()), "runs": prob.names, "mape": float(np.mean(np.abs(r))),
            "used": True,
            "values": {"host.step_us": c[0] * 1e6, "host.per_seq_us": c[1] * 1e6,
                       "memory_efficiency": 1.0 / c[2], "compute_efficiency": 1.0 / c[3]},
            "stderr": {"host.step_us": se[0] * 1e6, "host.per_seq_us": se[1] * 1e6,
                       "memory_efficiency": se[2] / c[2] ** 2, "compute_efficiency": se[3] / c[3] ** 2},
            "batch_range": [float(batch.min()), float(batch.max())]}


# ---- stage 2: simulator in the loop ----------------------------------------------------------------
def _stats(run, base, overrides, seed, lat):
    from .cosim import cosim_report, simulate_run
    res, scn = simulate_run(run, base, overrides, seed, lat)
    return cosim_report(run, res, scn)


def run_errors(rep: dict) -> list:
    """(stage, 'metric quantile', error) over the report's non-overloaded stages that are not held out."""
    out = []
    for st in rep["stages"]:
        if st["overloaded"] or st.get("held_out"):
            continue
        for m, q in TARGETS:
            e = st["metrics"].get(m, {}).get("error", {}).get(q)
            if e is not None and e > -1:
                out.append((st["stage"], f"{m} {q}", float(e)))
    return out


def loss_of(reports) -> float:
    errs = [abs(math.log1p(e)) for rep in reports for *_, e in run_errors(rep)]
    return float(np.mean(errs)) if errs else math.inf


def evaluate(runs, base, overrides, seed, lat, jobs: int = 1) -> list:
    from joblib import Parallel, delayed
    return Parallel(n_jobs=jobs)(delayed(_stats)(r, base, overrides, seed, lat) for r in runs)


OPTIMIZERS = ("nelder-mead", "differential-evolution", "dual-annealing", "bayesian")
POSITION_BOUND = 9.22       # logistic positions searched by the global optimisers: 1e-4 .. 1 - 1e-4 of each range


class _Budget(Exception):
    """The optimiser asked for more than ``max_evals`` simulations."""


def stage2(runs, base, overrides, seed, lat: dict, space, max_evals: int, jobs: int = 1, log=None,
           optimizer: str = "nelder-mead", cliff_weight: float = 0.0) -> dict:
    """Minimise the loss over the parameters in ``space`` (each mapped from R into its physical
    range) with at most ``max_evals`` simulations of every run: Nelder-Mead from the start (seed 003
    stage 2), or scipy's differential evolution or dual annealing over the whole range (seeded with
    ``seed``; the start is one of their first points), which cannot be trapped by the saturation
    cliff's flat region but spend their budget exploring (seed 003 Part 2's robustness table).
    ``cliff_weight`` > 0 adds seed 003's saturation penalty (dsim.calibrate.cliff.cliff_penalty) over
    the staged runs with an overloaded stage: ``cliff_weight`` x how far (log ratio) each simulated
    cliff lies outside its real bracket widened by 20 %, 0 inside."""
    from scipy.optimize import minimize
    if optimizer not in OPTIMIZERS:
        raise ConfigError("--optimizer", optimizer, "one of " + ", ".join(OPTIMIZERS))
    usable = [r for r in runs if not r.overloaded]
    if not usable:
        raise ConfigError("runs", None, "at least one run that is not overloaded", show_value=False)

    def value(p, x):
        return p.lo + (p.hi - p.lo) / (1.0 + math.exp(-x))

    def position(p, v):
        u = min(max((v - p.lo) / (p.hi - p.lo), 1e-4), 1 - 1e-4)
        return math.log(u / (1 - u))

    def vertex(p, v):
        # the initial simplex steps in value space (25 % of the value, at least 5 % of the range, away
        # from the nearer bound): a fixed step in logistic space barely moves a start next to a bound
        step = max(0.25 * abs(v), 0.05 * (p.hi - p.lo))
        return position(p, v + step if v + step <= p.hi else v - step)

    def latency(x):
        out = copy.deepcopy(lat)
        for p, xi in zip(space, x):
            set_value(out, p.name, value(p, xi))
        return out
    hist, targets, points, pens = [], [], [], []
    if cliff_weight and not any(real_bracket(r) for r in runs):
        raise ConfigError("--cliff-penalty", cliff_weight, "a staged run with an overloaded stage among the runs "
                          "(the penalty compares its simulated cliff with the real failure onset)")

    limit = None if optimizer == "nelder-mead" else max_evals      # Nelder-Mead keeps scipy's own maxfev

    def f(x):
        if limit is not None and len(hist) >= limit:
            raise _Budget
        reps = evaluate(usable, base, overrides, seed, latency(x), jobs)
        lo = loss_of(reps)
        if cliff_weight:
            pen = cliff_penalty(runs, base, overrides, seed, latency(x), cliff_weight, jobs)
            pens.append(pen)
            lo += pen["value"]
        hist.append(lo)
        points.append(np.array(x, dtype=float))
        targets.append(sum(len(run_errors(r)) for r in reps))
        if log:
            log(f"stage 2 eval {len(hist)}: loss {lo:.4f}"
                + (f" (saturation-cliff penalty {pens[-1]['value']:.4f})" if cliff_weight else ""))
        return lo
    x0 = np.array([position(p, get_value(lat, p.name)) for p in space])
    n = len(x0)
    if optimizer != "nelder-mead":
        out = _global(optimizer, f, x0, hist, points, targets, space, value, latency, max_evals, seed, position)
        return _with_penalty(out, pens, points, hist, cliff_weight)
    simplex = np.vstack([x0] + [x0 for _ in range(n)])
    for i, p in enumerate(space):
        simplex[i + 1, i] = vertex(p, get_value(lat, p.name))
    opt = minimize(f, x0, method="Nelder-Mead",
                   options={"maxfev": max_evals, "initial_simplex": simplex, "xatol": 1e-3, "fatol": 2e-4})
    sim = opt.final_simplex
    spread = float(np.max(sim[1]) - np.min(sim[1])) if np.all(np.isfinite(sim[1])) else None
    if not (opt.fun is not None and math.isfinite(opt.fun)):
        raise ConfigError("runs", None, f"a finite loss to minimise (stage 2 ended at {opt.fun}): no target "
                          "quantile could be compared", show_value=False)
    values = [[value(p, xi) for p, xi in zip(space, row)] for row in sim[0]]
    unc = {p.name: float(np.ptp([v[i] for v in values])) / 2 for i, p in enumerate(space)}
    converged = bool(opt.success) or (spread is not None and spread < 2e-3)
    out = {"latency": latency(opt.x), "loss_start": hist[0], "loss": float(opt.fun), "evaluations": len(hist),
           "targets": targets[0], "optimizer": optimizer,
           "converged": converged, "simplex_loss_spread": spread, "uncertainty": unc,
           "reason": "simplex converged" if opt.success else
           (f"stopped at {max_evals} evaluations; final simplex loss spread "
            + ("n/a (a vertex's loss is not finite)" if spread is None else f"{spread:.4f}"))}
    return _with_penalty(out, pens, points, hist, cliff_weight, opt.x)


def _with_penalty(out: dict, pens, points, hist, weight, x=None) -> dict:
    """Stage 2's result with the saturation penalty at its start and at its result (when asked for):
    the result is ``x`` (Nelder-Mead's best vertex) or the best point simulated (the global ones)."""
    if not weight:
        return out
    i = next((k for k, p in enumerate(points) if x is not None and np.array_equal(p, x)), None)
    if i is None:
        i = min(range(len(hist)), key=lambda k: hist[k])
    out["cliff_penalty"] = {"weight": weight, "margin": MARGIN, "start": pens[0], "result": pens[i]}
    return out


def _global(optimizer, f, x0, hist, points, targets, space, value, latency, max_evals, seed, position) -> dict:
    """Differential evolution, dual annealing or Bayesian optimisation within the budget; the result is
    the best point simulated, its uncertainty half the range of each parameter over the n + 1 best points."""
    from scipy.optimize import differential_evolution, dual_annealing
    n = len(x0)
    bounds = [(-POSITION_BOUND, POSITION_BOUND)] * n
    x0 = np.clip(x0, -POSITION_BOUND, POSITION_BOUND)
    finished = False
    seen: dict = {}

    def g(x):               # a point already simulated is not simulated (nor counted) again
        key = tuple(float(v) for v in x)
        if key not in seen:
            seen[key] = f(x)
        return seen[key]
    g(x0)                   # the start first: loss_start is the start's loss for every optimiser
    try:
        if optimizer == "differential-evolution":
            # the smallest population scipy takes for n parameters (5 at least): generations, not members
            pop = max(2, -(-5 // n))
            differential_evolution(g, bounds, seed=seed, popsize=pop, maxiter=10 ** 6, polish=False, x0=x0,
                                   init="latinhypercube", tol=1e-3)
        elif optimizer == "dual-annealing":
            dual_annealing(g, bounds, seed=seed, maxfun=max_evals, x0=x0)
        else:
            from .bayes import tpe_search
            tpe_search(g, space, value, position, x0, hist, max_evals, seed)
        finished = optimizer != "bayesian"      # it has no criterion of its own: it spends the budget
    except _Budget:
        pass
    finite = [i for i, v in enumerate(hist) if math.isfinite(v)]
    if not finite:
        raise ConfigError("runs", None, "a finite loss to minimise (every stage-2 point had an infinite loss): "
                          "no target quantile could be compared", show_value=False)
    order = sorted(finite, key=lambda i: hist[i])
    best = points[order[0]]
    top = order[:n + 1]
    values = [[value(p, xi) for p, xi in zip(space, points[i])] for i in top]
    unc = {p.name: float(np.ptp([v[j] for v in values])) / 2 for j, p in enumerate(space)}
    spread = float(hist[top[-1]] - hist[top[0]])
    return {"latency": latency(best), "loss_start": hist[0], "loss": float(hist[order[0]]),
            "evaluations": len(hist), "targets": targets[0], "optimizer": optimizer,
            "converged": finished, "simplex_loss_spread": spread, "uncertainty": unc,
            "reason": f"{optimizer} {'ended by its own criterion' if finished else f'stopped at {max_evals} evaluations'}"
                      f"; loss spread of the {len(top)} best points {spread:.4f}"}


# ---- physical checks -------------------------------------------------------------------------------
def physical_issues(lat: dict, ctx) -> list:
    """What in a fitted latency mapping is faster than the hardware: a decode step of one request
    below one read of the weights at peak bandwidth, a prefill above peak FLOP/s."""
    from ..latency.base import BatchShape
    from ..config.schema.latency import parse_latency
    from ..latency.registry import build_latency
    step, _, _ = build_latency(parse_latency(lat), ctx)
    gpu = getattr(step, "gpu", step)
    m, d = ctx.model, ctx.device
    tp = ctx.engine.tensor_parallel_size
    issues = []
    t1 = gpu.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=1, num_sampled=1, running=1))
    active = m.layer_weight_bytes(m.experts_per_token if m.is_moe else None) / tp
    floor = active / d.hbm_bytes_s
    if t1 < floor * 0.999:
        issues.append(f"a one-request decode step takes {t1 * 1e3:.3f} ms, less than reading the weights once "
                      f"({floor * 1e3:.3f} ms at {d.hbm_bytes_s / 1e9:.0f} GB/s)")
    n = 2048
    tpf = gpu.step_time(BatchShape(prefill_tokens=n, num_prefill=1, prefill_attn_pairs=n * (n + 1) // 2,
                                   num_sampled=1, running=1))
    flops = (m.flops_per_token_linear * n + m.attn_flops_per_pair * n * (n + 1) // 2) / tp
    if tpf > 0 and flops / tpf > d.peak_flops * 1.001:
        issues.append(f"a {n}-token prefill runs at {flops / tpf / 1e12:.0f} TFLOP/s, above the "
                      f"{d.peak_flops / 1e12:.0f} TFLOP/s peak")
    return issues
