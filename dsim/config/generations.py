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

import yaml

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

    def minus(self, ref: "HostCosts") -> "HostCosts":
        """The per-step costs of self beyond ref's.  Launch gaps are not subtracted: they are paid
        only on steps a graph does not capture, and the reference captured them."""
        return replace(self, **{k: getattr(self, k) - getattr(ref, k) for k in
                                ("step_us", "per_seq_us", "per_prefill_us", "per_worker_us")})

    @property
    def is_zero(self) -> bool:
        return not (self.step_us or self.per_seq_us or self.per_prefill_us or self.per_worker_us
                    or self.eager_layer_us)


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
    for g in yaml.safe_load(text)["generations"]:
        out.append(Generation(
            name=g["name"], since=parse_version(g["since"]),
            before=parse_version(g["before"]) if g.get("before") else None,
            description=g["description"], scheduler=g["scheduler"], executor=g["executor"],
            cuda_graphs=bool(g["cuda_graphs"]), host=HostCosts(**g["host"]),
            alpha_us=tuple(float(a) for a in g["alpha_us"]), provenance=" ".join(g["provenance"].split())))
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
