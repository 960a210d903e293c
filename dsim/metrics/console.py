"""The few lines `dsim run` and `dsim validate` print: what a reader checks first, in words they know."""
from __future__ import annotations

from .band import band_lines


def offered_load(reqs) -> dict:
    """Requests, span of arrivals and mean offered rate of a built workload."""
    n = len(reqs)
    if n == 0:
        return {"requests": 0, "duration_s": 0.0, "rate": 0.0}
    first = min(r.arrival for r in reqs)
    last = max(r.arrival for r in reqs)
    span = last - first
    return {"requests": n, "duration_s": span, "rate": (n - 1) / span if span > 0 else float("inf")}


def workload_line(reqs) -> str:
    w = offered_load(reqs)
    ins = sum(r.prompt_len for r in reqs) / max(1, w["requests"])
    outs = sum(r.max_tokens for r in reqs) / max(1, w["requests"])
    return (f"workload: {w['requests']} requests over {w['duration_s']:.1f} s, offered {w['rate']:.2f} req/s, "
            f"mean {ins:.0f} prompt / {outs:.0f} output tokens")


def summary_lines(name: str, s: dict) -> list[str]:
    """Completion, throughput, latency percentiles, and goodput, rejections, preemptions, cost and
    scale events whenever the run has them."""
    req, thr, lat = s["requests"], s["throughput"], s["latency_ms"]
    lines = [f"{name}: {req['completed']}/{req['submitted']} requests completed in {thr['duration_s']:.1f} s, "
             f"{thr['requests_per_s']:.2f} req/s, {thr['output_tokens_per_s']:.0f} output tok/s "
             f"({thr['input_tokens_per_s'] + thr['output_tokens_per_s']:.0f} total tok/s)"]
    for k in ("ttft", "tpot", "itl", "e2e"):
        st = lat[k]
        if st.get("count"):
            lines.append(f"  {k.upper():5s} ms  mean {st['mean']:9.2f}  p50 {st['p50']:9.2f}  "
                         f"p99 {st['p99']:9.2f}  max {st['max']:9.2f}")
    extra = []
    if "goodput" in s:
        g = s["goodput"]
        bounds = ("their class's SLO" if g.get("per_request_targets") else
                  ", ".join(f"{k} <= {g[f'slo_{k}_ms']:g} ms" for k in ("ttft", "tpot") if g.get(f"slo_{k}_ms")))
        extra.append(f"goodput {g['requests_per_s']:.2f} req/s ({g['fraction']:.1%} of requests meet {bounds})")
    if req.get("rejected"):
        why = ", ".join(f"{k} {v}" for k, v in req.get("rejected_by", {}).items())
        extra.append(f"rejected {req['rejected']}" + (f" ({why})" if why else ""))
    if req.get("unfinished"):
        extra.append(f"unfinished {req['unfinished']}")
    sch = s.get("scheduler", {})
    if sch.get("preemptions"):
        extra.append(f"preemptions {sch['preemptions']} ({sch['preempted_requests']} requests)")
    if s.get("cost"):
        extra.append(f"cost ${s['cost']['usd']:.2f} ({s['cost']['gpu_hours']:.2f} GPU-hours)")
    if s.get("scale_events"):
        kinds: dict = {}
        for e in s["scale_events"]:
            kinds[e["event"]] = kinds.get(e["event"], 0) + 1
        extra.append("scale events: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in sorted(kinds.items())))
    if extra:
        lines.append("  " + "; ".join(extra))
    lines += band_lines(s)
    for name, c in s.get("slo_classes", {}).items():
        t, tp = c["ttft_ms"], c["tpot_ms"]
        met = "n/a" if c["slo_attainment"] is None else f"{c['slo_attainment']:.1%}"
        lines.append(f"  class {name}: {c['completed']}/{c['requests']} done, TTFT p50 {t.get('p50', float('nan')):.1f} "
                     f"p99 {t.get('p99', float('nan')):.1f} ms, TPOT p99 {tp.get('p99', float('nan')):.1f} ms, "
                     f"{met} meet SLO, goodput {c['goodput_requests_per_s']:.2f} req/s")
    for pool, t in s.get("latency_tiers", {}).items():       # latency.fallback: the tier each pool ran on
        lines.append(f"  latency: pool {pool} ran {t['used']} (tier {t['tier'] + 1} of {' -> '.join(t['chain'])})")
    lines += [f"  warning: {w}" for w in s.get("warnings", [])]
    return lines
