"""Blackbox linear step time (BLIS): step = b0 + b1 x prefill tokens + b2 x decode tokens."""
from __future__ import annotations

from .base import BatchShape


class BlackboxModel:

    pure = True          # step_time keeps no state: quiet decode steps may be replayed in one go
    name = "blackbox"

    def __init__(self, b0_us: float, b1_us: float, b2_us: float):
        self.b0, self.b1, self.b2 = b0_us * 1e-6, b1_us * 1e-6, b2_us * 1e-6

    def step_time(self, b: BatchShape) -> float:
        if b.prefill_tokens + b.decode_tokens == 0:
            return 0.0
        return self.b0 + self.b1 * b.prefill_tokens + self.b2 * b.decode_tokens
