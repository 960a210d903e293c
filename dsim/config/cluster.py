"""The ``cluster:`` section: clusters of replica pools, each pool with its own model, hardware,
engine, latency model and replica count.  The section is declared in dsim.config.schema.cluster and
validated there, once, when the scenario is loaded; this module loads each pool's model, hardware
and engine (merged over the top-level ones) and keeps routers, admission, disaggregation and
controllers as their typed sections for ``dsim.cluster`` to build when the fleet runs.

Without a ``cluster:`` section a scenario is one pool of one replica built from the top-level
``model``, ``hardware``, ``engine`` and ``latency`` keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .engine import EngineConfig, load_engine
from .errors import ConfigError
from .hardware import DeviceProfile, load_device
from .model import ModelSpec, load_model


@dataclass
class PoolSpec:
    name: str
    cluster: str
    model: ModelSpec
    device: DeviceProfile
    engine: EngineConfig
    latency: object                         # typed latency section (schema.latency) or None: roofline
    replicas: int
    role: str = "mixed"
    min_replicas: int = 1
    max_replicas: int | None = None
    router_weight: float | None = None     # capacity weight for weighted routers (default: estimated)
    cold_start_s: float = 0.0               # fixed start-up time on top of the weight load
    path: str = ""

    @property
    def gpus_per_replica(self) -> int:
        return self.engine.tensor_parallel_size * self.engine.context_parallel_size


@dataclass
class ClusterSpec:
    name: str
    router: object                          # a typed router (schema.cluster.RouterField)
    pools: list
    affinity: str = "none"
    disaggregation: object = None           # schema.cluster.DisaggregationConfig when P/D, else None
    path: str = ""


@dataclass
class FleetSpec:
    clusters: list
    global_router: object = None            # typed router; only used with several clusters
    admission: object = None                # schema.cluster.AdmissionField (None: always)
    controllers: list = field(default_factory=list)     # schema.cluster.AutoscalerConfig, ...
    declared: bool = False                  # the scenario has a cluster: section

    @property
    def pools(self) -> list:
        return [p for c in self.clusters for p in c.pools]


def check_tp(model: ModelSpec, engine: EngineConfig, path: str, device=None, hw_path: str = "hardware") -> None:
    tp = engine.tensor_parallel_size
    if device is not None:
        check_device_limits(device, engine, path, hw_path)
    if tp > 1 and model.num_heads % tp:
        raise ConfigError(f"{path}.tensor_parallel_size", tp,
                          f"a divisor of the model's {model.num_heads} attention heads")
    dp = engine.data_parallel_size
    if dp > 1 and not (model.is_moe and engine.enable_expert_parallel):
        raise ConfigError(f"{path}.data_parallel_size", dp, "1 unless the model is MoE and enable_expert_parallel "
                          "is true (DP attention with EP experts; dense data parallelism is replicas)")
    if dp > 1 and engine.pipeline_parallel_size > 1:
        raise ConfigError(f"{path}.data_parallel_size", dp, "1 with pipeline_parallel_size > 1 (not combined yet)")
    pp = engine.pipeline_parallel_size
    cp = engine.context_parallel_size
    if cp > 1 and (pp > 1 or dp > 1):
        key, v = ("pipeline_parallel_size", pp) if pp > 1 else ("data_parallel_size", dp)
        raise ConfigError(f"{path}.{key}", v, "1 with context_parallel_size > 1 (not combined yet)")
    if pp > model.num_layers:
        raise ConfigError(f"{path}.pipeline_parallel_size", pp, f"at most the model's {model.num_layers} layers")


def check_device_limits(device, engine: EngineConfig, path: str, hw_path: str = "hardware") -> None:
    """The target profile's parallelism limits (seed 002 section 5.1): ``max_tensor_parallel``,
    ``max_pipeline_parallel``, and a TP group beyond ``gpus_per_node`` only with an inter-node link."""
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    if device.max_tensor_parallel is not None and tp > device.max_tensor_parallel:
        raise ConfigError(f"{path}.tensor_parallel_size", tp, f"at most {hw_path}.max_tensor_parallel "
                          f"({device.max_tensor_parallel}) on {device.name}")
    if device.max_pipeline_parallel is not None and pp > device.max_pipeline_parallel:
        raise ConfigError(f"{path}.pipeline_parallel_size", pp, f"at most {hw_path}.max_pipeline_parallel "
                          f"({device.max_pipeline_parallel}) on {device.name}")
    if device.crosses_nodes(tp * engine.context_parallel_size) and device.internode_bytes_s is None:
        raise ConfigError(f"{path}.tensor_parallel_size", tp, f"at most the {device.gpus_per_node} GPUs of one "
                          f"{device.name} node ({hw_path}.gpus_per_node), or {hw_path}.internode_gb_s for the "
                          "all-reduce across nodes")


@dataclass(frozen=True)
class _FixedRouter:
    """The router of a scenario without a cluster section (one replica): the fields build_router reads
    of a declared router, without importing the cluster schema for a section the scenario lacks."""
    policy: str = "round_robin"
    staleness_s: float = 0.0


ONE_REPLICA_ROUTER = _FixedRouter()


def single_pool(model, device, engine, latency) -> FleetSpec:
    pool = PoolSpec("default", "default", model, device, engine, latency, 1, path="")
    return FleetSpec([ClusterSpec("default", ONE_REPLICA_ROUTER, [pool])], declared=False)


def _pool(p, path: str, cluster: str, top: dict, base_dir) -> PoolSpec:
    """Load one pool (a typed ``schema.cluster.PoolConfig`` at ``path``) over the top-level sections."""
    m_raw = p.model if p.model is not None else top.get("model")
    if m_raw is None:
        raise ConfigError(f"{path}.model", None, "a model here or at the top level", show_value=False)
    h_raw = p.hardware if p.hardware is not None else top.get("hardware")
    if h_raw is None:
        raise ConfigError(f"{path}.hardware", None, "a hardware profile here or at the top level", show_value=False)
    model = load_model(m_raw, f"{path}.model" if p.model is not None else "model", base_dir)
    device = load_device(h_raw, f"{path}.hardware" if p.hardware is not None else "hardware")
    engine = load_engine(_merge(top.get("engine"), p.engine, f"{path}.engine"), f"{path}.engine")
    check_tp(model, engine, f"{path}.engine", device, f"{path}.hardware" if p.hardware is not None else "hardware")
    model = model.with_kv_cache_dtype(engine.kv_cache_dtype, f"{path}.engine.kv_cache_dtype")
    # a pool's latency replaces the shared one (its keys depend on its model: they are not merged)
    lat = p.latency if p.latency is not None else top.get("latency")      # None: roofline defaults
    return PoolSpec(p.name, cluster, model, device, engine, lat, p.replicas, p.role, p.min_replicas, p.max_replicas,
                    p.router_weight, p.cold_start_s, path)


def _merge(shared, own, path: str):
    """``merged(shared, own)`` with a problem of the combination reported at the pool's ``path``."""
    from .schema.base import ValidationError, merged, translate
    try:
        return merged(shared, own)
    except ValidationError as e:
        raise translate(e, {**shared.to_dict(), **own.to_dict()}, path) from None


def load_fleet(cfg, top: dict, base_dir, path: str = "cluster") -> FleetSpec:
    """Build the fleet of a ``cluster:`` section: ``cfg`` is the typed section
    (``schema.cluster.ClusterConfig``), ``top`` the scenario's top-level model, hardware, engine and
    latency (the pools' defaults)."""
    from .schema.cluster import DisaggregationConfig
    clusters = []
    for where, name, c in cfg.cluster_list():
        cp = f"{path}.{where}" if where else path
        pools = [_pool(p, f"{cp}.pools[{j}]", name, top, base_dir) for j, p in enumerate(c.pools)]
        disagg = c.disaggregation
        if disagg is None and c.disaggregated:
            disagg = DisaggregationConfig()
        clusters.append(ClusterSpec(name, c.router, pools, c.affinity, disagg, cp))
    global_router = cfg.router if cfg.clusters is not None else None
    return FleetSpec(clusters, global_router, cfg.admission, list(cfg.controllers), declared=True)
