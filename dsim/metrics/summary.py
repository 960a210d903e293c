"""Per-request latencies and the run summary (percentiles, throughput, goodput, KV, preemption)."""
from __future__ import annotations

import numpy as np

PCTS = (50, 90, 95, 99)


def stats(values) -> dict:
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"count": 0}
    out = {"count": int(a.size), "mean": float(a.mean())}
    for p, v in zip(PCTS, np.percentile(a, PCTS)):
        out[f"p{p}"] = float(v)
    out["max"] = float(a.max())
    return out


def weighted_stats(values, weights) -> dict:
    """Percentiles of a distribution given as (value, multiplicity) pairs (inverted CDF)."""
    v = np.asarray(values, dtype=float)
    w = np.asarray(weights, dtype=float)
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        return {"count": 0}
    order = np.argsort(v, kind="stable")
    v, w = v[order], w[order]
    cw = np.cumsum(w)
    total = cw[-1]
    out = {"count": int(total), "mean": float((v * w).sum() / total)}
    for p in PCTS:
        i = int(np.searchsorted(cw, p / 100.0 * total, side="left"))
        out[f"p{p}"] = float(v[min(i, v.size - 1)])
    out["max"] = float(v[-1])
    return out


def request_latencies(reqs) -> dict:
    """Arrays (ms) over completed requests: ttft, tpot (requests with > 1 token), e2e, queue."""
    done = [r for r in reqs if r.t_completion is not None]
    ttft = [(r.t_first_token - r.arrival) * 1e3 for r in done]
    e2e = [(r.t_completion - r.arrival) * 1e3 for r in done]
    tpot = [(r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1) for r in done if r.n_out > 1]
    queue = [(r.t_scheduled - r.arrival) * 1e3 for r in done]
    return {"ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "queue_ms": queue}


def summarize(scn, inst, reqs) -> dict:
    lat = request_latencies(reqs)
    done = [r for r in reqs if r.t_completion is not None]
    log = inst.log
    itl_v = list(log.dur) + [v for v, _ in inst.itl_extra]
    itl_w = list(log.itl_count) + [w for _, w in inst.itl_extra]
    itl = weighted_stats(np.asarray(itl_v) * 1e3, itl_w)
    first = min((r.arrival for r in reqs), default=0.0)
    last = max((r.t_completion for r in done), default=first)
    span = max(last - first, 1e-12)
    out_tok = sum(r.n_out for r in done)
    in_tok = sum(r.prompt_len for r in done)
    summary = {
        "scenario": scn.name,
        "seed": scn.seed,
        "requests": {
            "submitted": inst.submitted,
            "completed": len(done),
            "rejected": len(inst.rejected),
            "unfinished": inst.submitted - len(done) - len(inst.rejected),
            "not_arrived": len(reqs) - inst.submitted,
        },
        "latency_ms": {
            "ttft": stats(lat["ttft_ms"]),
            "tpot": stats(lat["tpot_ms"]),
            "itl": itl,
            "e2e": stats(lat["e2e_ms"]),
            "queue": stats(lat["queue_ms"]),
        },
        "throughput": {
            "duration_s": span,
            "requests_per_s": len(done) / span,
            "output_tokens_per_s": out_tok / span,
            "input_tokens_per_s": in_tok / span,
            "output_tokens": out_tok,
            "input_tokens": in_tok,
        },
    }
    ttft_slo, tpot_slo = scn.slo_ttft_ms, scn.slo_tpot_ms
    if ttft_slo is not None or tpot_slo is not None:
        good = 0
        for r in done:
            ok = True
            if ttft_slo is not None and (r.t_first_token - r.arrival) * 1e3 > ttft_slo:
                ok = False
            if ok and tpot_slo is not None and r.n_out > 1 and \
                    (r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1) > tpot_slo:
                ok = False
            good += ok
        summary["goodput"] = {
            "slo_ttft_ms": ttft_slo, "slo_tpot_ms": tpot_slo,
            "requests_meeting_slo": good,
            "fraction": good / max(1, len(done) + len(inst.rejected)),
            "requests_per_s": good / span,
        }
    dur = np.asarray(log.dur)
    kv_used = np.asarray(log.kv_used, dtype=float)
    total_blocks = inst.kv.total
    busy = float(dur.sum())
    summary["kv_cache"] = {
        "total_blocks": total_blocks,
        "block_size": inst.bs,
        "mean_usage": float((kv_used * dur).sum() / busy / total_blocks) if busy else 0.0,
        "peak_usage": float(kv_used.max() / total_blocks) if kv_used.size else 0.0,
        "prefix_hit_rate": inst.kv.hits / inst.kv.queries if inst.kv.queries else 0.0,
        "prefix_hit_tokens": int(sum(r.cached_tokens for r in reqs)),
    }
    summary["scheduler"] = {
        "steps": inst.num_steps,
        "busy_fraction": busy / span,
        "preemptions": inst.num_preemptions,
        "preempted_requests": sum(1 for r in reqs if r.preempt_times),
        "mean_batch_tokens": float((np.asarray(log.prefill_tokens) + np.asarray(log.decode_tokens)).mean())
        if log.dur else 0.0,
        "peak_running": max(log.running, default=0),
        "peak_waiting": max(log.waiting, default=0),
    }
    energy_mj = getattr(inst.step_model, "energy_mj", None)
    if energy_mj is not None:      # latency models that know energy (LUT rows carry energy_mj)
        summary["energy"] = {"joules": energy_mj / 1e3,
                             "joules_per_output_token": energy_mj / 1e3 / out_tok if out_tok else None}
    return summary
