"""A run in `vllm bench serve`'s terms: the keys its result JSON has that summary.json lacked
(``failed``, ``max_output_tokens_per_s``, ``max_concurrent_requests`` and the run header), and the
whole run as a ``--save-result --save-detailed`` file, so notebooks written for vLLM's benchmark
read dsim runs unchanged and ``dsim cosim`` replays them.

vLLM's definitions (vllm/benchmarks/serve.py): one-second buckets from the first request's send
time; a bucket's output tokens are the tokens whose emission time falls in it; a request counts as
concurrent in every bucket from its send's to its completion's.  ``failed`` counts requests that
did not complete: dsim's rejected ones and those still unfinished when a run stopped.
"""
from __future__ import annotations

import json
import math

import numpy as np

from ..core.request import PENDING
from .exact import sorted_unique

BLOCK_ROWS = 1 << 14         # ledger rows ``peaks`` reads at a time (~25 temporaries of this length)


def header(scn) -> dict:
    """``model_id``, ``request_rate`` ("inf" when all requests arrive at once, None for a trace or
    a class mix), ``burstiness`` (vLLM's gamma shape: 1 / cv^2) and ``max_concurrency``."""
    w = scn.config.workload
    rate = w.rate if w.type in ("poisson", "gamma", "constant") else None
    if rate is not None and math.isinf(rate):
        rate = "inf"
    burst = None
    if w.type == "poisson":
        burst = 1.0
    elif w.type == "gamma" and w.cv is not None:
        burst = 1.0 / float(w.cv) ** 2
    return {"model_id": scn.model.name, "request_rate": rate, "burstiness": burst,
            "max_concurrency": w.max_concurrency}


def peaks(led) -> dict:
    """``max_output_tokens_per_s`` and ``max_concurrent_requests`` from the ledger's columns.
    dsim keeps no per-token times (memory), so a request's tokens after the first are spread evenly
    between its first and last token (the fluid count; the export below has the exact ones).

    Only the buckets where something changes are materialised (a run spanning 1e9 s would need a
    billion buckets): between two such buckets every bucket has the same value, so the maximum over
    them, plus the first bucket after each, is the maximum over all.

    The ledger is read a block of rows at a time (``RequestLedger.blocks``): a million requests
    would otherwise make ~14 arrays of a million floats at once.  The bucket additions keep the
    order of one pass over the whole columns (each addition part in turn, blocks in id order), so
    the sums are the same floats."""
    rows = _Blocks(led, led.blocks(BLOCK_ROWS))
    if len(rows.bounds) <= 1:
        rows = list(rows)                              # one block: read and computed once
    ends = [(arr.min(), comp.max()) for arr, comp, *_ in rows]
    if not ends:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = float(np.min([a for a, _ in ends]))
    # bucket numbers as floats: a run can span more seconds than an int64 holds (1e30 ms latencies)
    nb = float(math.ceil(float(np.max([c for _, c in ends])) - t0) + 1)
    if isinstance(rows, list):
        once = [_parts(blk, t0, nb) for blk in rows]
        all_parts = lambda: once                       # noqa: E731
    else:                                              # several blocks: each pass reads them again
        all_parts = lambda: (_parts(blk, t0, nb) for blk in rows)      # noqa: E731
    keys = None
    for p in all_parts():
        at = np.concatenate([a for a, _ in p["conc"] + p["tok"] + p["run"]])
        k = sorted_unique(np.clip(np.concatenate([at, at + 1]), 0, nb))
        keys = k if keys is None else sorted_unique(np.concatenate([keys, k]))
    dense = {name: np.zeros(keys.size) for name in ("conc", "tok", "run")}
    for i in range(4):                                 # part i of every series, over every block in turn
        for p in all_parts():
            for name, out in dense.items():
                if i < len(p[name]):
                    at, v = p[name][i]
                    np.add.at(out, np.searchsorted(keys, at), v)
    live = keys < nb
    conc = np.cumsum(dense["conc"])
    tok = dense["tok"] + np.cumsum(dense["run"])
    return {"max_output_tokens_per_s": float(np.round(tok[live].max(), 6)),
            "max_concurrent_requests": int(conc[live].max())}


class _Blocks:
    """The completed rows of each block (``_done_rows``), read again on each iteration (each
    pass of ``peaks``), so only one block's rows are in memory at a time."""

    def __init__(self, led, bounds):
        self.led, self.bounds = led, bounds

    def __iter__(self):
        for lo, hi in self.bounds:
            blk = _done_rows(self.led, lo, hi)
            if blk is not None:
                yield blk


def _done_rows(led, lo: int, hi: int):
    """(arrival, completion, first token, last token, tokens out) of the completed requests among
    rows [lo, hi), or None when none completed.  Read through the ledger's block API: a spilled
    ledger reads only these rows back."""
    done = led.present("t_completion", lo, hi)
    if not done.any():
        return None
    return (led.col("arrival", lo, hi)[done], led.col("t_completion", lo, hi)[done],
            led.col("t_first_token", lo, hi)[done], led.col("t_last_token", lo, hi)[done],
            led.col("n_out", lo, hi)[done])


def _parts(blk, t0: float, nb: float) -> dict:
    """A block's bucket additions, as (buckets, values) parts in their fixed order: ``conc``
    (+1 from a send's bucket, -1 after its completion's), ``tok`` (direct token additions) and
    ``run`` (cumulative deltas of the whole buckets a request's tokens spread over)."""
    arr, comp, first, last, n = blk
    first, last, n = first - t0, last - t0, n.astype(float)
    conc = [(np.floor(arr - t0), np.ones(arr.size)), (np.minimum(np.floor(comp - t0) + 1, nb), -np.ones(arr.size))]
    tok = [(np.clip(np.floor(first), 0, nb), np.ones(first.size))]           # first tokens
    run = []
    _spread(first, last, n - 1, nb, tok, run)
    return {"conc": conc, "tok": tok, "run": run}


def _spread(a, b, count, nb, tok, run) -> None:
    """``count`` tokens spread uniformly over [a, b] into one-second buckets: direct additions to
    the partial first and last buckets (tok), cumulative deltas for the whole ones between (run)."""
    sel = (count > 0) & (b > a)
    a, b, count = a[sel], b[sel], count[sel]
    rate = count / (b - a)
    ia, ib = np.clip(np.floor(a), 0, nb - 1), np.clip(np.floor(b), 0, nb - 1)
    same = ia == ib
    tok.append((ia[same], count[same]))
    ia, ib, a, b, rate = ia[~same], ib[~same], a[~same], b[~same], rate[~same]
    tok += [(ia, rate * (ia + 1 - a)), (ib, rate * (b - ib))]              # partial first and last bucket
    run += [(ia + 1, rate), (ib, -rate)]


def _token_times(res):
    """Per request id: its token emission times after the first, from its replica's step end times
    when they account for every token (else None: preempted, speculative or stepped elsewhere)."""
    emit = {}
    for rep in res.fleet.replicas():
        log = rep.inst.log
        if log.keep_all:
            emit[rep.inst.name] = np.asarray(log.t_end) + rep.inst.token_overhead
    out = {}
    for r in res.requests:
        if r.t_completion is None or r.n_out < 2 or r.replica not in emit:
            continue
        e = emit[r.replica]
        lo, hi = np.searchsorted(e, r.t_first_token, "right"), np.searchsorted(e, r.t_last_token, "right")
        if hi - lo == r.n_out - 1 and e[hi - 1] == r.t_last_token:
            out[r.rid] = e[lo:hi]
    return out


def detailed(res) -> dict:
    """The run as `vllm bench serve --save-result --save-detailed` writes it: the header, the
    aggregates, and per sent request input_lens, output_lens, ttfts and itls (seconds) and errors.
    ``start_times`` (seconds from the first send) is dsim's addition: vLLM's file has no send
    times, and with them ``dsim cosim`` replays the exact arrivals."""
    scn, m = res.scenario, res.summary["metrics"]
    exact = _token_times(res)
    inputs, outputs, ttfts, itls, errors, starts = [], [], [], [], [], []
    spread = 0
    t0 = None
    times = []
    for r in res.requests:
        if r.state == PENDING:
            continue                                   # never sent
        t0 = r.arrival if t0 is None else min(t0, r.arrival)
        inputs.append(int(r.prompt_len))
        starts.append(r.arrival)
        if r.t_completion is None:
            outputs.append(0)
            ttfts.append(0.0)
            itls.append([])
            errors.append(f"rejected: {r.reject_reason}" if r.reject_reason else "unfinished when the run stopped")
            continue
        outputs.append(int(r.n_out))
        ttfts.append(r.t_first_token - r.arrival)
        if r.n_out < 2:
            gaps = []
        elif r.rid in exact:
            gaps = np.diff(np.concatenate(([r.t_first_token], exact[r.rid]))).tolist()
        else:
            spread += 1
            gaps = [(r.t_last_token - r.t_first_token) / (r.n_out - 1)] * (r.n_out - 1)
        itls.append(gaps)
        errors.append("")
        times.append((r.arrival, r.t_first_token, gaps, r.t_completion))
    doc = {"date": None, "endpoint_type": "dsim", "backend": "dsim", "label": scn.name,
           **header(scn), "tokenizer_id": scn.model.name, "num_prompts": len(inputs)}
    doc.update({
        "duration": m["duration"], "completed": m["completed"], "failed": len(inputs) - m["completed"],
        "total_input_tokens": m["total_input_tokens"], "total_output_tokens": m["total_output_tokens"],
        "request_throughput": m["request_throughput"], "request_goodput": m.get("request_goodput"),
        "output_throughput": m["output_throughput"], "total_token_throughput": m["total_token_throughput"],
        "input_lens": inputs, "output_lens": outputs, "ttfts": ttfts, "itls": itls,
        "generated_texts": [""] * len(inputs), "errors": errors,
        "start_times": [s - t0 for s in starts] if starts else [],
    })
    doc.update(_exact_peaks(times))
    for k, v in m.items():                             # mean_/median_/std_/pNN_ of ttft, tpot, itl, e2el
        if k.endswith("_ms") and not k.endswith("_band_ms") and k not in doc:
            doc[k] = v
    doc["dsim"] = {"scenario": scn.name, "seed": scn.seed, "scenario_sha256": scn.digest,
                   "itls": f"{len(exact)} requests from their replica's step times; {spread} (preempted, "
                           "speculative) spread evenly between first and last token"}
    return doc


def _exact_peaks(times) -> dict:
    """vLLM's two peak metrics over the exported token times (its own definition, exactly), counted
    in the buckets that hold a token or a concurrency change only (a run can span 1e9 s)."""
    if not times:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    t0 = min(a for a, _, _, _ in times)
    nb = float(math.ceil(max(c for _, _, _, c in times) - t0) + 1)
    tok_at, conc_at, conc_dv = [], [], []
    for a, first, gaps, comp in times:
        t = first + np.concatenate(([0.0], np.cumsum(gaps))) - t0
        tok_at.append(np.clip(np.floor(t), 0, nb - 1))
        conc_at += [np.floor([a - t0]), np.minimum(np.floor([comp - t0]) + 1, nb)]
        conc_dv += [np.ones(1), -np.ones(1)]
    _, counts = np.unique(np.concatenate(tok_at), return_counts=True)
    keys = sorted_unique(np.concatenate(conc_at))
    conc = np.zeros(keys.size)
    np.add.at(conc, np.searchsorted(keys, np.concatenate(conc_at)), np.concatenate(conc_dv))
    live = keys < nb
    return {"max_output_tokens_per_s": float(counts.max()),
            "max_concurrent_requests": int(np.cumsum(conc)[live].max())}


def write_detailed(res, path) -> None:
    """``detailed(res)`` as JSON (written whole, then renamed: no half file on an interrupt)."""
    from pathlib import Path
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(detailed(res), allow_nan=False))
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
