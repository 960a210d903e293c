"""Network topologies (NetworkX): explicit links, a leaf-spine (clos) fabric, or a complete graph.

Every edge is full duplex: each direction has the edge's bandwidth to itself.  Latencies are
one-way (rtt / 2 for explicit links; per hop for clos).  Paths are shortest by latency, with
ties broken by node insertion order (deterministic); path latency and bottleneck bandwidth are
cached per (src, dst).
"""
from __future__ import annotations

import networkx as nx

from ..config.errors import ConfigError
from ..config.fields import Section
from ..config.limits import MAX_NODES, MAX_TIME_S, MIN_BW_MBPS

BW_RULE = f"a bandwidth >= {MIN_BW_MBPS:g} Mb/s (1 kbit/s)"

MBPS = 1e6 / 8          # bytes/s per Mb/s


class Topology:
    def __init__(self, graph: nx.Graph, kind: str, path: str, auto_attach=None):
        self.g = graph
        self.kind = kind
        self.path = path
        self._auto = auto_attach        # callable(device) -> attach a new device, or None
        self._paths: dict = {}
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
        self._paths.clear()
        self._latency.clear()

    def ensure(self, device: str, where: str) -> None:
        """Make sure ``device`` is a node (auto-attaching where the preset allows)."""
        if device in self.g:
            return
        if self._auto is None:
            known = ", ".join(sorted(n for n, d in self.g.nodes(data=True) if d.get("device", True)))
            raise ConfigError(where, device, f"a device of the {self.kind} topology at {self.path} ({known})")
        self._auto(device)
        self._paths.clear()
        self._latency.clear()

    def route(self, src: str, dst: str, down=frozenset()) -> list:
        """Nodes on the lowest-latency path avoiding ``down`` edges (frozensets {u, v})."""
        key = (src, dst)
        if not down:
            p = self._paths.get(key)
            if p is not None:
                return p
        g = self.g
        if down:
            g = nx.restricted_view(self.g, [], [tuple(e) for e in down])
        try:
            p = nx.shortest_path(g, src, dst, weight="latency_s")
        except nx.NetworkXNoPath:
            return None
        if not down:
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


def _edge(g, u, v, latency_s, bw_mbps, where):
    if not bw_mbps >= MIN_BW_MBPS:
        raise ConfigError(where, bw_mbps, BW_RULE)
    g.add_edge(u, v, latency_s=latency_s, bw=bw_mbps * MBPS, key=where)


def build_topology(s: Section, path: str) -> Topology:
    """One of ``links``, ``clos`` or ``complete`` under ``network``."""
    kinds = [k for k in ("links", "clos", "complete") if k in s.data]
    if len(kinds) != 1:
        raise ConfigError(path, sorted(s.data), "exactly one of links, clos or complete", show_value=bool(kinds))
    kind = kinds[0]
    g = nx.Graph()
    if kind == "links":
        rows = s.raw("links")
        if not isinstance(rows, list) or not rows:
            raise ConfigError(s.sub("links"), rows, "a non-empty list of {src, dst, rtt_ms, bw_mbps}")
        for i, row in enumerate(rows):
            p = f"{s.sub('links')}[{i}]"
            r = Section(row, p)
            u, v = r.str("src"), r.str("dst")
            if u == v:
                raise ConfigError(f"{p}.dst", v, "a device other than src")
            if g.has_edge(u, v):
                raise ConfigError(p, [u, v], "one link per pair of devices")
            _edge(g, u, v, r.num("rtt_ms", lo=0, hi=MAX_TIME_S * 1e3) / 2e3, r.num("bw_mbps"), f"{p}.bw_mbps")
            r.done()
        return Topology(g, kind, s.sub("links"))
    c = s.section(kind)
    if kind == "complete":
        lat = c.num("rtt_ms", lo=0, hi=MAX_TIME_S * 1e3) / 2e3
        bw = c.num("bw_mbps") * MBPS
        if not bw >= MIN_BW_MBPS * MBPS:
            raise ConfigError(c.sub("bw_mbps"), bw / MBPS, BW_RULE)
        devices = c.raw("devices", [])
        if not isinstance(devices, list):
            raise ConfigError(c.sub("devices"), devices, "a list of device names")
        c.done()

        def attach(dev):
            for other in list(g.nodes):
                g.add_edge(dev, other, latency_s=lat, bw=bw, key=c.sub("bw_mbps"))
            g.add_node(dev)
        for d in devices:
            attach(str(d))
        return Topology(g, kind, c.path, attach)
    # leaf-spine: every leaf connects to every spine; devices hang off one leaf each
    spines = c.int("spine_count", lo=1, hi=MAX_NODES)
    leaves = c.int("leaf_count", lo=1, hi=MAX_NODES)
    hop = c.num("hop_latency_ms", lo=0) / 1e3
    edge_lat = c.num("device_edge_latency_ms", lo=0) / 1e3
    fabric_bw = c.num("spine_bw_mbps", 400_000) * MBPS
    edge_bw = c.num("edge_bw_mbps", 400_000) * MBPS
    for key, v in (("spine_bw_mbps", fabric_bw), ("edge_bw_mbps", edge_bw)):
        if not v >= MIN_BW_MBPS * MBPS:
            raise ConfigError(c.sub(key), v / MBPS, BW_RULE)
    attach_map = c.raw("attach", {})
    if not isinstance(attach_map, dict):
        raise ConfigError(c.sub("attach"), attach_map, "a mapping device -> leaf index")
    c.done()
    for j in range(leaves):
        g.add_node(f"leaf{j}", device=False)
    for i in range(spines):
        g.add_node(f"spine{i}", device=False)
        for j in range(leaves):
            g.add_edge(f"leaf{j}", f"spine{i}", latency_s=hop, bw=fabric_bw, key=c.sub("spine_bw_mbps"))
    counter = [0]

    def attach(dev, leaf=None):
        if leaf is None:
            leaf = counter[0] % leaves
            counter[0] += 1
        g.add_edge(dev, f"leaf{leaf}", latency_s=edge_lat, bw=edge_bw, key=c.sub("edge_bw_mbps"))
    for dev, leaf in attach_map.items():
        if isinstance(leaf, bool) or not isinstance(leaf, int) or not 0 <= leaf < leaves:
            raise ConfigError(f"{c.sub('attach')}.{dev}", leaf, f"a leaf index in 0..{leaves - 1}")
        attach(str(dev), leaf)
    return Topology(g, kind, c.path, attach)
