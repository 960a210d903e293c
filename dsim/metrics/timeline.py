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
