"""The simulated saturation cliff of a staged run, found by bisection (seed 003 Part 4, "Cliff
detection"), and the stage-2 penalty when it is off the real failure onset by more than the margin.

Overloaded, in simulation, is the seed's definition: a constant-rate stage whose TTFT p50 exceeds
``FACTOR`` x the TTFT p50 of the same workload at a low rate.  The low rate is a tenth of the run's
highest stage rate, halved while dsim's own overload test (``metrics.summary.stability``: the
queueing delay still grows) says it is not low.  The cliff is bracketed between a rate that keeps up
and one that does not, and the bracket is halved (geometric mean: rates span decades) until its ends
are within ``rtol`` of each other, with every probe simulated with the same seed (deterministic) and
at most ``max_sims`` simulations in all.

The real failure onset of a staged run lies above its highest stage that kept up and at most at its
lowest overloaded stage (``realrun``: more than 1 % of requests failed, or it completed under 90 % of
the offered rate).  The simulated cliff agrees when it lies within ``MARGIN`` of that bracket.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

import numpy as np

FACTOR = 3.0            # TTFT p50 over its low-load value that marks a simulated overload (seed 003)
MARGIN = 0.20           # the seed's "more than 20 % off" (Part 4) and "within 20 %" (Part 7)
RTOL = 0.02             # bracket width (hi - lo) / hi the bisection stops at
MAX_SIMS = 16           # simulations per cliff, the low-load one included
DURATION_S = 120.0      # length of each probe's constant-rate stage
LOW_SHARE = 0.1         # the low-load rate as a share of the run's highest stage rate
LOW_HALVINGS = 3        # at most this many halvings of a low rate that is itself overloaded


@dataclass
class Cliff:
    """``rate``: the lowest rate found overloaded (None: none up to ``below``, the budget ran out);
    ``below``: the highest rate found keeping up; ``probes``: (rate, TTFT p50 s, overloaded) in the
    order simulated."""
    rate: float | None
    below: float
    low_ttft_s: float
    simulations: int
    converged: bool
    probes: list = field(default_factory=list)


def bisect_rate(overloaded, lo: float, probes, rtol: float = RTOL, budget: int = MAX_SIMS, grow: float = 2.0):
    """(highest rate keeping up, lowest overloaded rate or None, calls) for a predicate ``overloaded``
    monotone in the rate.  ``lo`` (> 0) is known to keep up; ``probes`` are the first rates tried, in
    increasing order (the real run's bracket); past the last the rate grows by ``grow`` until one is
    overloaded.  Then the bracket is bisected at its geometric mean until (hi - lo) <= rtol x hi.
    At most ``budget`` calls."""
    calls, hi = 0, None
    todo = sorted(p for p in probes if p > lo)
    while hi is None and calls < budget:
        r = todo.pop(0) if todo else lo * grow
        calls += 1
        if overloaded(r):
            hi = r
        else:
            lo = r
    while hi is not None and hi - lo > rtol * hi and calls < budget:
        mid = math.sqrt(lo * hi)
        calls += 1
        if overloaded(mid):
            hi = mid
        else:
            lo = mid
    return lo, hi, calls


def real_bracket(run) -> tuple[float, float] | None:
    """(highest stage rate that kept up or 0, lowest overloaded stage rate) of a staged run with an
    overloaded stage whose rate is known; None otherwise."""
    if run.scenario.get("workload", {}).get("type") != "staged":
        return None
    over = [s.rate for s in run.stages if s.overloaded and s.rate]
    if not over:
        return None
    ok = [s.rate for s in run.stages if not s.overloaded and s.rate]
    return (max(ok) if ok else 0.0), min(over)


def probe(run, base, overrides, seed: int, latency, rate: float, duration_s: float = DURATION_S):
    """(TTFT p50 s, dsim's overload verdict) of the run's workload at one constant ``rate`` for
    ``duration_s`` (inf TTFT when no request got a first token)."""
    from ..metrics.summary import stability
    from .cosim import simulate_run
    r2 = copy.copy(run)
    r2.scenario = copy.deepcopy(run.scenario)
    wl = r2.scenario["workload"]
    wl["stages"] = [{"rate": float(rate), "duration_s": float(duration_s)}]
    wl.pop("num_requests", None)
    res, _ = simulate_run(r2, base, overrides, seed, latency)
    led = res.requests
    ttft = led.col("t_first_token") - led.col("arrival")
    done = led.present("t_first_token")
    p50 = float(np.median(ttft[done])) if done.any() else math.inf
    return p50, bool(stability(led, duration_s)["overloaded"])


def saturation_cliff(run, latency, base=None, overrides=(), seed: int = 42, factor: float = FACTOR,
                     duration_s: float = DURATION_S, rtol: float = RTOL, max_sims: int = MAX_SIMS) -> Cliff:
    """The lowest offered rate at which the simulated TTFT p50 exceeds ``factor`` x its low-load value,
    bisected to ``rtol`` with at most ``max_sims`` simulations.  Staged runs only."""
    wl = run.scenario["workload"]
    if wl.get("type") != "staged":
        raise ValueError("saturation_cliff needs a staged (inference-perf) run")
    top = max(s["rate"] for s in wl["stages"])
    probes = []

    def sim(rate):
        t, dsim_over = probe(run, base, overrides, seed, latency, rate, duration_s)
        probes.append([float(rate), t, None, dsim_over])
        return t, dsim_over
    low = LOW_SHARE * top
    low_ttft, dsim_over = sim(low)
    for _ in range(LOW_HALVINGS):              # the low rate must be low: dsim's own test says when not
        if not dsim_over or len(probes) >= max_sims - 1:
            break
        low /= 2
        low_ttft, dsim_over = sim(low)
    for p in probes:
        p[2] = p[1] > factor * low_ttft

    def overloaded(rate):
        t, _ = sim(rate)
        probes[-1][2] = t > factor * low_ttft
        return probes[-1][2]
    bracket = real_bracket(run)
    first = [r for r in (bracket or (top,)) if r > low] or [top]
    below, rate, _ = bisect_rate(overloaded, low, first, rtol, max_sims - len(probes))
    converged = rate is not None and rate - below <= rtol * rate
    return Cliff(None if rate is None else float(rate), float(below), low_ttft, len(probes), converged,
                 [tuple(p[:3]) for p in probes])


def penalty(cliff: Cliff, bracket: tuple[float, float], margin: float = MARGIN) -> float:
    """How far (log ratio) the simulated cliff lies outside the real bracket widened by ``margin``:
    0 inside [lo (1 - margin), hi (1 + margin)]; log(band end / cliff) beyond it.  A cliff not found
    (every rate up to ``below`` kept up) is at least ``below``."""
    lo, hi = bracket[0] * (1 - margin), bracket[1] * (1 + margin)
    c = cliff.rate if cliff.rate is not None else cliff.below
    if c > hi * (1 + 1e-9):                 # (a band end computed as 6 x 1.2 is 7.199999999999999)
        return math.log(c / hi)
    if cliff.rate is not None and c * (1 + 1e-9) < lo:
        return math.log(lo / c)
    return 0.0


def cliff_penalty(runs, base, overrides, seed, lat: dict, weight: float, jobs: int = 1, rtol: float = 0.05) -> dict:
    """Stage 2's saturation term: ``weight`` x the mean ``penalty`` over the staged runs with an
    overloaded stage (the runs the metric loss leaves out), each cliff bisected to ``rtol``."""
    from joblib import Parallel, delayed
    todo = [(r, b) for r in runs if (b := real_bracket(r)) is not None]
    cliffs = Parallel(n_jobs=jobs)(delayed(saturation_cliff)(r, lat, base, overrides, seed, rtol=rtol)
                                   for r, _ in todo)
    per = {r.name: penalty(c, b) for (r, b), c in zip(todo, cliffs)}
    return {"value": weight * float(np.mean(list(per.values()))) if per else 0.0, "per_run": per,
            "simulations": sum(c.simulations for c in cliffs)}
