"""The ``cluster``: section of a scenario (declared schema; see dsim.config.schema.base for the rules).

A fleet is one cluster (``pools`` here) or several (``clusters``, each with its own pools, behind
the top-level ``router``).  A pool's ``model``, ``hardware``, ``engine`` and ``latency`` are the
sections of the same names (the top-level ones are the defaults); what depends on the whole scenario
(a model here or at the top, the KV path with a ``network:`` section, ``slo_guard``'s default) is
resolved by the builders in dsim.config.cluster and dsim.cluster.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional

from ..errors import ConfigError
from ..names import ROUTERS
from ..limits import MAX_REPLICAS, MIN_BW_MBPS, MIN_TIMER_S
from .base import Choice, Field, Float, Int, Section, Str, Tagged, field_validator, model_validator
from .engine import EngineField
from .hardware import HardwareField
from .latency import LatencyField
from .model import ModelField
from .planner import PlannerConfig

SECTION = "cluster"
ROLES = ("mixed", "prefill", "decode")


class NameOrMapping:
    """``router: jsq`` for ``router: {policy: jsq}``: a bare string is the value of ``key``.

    Put it in ``Annotated[...]`` after the tagged union; the JSON Schema offers the names as well."""

    def __init__(self, key: str, names, what: str):
        """``what``: the value's name with its article ("a router", "an admission policy")."""
        self.key, self.names, self.what = key, tuple(names), what

    def before(self, v):
        """A bare string is the mapping ``{key: v}``; anything but a mapping or null is refused."""
        if isinstance(v, str):
            return {self.key: v}
        if v is not None and not isinstance(v, (dict, Section)):
            raise ConfigError("", v, f"{self.what} name (one of {', '.join(self.names)}) or a mapping "
                              f"with {self.key}: ...")
        return v

    def json_schema(self, inner: dict) -> dict:
        """The names as well as the mappings ``inner`` describes."""
        members = inner["anyOf"] if list(inner) == ["anyOf"] else [inner]     # Optional: ..., null
        return {"anyOf": [{"type": "string", "enum": list(self.names)}, *members]}


# ---- routers -----------------------------------------------------------------------------------

class _Router(Section):
    staleness_s: Float(0) = 0.0
    """Seconds between refreshes of the replica-reported load the router sees (0: always fresh)."""

    @field_validator("staleness_s", mode="after")
    @classmethod
    def _timer(cls, v):
        if 0 < v < MIN_TIMER_S:
            raise ConfigError("", v, f"0 (fresh views) or a period >= {MIN_TIMER_S:g} s")
        return v


_WITH_SETTINGS = ("prefix_affinity", "semi_clairvoyant")
PLAIN_ROUTERS = tuple(sorted(n for n in ROUTERS if n not in _WITH_SETTINGS))


class PlainRouter(_Router):
    """A router without settings of its own (see docs/cluster.md for each policy)."""
    policy: Literal[PLAIN_ROUTERS]
    """The routing policy."""


class PrefixAffinityRouter(_Router):
    """Longest cached prefix wins; queue depth breaks ties."""
    policy: Literal["prefix_affinity"]
    """The routing policy."""
    max_queue_gap: Float(0) | None = None
    """Ignore the cache when the best-cached replica's queue exceeds the shortest by more than this
    (None: never ignore it)."""


class SemiClairvoyantRouter(_Router):
    """Least pending work per unit of capacity, with an estimate of each request's output length."""
    policy: Literal["semi_clairvoyant"]
    """The routing policy."""
    estimate: Choice("exact", "lognormal", "mean") = "lognormal"
    """How the output length is estimated: the truth, the truth times a lognormal error, or a constant."""
    sigma: Float(0) = 0.5
    """Sigma of the lognormal error (estimate: lognormal)."""
    mean_output_tokens: Float(1) = 256
    """The constant estimate (estimate: mean)."""


_ROUTER_MEMBERS = {n: (PrefixAffinityRouter if n == "prefix_affinity" else SemiClairvoyantRouter
                       if n == "semi_clairvoyant" else PlainRouter) for n in sorted(ROUTERS)}
def _router_type(default: str):
    """A router: its policy name, or a mapping with ``policy`` and the policy's settings; ``router:
    null`` (or a mapping without ``policy``) is the field's default policy."""
    return Annotated[Tagged("policy", _ROUTER_MEMBERS, default), NameOrMapping("policy", sorted(ROUTERS), "a router")]


RouterField = _router_type("round_robin")
DecodeRouterField = _router_type("least_outstanding")


def _router(default: str):
    return Field(default=default, validate_default=True)


# ---- admission ---------------------------------------------------------------------------------

class AlwaysAdmission(Section):
    """Admit every request."""
    policy: Literal["always"]
    """The admission policy."""


class TokenBucketAdmission(Section):
    """``rate`` requests/s refill a bucket of ``burst`` requests; a request takes one token."""
    policy: Literal["token_bucket"]
    """The admission policy."""
    rate: Float(0, lo_open=True)
    """Refill rate, requests/s."""
    burst: Float(1) | None = None
    """Bucket size, requests (None: max(1, rate)); the bucket starts full."""


class QueueCapAdmission(Section):
    """Reject when the chosen replica already has ``max_waiting`` requests waiting."""
    policy: Literal["queue_cap"]
    """The admission policy."""
    max_waiting: Int(0)
    """Waiting requests at which the replica's arrivals are rejected."""


class SloGuardAdmission(Section):
    """Reject when the predicted TTFT on the chosen replica exceeds ``ttft_ms``."""
    policy: Literal["slo_guard"]
    """The admission policy."""
    ttft_ms: Float(0, lo_open=True) | None = None
    """TTFT bound, ms (None: the scenario's slo.ttft_ms, which must then be set)."""


_ADMISSION_MEMBERS = {"always": AlwaysAdmission, "token_bucket": TokenBucketAdmission,
                      "queue_cap": QueueCapAdmission, "slo_guard": SloGuardAdmission}
AdmissionField = Annotated[Optional[Tagged("policy", _ADMISSION_MEMBERS)],
                           NameOrMapping("policy", _ADMISSION_MEMBERS, "an admission policy")]
"""An admission policy: its name, or a mapping with ``policy`` and its settings (None: always)."""


# ---- P/D disaggregation ------------------------------------------------------------------------

class KvTransferConfig(Section):
    """A dedicated path per KV transfer: latency + bytes / bandwidth, no contention."""
    latency_ms: Float(0) = 0.1
    """Fixed latency of one transfer, ms."""
    bandwidth_gb_s: Float(MIN_BW_MBPS / 8e3) = 25.0
    """Bandwidth, GB/s (default: one 200 Gb/s RDMA NIC)."""


class DisaggregationConfig(Section):
    """Prefill/decode disaggregation of a cluster with ``role: prefill`` and ``role: decode`` pools."""
    decode_router: DecodeRouterField = _router("least_outstanding")
    """The router that picks a decode replica when a prefill replica hands a request off."""
    kv_transfer: KvTransferConfig | None = None
    """The KV path from prefill to decode replicas (None: the defaults of kv_transfer; not allowed
    with a network: section, where the KV moves over the network)."""


# ---- controllers -------------------------------------------------------------------------------

class AutoscalerConfig(Section):
    """Scale a pool out when its queue or KV is under pressure, in when it idles (docs/cluster.md)."""
    type: Literal["autoscaler"]
    """The controller."""
    pool: Str
    """The pool it scales (a pool name of this section)."""
    interval_s: Float(MIN_TIMER_S) = 5.0
    """Seconds between observations."""
    scale_out_waiting: Float(0) = 4.0
    """Scale out when waiting requests per ready replica exceed this..."""
    scale_out_kv: Float(0, 1) = 0.9
    """...or mean KV-cache usage exceeds this (and no replica is starting)."""
    scale_in_kv: Float(0, 1) = 0.2
    """Scale in when nothing waits, mean KV usage is below this..."""
    scale_in_busy: Float(0, 1) = 1.0
    """...and the busy fraction is below this (1: not a condition)."""
    cooldown_s: Float(0) = 30.0
    """Seconds without another action after each action."""


ControllerField = Tagged("type", {"autoscaler": AutoscalerConfig, "planner": PlannerConfig})
"""A controller, chosen by ``type``."""


# ---- pools and clusters ------------------------------------------------------------------------

class PoolConfig(Section):
    """Identical replicas: one model on one hardware profile with one engine configuration."""
    name: Str
    """Pool name, unique in the fleet (replicas are named <pool>-<i>)."""
    model: ModelField = None
    """The served model (None: the top-level model)."""
    hardware: HardwareField = None
    """The GPU of each replica (None: the top-level hardware)."""
    engine: EngineField = None
    """Engine keys of this pool, on top of the top-level engine (the pool's keys win)."""
    latency: LatencyField = None
    """The step-time model of this pool; replaces the top-level latency (None: the top-level one)."""
    replicas: Int(1, MAX_REPLICAS) = 1
    """Replicas at the start."""
    role: Choice(*ROLES) = "mixed"
    """mixed (prefill and decode), or prefill / decode for P/D disaggregation."""
    min_replicas: Int(1) = 1
    """Fewest replicas scaling in leaves (<= replicas)."""
    max_replicas: Int(1, MAX_REPLICAS) | None = None
    """Most replicas scaling out reaches (None: no bound)."""
    router_weight: Float(0, lo_open=True) | None = None
    """Capacity weight of a replica for weighted routers (None: estimated from its latency model)."""
    cold_start_s: Float(0) = 0.0
    """Start-up time of a new replica on top of loading its weights, s."""

    @model_validator(mode="after")
    def _bounds(self):
        hi, lo, n = self.max_replicas, self.min_replicas, self.replicas
        if hi is not None and hi < max(lo, n):
            raise ConfigError("max_replicas", hi, f">= replicas ({n}) and min_replicas ({lo})")
        if lo > n:
            raise ConfigError("min_replicas", lo, f"<= replicas ({n})")
        return self


def _non_empty(v, what: str):
    if not isinstance(v, list) or not v:
        raise ConfigError("", v, f"a non-empty list of {what}")
    return v


class _ClusterBody(Section):
    """What one cluster is: pools behind a router."""
    router: RouterField = _router("round_robin")
    """The router that picks a replica for each arrival."""
    affinity: Choice("none", "session") = "none"
    """session: the requests of a conversation go to the replica that served its first one."""
    pools: list[PoolConfig]
    """The pools of replicas."""
    disaggregation: DisaggregationConfig | None = None
    """P/D settings (None: the defaults when the pools have prefill and decode roles)."""

    @field_validator("pools", mode="before")
    @classmethod
    def _pools_listed(cls, v):
        return v if v is None else _non_empty(v, "pools")

    @model_validator(mode="after")
    def _roles(self):
        if self.pools is None:
            return self
        roles = {p.role for p in self.pools}
        if "prefill" in roles or "decode" in roles:
            if roles != {"prefill", "decode"}:
                raise ConfigError("pools", sorted(roles),
                                  "prefill/decode disaggregation: at least one prefill pool and one decode pool, "
                                  "and no mixed pool in the same cluster")
        elif self.disaggregation is not None:
            raise ConfigError("disaggregation", self.disaggregation.to_dict(),
                              "pools with role: prefill and role: decode")
        return self

    @property
    def disaggregated(self) -> bool:
        return self.pools is not None and self.pools[0].role != "mixed"


class ClusterItemConfig(_ClusterBody):
    """One cluster of a multi-cluster fleet."""
    name: Str
    """Cluster name, unique in the fleet."""


class ClusterConfig(_ClusterBody):
    """The fleet: one cluster of pools, or several clusters behind a global router; admission at the
    gateway and controllers that act on the pools."""
    router: RouterField = _router("round_robin")
    """The router that picks a replica for each arrival; with clusters, the global router that picks
    a cluster (each cluster routes among its replicas with its own router)."""
    pools: list[PoolConfig] | None = None
    """The pools of replicas of the one cluster (required unless clusters are listed)."""
    clusters: list[ClusterItemConfig] | None = None
    """Several clusters, each with its own router, affinity, pools and disaggregation."""
    admission: AdmissionField = None
    """Admission control at the gateway, after routing (None: admit everything)."""
    controllers: list[ControllerField] = []
    """Control-plane processes that observe the fleet on a tick and act (scale pools)."""

    @field_validator("clusters", mode="before")
    @classmethod
    def _clusters_listed(cls, v):
        return v if v is None else _non_empty(v, "clusters")

    @field_validator("controllers", mode="before")
    @classmethod
    def _controllers_listed(cls, v):
        if not isinstance(v, list):
            raise ConfigError("", v, "a list of controllers")
        return v

    @model_validator(mode="after")
    def _fleet(self):
        if self.clusters is None:
            if self.pools is None:
                raise ConfigError("pools", None, "this key to be set (a non-empty list of pools), or a list of "
                                  "clusters", show_value=False)
        else:
            if self.pools is not None:
                raise ConfigError("pools", None, "either pools (one cluster) or clusters, not both", show_value=False)
            for key in ("affinity", "disaggregation"):
                if self.given(key):
                    raise ConfigError(key, None, "set on each of clusters[i] when clusters are listed, not here",
                                      show_value=False)
        clusters = [(where, name) for where, name, _ in self.cluster_list()]
        for kind, items in (("cluster", clusters), ("pool", [(w, p.name) for w, p in self.pool_list()])):
            seen: dict = {}
            for where, name in items:
                if name in seen:
                    raise ConfigError(f"{where}.name", name, f"a unique {kind} name (also used at "
                                      f"{_join(SECTION, seen[name])})")
                seen[name] = where
        names = [p.name for _, p in self.pool_list()]
        for i, c in enumerate(self.controllers):
            for where, pool in ([("pool", c.pool)] if c.type == "autoscaler" else
                                [(f"pools.{k}", k) for k in c.pools]):
                if pool not in names:
                    raise ConfigError(f"controllers[{i}].{where}", pool, "one of " + ", ".join(names))
        return self

    def cluster_list(self) -> list:
        """(path relative to the section, name, cluster) of each cluster; the one cluster of
        ``pools:`` is the section itself, named "default", at path ""."""
        if self.clusters is None:
            return [("", "default", self)]
        return [(f"clusters[{i}]", c.name, c) for i, c in enumerate(self.clusters)]

    def pool_list(self) -> list:
        """(path relative to the section, pool) of every pool of every cluster."""
        return [(_join(where, f"pools[{j}]"), p) for where, _, c in self.cluster_list()
                for j, p in enumerate(c.pools)]


def _join(a: str, b: str) -> str:
    return f"{a}.{b}" if a else b


ClusterField = Optional[ClusterConfig]
