"""Chrome/Perfetto trace of scheduler steps (``output.timeline: true``)."""
from __future__ import annotations

import json


def chrome_trace(insts) -> str:
    """One process (pid) per replica, named after it."""
    ev = []
    for pid, inst in enumerate(insts):
        ev.append({"name": "process_name", "ph": "M", "pid": pid, "args": {"name": inst.name}})
        _steps(inst.log, pid, ev)
    return json.dumps({"traceEvents": ev, "displayTimeUnit": "ms"}, separators=(",", ":")) + "\n"


def _steps(log, pid: int, ev: list) -> None:
    if not log.keep_all:
        raise ValueError("the replica's step log was not kept whole (output.timeline)")
    for t_end, dur, p, d, run, wait, kv in zip(log.t_end, log.dur, log.prefill_tokens, log.decode_tokens,
                                               log.running, log.waiting, log.kv_used):
        ts = (t_end - dur) * 1e6
        ev.append({"name": "step", "ph": "X", "pid": pid, "tid": 0, "ts": round(ts, 3), "dur": round(dur * 1e6, 3),
                   "args": {"prefill_tokens": p, "decode_tokens": d}})
        ev.append({"name": "load", "ph": "C", "pid": pid, "ts": round(ts, 3),
                   "args": {"running": run, "waiting": wait, "kv_blocks": kv}})


def series_csv(insts, budget: int = 6000) -> str:
    """timeline.csv: requests running and waiting and KV cache used (%) per replica over simulated
    time, each series min/max-decimated (a short spike survives) to share ``budget`` points per
    quantity across the replicas.  What report.html draws; long format: replica,series,time_s,value."""
    from ..serving.steplog import minmax_decimate
    live = [i for i in insts if i.log.steps]
    per = max(100, budget // max(1, len(live)))
    lines = ["replica,series,time_s,value"]
    for inst in live:
        for name in ("running", "waiting", "kv"):
            t, y = inst.log.series(name)
            if name == "kv":
                y = y * 100.0 / max(1, inst.kv.total)
            t, y = minmax_decimate(t, y, per)
            label = "kv_used_pct" if name == "kv" else name
            lines += [f"{inst.name},{label},{a:.6f},{b:.6g}" for a, b in zip(t.tolist(), y.tolist())]
    return "\n".join(lines) + "\n"
