"""vLLM's three tracing streams (seed 000 sections 1-3) as dsim writes them: the recorder an
Instance carries while it runs (``StepRecorder``) and the OTLP JSON writer (``write_otlp``).
Reading trace files back, and the training tables built from them, is ``dsim.calibrate.vllm_traces``.

Written as OTLP JSON, the OpenTelemetry collector's file-exporter layout: one ``{"resourceSpans": [...]}``
object a line.  Each replica is a resource (``service.name``, ``dsim.replica``, and the model,
hardware and TP it ran); its spans are grouped by instrumentation scope:
  * ``vllm.api``: one ``llm_request`` span per request, events ARRIVED, HANDOFF_TO_CORE,
    FIRST_RESPONSE, DEPARTED;
  * ``vllm.scheduler``: one ``llm_core`` span per request, events QUEUED, SCHEDULED, FIRST_TOKEN,
    PREEMPTED, FINISHED, with phase / progress attributes (SCHEDULED's ``schedule.kind`` is FIRST,
    or RESUME when a preempted request is scheduled again: re-admitted after a recompute
    preemption, phase PREFILL, or swapped back in, phase DECODE when it continues decoding);
  * ``vllm.scheduler.step``: one ``scheduler_step`` span per sampled step carrying a
    ``step.BATCH_SUMMARY`` event and, in rich mode, one ``step.REQUEST_SNAPSHOT`` per scheduled request;
  * ``vllm.kv_connector`` (replicas with ``engine.kv_offload``): one span per CPU-tier copy with
    TransferInitiated / TransferCompleted (and CacheStoreCommitted for stores), and CacheEvicted
    for host blocks dropped.
Timestamps are integer nanoseconds from the start of the simulation.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..latency.base import BatchShape

NS = 1_000_000_000


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
        resumes = r.resume_times
        for i, t in enumerate(r.preempt_times):
            c_ev.append(_event("journey.PREEMPTED", t, {"num_preemptions": i + 1}))
            if i < len(resumes):     # scheduled again: vLLM's SCHEDULED with schedule.kind RESUME
                c_ev.append(_event("journey.SCHEDULED", resumes[i][0], {"phase": resumes[i][1],
                                                                        "schedule.kind": "RESUME"}))
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
