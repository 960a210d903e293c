"""``latency.scale``: every step of a replica takes ``scale`` times what its latency model says.

Why: an answer's error band (dsim.metrics.band) says the real engine may be a few per cent faster
or slower than the model; a capacity search or a plan asks what the deployment sustains at either
end of that band. Scaling the whole step (GPU and host time) and simulating again, rather than
scaling the answer's latencies afterwards, keeps the queueing that a slower engine builds up.
It is also the plain what-if "this GPU is 10 % slower than its datasheet".
"""
from __future__ import annotations

from .base import BatchShape, decode_curve


class ScaledStepModel:
    """A step-time model whose every step is multiplied by ``scale`` (> 0)."""

    def __init__(self, inner, scale: float):
        self.inner = inner
        self.scale = float(scale)
        self._step = inner.step_time

    def __getattr__(self, item):          # energy, basis, pure, ... of the wrapped model
        if item in ("inner", "_step"):
            raise AttributeError(item)
        return getattr(self.inner, item)

    def step_time(self, b: BatchShape) -> float:
        return self._step(b) * self.scale

    def decode_curve(self, n: int, running: int):
        curve, k = decode_curve(self.inner, n, running), self.scale
        return lambda ctx: curve(ctx) * k
