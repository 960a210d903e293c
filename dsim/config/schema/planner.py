"""The online planner's section (``cluster.controllers: [{type: planner, ...}]``): docs/planner.md.

Its own module because it is a concern of its own (cadence, triggers, candidate space, objective,
hysteresis) and cluster.py holds the fleet's shape.
"""
from __future__ import annotations

from typing import Literal

from ..errors import ConfigError
from ..limits import MAX_REPLICAS, MIN_TIMER_S
from .base import Bool, Choice, Float, Int, Section, field_validator, model_validator


class PlannerPoolSpace(Section):
    """What the planner may choose for one pool (each key: the values to try besides the current
    one; unset: keep as is)."""
    replicas: list[Int(1, MAX_REPLICAS)] | None = None
    """Replica counts to try (None: every count from min_replicas to max_replicas when the pool
    sets max_replicas, else the current count and ``step`` either side)."""
    max_num_seqs: list[Int(1)] | None = None
    """engine.max_num_seqs values to try (None: keep the pool's)."""
    max_num_batched_tokens: list[Int(1)] | None = None
    """engine.max_num_batched_tokens values to try (None: keep the pool's)."""
    speculation_k: list[Int(0, 64)] | None = None
    """Drafts per speculative round to try for the pool's conversations (None: keep; needs a
    speculation section and forecast: oracle)."""
    speculation_mode: list[Choice("off", "fused", "distributed")] | None = None
    """Speculative decoding modes to try for the pool (None: keep the selector's)."""

    @field_validator("replicas", "max_num_seqs", "max_num_batched_tokens", "speculation_k", mode="after")
    @classmethod
    def _non_empty(cls, v):
        if v is not None and not v:
            raise ConfigError("", v, "a non-empty list of values")
        return v if v is None else sorted(set(v))


class PlannerConfig(Section):
    """Plan inside the run: on a cadence (or a trigger) fork the running simulation once per
    candidate configuration, simulate each for ``horizon_s``, apply the cheapest candidate that
    meets the objective; or (kind: interpolate) scale as Dynamo's planner does (docs/planner.md)."""
    type: Literal["planner"]
    """The controller."""
    kind: Choice("simulate", "interpolate") = "simulate"
    """simulate: forecast each candidate by forking the run; interpolate: the Dynamo-style baseline
    (predicted load over capacities read off profiled tables, with correction factors)."""
    predictor: Choice("constant", "arima") = "constant"
    """interpolate: the load predictor of the next interval's request count and lengths (arima
    needs statsmodels)."""
    correction: Bool = True
    """interpolate: scale the profiled capacities by observed / expected TTFT and ITL."""
    cadence_s: Float(MIN_TIMER_S) = 30.0
    """Seconds between planning ticks."""
    horizon_s: Float(MIN_TIMER_S) | None = None
    """Simulated seconds each candidate is forecast over (None: cadence_s plus the slowest pool's
    cold start, so that a scale-out's new replica is ready within the forecast)."""
    forecast: Choice("trend", "recent", "oracle") = "trend"
    """Arrivals during a forecast: trend (the last horizon_s of arrivals replayed at the rate a
    linear extrapolation of the last two horizons gives), recent (replayed as they came), or
    oracle (the run's true next arrivals: an upper bound no real planner has)."""
    pools: dict[str, PlannerPoolSpace] = {}
    """The candidate space by pool name (a pool not listed: its replica counts as PlannerPoolSpace.replicas
    says for None, its engine knobs kept)."""
    step: Int(1) = 1
    """Replica step of the default space of a pool without max_replicas (current - step, current,
    current + step)."""
    max_candidates: Int(1, 4096) = 27
    """Most candidates a tick forecasts (the nearest to the current configuration first)."""
    min_attainment: Float(0, 1) = 0.95
    """Objective constraint: share of judged requests meeting their SLO."""
    max_ttft_p99_ms: Float(0, lo_open=True) | None = None
    """Objective constraint: p99 TTFT of the judged requests, ms (None: no bound)."""
    max_fairness_gap: Float(0, 1) | None = None
    """Objective constraint: highest minus lowest SLO attainment among tenants with at least 10
    judged requests (None: no bound)."""
    cost: Choice("gpus", "usd") = "gpus"
    """What the objective minimises among feasible candidates: GPUs, or dollars per hour (each
    pool's GPUs x its device's usd_per_gpu_hour: a mixed fleet's GPUs are not worth the same)."""
    min_dwell_s: Float(0) | None = None
    """Hysteresis: seconds after a change before the next change (None: cadence_s)."""
    trigger_waiting: Float(0, lo_open=True) | None = None
    """Plan early when a pool's waiting requests per ready replica exceed this (None: off)."""
    trigger_busy_swing: Float(0, 1, lo_open=True) | None = None
    """Plan early when a pool's busy fraction moved by more than this since the last tick (None: off)."""
    trigger_acceptance_drop: Float(0, 1, lo_open=True) | None = None
    """Plan early when a speculative pool's acceptance rate over the last check fell by more than
    this below the rate over the check before the last tick (None: off)."""
    trigger_check_s: Float(MIN_TIMER_S) = 1.0
    """Seconds between trigger checks (with a trigger set)."""
    jobs: Int(1, 64) = 2
    """Forecasts run at once (forked processes)."""

    @model_validator(mode="after")
    def _horizon(self):
        if self.trigger_check_s > self.cadence_s:
            raise ConfigError("trigger_check_s", self.trigger_check_s, f"<= cadence_s ({self.cadence_s})")
        return self

    @property
    def interval_s(self) -> float:
        """How often the planner's process wakes (a trigger check, or a tick)."""
        triggers = (self.trigger_waiting is not None or self.trigger_busy_swing is not None
                    or self.trigger_acceptance_drop is not None)
        return self.trigger_check_s if triggers else self.cadence_s
