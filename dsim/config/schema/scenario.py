"""The whole scenario: one section model per concern, aggregated here.

``load_scenario`` validates a file against :class:`ScenarioConfig` once, at the door; the builders
of each layer receive the typed sections, never the raw mapping.  ``dsim schema`` prints this
model's JSON Schema and ``docs/scenario-reference.md`` is generated from it.
"""
from __future__ import annotations

from ..errors import ConfigError
from .base import Bool, Field, Float, Int, Lazy, Section, Str, field_validator, model_validator, parse
from .workload import WorkloadField


class SloClass(Section):
    """Targets of one request class (requests join it by their ``slo_class``)."""
    ttft_ms: Float(0, lo_open=True) | None = None
    """Time-to-first-token bound, ms (None: no bound)."""
    tpot_ms: Float(0, lo_open=True) | None = None
    """Time-per-output-token bound, ms (None: no bound)."""

    @model_validator(mode="after")
    def _one_bound(self):
        if self.ttft_ms is None and self.tpot_ms is None:
            raise ConfigError("", self.to_dict(), "at least one of ttft_ms, tpot_ms")
        return self


class SloConfig(Section):
    """Service-level objectives: a request meets its SLO when every bound set here holds."""
    ttft_ms: Float(0, lo_open=True) | None = None
    """Time-to-first-token bound, ms, for goodput and SLO attainment (None: no bound)."""
    tpot_ms: Float(0, lo_open=True) | None = None
    """Time-per-output-token bound, ms (None: no bound)."""
    tvt_ms: Float(0, lo_open=True) | None = None
    """Time-per-verified-token bound, ms, for speculative decoding (None: no bound)."""
    classes: dict[str, SloClass] = {}
    """Per-class targets, by class name; a request of a class is judged by its class's bounds."""


class OutputConfig(Section):
    """What a run writes besides summary.json, requests.csv and manifest.json."""
    plots: Bool = True
    """Write plots/*.png (latency CDFs, queue and KV use over time)."""
    timeline: Bool = False
    """Write timeline.json, a Chrome/Perfetto trace of every replica's steps and requests."""
    kv_events: Bool = False
    """Write kv_events.jsonl (one replica) or kv_events/REPLICA.jsonl: vLLM's KV cache events
    (BlockStored / BlockRemoved) of the prefix cache, one JSON batch per instant, as vLLM's KV events
    subscriber writes them; `dsim cosim` compares a real run's file with its replay's (docs/calibration.md)."""
    repro_log: Bool = False
    """Write repro_log.jsonl: every speculative acceptance outcome and mode decision, in order, which
    speculation.replay_log replays (needs a speculation section)."""
    percentiles: list[Float(0, 100, lo_open=True)] = [50, 90, 95, 99]
    """Latency percentiles reported in summary.json, each in (0, 100] (sorted, duplicates dropped)."""

    @field_validator("percentiles", mode="before")
    @classmethod
    def _non_empty(cls, v):
        if not isinstance(v, list) or not v:
            raise ConfigError("", v, "a non-empty list of percentiles in (0, 100], e.g. [50, 99, 99.9]")
        return v

    @field_validator("percentiles", mode="after")
    @classmethod
    def _sorted(cls, v):
        return tuple(sorted(set(v)))


class SeedsConfig(Section):
    """Separate master seeds for groups of random streams (seed 004's SimulationKey); a group left
    unset follows ``seed``, so ``seeds: {workload: S}`` with S equal to seed changes nothing."""
    workload: Int(0) | None = None
    """Arrivals, lengths, prefixes (a sweep over seeds.simulation keeps these fixed)."""
    simulation: Int(0) | None = None
    """Routers' random choices, speculative acceptance draws, trace sampling."""
    jitter: Int(0) | None = None
    """Timing noise: latency models' random draws (latency.tail) and the network's."""


class ScenarioConfig(Section):
    """A dsim scenario: what is served (model, hardware, engine, cluster), how fast each step is
    (latency), what arrives (workload), what counts as good (slo) and what is written (output)."""
    seed: Int(0) = 0
    """Seed of every random stream (unless seeds gives a group its own); same scenario and seed give
    byte-identical outputs."""
    seeds: SeedsConfig | None = None
    """Per-group master seeds: workload, simulation, jitter (None: all follow seed)."""
    name: Str | None = None
    """Run name (default: the file's stem)."""
    description: Str = ""
    """Free text, kept in manifest.json."""
    model: Lazy("dsim.config.schema.model:ModelField") = None
    """The served model (required unless every cluster pool names its own)."""
    hardware: Lazy("dsim.config.schema.hardware:HardwareField") = None
    """The GPU of each replica (required unless every cluster pool names its own)."""
    engine: Lazy("dsim.config.schema.engine:EngineField") = None
    """vLLM engine arguments of each replica (shared by every cluster pool)."""
    latency: Lazy("dsim.config.schema.latency:LatencyField") = None
    """The step-time model (shared by every cluster pool): roofline by default."""
    workload: WorkloadField
    """What arrives: an arrival process with length distributions, a trace, or a mix of tenants."""
    slo: SloConfig = Field(default_factory=SloConfig)
    """Latency targets for goodput and SLO attainment."""
    horizon_s: Float(0, lo_open=True) | None = None
    """Stop admitting arrivals after this many simulated seconds (None: the workload decides)."""
    drain: Bool = True
    """After the horizon, finish the requests already admitted."""
    output: OutputConfig = Field(default_factory=OutputConfig)
    """What a run writes."""
    cluster: Lazy("dsim.config.schema.cluster:ClusterField") = None
    """Pools of replicas, routers, admission, P/D disaggregation and controllers (None: one replica)."""
    network: Lazy("dsim.config.schema.network:NetworkField") = None
    """Links between clients, routers and replicas (None: no network delay)."""
    speculation: Lazy("dsim.config.schema.speculation:SpeculationField") = None
    """Speculative decoding: drafters, verification, gamma policy (None: off)."""
    policy_bundle: Str | None = None
    """A policy bundle file (relative to the scenario): one named, versioned set of policies (routers,
    admission, scheduling, gamma, mode switch, verify order, ...) written over the scenario's own
    (docs/specdec.md, "Policy bundles"; None: none)."""


def parse_scenario(data: dict) -> ScenarioConfig:
    """Validate a whole scenario mapping (after ``--set`` overrides) at the door."""
    if isinstance(data, dict) and "workload" not in data:
        for key in data:                   # a typo at the top is named before anything it hides
            if key not in ScenarioConfig.keys():
                break
        else:
            raise ConfigError("workload", None, "a workload section (type: poisson | ... | trace)", show_value=False)
    return parse(ScenarioConfig, data, "")
