"""What a set of requests measured: latency arrays and statistics, SLO checks, queueing trend.

Why its own module: the run summary (summary.py) and the fleet sections (fleet.py) both use these,
and neither should import the other to get them.
"""
from __future__ import annotations

import numpy as np

from .exact import PCTS, pairwise_sum, percentiles, pkey as _pkey


def stats(values, pcts=PCTS) -> dict:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"count": 0}
    out = {"count": int(a.size), "mean": float(a.mean()), "std": float(a.std()), "min": float(a.min())}
    for p, v in zip(pcts, percentiles(a, pcts)):
        out[_pkey(p)] = float(v)
    out["max"] = float(a.max())
    return out


def gpu_utilization(work_s: float, replica_s: float) -> float:
    """Seed 001's ``gpu_utilization``, percent: min(100, 100 x compute load), the load being the
    replica-seconds of work (``dsim.cluster.pool.Pool.work_s``: prefill tokens at the replica's
    full-budget prefill rate, plus 0.3 x decode tokens at its batch-64 decode rate) over the
    replica-seconds that did it (0 when none passed)."""
    return min(100.0, 100.0 * work_s / replica_s) if replica_s > 0 else 0.0


def request_latencies(reqs) -> dict:
    """Arrays (ms) over completed requests: ttft, tpot (requests with > 1 token), e2e, queue.
    ``reqs``: Requests, or a sealed ``RequestLedger`` (read as columns, in id order)."""
    if hasattr(reqs, "col"):
        return ledger_latencies(reqs, reqs.present("t_completion"))
    done = [r for r in reqs if r.t_completion is not None]
    n = len(done)

    def col(values, count=n):       # float64 arrays: 8 bytes a value, not a list slot and a float object
        return np.fromiter(values, dtype=float, count=count)
    ttft = col((r.t_first_token - r.arrival) * 1e3 for r in done)
    e2e = col((r.t_completion - r.arrival) * 1e3 for r in done)
    tpot = col(((r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1) for r in done if r.n_out > 1), -1)
    queue = col((r.t_scheduled - r.arrival) * 1e3 for r in done)
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "queue_ms": queue}


def ledger_latencies(ledger, sel) -> dict:
    """``request_latencies`` of the ledger's completed rows ``sel``: a bool mask, or row indices in
    the order the statistics sum them."""
    arr = ledger.col("arrival")[sel]
    first = ledger.col("t_first_token")[sel]
    last = ledger.col("t_last_token")[sel]
    n_out = ledger.col("n_out")[sel]
    multi = n_out > 1
    return {"ttft_ms": (first - arr) * 1e3,
            "tpot_ms": (last[multi] - first[multi]) * 1e3 / (n_out[multi] - 1).astype(float),
            "e2e_ms": (ledger.col("t_completion")[sel] - arr) * 1e3,
            "queue_ms": (ledger.col("t_scheduled")[sel] - arr) * 1e3}


def latency_column(ledger, sel, name: str) -> np.ndarray:
    """``ledger_latencies(ledger, sel)[name]``: the same values in the same order, holding one
    block's columns instead of five whole ones and their results (80 MB at 10^6 requests).  A bool
    mask ``sel`` over every row is read a block of rows at a time (``RequestLedger.blocks``); row
    indices (in the order the statistics sum them) gather one column at a time."""
    if sel.dtype != bool:
        return _gathered_latency(ledger, sel, name)
    parts = []
    for lo, hi in ledger.blocks():
        s = sel[lo:hi]
        arr = ledger.col("arrival", lo, hi)[s]
        if name == "ttft_ms":
            parts.append((ledger.col("t_first_token", lo, hi)[s] - arr) * 1e3)
        elif name == "e2e_ms":
            parts.append((ledger.col("t_completion", lo, hi)[s] - arr) * 1e3)
        elif name == "queue_ms":
            parts.append((ledger.col("t_scheduled", lo, hi)[s] - arr) * 1e3)
        elif name == "tpot_ms":
            n_out = ledger.col("n_out", lo, hi)[s]
            multi = n_out > 1
            first = ledger.col("t_first_token", lo, hi)[s][multi]
            parts.append((ledger.col("t_last_token", lo, hi)[s][multi] - first) * 1e3
                         / (n_out[multi] - 1).astype(float))
        else:
            raise KeyError(name)
    if not parts:
        return np.empty(0)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


def _gathered_latency(ledger, rows: np.ndarray, name: str) -> np.ndarray:
    """``latency_column`` of row indices: each column read, gathered at ``rows`` and let go."""
    arr = ledger.col("arrival")[rows]
    if name == "tpot_ms":
        n_out = ledger.col("n_out")[rows]
        multi = n_out > 1
        first = ledger.col("t_first_token")[rows][multi]
        return (ledger.col("t_last_token")[rows][multi] - first) * 1e3 / (n_out[multi] - 1).astype(float)
    key = {"ttft_ms": "t_first_token", "e2e_ms": "t_completion", "queue_ms": "t_scheduled"}[name]
    return (ledger.col(key)[rows] - arr) * 1e3


def bad_latencies(a: np.ndarray) -> int:
    """Latency values that are negative, infinite or NaN."""
    return int(np.count_nonzero(~((a >= 0) & (a < np.inf))))


def busy_and_kv(log) -> tuple:
    """(busy seconds, KV block-seconds in use, peak blocks in use) of a step log, summed as numpy
    sums the whole columns (the same bytes whether the log spilled or not)."""
    n = log.steps
    busy = pairwise_sum((d for d, in log.chunks("dur")), n)
    used = pairwise_sum((k.astype(float) * d for d, k in log.chunks("dur", "kv_used")), n)
    peak = max((int(k.max()) for k, in log.chunks("kv_used") if k.size), default=None)
    return busy, used, peak


# Tolerated trend of the queueing delay, seconds of extra wait per second of arrivals.  A deployment
# overloaded by a share e adds e seconds of wait per second of arrivals, so this is the overload a
# finite run lets pass; unlike a growing backlog, it does not mistake a rising arrival rate (traces
# are not stationary) for instability.  `dsim capacity` and the summary's overload warning share it.
GROWTH_LIMIT = 0.02


def delay_trend(t: np.ndarray, q: np.ndarray) -> float:
    """Least-squares slope of delays ``q`` against arrival times ``t`` (0 for fewer than 3 points,
    one arrival time, or non-finite values)."""
    if t.size < 3 or not t.max() > t.min() or not np.isfinite(t).all() or not np.isfinite(q).all():
        return 0.0
    return line_slope(t - t.min(), q)


def line_slope(x: np.ndarray, y: np.ndarray) -> float:
    """``np.polyfit(x, y, 1)[0]``, the same bits, with two fewer copies of the input (a million
    points: 16 MB): numpy's own steps (the Vandermonde matrix, its columns scaled by their norms,
    ``lstsq`` with polyfit's ``rcond``, the slope unscaled, its warning on a rank-deficient fit)
    on float64 arrays as given.  ``x`` is let go once in the matrix: pass a temporary."""
    if x.dtype != np.float64 or y.dtype != np.float64 or x.ndim != 1 or y.ndim != 1:
        return float(np.polyfit(x, y, 1)[0])
    rcond = len(x) * np.finfo(x.dtype).eps
    lhs = np.vander(x, 2)
    del x
    scale = np.sqrt((lhs * lhs).sum(axis=0))
    lhs /= scale
    c, _, rank, _ = np.linalg.lstsq(lhs, y, rcond)
    if rank != 2:
        import warnings
        warnings.warn("Polyfit may be poorly conditioned", np.exceptions.RankWarning, stacklevel=2)
    return float((c.T / scale).T[0])


def decode_wait_trend(t: np.ndarray, residence: np.ndarray, n_out: np.ndarray) -> float:
    """P/D: the least-squares slope on arrival time of a request's time in the decode pool (KV ready to
    completion), with its output tokens as a second regressor.  The residence is the decode queue wait
    plus the request's own decoding, which grows with its output, not with time; a saturated decode pool
    adds a wait that grows with time (0 for fewer than 4 points or a degenerate fit)."""
    if t.size < 4 or not t.max() > t.min() or not np.isfinite(t).all() or not np.isfinite(residence).all():
        return 0.0
    x = np.column_stack([np.ones(t.size), n_out.astype(float), t - t.min()])
    coef, _, rank, _ = np.linalg.lstsq(x, residence, rcond=None)
    return float(coef[2]) if rank == 3 else delay_trend(t, residence)


def meets_slo(r, ttft_ms=None, tpot_ms=None) -> bool:
    """A completed request meets its TTFT and TPOT SLOs: its own targets (``r.ttft_slo_ms``, set
    from its class or the scenario), else the ones given (None = no bound)."""
    if r.ttft_slo_ms is not None:
        ttft_ms = r.ttft_slo_ms
    if r.tpot_slo_ms is not None:
        tpot_ms = r.tpot_slo_ms
    if ttft_ms is not None and (r.t_first_token - r.arrival) * 1e3 > ttft_ms:
        return False
    if tpot_ms is not None and r.n_out > 1 and (r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1) > tpot_ms:
        return False
    return True


def meets_slo_mask(led, sel, ttft_ms, tpot_ms) -> np.ndarray:
    """``meets_slo`` over the ledger's rows where ``sel``, as a bool array."""
    arr = led.col("arrival")[sel]
    first = led.col("t_first_token")[sel]
    last = led.col("t_last_token")[sel]
    n_out = led.col("n_out")[sel]
    ok = np.ones(arr.size, dtype=bool)
    for key, default in (("ttft_slo_ms", ttft_ms), ("tpot_slo_ms", tpot_ms)):
        own = led.present(key)[sel]
        target = np.where(own, led.col(key)[sel], np.nan if default is None else default)
        if key == "ttft_slo_ms":
            ok &= ~((first - arr) * 1e3 > target)
        else:
            multi = n_out > 1
            tpot = (last[multi] - first[multi]) * 1e3 / (n_out[multi] - 1).astype(float)
            ok[multi] &= ~(tpot > target[multi])
    return ok
