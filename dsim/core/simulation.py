"""Simulation: owns the simpy.Environment, the RNG partitions and the clock checks (BC-5)."""
from __future__ import annotations

import simpy

from .rng import PartitionedRNG


class Simulation:
    def __init__(self, seed: int):
        self.env = simpy.Environment()
        self.rng = PartitionedRNG(seed)
        self.seed = seed

    @property
    def now(self) -> float:
        return self.env.now

    def process(self, gen):
        return self.env.process(gen)

    def run(self, until=None) -> None:
        self.env.run(until=until)
