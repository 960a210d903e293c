"""PartitionedRNG: one numpy Generator per named subsystem (seed 004, BC-10).

A subsystem's stream depends only on (master seed, name), via a stable hash, so drawing from
one subsystem never shifts another, whatever the call order.
"""
from __future__ import annotations

import hashlib

import numpy as np


def subsystem_seed(master_seed: int, name: str) -> int:
    h = hashlib.blake2b(f"{int(master_seed)}\x00{name}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "little")


def seed_group(name: str) -> str:
    """Which of a scenario's ``seeds`` a stream follows (seed 004's SimulationKey): ``workload``
    (arrivals, lengths, prefixes, speculative clients' think times), ``jitter`` (timing noise: latency models' draws, the network),
    or ``simulation`` (everything else: routers, acceptance draws, trace sampling)."""
    head = name.split(".", 1)[0]
    if head in ("workload", "cosim") or name.startswith("specdec.think"):     # think time times arrivals
        return "workload"
    if head in ("latency", "network"):
        return "jitter"
    return "simulation"


class PartitionedRNG:
    """``seeds`` (optional) gives a group of streams its own master seed, so a sweep can hold the
    workload fixed while it varies the rest, or the other way round; a group left out (or None)
    follows ``master_seed``, which is then what the streams would be without ``seeds``."""

    def __init__(self, master_seed: int, seeds: dict | None = None):
        self.master_seed = int(master_seed)
        self.seeds = {k: int(v) for k, v in (seeds or {}).items() if v is not None}
        self._streams: dict[str, np.random.Generator] = {}

    def stream(self, name: str) -> np.random.Generator:
        g = self._streams.get(name)
        if g is None:
            seed = self.seeds.get(seed_group(name), self.master_seed) if self.seeds else self.master_seed
            g = np.random.Generator(np.random.PCG64(subsystem_seed(seed, name)))
            self._streams[name] = g
        return g

    __call__ = stream
