"""Per-request latencies and the run summary (percentiles, throughput, goodput, KV, preemption)."""
from __future__ import annotations

import numpy as np

from ..core.request import PENDING, REJECTED
from .conversations import conversation_summary
from .exact import PCTS, pkey as _pkey, weighted_stats_chunked
from .fleet import (efficiency, energy_cost, fairness, fleet_sections, length_bins, memory_utilization,
                    replica_usage)
from .measures import (GROWTH_LIMIT, bad_latencies, delay_trend, gpu_utilization, latency_column, ledger_latencies,
                       meets_slo_mask, stats)


# vLLM's `vllm bench serve` result names for our nested latency sections
VLLM_NAMES = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2e": "e2el"}


def flat_metrics(summary: dict, pcts) -> dict:
    """The summary's headline numbers under the names `vllm bench serve` writes in its result JSON
    (``mean_ttft_ms``, ``median_ttft_ms``, ``std_ttft_ms``, ``p99_ttft_ms``, ... ``e2el``), so a
    simulated run and a benchmarked one can be compared key by key."""
    thr, req = summary["throughput"], summary["requests"]
    out = {"completed": req["completed"], "duration": thr["duration_s"],
           "total_input_tokens": thr["input_tokens"], "total_output_tokens": thr["output_tokens"],
           "request_throughput": thr["requests_per_s"], "output_throughput": thr["output_tokens_per_s"],
           "total_token_throughput": thr["input_tokens_per_s"] + thr["output_tokens_per_s"]}
    if "goodput" in summary:
        out["request_goodput"] = summary["goodput"]["requests_per_s"]
    for ours, theirs in VLLM_NAMES.items():
        st = summary["latency_ms"][ours]
        if not st.get("count"):
            continue
        out[f"mean_{theirs}_ms"] = st["mean"]
        out[f"median_{theirs}_ms"] = st["p50"]
        out[f"std_{theirs}_ms"] = st["std"]
        for p in pcts:
            out[f"{_pkey(p)}_{theirs}_ms"] = st[_pkey(p)]
    return out


def _itl_stats(insts, pcts) -> dict:
    """ITL statistics (ms) of the replicas' steps and their extra samples, in replica order, steps
    without a token left out; read chunk by chunk, so a spilled step log is never whole in memory."""
    def source():
        for inst in insts:
            yield from inst.log.chunks("dur", "itl_count")
            if inst.itl_extra:
                yield (np.array([v for v, _ in inst.itl_extra], dtype=float),
                       np.array([w for _, w in inst.itl_extra], dtype=np.int64))
    return weighted_stats_chunked(source, pcts, scale=1e3)


def summarize(scn, fleet, led, t_end: float | None = None, actions=()) -> dict:
    """The run's summary.json from its sealed ``RequestLedger`` (columns only: no request is
    rebuilt, so a million requests cost arrays, not objects)."""
    is_done = led.present("t_completion")
    n_done = int(is_done.sum())
    insts = [rep.inst for rep in fleet.replicas()]
    pcts = sorted(set(PCTS) | set(getattr(scn, "percentiles", PCTS)))
    lat_stats, bad = {}, 0
    for k in ("ttft", "tpot", "e2e", "queue"):          # one latency array in memory at a time
        a = latency_column(led, is_done, k + "_ms")
        lat_stats[k] = stats(a, pcts)
        if k != "queue":
            bad += bad_latencies(a)
        del a
    arrival = led.col("arrival")
    itl = _itl_stats(insts, pcts)
    first = float(arrival.min()) if led.n else 0.0
    last = float(led.col("t_completion")[is_done].max()) if n_done else first
    span = max(last - first, 1e-12)
    out_tok = int(led.col("n_out")[is_done].sum())
    in_tok = int(led.col("prompt_len")[is_done].sum())
    state = led.col("state")
    summary = {
        "scenario": scn.name,
        "seed": scn.seed,
        "requests": {
            "submitted": fleet.arrived,
            "completed": n_done,
            "rejected": fleet.n_rejected,
            "unfinished": fleet.arrived - n_done - fleet.n_rejected,
            "not_arrived": led.n - fleet.arrived,
        },
        "latency_ms": {
            "ttft": lat_stats["ttft"],
            "tpot": lat_stats["tpot"],
            "itl": itl,
            "e2e": lat_stats["e2e"],
            "queue": lat_stats["queue"],
        },
        "throughput": {
            "duration_s": span,
            "requests_per_s": n_done / span,
            "output_tokens_per_s": out_tok / span,
            "input_tokens_per_s": in_tok / span,
            "output_tokens": out_tok,
            "input_tokens": in_tok,
        },
    }
    if fleet.n_rejected:
        codes, counts = np.unique(led.col("reject_reason")[state == REJECTED], return_counts=True)
        names = led.string_table
        summary["requests"]["rejected_by"] = dict(sorted((names[c], int(k)) for c, k in zip(codes, counts)))
    ttft_slo, tpot_slo = scn.slo_ttft_ms, scn.slo_tpot_ms
    if led.present("ttft_slo_ms").any() or led.present("tpot_slo_ms").any():
        good = int(meets_slo_mask(led, is_done, ttft_slo, tpot_slo).sum())
        summary["goodput"] = {
            "slo_ttft_ms": ttft_slo, "slo_tpot_ms": tpot_slo,
            "requests_meeting_slo": good,
            # over every request that arrived: unfinished work counts against the SLO too
            "fraction": good / max(1, fleet.arrived),
            "requests_per_s": good / span,
        }
        if scn.slo_classes:
            summary["goodput"]["per_request_targets"] = True     # each judged by its class's SLO
    if scn.slo_classes:
        summary["slo_classes"] = class_sections(led, scn.slo_classes, span, pcts)
    if t_end is None or (scn.horizon_s is None or scn.drain):
        sent = arrival[state != PENDING]
        t_acct = max(last, float(sent.max()) if sent.size else 0.0)
    else:
        t_acct = t_end
    uses = {rep.name: replica_usage(rep, t_acct) for rep in fleet.replicas()}
    logs = [(u["busy_s"], u["kv_block_s"], u["kv_peak"]) for u in uses.values()]
    busy = [b for b, _, _ in logs]
    used_t = sum(u / i.kv.total for i, (_, u, _) in zip(insts, logs))
    hits = sum(i.kv.hits for i in insts)
    queries = sum(i.kv.queries for i in insts)
    peak = max((p / i.kv.total for i, (_, _, p) in zip(insts, logs)), default=0.0)
    summary["kv_cache"] = {
        "total_blocks": sum(i.kv.total for i in insts),
        "block_size": insts[0].bs,
        "mean_usage": used_t / sum(busy) if sum(busy) else 0.0,
        "peak_usage": float(peak),
        # percent of one GPU's memory holding KV: block-seconds over busy seconds, as mean_usage
        "mean_memory_utilization": (sum(u["kv_block_s"] * u["block_pct"] for u in uses.values()) / sum(busy)
                                    if sum(busy) else 0.0),
        "peak_memory_utilization": max((memory_utilization(u)[1] for u in uses.values()), default=0.0),
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "prefix_hit_tokens": int(led.col("cached_tokens").sum()),
    }
    tiers = [i.tier for i in insts if i.tier is not None]
    if tiers:
        cpu = {k: sum(t.summary()[k] for t in tiers) for k in tiers[0].summary()}
        cpu["hit_rate"] = cpu["hit_tokens"] / queries if queries else 0.0
        summary["kv_cache"]["gpu_hit_tokens"] = hits
        summary["kv_cache"]["cpu_tier"] = cpu
    n_steps = sum(i.num_steps for i in insts)
    summary["scheduler"] = {
        "steps": n_steps,
        "busy_fraction": min(1.0, sum(busy) / (span * len(insts))) if n_done else None,
        "preemptions": sum(i.num_preemptions for i in insts),
        "preempted_requests": len(led.preempt_times),
        "mean_batch_tokens": float(sum(i.log.total_tokens() for i in insts) / n_steps) if n_steps else 0.0,
        "peak_running": max((i.log.peak_running() for i in insts), default=0),
        "peak_waiting": max((i.log.peak_waiting() for i in insts), default=0),
        "gpu_utilization": gpu_utilization(sum(u["work_s"] for u in uses.values()),
                                           sum(u["alive_s"] for u in uses.values())),
    }
    swaps = [i.swap for i in insts if getattr(i, "swap", None) is not None]
    if swaps:                        # engine.preemption_mode: swap (dsim.serving.swap)
        summary["scheduler"].update({k: sum(w.summary()[k] for w in swaps) for k in swaps[0].summary()})
    energy, cost = energy_cost(fleet.replicas(), t_acct, out_tok, out_tok + in_tok)
    good_n = summary["goodput"]["requests_meeting_slo"] if "goodput" in summary else None
    summary["efficiency"] = efficiency(fleet.replicas(), t_acct, span, out_tok, good_n,
                                      summary["latency_ms"]["tpot"].get("mean"))
    summary["energy"] = energy
    if cost is not None:
        summary["cost"] = cost
    if scn.fleet.declared:
        summary.update(fleet_sections(fleet, led, t_acct, uses))
        summary["scale_events"] = [{"time_s": t, "pool": p, "event": e, "replica": n}
                                   for t, p, e, n in fleet.scale_events]
        if actions:
            summary["controller_actions"] = list(actions)
    if getattr(fleet, "migrations", 0):
        summary["migrations"] = {"requests": fleet.migrations, "kv_bytes": fleet.migrated_bytes}
    if getattr(fleet, "network", None) is not None:
        summary["network"] = fleet.network.summary(t_acct)
    fair = fairness(led, ttft_slo, tpot_slo)
    if fair is not None:
        summary["fairness"] = fair
    summary["length_bins"] = length_bins(led, ttft_slo, tpot_slo, pcts)
    conv = conversation_summary(led, pcts, span)
    if conv is not None:
        summary["conversations"] = conv
    summary["stability"] = stability(led, last if t_end is None else max(t_end, last))
    summary["metrics"] = flat_metrics(summary, getattr(scn, "percentiles", PCTS))
    from .vllm_bench import header, peaks             # the rest of vllm bench serve's result keys
    summary["metrics"].update(failed=fleet.arrived - n_done, **peaks(led), **header(scn))
    warn = health_warnings(summary, bad)
    if warn:
        summary["warnings"] = warn
    return summary


def class_sections(led, classes: dict, span: float, pcts) -> dict:
    """Per SLO class (and "(none)" for requests without one): targets, latency percentiles, SLO
    attainment (share of the class's arrived requests meeting the class's SLO) and goodput.
    ``led``: the run's sealed RequestLedger."""
    cls = led.col("slo_class")
    names = list(classes) + (["(none)"] if (cls == led.code_of("")).any() else [])
    sent = led.col("state") != PENDING
    finished = led.present("t_completion")
    out = {}
    for name in names:
        key = "" if name == "(none)" else name
        arrived = sent & (cls == led.code_of(key))       # a class no request has: code None, nothing
        done = arrived & finished
        lat = ledger_latencies(led, done)
        good = int(meets_slo_mask(led, done, None, None).sum())      # each by its own targets
        n_arrived = int(arrived.sum())
        ttft, tpot = classes.get(key, (None, None))
        out[name] = {
            "slo_ttft_ms": ttft, "slo_tpot_ms": tpot,
            "requests": n_arrived, "completed": int(done.sum()),
            "ttft_ms": stats(lat["ttft_ms"], pcts), "tpot_ms": stats(lat["tpot_ms"], pcts),
            "requests_meeting_slo": good,
            "slo_attainment": good / n_arrived if n_arrived else None,
            "goodput_requests_per_s": good / span,
        }
    return out


def stability(led, end: float, warmup: float = 0.1) -> dict:
    """Offered load and the trend of the queueing delay over the arrivals after the first ``warmup``
    share of the arrival span: a drained run of an overloaded deployment finishes every request,
    and only this says its percentiles describe a growing queue.  ``led``: a sealed RequestLedger."""
    arrival = led.col("arrival")
    seen = arrival <= end
    n = int(np.count_nonzero(seen))          # count, first and last of the arrivals by then: no sorted copy
    if n < 3:
        return {"offered_requests_per_s": None, "queue_delay_trend_ms_per_s": None, "overloaded": False}
    t0, t1 = float(np.min(arrival, where=seen, initial=np.inf)), float(np.max(arrival, where=seen, initial=-np.inf))
    if not t1 > t0:
        return {"offered_requests_per_s": None, "queue_delay_trend_ms_per_s": None, "overloaded": False}
    tw = t0 + warmup * (t1 - t0)
    # requests a stopped run never scheduled have no queueing delay yet (their wait is censored at
    # the stop, which would bend the trend down): the trend is over the scheduled ones; rejected
    # requests are left out
    sel = ((tw <= arrival) & (arrival <= t1) & led.present("t_scheduled")
           & (led.col("reject_reason") == led.code_of("")))
    del seen
    t = arrival[sel]
    del arrival                              # the least-squares fit copies its inputs several times
    q = led.col("t_scheduled")[sel] - t
    del sel
    trend = delay_trend(t, q)
    return {"offered_requests_per_s": (n - 1) / (t1 - t0), "queue_delay_trend_ms_per_s": trend * 1e3,
            "overloaded": trend > GROWTH_LIMIT}


def health_warnings(summary: dict, bad: int) -> list[str]:
    """What makes the numbers above untrustworthy as a steady-state answer, said plainly (``bad``:
    the TTFT, TPOT and E2E values that are negative, infinite or NaN)."""
    req = summary["requests"]
    out = []
    if req["submitted"] and not req["completed"]:
        out.append("no request completed: latency percentiles and throughput are empty")
    if req["unfinished"]:
        out.append(f"{req['unfinished']} of {req['submitted']} requests were still unfinished when the run "
                   "stopped: the deployment may be overloaded, and percentiles cover finished requests only")
    st = summary.get("stability") or {}
    if st.get("overloaded"):
        out.append(f"overloaded: the queueing delay grows {st['queue_delay_trend_ms_per_s']:.0f} ms per second of "
                   f"arrivals at {st['offered_requests_per_s']:.3g} req/s offered (limit {GROWTH_LIMIT * 1e3:.0f}); "
                   "latency percentiles describe a growing queue, not a steady state")
    if req["rejected"] and req["rejected"] * 10 >= req["submitted"]:
        out.append(f"{req['rejected']} of {req['submitted']} requests were rejected")
    if bad:
        out.append(f"{bad} latency values are negative, infinite or NaN (check the inputs: infinite arrival "
                   "times or RTTs?)")
    return out
