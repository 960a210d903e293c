"""``dsim trace generate``: a scenario's generated workload as the dsim JSONL trace ``dsim run`` replays.

Why: a workload drawn from distributions is then a file that can be inspected, edited, shared or
replayed by another tool, and a scenario whose ``workload`` is ``{type: trace, path: FILE}``
runs exactly the requests the original drew (the round trip, tested per request row).

One line per request, in arrival (request id) order, with only the columns that carry something:
arrival_s (exact: JSON keeps a float's shortest repr), prompt_tokens, output_tokens, and when set
request_id (the label), prefix_group, tenant, session, draft_id, priority, slo_class, the request's own
temperature / top_p / domain (speculative acceptance),
ttft_slo_ms / tpot_slo_ms, and segments, the prompt's content identity ([[id, tokens], ...]:
shared system prompts, pooled questions and multi-turn history; an id -(i + 1) is request i's
answer).  The scenario's SLO targets, classes and ``max_concurrency`` are not per request: the
replaying scenario keeps them.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..config.errors import ConfigError
from ..core.rng import PartitionedRNG
from .generator import build_workload


def trace_record(r) -> dict:
    """The JSONL record of one request as the workload built it (before SLO targets are applied)."""
    rec: dict = {"arrival_s": float(r.arrival), "prompt_tokens": int(r.prompt_len), "output_tokens": int(r.max_tokens)}
    if r.label:
        rec["request_id"] = r.label
    if r.prefix_group >= 0:
        rec["prefix_group"] = int(r.prefix_group)
    if r.tenant:
        rec["tenant"] = r.tenant
    if r.session >= 0:
        rec["session"] = int(r.session)
    if r.draft_id:
        rec["draft_id"] = r.draft_id
    if r.priority or r.slo_class or r.ttft_slo_ms is not None or r.tpot_slo_ms is not None:
        rec["priority"] = int(r.priority)
        if r.slo_class:
            rec["slo_class"] = r.slo_class
        for k in ("ttft_slo_ms", "tpot_slo_ms"):
            if getattr(r, k) is not None:
                rec[k] = getattr(r, k)
    if r.sampling is not None:
        for k, v in zip(("temperature", "top_p", "domain"), r.sampling):
            if v not in (None, ""):
                rec[k] = v
    if r.segments is not None:
        rec["segments"] = [[int(i), int(n)] for i, n in r.segments]
    return rec


def trace_lines(scn):
    """The scenario's workload, drawn with its seed exactly as ``dsim run`` draws it, as JSONL lines."""
    wl, _ = build_workload(scn.config.workload, PartitionedRNG(scn.seed, scn.seeds), scn.base_dir)
    for r in wl:
        yield json.dumps(trace_record(r), separators=(",", ":")) + "\n"


def generate_trace(scn, out) -> int:
    """Write the scenario's workload to ``out`` (atomically: all of it or nothing); return the count."""
    from ..metrics.writers import write_atomic
    out = Path(out)
    if out.is_dir():
        raise ConfigError("--out", str(out), "a file path (this is a folder)")
    lines = list(trace_lines(scn))
    try:
        write_atomic(out, "".join(lines))
    except OSError as e:
        raise ConfigError("--out", str(out), f"a file that can be written ({e.strerror})") from None
    return len(lines)
