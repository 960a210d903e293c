"""Controller-facing calibrated throughput model (seed 001).

The seed describes a replica by two throughputs and a handful of penalties, so that controller
actions (batch size, scale out, speculative decoding) have a clear causal effect:

* prefill: tokens / (base_prefill_tps x gpus x (1 - saturation_penalty(gpu_util)));
* decode: each decode step emits one token per request in sqrt(B) / (base_decode_tps x gpus)
  seconds (the seed's tokens_per_second_decode = base x gpus / sqrt(batch));
* TP: 5 x log2(gpus) ms per step that prefills, a tenth of that per decode step;
* speculative decoding: decode time x speculation_factor (0.6), draft work adds 20 % to the
  utilisation that drives the saturation penalty.

Mapped onto dsim's iteration-level loop: the seed's 100 ms tick becomes one scheduler step, its
``batch_size`` the number of decoding requests in the step, and gpu_count the TP degree.
The seed's utilisation formula is taken literally (prefill seconds of work in the step + 0.3 x
decode seconds, as a percentage).  Its penalty code checks ``> 85`` before ``> 95``, which makes
the severe branch unreachable; here the branches are ordered so both apply (85-95 %: 0 to 10 %,
above 95 %: 15 % + 20 % x (u - 95) / 5), as its comments describe.
"""
from __future__ import annotations

import math

from .base import BatchShape


def saturation_penalty(util_pct: float) -> float:
    if util_pct > 95:
        return 0.15 + 0.20 * ((min(util_pct, 100.0) - 95) / 5)
    if util_pct > 85:
        return 0.15 * ((util_pct - 85) / 15)
    return 0.0


class CalibratedTPSModel:

    pure = True          # step_time keeps no state: quiet decode steps may be replayed in one go
    name = "calibrated_tps"
    DEFAULTS = {"base_prefill_tps": 3000.0, "base_decode_tps": 200.0, "comm_overhead_ms": 5.0,
                "speculative": False, "speculation_factor": 0.6, "draft_compute_overhead": 0.2}

    def __init__(self, gpus: int = 1, **params):
        unknown = set(params) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"unknown calibrated_tps parameters: {sorted(unknown)}")
        p = {**self.DEFAULTS, **params}
        self.gpus = gpus
        self.prefill_tps = p["base_prefill_tps"] * gpus
        self.decode_tps = p["base_decode_tps"] * gpus
        comm = p["comm_overhead_ms"] * 1e-3 * math.log2(gpus) if gpus > 1 else 0.0
        self.comm_prefill, self.comm_decode = comm, comm / 10
        self.spec = bool(p["speculative"])
        self.decode_factor = p["speculation_factor"] if self.spec else 1.0
        self.util_factor = 1.0 + (p["draft_compute_overhead"] if self.spec else 0.0)

    def gpu_utilization(self, b: BatchShape) -> float:
        """Percent, the seed's formula: prefill load + 0.3 x decode load."""
        load = b.prefill_tokens / self.prefill_tps + 0.3 * b.decode_tokens / self.decode_tps
        return min(100.0, load * 100.0 * self.util_factor)

    def step_time(self, b: BatchShape) -> float:
        t = 0.0
        if b.prefill_tokens:
            tps = self.prefill_tps * (1.0 - saturation_penalty(self.gpu_utilization(b)))
            t += b.prefill_tokens / tps + self.comm_prefill
        if b.decode_tokens:
            t += math.sqrt(b.decode_tokens) / self.decode_tps * self.decode_factor + self.comm_decode
        return t
