"""Network topologies (NetworkX): explicit links, a leaf-spine (clos) fabric, or a complete graph.

Every edge is full duplex: each direction has the edge's bandwidth to itself.  Latencies are
one-way (rtt / 2 for explicit links; per hop for clos).  Paths are shortest by latency, with
ties broken by node insertion order (deterministic); path latency and bottleneck bandwidth are
cached per (src, dst).
"""
from __future__ import annotations

import networkx as nx

from typing import TYPE_CHECKING

from ..config.errors import ConfigError

if TYPE_CHECKING:                       # the schema is imported when a scenario is loaded, not with dsim
    from ..config.schema.network import NetworkConfig

MBPS = 1e6 / 8          # bytes/s per Mb/s


class Topology:
    def __init__(self, graph: nx.Graph, kind: str, path: str, auto_attach=None):
        self.g = graph
        self.kind = kind
        self.path = path
        self._auto = auto_attach        # callable(device) -> attach a new device, or None
        self._paths: dict = {}
        self._detours: dict = {}        # (src, dst, down edges) -> route avoiding them (or None)
        self._latency: dict = {}

    def has(self, device: str) -> bool:
        return device in self.g

    @property
    def attaches_new_devices(self) -> bool:
        """clos and complete attach unknown devices when first used; explicit links do not."""
        return self._auto is not None

    def add_link(self, u: str, v: str, latency_s: float, bw_bytes_s: float, key: str | None = None) -> None:
        """Attach a link at run time (draft devices' access links); cached paths are dropped.
        ``key``: the scenario key that set its bandwidth (named when the network's work explodes)."""
        old = self.g.edges[u, v].get("key") if self.g.has_edge(u, v) else None
        self.g.add_edge(u, v, latency_s=latency_s, bw=bw_bytes_s, key=key or old)
        self._forget_routes()

    def ensure(self, device: str, where: str) -> None:
        """Make sure ``device`` is a node (auto-attaching where the preset allows)."""
        if device in self.g:
            return
        if self._auto is None:
            known = ", ".join(sorted(n for n, d in self.g.nodes(data=True) if d.get("device", True)))
            raise ConfigError(where, device, f"a device of the {self.kind} topology at {self.path} ({known})")
        self._auto(device)
        self._forget_routes()

    def _forget_routes(self) -> None:
        """The graph changed: every cached route, detour and latency may have."""
        self._paths.clear()
        self._detours.clear()
        self._latency.clear()

    def route(self, src: str, dst: str, down=frozenset()) -> list:
        """Nodes on the lowest-latency path avoiding ``down`` edges (frozensets {u, v}); cached per
        (src, dst) and, with edges down, per set of down edges (a detour is the same until the graph
        or that set changes: every send during an outage would otherwise search the graph again)."""
        if not down:
            key = (src, dst)
            p = self._paths.get(key)
            if p is not None:
                return p
        else:
            key = (src, dst, down)
            if key in self._detours:
                return self._detours[key]
        g = self.g
        if down:
            g = nx.restricted_view(self.g, [], [tuple(e) for e in down])
        try:
            p = nx.shortest_path(g, src, dst, weight="latency_s")
        except nx.NetworkXNoPath:
            p = None
        if down:
            self._detours[key] = p
        elif p is not None:
            self._paths[key] = p
        return p

    def latency_s(self, src: str, dst: str) -> float:
        lat = self._latency.get((src, dst))
        if lat is None:
            p = self.route(src, dst)
            lat = self._latency[src, dst] = sum(self.g.edges[u, v]["latency_s"] for u, v in zip(p, p[1:]))
        return lat

    def bottleneck_bytes_s(self, src: str, dst: str) -> float:
        p = self.route(src, dst)
        return min((self.g.edges[u, v]["bw"] for u, v in zip(p, p[1:])), default=float("inf"))


def build_topology(cfg: NetworkConfig, path: str) -> Topology:
    """The graph of the one topology the (validated) ``network`` section declares.  Each edge keeps
    the scenario key that set its bandwidth (named if the run's fabric work explodes)."""
    g = nx.Graph()
    kind = cfg.kind
    if kind == "links":
        for i, lk in enumerate(cfg.links):
            g.add_edge(lk.src, lk.dst, latency_s=lk.rtt_ms / 2e3, bw=lk.bw_mbps * MBPS,
                       key=f"{path}.links[{i}].bw_mbps")
        return Topology(g, kind, f"{path}.links")
    where = f"{path}.{kind}"
    if kind == "complete":
        c = cfg.complete
        lat, bw = c.rtt_ms / 2e3, c.bw_mbps * MBPS

        def attach(dev):
            for other in list(g.nodes):
                g.add_edge(dev, other, latency_s=lat, bw=bw, key=f"{where}.bw_mbps")
            g.add_node(dev)
        for d in c.devices:
            attach(d)
        return Topology(g, kind, where, attach)
    # leaf-spine: every leaf connects to every spine; devices hang off one leaf each
    c = cfg.clos
    leaves, hop, edge_lat = c.leaf_count, c.hop_latency_ms / 1e3, c.device_edge_latency_ms / 1e3
    fabric_bw, edge_bw = c.spine_bw_mbps * MBPS, c.edge_bw_mbps * MBPS
    for j in range(leaves):
        g.add_node(f"leaf{j}", device=False)
    for i in range(c.spine_count):
        g.add_node(f"spine{i}", device=False)
        for j in range(leaves):
            g.add_edge(f"leaf{j}", f"spine{i}", latency_s=hop, bw=fabric_bw, key=f"{where}.spine_bw_mbps")
    counter = [0]

    def attach(dev, leaf=None):
        if leaf is None:
            leaf = counter[0] % leaves
            counter[0] += 1
        g.add_edge(dev, f"leaf{leaf}", latency_s=edge_lat, bw=edge_bw, key=f"{where}.edge_bw_mbps")
    for dev, leaf in c.attach.items():
        attach(dev, leaf)
    return Topology(g, kind, where, attach)
