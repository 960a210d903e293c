"""Admission control at the gateway: decide, after routing, whether a request enters the fleet.

A rejected request is kept, marked ``rejected`` with the policy's reason, and counted in the
report; nothing is dropped silently.
"""
from __future__ import annotations

from ..config.errors import ConfigError


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


def build_admission(spec, path: str, slo_ttft_ms):
    """The policy of a typed ``schema.cluster.AdmissionField`` (None: admit everything);
    ``slo_guard`` without ``ttft_ms`` takes the scenario's ``slo.ttft_ms``."""
    if spec is None or spec.policy == "always":
        return Always()
    if spec.policy == "token_bucket":
        return TokenBucket(spec.rate, spec.burst if spec.burst is not None else max(1.0, spec.rate))
    if spec.policy == "queue_cap":
        return QueueCap(spec.max_waiting)
    ttft = spec.ttft_ms if spec.ttft_ms is not None else slo_ttft_ms
    if ttft is None:
        raise ConfigError(f"{path}.ttft_ms", None, "this key to be set (the scenario has no slo.ttft_ms)",
                          show_value=False)
    return SLOGuard(ttft)
