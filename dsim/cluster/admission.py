"""Admission control at the gateway: decide, after routing, whether a request enters the fleet.

A rejected request is kept, marked ``rejected`` with the policy's reason, and counted in the
report; nothing is dropped silently.
"""
from __future__ import annotations

from ..config.fields import Section


class Always:
    name = "always"

    def reject(self, request, view, now: float):
        return None


class TokenBucket:
    """``rate`` requests/s refill a bucket of ``burst`` requests; a request takes one token."""
    name = "token_bucket"

    def __init__(self, rate: float, burst: float):
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.t = 0.0

    def reject(self, request, view, now: float):
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1.0 - 1e-9:      # arrival times are float sums: allow rounding
            self.tokens -= 1.0
            return None
        return "admission:token_bucket"


class QueueCap:
    """Reject when the chosen replica already has ``max_waiting`` requests waiting."""
    name = "queue_cap"

    def __init__(self, max_waiting: int):
        self.max_waiting = max_waiting

    def reject(self, request, view, now: float):
        return "admission:queue_cap" if view.waiting >= self.max_waiting else None


class SLOGuard:
    """Reject when the predicted TTFT on the chosen replica exceeds ``ttft_ms``.

    Prediction: the prompt tokens queued ahead (waiting, plus the unfinished prompts of running
    requests) and this prompt, divided by the replica's prefill rate (a full token budget per
    step, timed by its latency model), plus one step.
    """
    name = "slo_guard"

    def __init__(self, ttft_ms: float):
        self.ttft_s = ttft_ms / 1e3

    def reject(self, request, view, now: float):
        pred = view.predict_ttft(request)
        return "admission:slo_guard" if pred > self.ttft_s else None


POLICIES = ("always", "token_bucket", "queue_cap", "slo_guard")


def build_admission(raw, path: str, slo_ttft_ms):
    if raw is None:
        return Always()
    if isinstance(raw, str):
        raw = {"policy": raw}
    s = Section(raw, path)
    kind = s.str("policy", choices=POLICIES)
    if kind == "always":
        a = Always()
    elif kind == "token_bucket":
        rate = s.num("rate", lo=0, lo_open=True)
        a = TokenBucket(rate, s.num("burst", max(1.0, rate), lo=1))
    elif kind == "queue_cap":
        a = QueueCap(s.int("max_waiting", lo=0))
    else:
        ttft = s.num("ttft_ms", slo_ttft_ms, lo=0, lo_open=True)
        if ttft is None:
            s.raw("ttft_ms")       # raises: required when the scenario has no slo.ttft_ms
        a = SLOGuard(ttft)
    s.done()
    return a
