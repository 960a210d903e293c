"""``latency.tail``: per-step timing noise for any latency model (seed 002 section 3.2, "tail-aware
timing"; Appendix A item 7).

Each step's GPU time is multiplied by a lognormal factor of mean 1, so the model's mean step time
is kept and only its spread is added.  Lognormal because a step time is positive and right-skewed
(a kernel can be delayed, not sped up below its floor), and two numbers pin it: with coefficient
of variation cv, log(factor) ~ N(-s^2/2, s^2) with s^2 = log(1 + cv^2); a p95/mean ratio r gives
s = z95 - sqrt(z95^2 - 2 log r) (the same inversion as a LUT row's latency_p95_ms).

The spread is either given (``{cv: X}`` or ``{p95_over_mean: Y}``, the same for every step) or the
model's own: a LUT's latency_p95_ms column, or for the vidur model the per-shape kernel noise of
its operator profiles (dsim.latency.kernel_noise), a cv that depends on the step's token count.
The factor's normal draw comes from the replica's ``latency.<name>`` stream (seed group
``jitter``), so ``seeds: {jitter: ...}`` varies it alone.  The engine's host costs are added after
the factor, without noise.
"""
from __future__ import annotations

import math

from .base import BatchShape, decode_curve


def sigma_of_cv(cv: float) -> float:
    """sigma of log(factor) for a mean-1 lognormal factor with this coefficient of variation."""
    return math.sqrt(math.log1p(cv * cv))


def sigma_of_p95(ratio: float) -> float:
    """sigma of log(factor) for a mean-1 lognormal factor whose 95th percentile is ``ratio``."""
    from .lut import lognormal_params
    return lognormal_params(1.0, ratio)[1]


def cv_of_sigma(sigma: float) -> float:
    return math.sqrt(math.expm1(sigma * sigma))


class TailStepModel:
    """A step-time model whose every step is x exp(s z - s^2/2), z a standard normal draw.

    ``sigma``: s for every step; or ``cv_of(b, t)``: the step's coefficient of variation from its
    shape b and mean time t (s then follows per step)."""

    pure = False           # each step draws: quiet stretches may not replay steps in one go

    def __init__(self, inner, rng, sigma: float | None = None, cv_of=None):
        if (sigma is None) == (cv_of is None):
            raise ValueError("TailStepModel takes sigma or cv_of")
        self.inner = inner
        self.rng = rng
        self._step = inner.step_time
        self.sigma = sigma
        self._shift = -sigma * sigma / 2 if sigma is not None else 0.0
        self._cv_of = cv_of

    def __getattr__(self, item):          # energy, profile, ... of the wrapped model
        if item in ("inner", "_step"):
            raise AttributeError(item)
        return getattr(self.inner, item)

    def factor(self, b: BatchShape | None = None, t: float = 0.0) -> float:
        z = float(self.rng.standard_normal())
        if self._cv_of is None:
            return math.exp(self.sigma * z + self._shift)
        cv = self._cv_of(b, t)
        if not cv > 0:
            return 1.0
        s = sigma_of_cv(cv)
        return math.exp(s * z - s * s / 2)

    def step_time(self, b: BatchShape) -> float:
        t = self._step(b)
        return t * self.factor(b, t) if t > 0 else t

    def decode_curve(self, n: int, running: int):
        """The mean curve (the factor has mean 1): for estimates read off the model (a pool's
        profile); the simulation itself never replays a stretch of a model that draws (pure False)."""
        return decode_curve(self.inner, n, running)
