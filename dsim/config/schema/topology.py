"""``speculation.topology``: the auto-topology of seed 002 (Status "Multi-Cluster Routing", 5.8).

Which draft device may send its conversations to which target pool, and over which link, is
generated from a few rules instead of being listed edge by edge: ``affinity_rules`` (a draft group,
or every group of a device kind, may reach only these clusters or pools), ``fanout_per_draft``
(each device connects to this many of the pools it may reach) and ``clusters[]`` (the link from
the gateway to each cluster, generated into the network with a link from the cluster to each of
its replicas).  The generator is dsim.specdec.topology; the rule is in docs/specdec.md.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..limits import MAX_TIME_S, MIN_BW_MBPS
from .base import Float, Int, Section, Str, field_validator

MAX_MS = MAX_TIME_S * 1e3


class ClusterUplink(Section):
    """The link from the draft devices' gateway to one cluster (its network node is its name)."""
    name: Str
    """A cluster of cluster.clusters (or ``default``, the cluster of a scenario that lists pools only)."""
    rtt_ms: Float(0, MAX_MS)
    """Round-trip time from the gateway to the cluster, ms."""
    bw_mbps: Float(MIN_BW_MBPS)
    """Bandwidth of the gateway-to-cluster link, Mbit/s."""


class ReplicaLink(Section):
    """The link from a cluster's node to each of its replicas (generated with ``clusters``)."""
    rtt_ms: Float(0, MAX_MS) = 0.02
    """Round-trip time inside the cluster, ms."""
    bw_mbps: Float(MIN_BW_MBPS) = 100_000.0
    """Bandwidth inside the cluster, Mbit/s."""


class AutoTopology(Section):
    """Generated draft-to-target connectivity: a device's conversations are routed only to the pools
    it connects to (docs/specdec.md, "Auto-topology")."""
    clusters: list[ClusterUplink] | None = None
    """Gateway-to-cluster links, one per cluster of the fleet: the network (gateway -> cluster ->
    replica) is generated from them (None: no generated network; the network section, if any,
    carries the messages)."""
    replica_link: ReplicaLink = ReplicaLink()
    """Cluster-to-replica link of the generated network (only with clusters)."""
    fanout_per_draft: Int(1, 4096) | None = None
    """Pools each draft device connects to, among those its affinity rule allows; device j of a
    group takes the allowed pools from position j mod n on, wrapping (None: all allowed pools)."""
    affinity_rules: dict[Str, list[Str]] = {}
    """Draft group name (or device kind: phone | laptop | edge) -> the clusters or pools its devices may
    reach; a group's own name wins over its kind; a group no rule names may reach every pool."""

    @field_validator("clusters")
    @classmethod
    def _unique(cls, v):
        if v is None:
            return v
        seen = set()
        for i, c in enumerate(v):
            if c.name in seen:
                raise ConfigError(f"[{i}].name", c.name, "a cluster listed once")
            seen.add(c.name)
        return v

    @field_validator("affinity_rules")
    @classmethod
    def _non_empty(cls, v):
        for k, targets in v.items():
            if not targets:
                raise ConfigError(str(k), targets, "a non-empty list of clusters or pools")
        return v
