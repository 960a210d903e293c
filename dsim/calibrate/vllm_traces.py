"""vLLM's three tracing streams (seed 000 sections 1-3) read back: OTLP JSON files, dsim's own
(``dsim run --emit-vllm-traces``, written by ``dsim.metrics.vllm_traces``) or a real vLLM's.

The reader accepts any arrangement of these events over spans (it goes by event name, the part
after the last dot) and also keeps KV-connector events (CacheStoreCommitted, TransferInitiated,
TransferCompleted) in a table of their own.  From them it builds the two training tables:
beta rows (one per traced step, with the exact BatchShape when the step was traced in rich mode)
and alpha rows (one per request: API delay, queue wait, output overhead, departure overhead).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..config.errors import ConfigError
from ..latency.base import BatchShape
from ..metrics.vllm_traces import NS, StepRecorder, write_otlp   # noqa: F401  (the writer, re-exported)


def _value(v: dict):
    if "intValue" in v:
        return int(v["intValue"])
    if "doubleValue" in v:
        return float(v["doubleValue"])
    if "boolValue" in v:
        return bool(v["boolValue"])
    if "stringValue" in v:
        return v["stringValue"]
    return None


def _kv(attrs) -> dict:
    return {a["key"]: _value(a.get("value") or {}) for a in attrs or ()}


@dataclass
class Traces:
    """Events of one or more OTLP files, grouped per replica (resource)."""
    resources: dict = field(default_factory=dict)    # replica -> resource attributes
    steps: dict = field(default_factory=dict)        # replica -> {step id: {"summary": {...}, "snapshots": [...]}}
    journeys: dict = field(default_factory=dict)     # (replica, request id) -> {event: (t_s, attrs)} (+ PREEMPTED list)
    kv_events: list = field(default_factory=list)    # (replica, name, t_s, attrs)


def read_otlp(paths) -> Traces:
    tr = Traces()
    for k, path in enumerate([paths] if isinstance(paths, (str, Path)) else paths):
        p = Path(path)
        earlier = set(tr.resources)       # replicas of the files before: a name met again is another run's
        mine: dict = {}
        if not p.is_file():
            raise ConfigError(str(p), None, "an existing OTLP JSON trace file", show_value=False)
        with p.open() as f:
            docs = [(f"{p}:{i}", line) for i, line in enumerate(f, 1) if line.strip()]
        for where, line in docs:
            try:
                doc = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(where, line.strip()[:60], f"an OTLP JSON object ({e.msg})") from None
            if not isinstance(doc, dict) or "resourceSpans" not in doc:
                raise ConfigError(where, None, "an object with resourceSpans (OTLP JSON)", show_value=False)
            for rs in doc["resourceSpans"]:
                res = _kv((rs.get("resource") or {}).get("attributes"))
                rep = str(res.get("dsim.replica") or res.get("service.instance.id") or res.get("service.name") or "replica")
                if rep in earlier:        # two runs' replica-0: their step ids would overwrite each other
                    rep = mine.setdefault(rep, f"{rep}@{k}:{p.name}")
                tr.resources.setdefault(rep, res)
                for ss in rs.get("scopeSpans") or ():
                    for sp in ss.get("spans") or ():
                        _read_span(tr, rep, sp, where)
    if not tr.steps and not tr.journeys:
        raise ConfigError(str(paths), None, "traces with step.BATCH_SUMMARY or journey events", show_value=False)
    return tr


def _read_span(tr: Traces, rep: str, sp: dict, where: str) -> None:
    span_attrs = None
    for ev in sp.get("events") or ():
        name = str(ev.get("name", "")).rsplit(".", 1)[-1]
        try:
            t = int(ev["timeUnixNano"]) / NS
        except (KeyError, ValueError, TypeError):
            raise ConfigError(f"{where}.events.{ev.get('name')}.timeUnixNano", ev.get("timeUnixNano"),
                              "integer nanoseconds") from None
        a = _kv(ev.get("attributes"))
        if name == "BATCH_SUMMARY":
            sid = a.get("step.id")
            if sid is None or a.get("step.duration_us") is None and a.get("step.ts_end_ns") is None:
                raise ConfigError(f"{where}.step.BATCH_SUMMARY", None, "step.id and a duration", show_value=False)
            tr.steps.setdefault(rep, {}).setdefault(sid, {"summary": None, "snapshots": []})["summary"] = a
        elif name == "REQUEST_SNAPSHOT":
            tr.steps.setdefault(rep, {}).setdefault(a.get("step.id"), {"summary": None, "snapshots": []})[
                "snapshots"].append(a)
        elif name in ("ARRIVED", "HANDOFF_TO_CORE", "FIRST_RESPONSE", "DEPARTED", "QUEUED", "SCHEDULED",
                      "FIRST_TOKEN", "PREEMPTED", "FINISHED"):
            if span_attrs is None:
                span_attrs = _kv(sp.get("attributes"))
            rid = str(span_attrs.get("request.id", sp.get("traceId")))
            j = tr.journeys.setdefault((rep, rid), {"PREEMPTED": [], "attrs": span_attrs})
            if name == "PREEMPTED":
                j["PREEMPTED"].append(t)
            elif name == "SCHEDULED" and "SCHEDULED" in j:
                continue                                  # resumes after preemption: keep the first
            else:
                j[name] = (t, a)
        elif name in ("CacheStoreCommitted", "TransferInitiated", "TransferCompleted", "CacheEvicted"):
            tr.kv_events.append((rep, name, t, a))


def _duration_s(s: dict) -> float:
    if s.get("step.ts_end_ns") is not None and s.get("step.ts_start_ns") is not None:
        return (s["step.ts_end_ns"] - s["step.ts_start_ns"]) / NS
    return s["step.duration_us"] * 1e-6


def shape_from_snapshots(snaps, running: int, preempted: int) -> BatchShape:
    """The exact BatchShape of a step from its rich-mode request snapshots."""
    p_tok = n_pre = pairs = p_ctx = n_dec = d_ctx = samp = sq = 0
    for a in snaps:
        c = int(a["request.scheduled_tokens_this_step"])
        p = int(a["request.num_computed_tokens"])
        if a["request.phase"] == "PREFILL":
            p_tok += c
            n_pre += 1
            sq += c * c
            pairs += c * p + c * (c + 1) // 2
            p_ctx += p
            if p + c >= int(a["request.num_prompt_tokens"]) + int(a.get("request.num_output_tokens") or 0):
                samp += 1
        else:
            n_dec += 1
            d_ctx += p + 1
            samp += 1
    return BatchShape(p_tok, n_pre, pairs, p_ctx, n_dec, d_ctx, samp, sq, running, preempted)


@dataclass
class BetaRow:
    replica: str
    step_id: int
    t_end: float
    duration_s: float
    shape: BatchShape
    rich: bool
    kv_usage: float
    waiting: int


def beta_table(tr: Traces) -> list:
    """One row per traced step, in step order per replica.  Without snapshots the shape is built
    from the summary's counts and has no attention context (``rich`` False)."""
    rows = []
    for rep in sorted(tr.steps):
        for sid in sorted(tr.steps[rep]):
            st = tr.steps[rep][sid]
            s = st["summary"]
            if s is None:
                continue
            running = int(s.get("queue.running_depth", 0))
            pre = int(s.get("batch.num_preempted", 0))
            if st["snapshots"]:
                shape, rich = shape_from_snapshots(st["snapshots"], running, pre), True
            else:
                shape = BatchShape(int(s.get("batch.prefill_tokens", 0)), int(s.get("batch.num_prefill_reqs", 0)),
                                   0, 0, int(s.get("batch.decode_tokens", 0)), 0, 0, 0, running, pre)
                rich = False
            rows.append(BetaRow(rep, sid, s.get("step.ts_end_ns", 0) / NS, _duration_s(s), shape, rich,
                                float(s.get("kv.usage_gpu_ratio", 0.0)), int(s.get("queue.waiting_depth", 0))))
    return rows


@dataclass
class AlphaRow:
    replica: str
    request_id: str
    prompt_tokens: int
    output_tokens: int
    api_delay_s: float          # HANDOFF_TO_CORE (or QUEUED) - ARRIVED
    queue_wait_s: float | None  # SCHEDULED - QUEUED (seed 000's alpha target)
    token_overhead_s: float | None   # FIRST_RESPONSE - FIRST_TOKEN
    departure_s: float | None   # DEPARTED - FINISHED
    running: int                # step state at queue time (last traced step before QUEUED)
    waiting: int
    kv_usage: float
    preemptions: int
    t_arrival: float = 0.0      # ARRIVED (s, the trace's clock)


def alpha_table(tr: Traces, beta: list | None = None) -> list:
    beta = beta_table(tr) if beta is None else beta
    import bisect
    by_rep: dict = {}
    for b in beta:
        by_rep.setdefault(b.replica, []).append(b)
    ends = {k: [b.t_end for b in v] for k, v in by_rep.items()}
    rows = []
    for (rep, rid), j in sorted(tr.journeys.items(), key=lambda kv: (kv[0][0], kv[1].get("ARRIVED", (0,))[0])):
        if "ARRIVED" not in j or ("QUEUED" not in j and "HANDOFF_TO_CORE" not in j):
            continue
        t_arr = j["ARRIVED"][0]
        t_q = (j.get("QUEUED") or j["HANDOFF_TO_CORE"])[0]
        t_h = (j.get("HANDOFF_TO_CORE") or j["QUEUED"])[0]

        def gap(a, b):
            return j[b][0] - j[a][0] if a in j and b in j else None
        prompt = int(j["ARRIVED"][1].get("prefill_total_tokens") or j["attrs"].get("gen_ai.usage.prompt_tokens") or 0)
        out = int(j["attrs"].get("gen_ai.usage.completion_tokens") or 0)
        run = wait = 0
        kv = 0.0
        lst = by_rep.get(rep)
        if lst:
            i = bisect.bisect_right(ends[rep], t_q) - 1
            if i >= 0:
                run, wait, kv = lst[i].shape.running, lst[i].waiting, lst[i].kv_usage
        rows.append(AlphaRow(rep, rid, prompt, out, t_h - t_arr, gap("QUEUED", "SCHEDULED"),
                             gap("FIRST_TOKEN", "FIRST_RESPONSE"), gap("FINISHED", "DEPARTED"), run, wait, kv,
                             len(j["PREEMPTED"]), t_arr))
    return rows
