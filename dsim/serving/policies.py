"""Scheduling policies: the order in which a replica admits waiting requests and, under KV
pressure, the order in which it gives running ones up.

Every policy is one method, ``key(request) -> tuple``: lower keys are admitted first and preempted
last.  The key is computed once, when the request enters a replica's waiting queue, so a policy
whose order drifts with time has to say it as a fixed key (``age_weighted`` can: see its class).
FCFS has no key: the replica keeps its deque and its O(1) decode path untouched.

- ``priority`` mirrors vLLM's ``--scheduling-policy priority`` (``vllm/v1/core/sched``: the waiting
  queue is a heap on (priority, arrival time); under KV pressure the running request with the
  largest (priority, arrival) is preempted).
- ``edf`` and ``age_weighted`` are dsim research policies (seed 002 section 6 names EDF /
  least-slack-first and age-based queues), not vLLM features.
"""
from __future__ import annotations

import math

from ..latency.base import BatchShape


class SchedulingPolicy:
    """Order of service: ``key(r)`` sorts lower first (admitted first, preempted last)."""

    name = ""

    def key(self, r) -> tuple:
        raise NotImplementedError


class Priority(SchedulingPolicy):
    """vLLM's priority policy: lower ``priority`` first, then earlier arrival."""

    name = "priority"

    def key(self, r) -> tuple:
        return (r.priority, r.arrival, r.rid)


class LeastSlack(SchedulingPolicy):
    """EDF on the TTFT deadline, less the time the prompt's prefill needs: least slack first.

    Slack at time t is ``arrival + ttft_slo - t - prefill_time``; t is common to every queued
    request, so ordering by ``arrival + ttft_slo - prefill_time`` is ordering by slack, at any t.
    The prefill time is the replica's own step-time model on the prompt alone, in chunks of
    ``max_num_batched_tokens`` (no prefix-cache hit assumed).  A request without a TTFT target has
    an infinite deadline: served after every request that has one, in arrival order."""

    name = "edf"

    def __init__(self, step_model, chunk: int):
        self.step_model = step_model
        self.chunk = chunk
        self._prefill: dict = {}

    def prefill_s(self, n: int) -> float:
        t = self._prefill.get(n)
        if t is None:
            t, done = 0.0, 0
            while done < n:
                c = min(self.chunk, n - done)
                t += self.step_model.step_time(BatchShape(
                    prefill_tokens=c, num_prefill=1, prefill_attn_pairs=c * done + c * (c + 1) // 2,
                    prefill_ctx_tokens=done, num_sampled=1 if done + c == n else 0, prefill_chunk_sq=c * c,
                    running=1))
                done += c
            self._prefill[n] = t
        return t

    def key(self, r) -> tuple:
        if r.ttft_slo_ms is None:
            return (math.inf, r.arrival, r.rid)
        return (r.arrival + r.ttft_slo_ms / 1e3 - self.prefill_s(r.prompt_len), r.arrival, r.rid)


class AgeWeighted(SchedulingPolicy):
    """Priority that improves as a request waits: effective priority ``priority - w x waited_s``.

    At time t that is ``priority + w x arrival - w x t``; the last term is common to every queued
    request, so the order is that of the fixed key ``priority + w x arrival``.  ``w`` (priority
    units per second, ``engine.age_weight``) trades class protection against starvation: a
    request of priority p + 1 overtakes one of priority p that arrived more than 1/w seconds later.
    """

    name = "age_weighted"

    def __init__(self, weight: float):
        self.weight = weight

    def key(self, r) -> tuple:
        return (r.priority + self.weight * r.arrival, r.arrival, r.rid)


def make_policy(engine, step_model) -> SchedulingPolicy | None:
    """The engine's policy object, or None for FCFS."""
    name = engine.scheduling_policy
    if name == "priority":
        return Priority()
    if name == "edf":
        return LeastSlack(step_model, engine.max_num_batched_tokens)
    if name == "age_weighted":
        return AgeWeighted(engine.age_weight)
    return None
