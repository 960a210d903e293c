"""Engine generations: the vLLM releases dsim distinguishes, with their host costs and defaults.

``engine.vllm_version`` picks the generation whose [since, before) range holds it (unset: the
newest).  The numbers and their provenance are package data (``data/engine_generations.yaml``);
dsim.latency.host applies them to every latency model.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources


from .files import read_yaml
from .errors import ConfigError

@dataclass(frozen=True)
class HostCosts:
    """Host costs of one engine generation, microseconds (see the YAML's header)."""
    step_us: float = 0.0
    per_seq_us: float = 0.0
    per_prefill_us: float = 0.0
    per_worker_us: float = 0.0
    eager_layer_us: float = 0.0
    cudagraph_max_tokens: int = 512
    cudagraph_decode_only: bool = False
    eager_layer_per_seq_us: float = 0.0      # per decoder layer and request, on the same eager steps
    # Ray round trips, paid per step only when the engine config selects them (dsim.latency.host)
    ray_step_us: float = 0.0                 # driver <-> one Ray worker actor (engine.executor: ray, any TP)
    ray_per_seq_us: float = 0.0              #   ... per request in the step
    ray_tp_us: float = 0.0                   # Ray executor with TP > 1, beyond one worker's round trip
    ray_tp_per_seq_us: float = 0.0           #   ... per request in the step
    ray_tp_per_worker_us: float = 0.0        #   ... per worker beyond the second, x (TP - 2)
    engine_ray_us: float = 0.0               # API server <-> engine actor (engine.engine_use_ray)
    engine_ray_per_seq_us: float = 0.0       #   ... per request in the step

    def minus(self, ref: "HostCosts") -> "HostCosts":
        """The per-step costs of self beyond ref's.  Launch gaps are not subtracted: they are paid
        only on steps a graph does not capture, and the reference captured them."""
        return replace(self, **{k: getattr(self, k) - getattr(ref, k) for k in
                                ("step_us", "per_seq_us", "per_prefill_us", "per_worker_us")})

    @property
    def is_zero(self) -> bool:
        return not any(getattr(self, k) for k in self.__dataclass_fields__
                       if k not in ("cudagraph_max_tokens", "cudagraph_decode_only"))

    def with_executor(self, executor: str, engine_use_ray: bool, tp: int) -> "HostCosts":
        """The Ray terms the engine config pays, the others zeroed: ``executor: ray`` pays one
        worker round trip per step (also at TP 1) and, with TP > 1, the executor's extra;
        ``engine_use_ray`` the engine actor's round trip."""
        z = {}
        if executor != "ray":
            z.update(ray_step_us=0.0, ray_per_seq_us=0.0)
        if executor != "ray" or tp < 2:
            z.update(ray_tp_us=0.0, ray_tp_per_seq_us=0.0, ray_tp_per_worker_us=0.0)
        if not engine_use_ray:
            z.update(engine_ray_us=0.0, engine_ray_per_seq_us=0.0)
        return replace(self, **z)


@dataclass(frozen=True)
class Generation:
    name: str
    since: tuple
    before: tuple | None
    description: str
    scheduler: str                   # v0 | v1
    executor: str
    cuda_graphs: bool
    host: HostCosts
    alpha_us: tuple
    provenance: str
    # what the memory-profiling run's peak holds (EngineConfig.kv_blocks): "layer" = one decoder
    # layer's activations (they are freed layer by layer); "forward" = every layer's activations of
    # a max_num_batched_tokens forward pass (the early engines' profile)
    profile_activation: str = "layer"
    engine_use_ray: bool | None = None       # default of engine.engine_use_ray; None: no such flag


def parse_version(text, path: str = "engine.vllm_version") -> tuple:
    """'0.6.3.post1', 'v0.19.0rc1', '0.1.7' -> (0, 6, 3): the leading numeric release parts."""
    m = re.match(r"^\s*v?(\d+)((?:\.\d+)*)", str(text))
    if not m:
        raise ConfigError(path, text, "a vLLM version such as \"0.6.3\" or \"0.15.1\"")
    parts = [int(m.group(1))] + [int(x) for x in m.group(2).split(".") if x]
    while len(parts) < 3:
        parts.append(0)
    return tuple(parts[:3])


@lru_cache(maxsize=1)
def generations() -> tuple:
    """The presets, oldest first (package data, read once)."""
    text = resources.files("dsim.config").joinpath("data/engine_generations.yaml").read_text()
    out = []
    for g in read_yaml(text, shipped=True)["generations"]:
        out.append(Generation(
            name=g["name"], since=parse_version(g["since"]),
            before=parse_version(g["before"]) if g.get("before") else None,
            description=g["description"], scheduler=g["scheduler"], executor=g["executor"],
            cuda_graphs=bool(g["cuda_graphs"]), host=HostCosts(**g["host"]),
            alpha_us=tuple(float(a) for a in g["alpha_us"]), provenance=" ".join(g["provenance"].split()),
            profile_activation=g.get("profile_activation", "layer"), engine_use_ray=g.get("engine_use_ray")))
    return tuple(out)


def generation_for(version, path: str = "engine.vllm_version") -> Generation:
    """The preset whose [since, before) range holds ``version``; None -> the newest generation."""
    gens = generations()
    if version is None:
        return gens[-1]
    v = parse_version(version, path)
    for g in gens:
        if g.since <= v and (g.before is None or v < g.before):
            return g
    raise ConfigError(path, version, f"a vLLM version >= {'.'.join(map(str, gens[0].since))}")


def by_name(name: str) -> Generation:
    return next(g for g in generations() if g.name == name)
