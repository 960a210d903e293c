"""Auto-topology (seed 002, Status "Multi-Cluster Routing" and 5.8): the draft-to-target
connectivity generated from ``speculation.topology``'s rules.

The rule (deterministic, no random draw):
1. A group's *allowed pools* are the fleet's entry pools (every pool but decode pools, which a
   conversation reaches through its cluster's prefill pool), in the order the scenario declares
   them, kept when the group's affinity rule names the pool or its cluster.  The rule of a group is
   ``affinity_rules[group name]``, else ``affinity_rules[its profile's kind]``, else none (every pool).
2. With ``fanout_per_draft`` f and n allowed pools, device j of the group (``<group>-<j>``)
   connects to the allowed pools at positions j, j+1, ..., j+f-1 (mod n): the devices stripe over
   the pools, so each pool gets the same share of a group's devices (within one when n does not
   divide the count).  Without fanout a device connects to all n.
3. An edge's link is the device's access link (the group's rtt_ms/bw_mbps) followed by the path from
   the gateway to the pool's first replica: with ``clusters`` the generated gateway -> cluster ->
   replica links, else the network section's path (nothing when the replica is not a node of it).
   rtt adds up; the bandwidth is the narrowest link's.

At run time a conversation is routed only among the replicas of its device's pools (the global
router among the clusters that hold one, then the cluster's router); ``describe()`` is what
summary.json's ``speculation.topology`` and ``dsim validate`` show.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..config.errors import ConfigError

WHERE = "speculation.topology"


@dataclass(frozen=True)
class Edge:
    group: str
    pool: str
    cluster: str
    devices: int          # devices of the group connected to the pool
    rtt_ms: float
    bw_mbps: float


@dataclass
class Connectivity:
    allowed: dict                     # group -> [pool names] in declaration order
    fanout: dict                      # group -> pools per device
    counts: dict                      # group -> devices
    edges: list
    uplinks: dict = field(default_factory=dict)    # cluster -> (rtt_ms, bw_mbps); empty: no generated network
    replica_link: tuple = (0.02, 100_000.0)
    gateway: str = "gateway"

    def pools_of(self, group: str, j: int) -> tuple:
        """The pools device j of ``group`` connects to (rule 2 of the module docstring)."""
        pools, f = self.allowed[group], self.fanout[group]
        n = len(pools)
        return tuple(pools[(j + m) % n] for m in range(f))

    def describe(self) -> dict:
        out = {"rule": "allowed pools in declaration order; device j takes positions j..j+f-1 mod n",
               "groups": {g: {"devices": self.counts[g], "allowed_pools": list(p), "fanout_per_draft": self.fanout[g]}
                          for g, p in self.allowed.items()},
               "edges": [{"group": e.group, "pool": e.pool, "cluster": e.cluster, "devices": e.devices,
                          "rtt_ms": round(e.rtt_ms, 6), "bw_mbps": e.bw_mbps} for e in self.edges]}
        if self.uplinks:
            out["generated_network"] = {"gateway": self.gateway,
                                        "clusters": {c: {"rtt_ms": r, "bw_mbps": b} for c, (r, b) in self.uplinks.items()},
                                        "replica_link": {"rtt_ms": self.replica_link[0],
                                                         "bw_mbps": self.replica_link[1]}}
        return out

    # ---- run time ---------------------------------------------------------------------------------
    def network(self, env, rng):
        """The generated network (gateway -> cluster nodes); replicas are linked by ``attach``."""
        from ..config.schema.base import parse
        from ..config.schema.network import NetworkConfig
        from ..network.build import build_network
        links = [{"src": self.gateway, "dst": c, "rtt_ms": r, "bw_mbps": b} for c, (r, b) in self.uplinks.items()]
        return build_network(parse(NetworkConfig, {"links": links}, WHERE + ".clusters"), env, rng,
                             WHERE + ".clusters")

    def attach(self, net, rep) -> None:
        """Link a replica to its cluster's node (every replica, also those an autoscaler adds)."""
        if not net.topo.has(rep.name):
            from ..network.topology import MBPS
            rtt, bw = self.replica_link
            net.topo.add_link(rep.pool.cluster.name, rep.name, rtt / 2e3, bw * MBPS, WHERE + ".replica_link.bw_mbps")

    def install(self, runtime, fleet) -> None:
        """Route each device's conversations to its pools only (``fleet.reach``)."""
        table = {}
        for dev in runtime.devices:
            g = dev.group.name
            j = int(dev.name.rsplit("-", 1)[1])
            table[dev.name] = frozenset(self.pools_of(g, j))
        states = runtime.states

        def reach(r):
            st = states.get(r.rid)
            dev = st.device if st is not None else None
            return table.get(dev.name) if dev is not None else None
        fleet.reach = reach


def _rule(rules: dict, group) -> tuple:
    if group.name in rules:
        return group.name, rules[group.name]
    if group.profile.kind in rules:
        return group.profile.kind, rules[group.profile.kind]
    return None, None


def plan(topo, groups: list, fleet, network_cfg=None, gateway: str = "gateway") -> Connectivity:
    """The connectivity of a validated ``speculation.topology`` over the spec's draft groups and the
    fleet (a FleetSpec); a ConfigError names the rule that cannot be met."""
    entry = [p for p in fleet.pools if p.role != "decode"]
    clusters = {c.name for c in fleet.clusters}
    pools = {p.name: p for p in fleet.pools}
    names = {g.name for g in groups}
    from ..config.schema.speculation import KINDS
    for key, targets in topo.affinity_rules.items():
        if key not in names and key not in KINDS:
            raise ConfigError(f"{WHERE}.affinity_rules.{key}", None,
                              f"a draft group ({', '.join(sorted(names))}) or a device kind ({', '.join(KINDS)})",
                              show_value=False)
        for i, t in enumerate(targets):
            if t not in clusters and t not in pools:
                raise ConfigError(f"{WHERE}.affinity_rules.{key}[{i}]", t,
                                  f"a cluster ({', '.join(sorted(clusters))}) or a pool ({', '.join(sorted(pools))})")
            if t in pools and pools[t].role == "decode":
                raise ConfigError(f"{WHERE}.affinity_rules.{key}[{i}]", t, "a pool that takes prompts (a decode "
                                  "pool is reached through its cluster's prefill pool)")
    uplinks = {}
    if topo.clusters is not None:
        if network_cfg is not None:
            raise ConfigError(f"{WHERE}.clusters", None, "no clusters when the scenario has a network section "
                              "(the links are written there; the topology then only restricts connectivity)",
                              show_value=False)
        listed = [c.name for c in topo.clusters]
        for i, c in enumerate(topo.clusters):
            if c.name not in clusters:
                raise ConfigError(f"{WHERE}.clusters[{i}].name", c.name, f"a cluster ({', '.join(sorted(clusters))})")
        missing = [c.name for c in fleet.clusters if c.name not in listed]
        if missing:
            raise ConfigError(f"{WHERE}.clusters", listed, f"every cluster of the fleet (missing: {', '.join(missing)})")
        uplinks = {c.name: (c.rtt_ms, c.bw_mbps) for c in topo.clusters}
    rl = (topo.replica_link.rtt_ms, topo.replica_link.bw_mbps)
    declared = _declared_paths(network_cfg, fleet, gateway) if network_cfg is not None and not uplinks else {}
    allowed, fanout, counts, edges = {}, {}, {}, []
    for g in groups:
        key, targets = _rule(topo.affinity_rules, g)
        ok = [p.name for p in entry if targets is None or p.name in targets or p.cluster in targets]
        if not ok:
            raise ConfigError(f"{WHERE}.affinity_rules.{key}", targets,
                              f"clusters or pools with a pool that takes prompts for group {g.name}")
        f = len(ok) if topo.fanout_per_draft is None else topo.fanout_per_draft
        if f > len(ok):
            raise ConfigError(f"{WHERE}.fanout_per_draft", f,
                              f"at most the {len(ok)} pools group {g.name} may reach ({', '.join(ok)})")
        allowed[g.name], fanout[g.name], counts[g.name] = ok, f, g.count
        n = len(ok)
        for pi, pname in enumerate(ok):
            # devices j with pi in {j, ..., j+f-1} mod n: j mod n in {pi-f+1, ..., pi} mod n
            hit = {(pi - m) % n for m in range(f)}
            devs = sum(len(range(r, g.count, n)) for r in hit)
            if not devs:
                continue
            p = pools[pname]
            if uplinks:
                up = uplinks[p.cluster]
                rtt, bw = g.rtt_ms + up[0] + rl[0], min(g.bw_mbps, up[1], rl[1])
            else:
                extra = declared.get(pname)
                rtt = g.rtt_ms + (extra[0] if extra else 0.0)
                bw = min(g.bw_mbps, extra[1]) if extra else g.bw_mbps
            edges.append(Edge(g.name, pname, p.cluster, devs, rtt, bw))
    return Connectivity(allowed, fanout, counts, edges, uplinks, rl, gateway)


def _declared_paths(network_cfg, fleet, gw: str) -> dict:
    """pool -> (rtt ms, bottleneck Mbit/s) from the gateway to its first replica over the declared
    network, for pools whose first replica is a node of it."""
    from ..network.topology import MBPS, build_topology
    topo = build_topology(network_cfg, "network")
    out = {}
    for p in fleet.pools:
        rep = f"{p.name}-0"
        if topo.has(gw) and topo.has(rep) and topo.route(gw, rep) is not None:
            out[p.name] = (2e3 * topo.latency_s(gw, rep), topo.bottleneck_bytes_s(gw, rep) / MBPS)
    return out
