"""Arrival processes: vectorised numpy generation of arrival times (seconds from 0).

Each generator takes the workload section, a numpy Generator and the stop rules (at most
``num_requests`` arrivals, none at or after ``duration_s``) and returns a sorted float array.
"""
from __future__ import annotations

import math

import numpy as np

from ..config.errors import ConfigError
from ..config.fields import Section
from ..config.limits import MAX_CV, MAX_REQUESTS, MAX_TIME_S, MIN_CV, expected_count

ARRIVALS = ("poisson", "gamma", "constant", "burst", "ramp", "staged")


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


def _stop_rules(s: Section, kind: str):
    n = s.int("num_requests", None, lo=1, hi=MAX_REQUESTS)
    dur = s.num("duration_s", None, lo=0, lo_open=True, hi=MAX_TIME_S)
    if n is None and dur is None:
        raise ConfigError(s.sub("num_requests"), None,
                          f"num_requests or duration_s to bound the {kind} arrivals", show_value=False)
    return n, dur


def generate_arrivals(s: Section, kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "staged":
        return _staged(s, rng)
    n, dur = _stop_rules(s, kind)
    if kind in ("poisson", "gamma", "constant") and str(s.data.get("rate")).lower() in ("inf", ".inf"):
        # `vllm bench serve --request-rate inf`: every request is ready at t=0 (use with max_concurrency)
        s.raw("rate")
        s.num("cv", None, lo=MIN_CV, hi=MAX_CV)
        if n is None:
            raise ConfigError(s.sub("num_requests"), None, "num_requests with rate: inf", show_value=False)
        return np.zeros(n)
    rate = s.num("rate", lo=1e-9, hi=1e9)
    if dur is not None:
        expected_count(s.sub("duration_s"), rate, dur, n)
    hint = int(min(max(1024, rate * (dur or 0) * 1.2 + 16), 5_000_000)) if dur else 1024
    if kind == "poisson":
        return _renewal(lambda k: rng.exponential(1.0 / rate, k), rate, n, dur, hint)
    if kind == "constant":
        if n is not None and dur is None:
            return np.arange(n, dtype=float) / rate
        m = int(math.ceil(dur * rate)) + 1
        if n is not None:
            m = min(m, n)
        return _cap(np.arange(m, dtype=float) / rate, n, dur)
    if kind == "gamma":
        cv = s.num("cv", lo=MIN_CV, hi=MAX_CV)
        shape = 1.0 / (cv * cv)
        scale = 1.0 / (rate * shape)
        return _renewal(lambda k: rng.gamma(shape, scale, k), rate, n, dur, hint)
    if kind == "burst":
        # seed 001: cycles of a quiet phase (no arrivals) then a burst at multiplier x rate
        quiet = s.num("quiet_s", 5.0, lo=0)
        burst = s.num("burst_s", 10.0, lo=0, lo_open=True)
        mult = s.num("burst_multiplier", 3.0, lo=0, lo_open=True, hi=1e4)
        period = quiet + burst
        lam = rate * mult
        if dur is not None:
            expected_count(s.sub("burst_multiplier"), lam, dur, n)
        # arrivals of a unit-rate process mapped through the burst-only clock
        busy = _renewal(lambda k: rng.exponential(1.0 / lam, k), lam, n,
                        None if dur is None else burst * (dur // period) + min(burst, max(0.0, dur % period - quiet)),
                        hint)
        cyc = np.floor(busy / burst)
        return _cap(cyc * period + quiet + (busy - cyc * burst), n, dur)
    if kind == "ramp":
        # seed 001: rate rises linearly from 0 to peak_multiplier x rate over ramp_s
        if dur is None and "ramp_s" not in s.data:
            raise ConfigError(s.sub("ramp_s"), None, "ramp_s or duration_s for a ramp", show_value=False)
        ramp = s.num("ramp_s", dur, lo=0, lo_open=True)
        peak = s.num("peak_multiplier", 2.0, lo=0, lo_open=True, hi=1e4) * rate
        if dur is not None:
            expected_count(s.sub("peak_multiplier"), peak, dur, n)
        # cumulative intensity L(t) = peak t^2 / (2 ramp) for t <= ramp, then linear at peak
        unit = _renewal(lambda k: rng.exponential(1.0, k), 1.0, n, None if dur is None else
                        (peak * min(dur, ramp) ** 2 / (2 * ramp) + peak * max(0.0, dur - ramp)), hint)
        l_ramp = peak * ramp / 2
        t = np.where(unit <= l_ramp, np.sqrt(2 * ramp * unit / peak), ramp + (unit - l_ramp) / peak)
        return _cap(t, n, dur)
    raise ConfigError(s.sub("type"), kind, "one of " + ", ".join(ARRIVALS))


def _staged(s: Section, rng: np.random.Generator) -> np.ndarray:
    """A list of {rate, duration_s} stages back to back (inference-perf load stages)."""
    stages = s.raw("stages")
    path = s.sub("stages")
    if not isinstance(stages, list) or not stages:
        raise ConfigError(path, stages, "a non-empty list of {rate, duration_s}")
    process = s.str("stage_arrivals", "poisson", choices=("poisson", "constant"))
    n = s.int("num_requests", None, lo=1, hi=MAX_REQUESTS)
    out = []
    t0 = 0.0
    total = 0
    for i, st in enumerate(stages):
        ss = Section(st, f"{path}[{i}]")
        rate = ss.num("rate", lo=1e-9, hi=1e9)
        d = ss.num("duration_s", lo=0, lo_open=True, hi=MAX_TIME_S)
        ss.done()
        huge = rate * d > MAX_REQUESTS
        if huge and (n is None or total >= n):
            expected_count(f"{path}[{i}].duration_s", rate, d, None if n is None else n)
            break
        # a stage longer than MAX_REQUESTS arrivals is generated only up to num_requests
        need = n - total if huge else None
        if process == "constant":
            m = int(math.ceil(d * rate)) if need is None else need
            t = np.arange(m, dtype=float) / rate
            t = t[t < d]
        else:
            t = _renewal(lambda k: rng.exponential(1.0 / rate, k), rate, need, d, int(min(rate * d * 1.2, 5e6)) + 16)
        out.append(t0 + t)
        total += len(t)
        t0 += d
    return _cap(np.concatenate(out), n, None)

