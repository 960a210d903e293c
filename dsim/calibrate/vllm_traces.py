"""vLLM's three tracing streams (seed 000 sections 1-3), written by dsim and read back.

Written as OTLP JSON, the OpenTelemetry collector's file-exporter layout: one ``{"resourceSpans": [...]}``
object a line.  Each replica is a resource (``service.name``, ``dsim.replica``, and the model,
hardware and TP it ran); its spans are grouped by instrumentation scope:
  * ``vllm.api``: one ``llm_request`` span per request, events ARRIVED, HANDOFF_TO_CORE,
    FIRST_RESPONSE, DEPARTED;
  * ``vllm.scheduler``: one ``llm_core`` span per request, events QUEUED, SCHEDULED, FIRST_TOKEN,
    PREEMPTED, FINISHED, with phase / progress attributes;
  * ``vllm.scheduler.step``: one ``scheduler_step`` span per sampled step carrying a
    ``step.BATCH_SUMMARY`` event and, in rich mode, one ``step.REQUEST_SNAPSHOT`` per scheduled request;
  * ``vllm.kv_connector`` (replicas with ``engine.kv_offload``): one span per CPU-tier copy with
    TransferInitiated / TransferCompleted (and CacheStoreCommitted for stores), and CacheEvicted
    for host blocks dropped.
Timestamps are integer nanoseconds from the start of the simulation.

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

NS = 1_000_000_000


# ---- writing ---------------------------------------------------------------------------------------
class StepRecorder:
    """Attached to an Instance (``inst.tracer``): records sampled steps, rich snapshots optional.

    Sampling draws from its own RNG stream, so tracing never changes a run's results."""

    def __init__(self, step_rate: float = 1.0, rich_rate: float = 1.0, rng=None):
        self.step_rate, self.rich_rate, self.rng = step_rate, rich_rate, rng
        self.steps: list = []
        self.step_id = 0
        self.kv_events = None        # the replica's CPU-tier transfers (dsim.serving.offload), if any

    def before(self, inst, prefills, skipped, shape: BatchShape):
        self.step_id += 1
        if self.step_rate < 1.0 and self.rng.random() >= self.step_rate:
            return None
        rich = self.rich_rate >= 1.0 or self.rng.random() < self.rich_rate
        snaps = None
        if rich:
            bs = inst.bs
            snaps = [(r.rid, "PREFILL", r.prompt_len, r.num_computed, r.num_tokens - r.prompt_len,
                      len(r.preempt_times), c, -(-(r.num_computed + c) // bs), r.cached_tokens)
                     for r, c in prefills]
            skip = {r.rid for r in skipped}
            D = inst.D
            for r in inst.running.values():
                if not r.prefilling and r.rid not in skip:
                    comp = r.c0 + D - r.d0
                    snaps.append((r.rid, "DECODE", r.prompt_len, comp, comp - r.prompt_len + 1,
                                  len(r.preempt_times), 1, -(-(comp + 1) // bs), r.cached_tokens))
        return (self.step_id, shape, len(inst.waiting), snaps)

    def after(self, inst, snap, t0: float, t1: float, n_finished: int) -> None:
        sid, shape, waiting, snaps = snap
        self.steps.append((sid, t0, t1, shape, shape.running, waiting, n_finished,
                           inst.kv.total - inst.kv.free_count, inst.kv.total, inst.bs, snaps))


def _attr(k, v):
    if isinstance(v, bool):
        return {"key": k, "value": {"boolValue": v}}
    if isinstance(v, int):
        return {"key": k, "value": {"intValue": str(v)}}
    if isinstance(v, float):
        return {"key": k, "value": {"doubleValue": v}}
    return {"key": k, "value": {"stringValue": str(v)}}


def _attrs(d: dict) -> list:
    return [_attr(k, v) for k, v in d.items()]


def _ns(t: float) -> str:
    return str(int(round(t * NS)))


def _event(name: str, t: float, attrs: dict) -> dict:
    return {"name": name, "timeUnixNano": _ns(t), "attributes": _attrs(attrs)}


def _span(trace_id: int, span_id: int, name: str, t0: float, t1: float, attrs: dict, events: list) -> dict:
    return {"traceId": f"{trace_id:032x}", "spanId": f"{span_id:016x}", "name": name,
            "startTimeUnixNano": _ns(t0), "endTimeUnixNano": _ns(t1), "attributes": _attrs(attrs), "events": events}


def _step_spans(rec: StepRecorder, base_id: int) -> list:
    spans = []
    for sid, t0, t1, b, running, waiting, fin, used, total, bs, snaps in rec.steps:
        ev = [_event("step.BATCH_SUMMARY", t1, {
            "step.id": sid, "step.ts_start_ns": int(round(t0 * NS)), "step.ts_end_ns": int(round(t1 * NS)),
            "step.duration_us": int(round((t1 - t0) * 1e6)),
            "queue.running_depth": running, "queue.waiting_depth": waiting,
            "batch.num_prefill_reqs": b.num_prefill, "batch.num_decode_reqs": b.decode_tokens,
            "batch.scheduled_tokens": b.prefill_tokens + b.decode_tokens,
            "batch.prefill_tokens": b.prefill_tokens, "batch.decode_tokens": b.decode_tokens,
            "batch.num_finished": fin, "batch.num_preempted": b.num_preempted,
            "kv.usage_gpu_ratio": used / total if total else 0.0,
            "kv.blocks_total_gpu": total, "kv.blocks_free_gpu": total - used,
            "step.rich": snaps is not None})]
        for rid, phase, prompt, comp, out, pre, sched, alloc, cached in snaps or ():
            ev.append(_event("step.REQUEST_SNAPSHOT", t1, {
                "step.id": sid, "request.id": str(rid), "request.phase": phase,
                "request.num_prompt_tokens": prompt, "request.num_computed_tokens": comp,
                "request.num_output_tokens": out, "request.num_preemptions": pre,
                "request.scheduled_tokens_this_step": sched, "kv.blocks_allocated_gpu": alloc,
                "kv.blocks_cached_gpu": cached // bs, "request.effective_prompt_len": prompt - cached}))
        spans.append(_span(base_id, base_id + sid, "scheduler_step", t0, t1, {"step.id": sid}, ev))
    return spans


def _kv_spans(events, base_id: int) -> list:
    """One ``kv_transfer`` span per CPU-tier copy: TransferInitiated and TransferCompleted (and
    CacheStoreCommitted for stores to host memory); host evictions are ``CacheEvicted`` events."""
    spans = []
    for i, (direction, t0, t1, blocks, rid) in enumerate(events):
        attrs = {"kv.num_blocks": blocks}
        if direction == "evict":
            spans.append(_span(base_id + i, base_id + i, "kv_evict", t0, t1, {"kv.medium": "CPU"},
                               [_event("kv.CacheEvicted", t0, attrs)]))
            continue
        attrs["kv.direction"] = direction
        if rid:
            attrs["request.id"] = rid
        ev = [_event("kv.TransferInitiated", t0, attrs), _event("kv.TransferCompleted", t1, attrs)]
        if direction == "gpu_to_cpu":
            ev.append(_event("kv.CacheStoreCommitted", t1, attrs))
        spans.append(_span(base_id + i, base_id + i, "kv_transfer", t0, t1, {"kv.direction": direction}, ev))
    return spans


def _journey_spans(reqs, tok_over: float) -> tuple[list, list]:
    api, core = [], []
    for r in reqs:
        if r.t_queued is None:
            continue
        tid = r.rid + 1
        a_ev = [_event("journey.ARRIVED", r.arrival, {"prefill_total_tokens": r.prompt_len}),
                _event("journey.HANDOFF_TO_CORE", r.t_queued, {})]
        c_ev = [_event("journey.QUEUED", r.t_queued, {"phase": "WAITING", "prefill_total_tokens": r.prompt_len,
                                                      "decode_max_tokens": r.max_tokens})]
        if r.t_scheduled is not None:
            c_ev.append(_event("journey.SCHEDULED", r.t_scheduled, {"phase": "PREFILL", "schedule.kind": "FIRST"}))
        for i, t in enumerate(r.preempt_times):
            c_ev.append(_event("journey.PREEMPTED", t, {"num_preemptions": i + 1}))
        end = r.t_queued
        if r.t_first_token is not None:
            c_ev.append(_event("journey.FIRST_TOKEN", r.t_first_token - tok_over, {"phase": "DECODE",
                               "prefill_done_tokens": r.prompt_len, "prefill_total_tokens": r.prompt_len}))
            a_ev.append(_event("journey.FIRST_RESPONSE", r.t_first_token, {}))
        if r.t_completion is not None:
            c_ev.append(_event("journey.FINISHED", r.t_last_token - tok_over, {
                "finish.status": "length", "decode_done_tokens": r.n_out, "decode_max_tokens": r.max_tokens,
                "num_preemptions": len(r.preempt_times)}))
            a_ev.append(_event("journey.DEPARTED", r.t_completion, {}))
            end = r.t_completion
        attrs = {"request.id": str(r.rid), "gen_ai.usage.prompt_tokens": r.prompt_len,
                 "gen_ai.usage.completion_tokens": r.n_out}
        api.append(_span(tid, 2 * tid, "llm_request", r.arrival, end, attrs, a_ev))
        core.append(_span(tid, 2 * tid + 1, "llm_core", r.t_queued, end, attrs, c_ev))
    return api, core


def write_otlp(path: Path, replicas, reqs) -> None:
    """``replicas``: (name, resource attributes, StepRecorder, token overhead s) per replica."""
    lines = []
    by_rep: dict = {}
    for r in reqs:
        by_rep.setdefault(r.replica, []).append(r)
    for k, (name, res_attrs, rec, tok_over) in enumerate(replicas):
        api, core = _journey_spans(by_rep.get(name, ()), tok_over)
        resource = {"attributes": _attrs({"service.name": "dsim", "dsim.replica": name, **res_attrs})}
        steps = _step_spans(rec, (k + 1) << 40)
        scopes = [("vllm.api", api), ("vllm.scheduler", core)]
        if rec.kv_events:
            scopes.append(("vllm.kv_connector", _kv_spans(rec.kv_events, (k + 1) << 44)))
        chunk = 2000
        for i in range(0, max(len(steps), 1), chunk):
            scopes.append(("vllm.scheduler.step", steps[i:i + chunk]))
        for scope, spans in scopes:
            if spans:
                lines.append(json.dumps({"resourceSpans": [{"resource": resource, "scopeSpans": [
                    {"scope": {"name": scope}, "spans": spans}]}]}, separators=(",", ":")))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)


# ---- reading ---------------------------------------------------------------------------------------
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
    for path in [paths] if isinstance(paths, (str, Path)) else paths:
        p = Path(path)
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
                             len(j["PREEMPTED"])))
    return rows
