"""The ``workload``: section of a scenario (declared schema; see dsim.config.schema.base for the rules).

What arrives, chosen by ``type``: a generated arrival process (poisson, gamma, constant, burst,
ramp, staged) with prompt and output length distributions and an optional shared prefix; a
recorded trace; or a mix of tenants, each itself a workload of any type but mix.  The builders
in ``dsim/workload/`` receive these objects; what depends on data (a trace's rows, an empirical
length file) is still checked by them.
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from ..errors import ConfigError
from ..fields import check_number
from ..limits import MAX_CV, MAX_GROUPS, MAX_REQUESTS, MAX_TIME_S, MAX_TOKENS, MIN_CV, expected_count
from .base import (BeforeValidator, Bool, Choice, Discriminator, Float, Int, Section, Str, Tag, Tagged,
                   TypeAdapter, ValidationError, checked, field_validator, is_number, model_validator,
                   translate)

# ---- token lengths ---------------------------------------------------------------------------


class _Dist(Section):
    """Clipping bounds every length distribution has."""
    min: Int(1, MAX_TOKENS) = 1
    """Smallest length, tokens: samples below it are raised to it."""
    max: Int(1, MAX_TOKENS) | None = None
    """Largest length, tokens: samples above it are lowered to it (None: no clipping)."""

    @model_validator(mode="after")
    def _max_at_least_min(self):
        if self.max is not None and self.max < self.min:
            raise ConfigError("max", self.max, f"a number >= {self.min}")
        return self


class ConstantLength(_Dist):
    """Every request has the same length."""
    dist: Literal["constant"]
    """The distribution."""
    value: Int(1, MAX_TOKENS)
    """The length, tokens."""


class UniformLength(_Dist):
    """Integers drawn uniformly from [low, high]."""
    dist: Literal["uniform"]
    """The distribution."""
    low: Int(hi=MAX_TOKENS) | None = None
    """Smallest drawn length, tokens (None: ``min``)."""
    high: Int(hi=MAX_TOKENS) | None = None
    """Largest drawn length, tokens, >= low (None: ``max``, which must then be set)."""

    @model_validator(mode="after")
    def _range(self):
        low, high = self.bounds
        if high is None:
            raise ConfigError("high", None, "this key to be set", show_value=False)
        if high < low:
            raise ConfigError("high", high, f"a number >= {low}")
        return self

    @property
    def bounds(self) -> tuple:
        """(low, high) with the defaults resolved from min and max."""
        return (self.min if self.low is None else self.low), (self.max if self.high is None else self.high)


class NormalLength(_Dist):
    """A normal distribution rounded to integers (then clipped to [min, max])."""
    dist: Literal["normal"]
    """The distribution."""
    mean: Float(0, MAX_TOKENS)
    """Mean length, tokens."""
    std: Float(0, MAX_TOKENS)
    """Standard deviation, tokens."""


class LognormalLength(_Dist):
    """A lognormal distribution with this mean and standard deviation (of the lengths, not their logs)."""
    dist: Literal["lognormal"]
    """The distribution."""
    mean: Float(1e-3, MAX_TOKENS)
    """Mean length, tokens."""
    std: Float(0, MAX_TOKENS, lo_open=True)
    """Standard deviation, tokens."""


class EmpiricalLength(_Dist):
    """Lengths resampled from a file: one positive integer per line, or a named column of a CSV."""
    dist: Literal["empirical"]
    """The distribution."""
    path: Str
    """The file of lengths (relative to the scenario's folder)."""
    column: Str | None = None
    """The CSV column holding the lengths (None: the file has one length per line, no header)."""


def _tagged(key: str, members: dict):
    """``Tagged(key, members)``, refusing a tag that is not a string with today's message (a list or
    mapping there made Tagged's member lookup raise TypeError, an internal error)."""
    def tag_is_a_string(v):
        if isinstance(v, dict) and key in v and not isinstance(v[key], str):
            raise ConfigError(key, v[key], "a string")
        return v
    return Annotated[Tagged(key, members), BeforeValidator(tag_is_a_string)]


LengthDist = _tagged("dist", {"constant": ConstantLength, "uniform": UniformLength, "normal": NormalLength,
                              "lognormal": LognormalLength, "empirical": EmpiricalLength})


def _fixed_length(v):
    v = check_number(v, "", integer=True)
    if not 1 <= v <= MAX_TOKENS:
        raise ConfigError("", v, f"an integer in [1, {MAX_TOKENS:.0e}]")
    return v


# a bare number is a constant length; anything else is read as a {dist: ...} mapping
Lengths = Annotated[
    Union[Annotated[checked(int, _fixed_length, {"type": "integer", "minimum": 1, "maximum": MAX_TOKENS}), Tag("fixed")],
          Annotated[LengthDist, Tag("distribution")]],
    Discriminator(lambda v: "fixed" if is_number(v) else "distribution")]


# ---- shared prefixes -------------------------------------------------------------------------


class SharedPrefix(Section):
    """inference-perf's shared_prefix profile: groups of users share a system prompt; ``prompt_tokens``
    is then the length of each request's question after it."""
    num_groups: Int(1, MAX_GROUPS)
    """Number of system prompts (groups)."""
    users_per_group: Int(1, MAX_GROUPS) = 1
    """Users of each group (num_groups x users_per_group is at most 1e8)."""
    system_prompt_len: Int(1, MAX_TOKENS)
    """Length of each group's system prompt, tokens."""
    multi_turn: Bool = False
    """A user's request also carries that user's earlier questions and answers (a growing shared prefix)."""
    max_context_tokens: Int(2) = 4096
    """multi_turn: a conversation restarts when the next prompt plus its answer would exceed this, tokens."""
    question_pool: Bool = False
    """Each (group, user) slot owns one fixed question: a pool of num_groups x users_per_group full prompts."""
    order: Choice("random", "cycle", "shuffled_cycle") = "random"
    """Which pool prompt a request sends: a random one, prompt n mod pool size (inference-perf's
    generator), or the same over a seeded permutation; other than random needs question_pool."""

    @model_validator(mode="after")
    def _consistent(self):
        if self.users_per_group > MAX_GROUPS // self.num_groups:
            raise ConfigError("users_per_group", self.users_per_group, f"a number <= {MAX_GROUPS // self.num_groups}")
        if self.question_pool and self.multi_turn:
            raise ConfigError("question_pool", True, "false with multi_turn (a pool re-sends fixed prompts)")
        if self.order != "random" and not self.question_pool:
            raise ConfigError("order", self.order, "random unless question_pool is true")
        return self


# ---- generated arrivals ----------------------------------------------------------------------

def _rate_or_inf(v):
    if str(v).lower() in ("inf", ".inf"):
        return math.inf
    return check_number(v, "", lo=1e-9, hi=1e9)


# `vllm bench serve --request-rate inf`: every request is ready at t=0 (use with max_concurrency)
RateOrInf = checked(float, _rate_or_inf,
    {"anyOf": [{"type": "number", "minimum": 1e-9, "maximum": 1e9}, {"const": "inf"}]})
Rate = Float(1e-9, 1e9)


# Pydantic lists (and checks, so the first error reported) inherited fields base first, a class's
# own last, and an override keeps its base's place: the bases below are split so every generated
# type lists type, stop rules and rate (or stages) before the lengths, in the order the builder
# used to read them.  A member's own keys (cv, quiet_s, ...) come last.

class _Stop(Section):
    """Keys every generated (not trace, not mix) workload starts with."""
    type: Str
    """The arrival process (each member narrows it to its own name)."""
    max_concurrency: Int(1) | None = None
    """Closed loop like ``vllm bench serve --max-concurrency``: at most this many requests in flight;
    a request waits for a free client and its latency clock starts when it is sent (None: open loop)."""
    num_requests: Int(1, MAX_REQUESTS) | None = None
    """Stop after this many arrivals (None: duration_s stops them)."""


class _Lengths(Section):
    """What each generated request asks for."""
    prompt_tokens: Lengths
    """Prompt length, tokens: an integer, or {dist: constant | uniform | normal | lognormal | empirical, ...}."""
    output_tokens: Lengths
    """Output length (max_tokens), tokens: an integer or a {dist: ...} mapping as prompt_tokens."""
    shared_prefix: SharedPrefix | None = None
    """Groups of users sharing system prompts (None: every prompt is unique)."""


class _RateStop(_Stop):
    """The stop rules and rate of a process with a rate."""
    duration_s: Float(0, MAX_TIME_S, lo_open=True) | None = None
    """No arrivals at or after this time, s (None: num_requests stops them)."""
    rate: Rate
    """Mean arrival rate, requests/s."""


class _Timed(_Lengths, _RateStop):
    """A renewal or rate-shaped process stopped by num_requests and/or duration_s."""

    @model_validator(mode="after")
    def _bounded(self):
        if self.num_requests is None and self.duration_s is None:
            raise ConfigError("num_requests", None, f"num_requests or duration_s to bound the {self.type} arrivals",
                              show_value=False)
        if math.isinf(self.rate):
            if self.num_requests is None:
                raise ConfigError("num_requests", None, "num_requests with rate: inf", show_value=False)
        elif self.duration_s is not None:
            expected_count("duration_s", self.rate, self.duration_s, self.num_requests)
        return self


MAX_BURST_FACTOR = 1e4
BurstFactor = Float(1, MAX_BURST_FACTOR)


class PoissonWorkload(_Timed):
    """Poisson arrivals: exponential gaps at a mean rate."""
    type: Literal["poisson"]
    """The arrival process."""
    rate: RateOrInf
    """Mean arrival rate, requests/s (inf: every request at t=0, paced by max_concurrency)."""
    burst_factor: BurstFactor = 1.0
    """Variance / mean of the number of arrivals in any window (1: Poisson, the default).  Above 1,
    requests arrive in bursts of simultaneous requests, a geometric number with mean
    (burst_factor + 1) / 2, the bursts themselves Poisson at rate / that mean: the same mean rate,
    burst_factor times the count variance (seed 002 Appendix A item 4; docs/traces.md)."""

    @model_validator(mode="after")
    def _burst_needs_a_rate(self):
        if self.burst_factor != 1 and math.isinf(self.rate):
            raise ConfigError("burst_factor", self.burst_factor, "1 with rate: inf (every request is at t=0)")
        return self


class GammaWorkload(_Timed):
    """Gamma-distributed gaps: burstier (cv > 1) or smoother (cv < 1) than Poisson at the same rate."""
    type: Literal["gamma"]
    """The arrival process."""
    rate: RateOrInf
    """Mean arrival rate, requests/s (inf: every request at t=0, paced by max_concurrency)."""
    cv: Float(MIN_CV, MAX_CV) | None = None
    """Coefficient of variation of the gaps (1 = Poisson; vLLM's burstiness is 1 / cv^2); required
    unless rate is inf."""

    @model_validator(mode="after")
    def _cv_set(self):
        if self.cv is None and not math.isinf(self.rate):
            raise ConfigError("cv", None, "this key to be set", show_value=False)
        return self


class ConstantWorkload(_Timed):
    """Evenly spaced arrivals, 1 / rate apart from t=0."""
    type: Literal["constant"]
    """The arrival process."""
    rate: RateOrInf
    """Arrival rate, requests/s (inf: every request at t=0, paced by max_concurrency)."""


class BurstWorkload(_Timed):
    """Cycles of a quiet phase with no arrivals, then a Poisson burst at burst_multiplier x rate."""
    type: Literal["burst"]
    """The arrival process."""
    rate: Rate
    """Base rate, requests/s (the burst runs at burst_multiplier times it)."""
    quiet_s: Float(0) = 5.0
    """Length of each quiet phase, s."""
    burst_s: Float(0, lo_open=True) = 10.0
    """Length of each burst, s."""
    burst_multiplier: Float(0, 1e4, lo_open=True) = 3.0
    """Rate during a burst, in multiples of rate."""

    @model_validator(mode="after")
    def _count(self):
        if self.duration_s is not None:
            expected_count("burst_multiplier", self.rate * self.burst_multiplier, self.duration_s, self.num_requests)
        return self


class RampWorkload(_Timed):
    """Poisson arrivals whose rate rises linearly from 0 to peak_multiplier x rate over ramp_s, then stays."""
    type: Literal["ramp"]
    """The arrival process."""
    rate: Rate
    """Base rate, requests/s."""
    ramp_s: Float(0, lo_open=True) | None = None
    """Time to reach the peak rate, s (None: duration_s, which must then be set)."""
    peak_multiplier: Float(0, 1e4, lo_open=True) = 2.0
    """Peak rate, in multiples of rate."""

    @model_validator(mode="after")
    def _ramp(self):
        if self.duration_s is None and self.ramp_s is None:
            raise ConfigError("ramp_s", None, "ramp_s or duration_s for a ramp", show_value=False)
        if self.duration_s is not None:
            expected_count("peak_multiplier", self.peak_multiplier * self.rate, self.duration_s, self.num_requests)
        return self


class Stage(Section):
    """One load stage: a rate held for a duration."""
    rate: Rate
    """Arrival rate during the stage, requests/s."""
    duration_s: Float(0, MAX_TIME_S, lo_open=True)
    """Length of the stage, s."""


class _StageList(_Stop):
    """The stages of a staged process."""
    stages: list[Stage]
    """The stages, in order: [{rate, duration_s}, ...]."""
    stage_arrivals: Choice("poisson", "constant") = "poisson"
    """The process within each stage."""


class StagedWorkload(_Lengths, _StageList):
    """Load stages back to back (inference-perf's load stages); num_requests may stop them early."""
    type: Literal["staged"]
    """The arrival process."""

    @field_validator("stages", mode="before")
    @classmethod
    def _non_empty(cls, v):
        if not isinstance(v, list) or not v:
            raise ConfigError("", v, "a non-empty list of {rate, duration_s}")
        return v


# ---- traces and mixes ------------------------------------------------------------------------


class TraceWorkload(Section):
    """Requests replayed from a file: dsim JSONL/CSV, the Azure 2023 CSV, BurstGPT CSV or Mooncake
    JSONL, told apart by their columns."""
    type: Literal["trace"]
    """The source."""
    max_concurrency: Int(1) | None = None
    """Closed loop: at most this many requests in flight (None: open loop, at the trace's times)."""
    path: Str
    """The trace file (relative to the scenario's folder)."""
    time_scale: Float(0, lo_open=True) | None = None
    """Divide arrival times by this (2: twice as fast; None: 1, or what rate implies)."""
    rate: Float(0, lo_open=True) | None = None
    """Rescale time so the selected requests' mean rate is exactly this, requests/s (not with time_scale)."""
    num_requests: Int(1, MAX_REQUESTS) | None = None
    """Replay only the first this many requests (after start_s; None: all)."""
    start_s: Float(0) = 0.0
    """Skip requests arriving before this trace time, s; the first kept one arrives at 0."""
    hash_block_tokens: Int(1) = 512
    """Mooncake traces: tokens per hash_ids block."""
    prefix_tokens: Int(1) | None = None
    """Tokens that requests of one prefix_group share (None: the group's shortest prompt)."""
    burst_factor: BurstFactor = 1.0
    """Bursts from the trace (1: replay as recorded, the default).  Above 1, consecutive requests
    are grouped into bursts of a geometric size with mean (burst_factor + 1) / 2, and a burst arrives
    at its first request's (scaled) time: counts in windows shorter than a burst's span get
    burst_factor times a Poisson trace's variance, while the trace's own timing is kept above that
    (seed 002 Appendix A item 4; docs/traces.md)."""
    prompt_length_override: Lengths | None = None
    """Replace every request's prompt length by a draw from this (an integer or a {dist: ...}
    mapping; seed 002's ``prompt_length_override``); the trace keeps the arrivals (None: the trace's
    lengths).  Not with rows that give their own ``segments``."""
    output_length_override: Lengths | None = None
    """Replace every request's output length (max_tokens) by a draw from this (None: the trace's)."""

    @model_validator(mode="after")
    def _one_time_rule(self):
        if self.rate is not None and self.time_scale is not None:
            raise ConfigError("rate", self.rate, "either rate or time_scale, not both", show_value=False)
        return self


def _tenant_name(v):
    if not isinstance(v, str) or not v:
        raise ConfigError("", v, "a non-empty tenant name")
    return v


def _priority(v):
    if isinstance(v, bool) or not isinstance(v, int) or abs(v) > 1_000_000:
        raise ConfigError("", v, "an integer in [-1e6, 1e6] (lower is served first)")
    return v


def _slo_class(v):
    if not isinstance(v, str) or not v:
        raise ConfigError("", v, "the name of a class of slo.classes")
    return v


class _Tenant(Section):
    """The keys a mix's tenant adds to its workload."""
    name: checked(str, _tenant_name, {"type": "string", "minLength": 1})
    """The tenant's name (unique in the mix): its requests' ``tenant``, and its key in the fairness report."""
    priority: checked(int, _priority,
        {"type": "integer", "minimum": -1_000_000, "maximum": 1_000_000}) | None = None
    """Scheduling priority of all its requests, lower served first (None: the requests' own, a trace's
    column or 0); used by the priority and age_weighted policies."""
    slo_class: checked(str, _slo_class, {"type": "string", "minLength": 1}) \
        | None = None
    """A class of slo.classes all its requests join (None: the requests' own, or none)."""
    temperature: Float(0, 100) | None = None
    """Sampling temperature of all its requests, read by speculative acceptance (None: the requests'
    own, a trace's column, else speculation.temperature)."""
    top_p: Float(0, 1, lo_open=True) | None = None
    """Nucleus (top-p) sampling of all its requests, read by speculative acceptance (None: the
    requests' own, else speculation.top_p); docs/specdec.md gives the rule."""
    domain: Str | None = None
    """Domain label of all its requests (code, chat, ...): speculation.acceptance_rules may give it
    its own acceptance curve (None: the requests' own, a trace's column, or none)."""


ARRIVALS = {"poisson": PoissonWorkload, "gamma": GammaWorkload, "constant": ConstantWorkload,
            "burst": BurstWorkload, "ramp": RampWorkload, "staged": StagedWorkload}
_SINGLE = {**ARRIVALS, "trace": TraceWorkload}


def _tenant_model(member: type) -> type:
    """``member`` with the tenant keys (declared first, so a tenant's name is checked first)."""
    return type(member.__name__.replace("Workload", "Tenant"), (member, _Tenant),
                {"__module__": __name__, "__doc__": f"A mix's tenant: {member.__doc__[0].lower()}{member.__doc__[1:]}"})


TENANTS = {k: _tenant_model(m) for k, m in _SINGLE.items()}
globals().update({m.__name__: m for m in TENANTS.values()})      # PoissonTenant, ...: importable, so picklable


def _not_a_mix(v):
    if not isinstance(v, dict):
        raise ConfigError("", v, "a workload mapping with a name")
    if v.get("type") == "mix":
        raise ConfigError("type", "mix", "a workload type other than mix")
    return v


Tenant = Annotated[_tagged("type", TENANTS), BeforeValidator(_not_a_mix)]


class MixWorkload(Section):
    """Several tenants, each a complete workload of its own, merged by arrival (the fairness report
    compares them); requests are renumbered in arrival order."""
    type: Literal["mix"]
    """The source."""
    max_concurrency: Int(1) | None = None
    """Closed loop over all tenants: at most this many requests in flight (None: open loop)."""
    classes: list[Tenant]
    """The tenants: [{name, priority, slo_class, <a workload of any type but mix>}, ...]."""

    @field_validator("classes", mode="before")
    @classmethod
    def _non_empty(cls, v):
        if not isinstance(v, list) or not v:
            raise ConfigError("", v, "a non-empty list of workloads, each with a name")
        return v

    @model_validator(mode="after")
    def _unique_names(self):
        seen: set = set()
        for k, c in enumerate(self.classes):
            if c.name in seen:
                raise ConfigError(f"classes[{k}].name", c.name, "a unique tenant name")
            seen.add(c.name)
        return self


TYPES = {**_SINGLE, "mix": MixWorkload}
WorkloadField = _tagged("type", TYPES)

_ADAPTER: TypeAdapter | None = None


def parse_workload(data: Any, path: str = "workload") -> Any:
    """A workload mapping (as a Python caller or a recorded run holds it) as its typed model; a
    typed one is returned as is.  ``path`` qualifies the first problem's ConfigError."""
    global _ADAPTER
    if isinstance(data, Section):
        return data
    if _ADAPTER is None:
        _ADAPTER = TypeAdapter(WorkloadField)
    try:
        return _ADAPTER.validate_python(data)
    except ValidationError as e:
        raise translate(e, data, path) from None
