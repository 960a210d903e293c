"""The ``speculation.gamma`` policies (declared schema; see dsim.config.schema.base for the rules).

One member per ``policy``, each with the parameters of its dsim.specdec.gamma class and the same
defaults (only the keys a scenario writes reach the class, tests/test_schema_speculation.py checks
that the documented defaults are the class's).
"""
from __future__ import annotations

import math
from typing import Any, Literal

from ..errors import ConfigError
from ..limits import MAX_SPEC_K
from .base import Float, Int, Section, Str, Tagged, checked, field_validator, is_number, model_validator

def check_finite(v, where: str = "") -> None:
    """Every number of a (nested) list finite: a NaN bias made every latency-head decision NaN,
    clamped to k_max without a word.  ``where`` prefixes the path of the bad number."""
    if isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            check_finite(x, f"{where}[{i}]")
    elif not is_number(v) or not math.isfinite(v):
        raise ConfigError(where, v, "a finite number")


def _finite(v):
    check_finite(v)
    return v


Numbers = checked(Any, _finite, {"anyOf": [{"type": "number"}, {"type": "array"}]})


K = Int(1, MAX_SPEC_K)
"""A speculation length (drafts per round)."""


class _KRange(Section):
    k_min: K = 1
    """Smallest k the policy may choose."""
    k_max: K = 8
    """Largest k the policy may choose."""

    @model_validator(mode="after")
    def _ordered(self):
        if self.k_min > self.k_max:
            raise ConfigError("k_min", self.k_min, f"a number <= k_max ({self.k_max})")
        return self


class StaticGamma(Section):
    """The same k every round."""
    policy: Literal["static"] = "static"
    """Gamma policy: static | acceptance_backoff | specpp | latency_head | backpressure | pid | bandit."""
    k: K = 4
    """Drafts per round."""


class AcceptanceBackoffGamma(_KRange):
    """AIMD per conversation: all drafts accepted -> k + 1; fewer than half -> k halved."""
    policy: Literal["acceptance_backoff"]
    """Gamma policy (see static)."""
    k0: K = 4
    """k of a conversation's first round."""


class SpecPPGamma(_KRange):
    """SpecDec++-style stopping: draft while the predicted chance that a draft so far is rejected
    stays at or below ``threshold`` (reads the top-level acceptance model)."""
    policy: Literal["specpp"]
    """Gamma policy (see static)."""
    threshold: Float(0, 1, lo_open=True) = 0.7
    """Stop drafting once P(some draft rejected) would exceed this, in (0, 1)."""

    @field_validator("threshold")
    @classmethod
    def _open(cls, v):
        if v >= 1:
            raise ConfigError("", v, "a number in (0, 1)")
        return v


class LatencyHeadGamma(Section):
    """A trained head (seed 002 6.4.1) over TPOT/RTT history picks k and fused vs distributed per
    round.  Keys left unset come from ``head`` (or, with neither a file nor weights, from the shipped
    head); keys written here override the file's."""
    policy: Literal["latency_head"]
    """Gamma policy (see static)."""
    head: Str | None = None
    """Head file written by ``dsim specdec train-head``, relative to the scenario (None: weights
    below, else the shipped head)."""
    weights: Numbers | None = None
    """Output weights: one per feature (9), or per hidden unit (None: the head file's)."""
    bias: Float() | None = None
    """Output bias (None: the head file's, else 0)."""
    hidden: Numbers | None = None
    """Hidden layer [weights (units x 9), biases (units)] (unset: the head file's; null: a linear head)."""
    residual: Numbers | None = None
    """Residual block around the hidden layer, y = x + V SiLU(W x + c): V as 9 rows of one weight per
    hidden unit, and weights then has 9 entries (None: the head file's, else no block)."""
    k_max: K | None = None
    """Largest k (None: the head file's, else 8)."""
    smoothing: Float() | None = None
    """EWMA weight of a new prediction, 1 = no smoothing (None: the head file's, else 1)."""
    fused_below: Float() | None = None
    """A smoothed prediction at or below this drafts fused (None: the head file's, else 1.5)."""
    default_k: K = 4
    """k until the history holds two rounds."""
    history: Int(0) = 3
    """Rounds of (TPOT, RTT, k, SLO hit) history the features are computed from."""
    fused_k: K | None = None
    """Drafts per fused round (None: the head file's, else 1)."""
    queue_capacity: Float(0, lo_open=True) = 64
    """Verify-queue length that the queue-utilisation feature divides by, requests."""


class BackpressureGamma(_KRange):
    """Per target: shrink k when the verify queue or KV use is high, grow it when the queue is
    short and acceptance is high."""
    policy: Literal["backpressure"]
    """Gamma policy (see static)."""
    k0: K = 4
    """Starting k."""
    queue_high: Float() = 16
    """Verify queue above this (requests) shrinks k by one."""
    queue_low: Float() = 4
    """Verify queue below this (requests) may grow k by one."""
    kv_high: Float() = 0.9
    """KV use above this fraction shrinks k by one."""
    confident: Float() = 0.6
    """Smoothed acceptance at least this lets k grow."""


class PIDGamma(_KRange):
    """Per target: k = round(k0 + Kp e + Ki sum e + Kd de), e = target_queue - verify queue."""
    policy: Literal["pid"]
    """Gamma policy (see static)."""
    k0: K = 4
    """k at zero error."""
    target_queue: Float() = 8.0
    """Verify-queue length the controller steers to, requests."""
    kp: Float() = 0.25
    """Proportional gain, k per queued request."""
    ki: Float() = 0.02
    """Integral gain."""
    kd: Float() = 0.0
    """Derivative gain."""


class BanditGamma(_KRange):
    """Per target: UCB1 over k_min..k_max, rewarded by tokens per second of a round."""
    policy: Literal["bandit"]
    """Gamma policy (see static)."""
    c: Float() = 1.0
    """Exploration weight."""


GAMMA = {"static": StaticGamma, "acceptance_backoff": AcceptanceBackoffGamma, "specpp": SpecPPGamma,
         "latency_head": LatencyHeadGamma, "backpressure": BackpressureGamma, "pid": PIDGamma,
         "bandit": BanditGamma}
GammaField = Tagged("policy", GAMMA, default="static")
