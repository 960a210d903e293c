"""Chrome/Perfetto trace of scheduler steps (``output.timeline: true``)."""
from __future__ import annotations

import json


def chrome_trace(inst) -> str:
    log = inst.log
    ev = []
    for t_end, dur, p, d, run, wait, kv in zip(log.t_end, log.dur, log.prefill_tokens, log.decode_tokens,
                                               log.running, log.waiting, log.kv_used):
        ts = (t_end - dur) * 1e6
        ev.append({"name": "step", "ph": "X", "pid": 0, "tid": 0, "ts": round(ts, 3), "dur": round(dur * 1e6, 3),
                   "args": {"prefill_tokens": p, "decode_tokens": d}})
        ev.append({"name": "load", "ph": "C", "pid": 0, "ts": round(ts, 3),
                   "args": {"running": run, "waiting": wait, "kv_blocks": kv}})
    return json.dumps({"traceEvents": ev, "displayTimeUnit": "ms"}, separators=(",", ":")) + "\n"
