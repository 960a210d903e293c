"""The ``cluster:`` section: clusters of replica pools, each pool with its own model, hardware,
engine, latency model and replica count.  Routers, admission, disaggregation and controllers are
kept raw here and validated by ``dsim.cluster`` when the fleet is built (like ``latency``).

Without a ``cluster:`` section a scenario is one pool of one replica built from the top-level
``model``, ``hardware``, ``engine`` and ``latency`` keys.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .engine import EngineConfig, load_engine
from .errors import ConfigError
from .limits import MAX_REPLICAS
from .fields import Section
from .hardware import DeviceProfile, load_device
from .model import ModelSpec, load_model

ROLES = ("mixed", "prefill", "decode")
CLUSTER_KEYS = ("router", "admission", "pools", "clusters", "disaggregation", "controllers", "affinity")


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
        return self.engine.tensor_parallel_size


@dataclass
class ClusterSpec:
    name: str
    router: object                          # raw router spec (str or mapping)
    pools: list
    affinity: str = "none"
    disaggregation: dict | None = None
    path: str = ""


@dataclass
class FleetSpec:
    clusters: list
    global_router: object = None            # raw; only used with several clusters
    admission: object = None
    controllers: list = field(default_factory=list)
    declared: bool = False                  # the scenario has a cluster: section

    @property
    def pools(self) -> list:
        return [p for c in self.clusters for p in c.pools]


def check_tp(model: ModelSpec, engine: EngineConfig, path: str) -> None:
    tp = engine.tensor_parallel_size
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
    if pp > model.num_layers:
        raise ConfigError(f"{path}.pipeline_parallel_size", pp, f"at most the model's {model.num_layers} layers")


def single_pool(model, device, engine, latency) -> FleetSpec:
    pool = PoolSpec("default", "default", model, device, engine, latency, 1, path="")
    return FleetSpec([ClusterSpec("default", "round_robin", [pool])], declared=False)


def _pool(data, path: str, cluster: str, top: dict, base_dir) -> PoolSpec:
    s = Section(data, path)
    name = s.str("name")
    m_raw = s.raw("model", top.get("model"))
    if m_raw is None:
        raise ConfigError(f"{path}.model", None, "a model here or at the top level", show_value=False)
    h_raw = s.raw("hardware", top.get("hardware"))
    if h_raw is None:
        raise ConfigError(f"{path}.hardware", None, "a hardware profile here or at the top level", show_value=False)
    model = load_model(m_raw, f"{path}.model" if "model" in data else "model", base_dir)
    device = load_device(h_raw, f"{path}.hardware" if "hardware" in data else "hardware")
    shared = top.get("engine")              # an EngineSection: the keys it was written with
    eng = shared.to_dict() if shared is not None else {}
    e_raw = s.raw("engine", {})
    if not isinstance(e_raw, dict):
        raise ConfigError(f"{path}.engine", e_raw, "a mapping of engine keys")
    eng.update(e_raw)
    engine = load_engine(eng, f"{path}.engine")
    check_tp(model, engine, f"{path}.engine")
    model = model.with_kv_cache_dtype(engine.kv_cache_dtype, f"{path}.engine.kv_cache_dtype")
    # a pool's own latency section replaces the top-level one whole (it may pick another model)
    lat = top.get("latency")
    if "latency" in data:
        from .schema.latency import parse_latency
        lat = parse_latency(s.raw("latency"), f"{path}.latency")
    replicas = s.int("replicas", 1, lo=1, hi=MAX_REPLICAS)
    role = s.str("role", "mixed", choices=ROLES)
    lo = s.int("min_replicas", 1, lo=1)
    hi = s.int("max_replicas", None, lo=1, hi=MAX_REPLICAS)
    if hi is not None and hi < max(lo, replicas):
        raise ConfigError(f"{path}.max_replicas", hi, f">= replicas ({replicas}) and min_replicas ({lo})")
    if lo > replicas:
        raise ConfigError(f"{path}.min_replicas", lo, f"<= replicas ({replicas})")
    weight = s.num("router_weight", None, lo=0, lo_open=True)
    cold = s.num("cold_start_s", 0.0, lo=0)
    s.done()
    return PoolSpec(name, cluster, model, device, engine, lat, replicas, role, lo, hi, weight, cold, path)


def _cluster(s: Section, name: str, path: str, top: dict, base_dir) -> ClusterSpec:
    router = s.raw("router", "round_robin")
    affinity = s.str("affinity", "none", choices=("none", "session"))
    pools_raw = s.raw("pools")
    if not isinstance(pools_raw, list) or not pools_raw:
        raise ConfigError(s.sub("pools"), pools_raw, "a non-empty list of pools")
    pools = [_pool(p, f"{s.sub('pools')}[{i}]", name, top, base_dir) for i, p in enumerate(pools_raw)]
    roles = {p.role for p in pools}
    disagg = s.raw("disaggregation", None)
    if "prefill" in roles or "decode" in roles:
        if "mixed" in roles or roles != {"prefill", "decode"}:
            raise ConfigError(s.sub("pools"), sorted(roles),
                              "prefill/decode disaggregation: at least one prefill pool and one decode pool, "
                              "and no mixed pool in the same cluster")
        if disagg is None:
            disagg = {}
    elif disagg is not None:
        raise ConfigError(s.sub("disaggregation"), disagg, "pools with role: prefill and role: decode")
    return ClusterSpec(name, router, pools, affinity, disagg, path)


def load_fleet(data, top: dict, base_dir, path: str = "cluster") -> FleetSpec:
    """Validate the ``cluster:`` section (pools fully; policies are checked when built)."""
    s = Section(data, path)
    admission = s.raw("admission", None)
    controllers = s.raw("controllers", [])
    if not isinstance(controllers, list):
        raise ConfigError(s.sub("controllers"), controllers, "a list of controllers")
    clusters_raw = s.raw("clusters", None)
    if clusters_raw is None:
        clusters = [_cluster(s, "default", path, top, base_dir)]
        global_router = None
    else:
        if "pools" in s.data:
            raise ConfigError(s.sub("pools"), None, "either pools (one cluster) or clusters, not both",
                              show_value=False)
        if not isinstance(clusters_raw, list) or not clusters_raw:
            raise ConfigError(s.sub("clusters"), clusters_raw, "a non-empty list of clusters")
        global_router = s.raw("router", "round_robin")
        clusters = []
        for i, c in enumerate(clusters_raw):
            cp = f"{s.sub('clusters')}[{i}]"
            cs = Section(c, cp)
            name = cs.str("name")
            clusters.append(_cluster(cs, name, cp, top, base_dir))
            cs.done()
    s.done()
    seen: dict = {}
    for kind, items in (("cluster", clusters), ("pool", [p for c in clusters for p in c.pools])):
        seen.clear()
        for it in items:
            if it.name in seen:
                raise ConfigError(f"{it.path}.name" if it.path else path, it.name,
                                  f"a unique {kind} name (also used at {seen[it.name]})")
            seen[it.name] = it.path or path
    return FleetSpec(clusters, global_router, admission, controllers, declared=True)
