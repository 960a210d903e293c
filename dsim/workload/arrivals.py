"""Arrival processes: vectorised numpy generation of arrival times (seconds from 0).

Each generator takes the typed workload section (validated at load: rates, bounds and the
rule that num_requests and/or duration_s stop the arrivals), a numpy Generator, and returns a sorted
float array: at most ``num_requests`` arrivals, none at or after ``duration_s``.
"""
from __future__ import annotations

import math

import numpy as np

from ..config.limits import MAX_REQUESTS, expected_count


def _cap(times: np.ndarray, n: int | None, duration: float | None) -> np.ndarray:
    if duration is not None:
        times = times[times < duration]
    if n is not None:
        times = times[:n]
    return times


def _renewal(gap_sampler, rate: float, n, duration, chunk_hint: int) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps, drawn in chunks until n arrivals or the duration."""
    out = []
    t0 = 0.0
    total = 0
    need = n if n is not None else None
    while True:
        k = chunk_hint if need is None else max(1, need - total)
        gaps = gap_sampler(k)
        t = t0 + np.cumsum(gaps)
        out.append(t)
        total += k
        t0 = float(t[-1])
        if (need is not None and total >= need) or (duration is not None and t0 >= duration):
            break
        if need is None and duration is None:
            raise AssertionError("unbounded arrivals")
    return _cap(np.concatenate(out), n, duration)


def burst_sizes(rng: np.random.Generator, factor: float, k: int) -> np.ndarray:
    """``k`` burst sizes for a burst factor: geometric on 1, 2, ... with mean m = (factor + 1) / 2,
    whose E[N^2] / E[N] = 2m - 1 = factor (the variance / mean of a compound Poisson count)."""
    return rng.geometric(2.0 / (factor + 1.0), k)


def _compound_poisson(rate: float, factor: float, n, duration, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals with a burst factor: bursts at rate / m (Poisson), each a geometric number of
    simultaneous requests with mean m = (factor + 1) / 2.  The mean rate is ``rate`` and the number of
    arrivals in any window has variance ``factor`` times its mean."""
    m = (factor + 1.0) / 2.0
    out = []
    t0, total = 0.0, 0
    while True:
        k = max(16, int(((n - total) if n is not None else rate * (duration - t0)) / m * 1.1) + 16)
        k = min(k, 5_000_000)
        starts = t0 + np.cumsum(rng.exponential(m / rate, k))
        sizes = burst_sizes(rng, factor, k)
        out.append(np.repeat(starts, sizes))
        total += int(sizes.sum())
        t0 = float(starts[-1])
        if (n is not None and total >= n) or (duration is not None and t0 >= duration):
            break
    return _cap(np.concatenate(out), n, duration)


def generate_arrivals(wl, rng: np.random.Generator, path: str = "workload") -> np.ndarray:
    """Arrival times of a generated workload (a typed section of dsim.config.schema.workload)."""
    if wl.type == "staged":
        return _staged(wl, rng, path)
    n, dur, rate = wl.num_requests, wl.duration_s, wl.rate
    if math.isinf(rate):
        # `vllm bench serve --request-rate inf`: every request is ready at t=0 (use with max_concurrency)
        return np.zeros(n)
    hint = int(min(max(1024, rate * (dur or 0) * 1.2 + 16), 5_000_000)) if dur else 1024
    if wl.type == "poisson":
        if wl.burst_factor != 1:
            return _compound_poisson(rate, wl.burst_factor, n, dur, rng)
        return _renewal(lambda k: rng.exponential(1.0 / rate, k), rate, n, dur, hint)
    if wl.type == "constant":
        if n is not None and dur is None:
            return np.arange(n, dtype=float) / rate
        m = int(math.ceil(dur * rate)) + 1
        if n is not None:
            m = min(m, n)
        return _cap(np.arange(m, dtype=float) / rate, n, dur)
    if wl.type == "gamma":
        shape = 1.0 / (wl.cv * wl.cv)
        scale = 1.0 / (rate * shape)
        return _renewal(lambda k: rng.gamma(shape, scale, k), rate, n, dur, hint)
    if wl.type == "burst":
        # seed 001: cycles of a quiet phase (no arrivals) then a burst at multiplier x rate
        quiet, burst = wl.quiet_s, wl.burst_s
        period = quiet + burst
        lam = rate * wl.burst_multiplier
        # arrivals of a unit-rate process mapped through the burst-only clock
        busy = _renewal(lambda k: rng.exponential(1.0 / lam, k), lam, n,
                        None if dur is None else burst * (dur // period) + min(burst, max(0.0, dur % period - quiet)),
                        hint)
        cyc = np.floor(busy / burst)
        return _cap(cyc * period + quiet + (busy - cyc * burst), n, dur)
    # ramp (seed 001): rate rises linearly from 0 to peak_multiplier x rate over ramp_s
    ramp = wl.ramp_s if wl.ramp_s is not None else dur
    peak = wl.peak_multiplier * rate
    # cumulative intensity L(t) = peak t^2 / (2 ramp) for t <= ramp, then linear at peak
    unit = _renewal(lambda k: rng.exponential(1.0, k), 1.0, n, None if dur is None else
                    (peak * min(dur, ramp) ** 2 / (2 * ramp) + peak * max(0.0, dur - ramp)), hint)
    l_ramp = peak * ramp / 2
    t = np.where(unit <= l_ramp, np.sqrt(2 * ramp * unit / peak), ramp + (unit - l_ramp) / peak)
    return _cap(t, n, dur)


def _staged(wl, rng: np.random.Generator, path: str) -> np.ndarray:
    """A list of {rate, duration_s} stages back to back (inference-perf load stages)."""
    n = wl.num_requests
    out = []
    t0 = 0.0
    total = 0
    for i, st in enumerate(wl.stages):
        rate, d = st.rate, st.duration_s
        huge = rate * d > MAX_REQUESTS
        if huge and (n is None or total >= n):
            expected_count(f"{path}.stages[{i}].duration_s", rate, d, None if n is None else n)
            break
        # a stage longer than MAX_REQUESTS arrivals is generated only up to num_requests
        need = n - total if huge else None
        if wl.stage_arrivals == "constant":
            m = int(math.ceil(d * rate)) if need is None else need
            t = np.arange(m, dtype=float) / rate
            t = t[t < d]
        else:
            t = _renewal(lambda k: rng.exponential(1.0 / rate, k), rate, need, d, int(min(rate * d * 1.2, 5e6)) + 16)
        out.append(t0 + t)
        total += len(t)
        t0 += d
    return _cap(np.concatenate(out), n, None)
