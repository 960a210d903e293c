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


class PartitionedRNG:
    def __init__(self, master_seed: int):
        self.master_seed = int(master_seed)
        self._streams: dict[str, np.random.Generator] = {}

    def stream(self, name: str) -> np.random.Generator:
        g = self._streams.get(name)
        if g is None:
            g = np.random.Generator(np.random.PCG64(subsystem_seed(self.master_seed, name)))
            self._streams[name] = g
        return g

    __call__ = stream
