"""Decode windows: the step-level picture a per-request log implies.

A request that emitted its first token at f and its last at l (n tokens) decoded in every step
that ended in (f, l]; its mean step time is (l - f) / (n - 1).  The requests decoding alongside
it are exactly those whose windows cover the same instants, so the time integral of the batch
size, and of the batch's summed context (each request's context grows linearly from its prompt
to prompt + n - 1 over its window), follow from the timestamps alone, with no step trace.
Both integrands are piecewise linear between window edges, so the integrals are exact.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..metrics.exact import sorted_unique


@dataclass
class Windows:
    """Per request with a decode window (n >= 2 and l > f): the quantities a step-time fit needs."""
    index: np.ndarray        # rows of the input that have a window
    tpot_s: np.ndarray       # mean step time over the window
    batch: np.ndarray        # time-averaged number of requests decoding (itself included)
    ctx_sum: np.ndarray      # time-averaged sum of their contexts (tokens)
    prefill_tokens: np.ndarray   # prompt tokens of other requests whose prefill ended in the window
    prefill_pairs: np.ndarray    # their causal attention pairs, p (p + 1) / 2 each
    steps: np.ndarray        # decode steps in the window (n - 1)


def _integral(edges, starts, ends, a, b):
    """F(t) = integral_0^t sum_j [s_j < u <= e_j] (a_j + b_j u) du at every edge (piecewise exact)."""
    da = np.zeros(len(edges))
    db = np.zeros(len(edges))
    i_s = np.searchsorted(edges, starts)
    i_e = np.searchsorted(edges, ends)
    np.add.at(da, i_s, a)
    np.add.at(da, i_e, -a)
    np.add.at(db, i_s, b)
    np.add.at(db, i_e, -b)
    A, B = np.cumsum(da), np.cumsum(db)           # active sums on [edges[k], edges[k + 1])
    dt = np.diff(edges)
    piece = A[:-1] * dt + B[:-1] * (edges[1:] ** 2 - edges[:-1] ** 2) / 2
    return np.concatenate([[0.0], np.cumsum(piece)])


def decode_windows(first_s, last_s, prompt, output, cached=None) -> Windows:
    """Reconstruct, per request, its decode window's mean batch, context and prefill interference.

    ``first_s``/``last_s``: first and last token times (s, one clock); ``prompt``/``output``: token
    counts; ``cached``: prompt tokens served from the prefix cache (not recomputed), if known."""
    f = np.asarray(first_s, float)
    l = np.asarray(last_s, float)
    p = np.asarray(prompt, float)
    n = np.asarray(output, float)
    c = np.zeros_like(p) if cached is None else np.asarray(cached, float)
    has = (n >= 2) & (l > f)
    edges = sorted_unique(np.concatenate([f[has], l[has]]))
    fw, lw, pw, nw = f[has], l[has], p[has], n[has]
    slope = (nw - 1) / (lw - fw)                  # context growth, tokens per second
    count = _integral(edges, fw, lw, np.ones_like(fw), np.zeros_like(fw))
    ctx = _integral(edges, fw, lw, pw - slope * fw, slope)
    i0, i1 = np.searchsorted(edges, fw), np.searchsorted(edges, lw)
    span = lw - fw
    batch = (count[i1] - count[i0]) / span
    ctx_sum = (ctx[i1] - ctx[i0]) / span
    # prefills that completed inside each window (their first token time), other than the request itself
    order = np.argsort(f, kind="stable")
    fs = f[order]
    new = (p - c)[order]
    cum_tok = np.concatenate([[0.0], np.cumsum(new)])
    cum_pairs = np.concatenate([[0.0], np.cumsum(new * (new + 1) / 2 + new * c[order])])
    a = np.searchsorted(fs, fw, side="right")
    b = np.searchsorted(fs, lw, side="right")
    return Windows(np.flatnonzero(has), span / (nw - 1), batch, ctx_sum,
                   cum_tok[b] - cum_tok[a], cum_pairs[b] - cum_pairs[a], nw - 1)
