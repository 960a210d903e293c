"""A ``network`` section made into a fabric: topology, jitter distributions, outages."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

from .fabric import Network
from .topology import build_topology

if TYPE_CHECKING:                       # the schema is imported when a scenario is loaded, not with dsim
    from ..config.schema.network import NetworkConfig


class _Jitter:
    """Additive RTT jitter (ms) or multiplicative bandwidth factor, distribution named in YAML."""

    def __init__(self, cfg, kind):
        self.kind = kind
        self.dist = cfg.dist
        self.scale = cfg.scale_ms / 1e3 if kind == "rtt" else cfg.scale_pct / 100

    def sample(self, rng) -> float:
        d, x = self.dist, self.scale
        if self.kind == "rtt":          # seconds added to the RTT (the one-way latency gets half)
            if d == "normal":
                return x * float(rng.standard_normal())
            if d == "uniform":
                return x * float(rng.uniform(-1.0, 1.0))
            return float(rng.exponential(x)) if x > 0 else 0.0
        if d == "lognormal":            # bandwidth factor with mean 1
            return math.exp(x * float(rng.standard_normal()) - x * x / 2)
        if d == "normal":
            return max(0.05, 1.0 + x * float(rng.standard_normal()))
        return max(0.05, 1.0 + x * float(rng.uniform(-1.0, 1.0)))


def build_network(cfg: NetworkConfig, env, rng, path: str = "network") -> Network:
    """The fabric a validated ``network`` section declares (parse a mapping first:
    ``parse(NetworkConfig, raw, "network")``), with its outages scheduled on ``env``."""
    topo = build_topology(cfg, path)
    j = cfg.jitter
    rtt = _Jitter(j.rtt, "rtt") if j.rtt is not None else None
    bw = _Jitter(j.bandwidth, "bw") if j.bandwidth is not None else None
    net = Network(env, topo, rng, cfg.serialization_overhead_us / 1e6, cfg.loss_pct / 100,
                  cfg.retransmit_timeout_ms / 1e3, cfg.max_retries, rtt, bw, cfg.outage_policy, cfg.timeline_bin_s)
    net.path = path
    for f in cfg.failures:                 # each joins two devices of the topology (checked at load)
        net.outages.append({"link": list(f.link), "start_s": f.start_s, "end_s": f.end_s})
        env.process(net._outage(frozenset(f.link), f.start_s, f.end_s))
    return net
