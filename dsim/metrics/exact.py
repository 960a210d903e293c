"""Exact statistics over columns too long to hold twice in memory (a million-request run's steps).

Why exact and not sketched: summary.json must be the same bytes whether a run's step log stayed in
memory or spilled to disk (``dsim.core.spill``).  So sums reproduce numpy's pairwise summation
tree over the concatenated column, chunk by chunk (``pairwise_sum``), and the ITL distribution is
sorted out of core by value buckets, each bucket stably sorted in memory, which is the global
stable sort piece by piece (``weighted_stats_chunked``).  Small inputs take the in-memory path.
"""
from __future__ import annotations

import math

import numpy as np

PCTS = (50, 90, 95, 99)      # the percentiles every latency section reports
LEAF = 1 << 16               # pairwise leaves summed by numpy itself (>= its 128-element block)
MEM_ITEMS = 1 << 20          # (value, weight) pairs sorted in memory at once
SAMPLE = 1 << 16             # values sampled to place the bucket bounds


def pkey(p) -> str:
    """'p99', 'p99.9': the percentile's name as vLLM's benchmark writes it."""
    return f"p{int(p)}" if float(p).is_integer() else f"p{p}"


def sorted_unique(values) -> np.ndarray:
    """``np.unique(values)`` of a plain array: its sorted distinct values.  Why not numpy's: its
    first call imports ``numpy.ma`` (about 20 ms of a short run's start-up) to ask whether the
    array is masked, which a plain array never is."""
    a = np.sort(np.asarray(values), axis=None)
    if a.size < 2:
        return a
    keep = np.empty(a.size, dtype=bool)
    keep[0] = True
    np.not_equal(a[1:], a[:-1], out=keep[1:])
    return a[keep]


def median(values) -> float:
    """``np.median(values)`` as a float, the same bits (the middle value, or the mean of the two
    middle ones), without the ``numpy.ma`` import its NaN check costs on first use."""
    a = np.sort(np.asarray(values, dtype=float), axis=None)
    n = a.size
    if n == 0 or np.isnan(a[-1]):
        return math.nan
    return float(a[n // 2]) if n % 2 else float((a[n // 2 - 1] + a[n // 2]) / 2)


def percentiles(values, pcts) -> np.ndarray:
    """``np.percentile(values, pcts)`` (its default 'linear' method), the same bits for every input.

    Why not numpy's own: since numpy 2.x its quantile code calls ``np.unique``, whose first call
    imports ``numpy.ma``, about 20 ms of a short run's start-up.  The arithmetic below is numpy's
    step for step: virtual index ``(n - 1) * q``, the two neighbours, and numpy's two-sided lerp
    (from below when the fraction is under 0.5, from above otherwise); any NaN gives NaN.
    """
    a = np.sort(np.asarray(values, dtype=float), axis=None)
    n = a.size
    if n == 0:
        raise ValueError("percentiles of an empty array")
    q = np.true_divide(np.asarray(pcts, dtype=float), 100)
    if np.any(q < 0) or np.any(q > 1) or np.any(np.isnan(q)):
        raise ValueError("percentiles must be in the range [0, 100]")
    virtual = (n - 1) * np.atleast_1d(q)
    lo_i = np.floor(virtual).astype(np.intp)
    hi_i = lo_i + 1
    top = virtual >= n - 1
    lo_i[top] = hi_i[top] = -1
    gamma = virtual - lo_i
    lo, hi = a[lo_i], a[hi_i]
    diff = hi - lo
    out = lo + diff * gamma
    np.subtract(hi, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    if np.isnan(a[-1]):
        out[...] = np.nan
    return out.reshape(q.shape)[()] if q.ndim == 0 else out


class _Reader:
    """Hands out the next k values of a stream of arrays, as one contiguous array."""

    def __init__(self, chunks):
        self._it = iter(chunks)
        self._buf = np.empty(0)
        self._pos = 0

    def take(self, k: int) -> np.ndarray:
        parts = []
        while k:
            if self._pos == self._buf.size:
                self._buf = np.asarray(next(self._it), dtype=float)
                self._pos = 0
                continue
            m = min(k, self._buf.size - self._pos)
            parts.append(self._buf[self._pos:self._pos + m])
            self._pos += m
            k -= m
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def pairwise_sum(chunks, n: int) -> float:
    """``np.sum`` of the concatenation of ``chunks`` (``n`` float values in all), bit for bit,
    without concatenating: numpy halves a contiguous sum (each half a multiple of 8 long) down to
    blocks it adds directly, so the same halving over a stream with numpy summing the leaves gives
    the same rounding (pinned by tests/test_exact.py)."""
    if n == 0:
        return 0.0
    return float(_halves(_Reader(chunks), n))


def _halves(r: _Reader, m: int):
    # a module function, not a recursive closure: a closure's cycle would keep the reader, and the
    # step log's buffer it views, alive until a garbage collection (BufferError on the next append)
    if m <= LEAF:
        return np.add.reduce(r.take(m))
    h = m // 2
    h -= h % 8
    return _halves(r, h) + _halves(r, m - h)


def weighted_stats(values, weights, pcts=PCTS) -> dict:
    """Statistics of a distribution given as (value, multiplicity) pairs (percentiles: inverted CDF)."""
    return weighted_stats_owned(np.array(values, dtype=float), np.array(weights), pcts)


def weighted_stats_owned(v: np.ndarray, w: np.ndarray, pcts) -> dict:
    """``weighted_stats`` over float64 values and integer (or float) weights that it may reorder in
    place: four arrays of the input's length alive at most."""
    keep = w > 0
    if not keep.all():
        v, w = v[keep], w[keep]
    del keep
    if v.size == 0:
        return {"count": 0}
    order = np.argsort(v, kind="stable")
    v[:] = v[order]
    w[:] = w[order]
    del order
    tmp = np.multiply(v, w, dtype=float)
    cw = np.cumsum(w, dtype=float)          # integer counts: every partial sum is exact
    total = cw[-1]
    mean = float(tmp.sum() / total)
    np.subtract(v, mean, out=tmp)
    np.square(tmp, out=tmp)
    tmp *= w
    out = {"count": int(total), "mean": mean, "std": float(np.sqrt(max(0.0, tmp.sum() / total))),
           "min": float(v[0])}
    del tmp
    for p in pcts:
        i = int(np.searchsorted(cw, p / 100.0 * total, side="left"))
        out[pkey(p)] = float(v[min(i, v.size - 1)])
    out["max"] = float(v[-1])
    return out


def weighted_stats_chunked(source, pcts, scale: float = 1.0, spill=None) -> dict:
    """``weighted_stats`` of (value x ``scale``, weight) pairs that ``source()`` yields as chunks of
    (float values, integer weights), in order; pairs of weight 0 are left out.  ``source`` is
    called for a fresh iterator each pass (three or four).  Up to ``MEM_ITEMS`` pairs are gathered
    without a copy per chunk and sorted in memory (``weighted_stats_owned``); more go through
    ``spill`` (a ``SpillFile``) in value buckets and give the same bytes."""
    n = total = wmax = 0
    for v, w in source():
        keep = w > 0
        k = int(np.count_nonzero(keep))
        if k:
            n += k
            total += int(w[keep].sum(dtype=np.int64))
            wmax = max(wmax, int(w.max()))
    if n <= MEM_ITEMS:
        v = np.empty(n)
        w = np.empty(n, dtype=np.int32 if wmax < 2**31 else np.int64)
        i = 0
        for a, b in source():                  # straight into the arrays the sort reorders in place
            keep = b > 0
            j = i + int(np.count_nonzero(keep))
            np.compress(keep, a, out=v[i:j])
            np.compress(keep, b, out=w[i:j])
            i = j
        v *= scale
        return weighted_stats_owned(v, w, pcts)
    if spill is None:
        from ..core.spill import SpillFile
        spill = SpillFile()
    runs = _sorted_runs(source, n, scale, spill)
    tot = float(total)                          # the float cumulative sum's last value: exact below 2**53
    found = {}

    def products():
        off = 0.0
        for sv, sw in runs:
            v, w = spill.get(sv), spill.get(sw)
            cw = np.cumsum(w, dtype=float)
            cw += off                             # integers: the same as one cumulative sum
            for p in pcts:
                t = p / 100.0 * tot
                if p not in found and cw[-1] >= t:
                    found[p] = float(v[int(np.searchsorted(cw, t, side="left"))])
            off = cw[-1]
            yield np.multiply(v, w, dtype=float)
    mean = float(pairwise_sum(products(), n) / tot)

    def squares():
        for sv, sw in runs:
            d = spill.get(sv)
            np.subtract(d, mean, out=d)
            np.square(d, out=d)
            d *= spill.get(sw)
            yield d
    std = float(np.sqrt(max(0.0, pairwise_sum(squares(), n) / tot)))
    lo, hi = spill.get(runs[0][0], 0, 1)[0], spill.get(runs[-1][0], runs[-1][0][2] - 1)[0]
    out = {"count": int(tot), "mean": mean, "std": std, "min": float(lo)}
    for p in pcts:
        out[pkey(p)] = found.get(p, float(hi))
    out["max"] = float(hi)
    return out


def _sorted_runs(source, n: int, scale: float, spill) -> list:
    """The kept pairs in stable value order as (values, weights) segments of ``spill``: each chunk
    is split by value bucket (bounds at sample quantiles) keeping its order, then each bucket is
    stably sorted alone.  Equal values share a bucket, so ties keep their input order, as a global
    stable sort does."""
    def kept():
        for v, w in source():
            keep = w > 0
            yield np.compress(keep, v) * scale, np.compress(keep, w)
    stride = max(1, n // SAMPLE)
    sample = np.sort(np.concatenate([v[::stride] for v, _ in kept()]))
    nb = -(-n // (MEM_ITEMS // 2))
    bounds = sorted_unique(sample[(np.arange(1, nb) * sample.size) // nb])
    del sample
    buckets = [[] for _ in range(bounds.size + 1)]
    for v, w in kept():
        b = np.searchsorted(bounds, v, side="right")
        order = np.argsort(b, kind="stable")
        edges = np.concatenate(([0], np.cumsum(np.bincount(b, minlength=len(buckets)))))
        v, w = v[order], w[order]
        del b, order
        for i in np.flatnonzero(np.diff(edges)):
            buckets[i].append((spill.put(v[edges[i]:edges[i + 1]]), spill.put(w[edges[i]:edges[i + 1]])))
    runs = []
    for segs in buckets:
        if not segs:
            continue
        v = np.concatenate([spill.get(s) for s, _ in segs])
        w = np.concatenate([spill.get(s) for _, s in segs])
        order = np.argsort(v, kind="stable")
        runs.append((spill.put(v[order]), spill.put(w[order])))
    return runs
