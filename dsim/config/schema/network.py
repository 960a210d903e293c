"""The ``network``: section of a scenario (declared schema; see dsim.config.schema.base for the rules).

One topology (``links``, ``clos`` or ``complete``) and the transfer model on top of it (overhead,
jitter, loss, outages).  Everything a scenario can get wrong here is refused at load, including a
``failures`` row naming two devices the topology does not join: :meth:`NetworkConfig.joins` states
which pairs ``dsim.network.topology.build_topology`` links, so the check needs no graph.
"""
from __future__ import annotations

import re
from typing import Annotated, Any

from ..errors import ConfigError
from ..fields import check_number
from ..limits import MAX_NODES, MAX_TIME_S, MIN_BW_MBPS
from .base import (BeforeValidator, Choice, Field, Float, Int, Section, Str, checked, field_validator,
                   model_validator)

KINDS = ("links", "clos", "complete")
BW_RULE = f"a bandwidth >= {MIN_BW_MBPS:g} Mb/s (1 kbit/s)"
MAX_RTT_MS = MAX_TIME_S * 1e3


def _bandwidth(v):
    v = check_number(v, "")                  # a finite number first, then dsim's floor for links
    if not v >= MIN_BW_MBPS:
        raise ConfigError("", v, BW_RULE)
    return v


Bandwidth = checked(float, _bandwidth, {"type": "number", "minimum": MIN_BW_MBPS})
"""A link's bandwidth in Mb/s (1 kbit/s at least: slower links make a run's fabric work explode)."""


def _name(v):
    # complete.devices, clos.attach and failures name devices; YAML reads `7` as a number
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise ConfigError("", v, "a device name")
    return str(v)


DeviceName = checked(str, _name, {"type": ["string", "integer"]})


def _shaped(kind: type, expected: str):
    """A before-check that keeps the message naming what the key holds ("a list of device names")."""
    def check(v):
        if not isinstance(v, kind):
            raise ConfigError("", v, expected)
        return v
    return BeforeValidator(check)


class Link(Section):
    """One full-duplex link between two devices (each direction has ``bw_mbps`` to itself)."""
    src: Str
    """One end: a device name (a replica such as prefill-0, its pool's name, a gateway, a switch)."""
    dst: Str
    """The other end (a device other than src)."""
    rtt_ms: Float(0, MAX_RTT_MS)
    """Round-trip time, ms; a message's one-way latency over the link is rtt_ms / 2."""
    bw_mbps: Bandwidth
    """Bandwidth of each direction, Mb/s (>= 0.001)."""

    @model_validator(mode="after")
    def _two_ends(self):
        if self.src == self.dst:
            raise ConfigError("dst", self.dst, "a device other than src")
        return self


class Clos(Section):
    """A leaf-spine fabric: every leaf linked to every spine, each device hanging off one leaf."""
    spine_count: Int(1, MAX_NODES)
    """Number of spine switches (nodes spine0, spine1, ...)."""
    leaf_count: Int(1, MAX_NODES)
    """Number of leaf switches (nodes leaf0, leaf1, ...)."""
    hop_latency_ms: Float(0)
    """One-way latency of a leaf-spine link, ms."""
    device_edge_latency_ms: Float(0)
    """One-way latency of a device's link to its leaf, ms."""
    spine_bw_mbps: Bandwidth = 400_000
    """Bandwidth of each leaf-spine link (each direction), Mb/s."""
    edge_bw_mbps: Bandwidth = 400_000
    """Bandwidth of each device's link to its leaf (each direction), Mb/s."""
    attach: Annotated[dict[DeviceName, Int()], _shaped(dict, "a mapping device -> leaf index")] = {}
    """Leaf index (0..leaf_count - 1) of named devices; others join leaves round-robin when first used."""

    @model_validator(mode="after")
    def _leaves_exist(self):
        for dev, leaf in self.attach.items():
            if not 0 <= leaf < self.leaf_count:
                raise ConfigError(f"attach.{dev}", leaf, f"a leaf index in 0..{self.leaf_count - 1}")
        return self

    def joins(self, a: str, b: str) -> bool:
        """A device and the leaf it is attached to, or a leaf and a spine."""
        for x, y in ((a, b), (b, a)):
            if x in self.attach and y == f"leaf{self.attach[x]}":
                return True
            if _switch(x, "leaf", self.leaf_count) and _switch(y, "spine", self.spine_count):
                return True
        return False


def _switch(name: str, prefix: str, count: int) -> bool:
    """Is ``name`` one of the fabric's switches ``prefix0`` .. ``prefix{count - 1}``?"""
    m = re.fullmatch(prefix + r"(0|[1-9][0-9]*)", name)
    return m is not None and int(m.group(1)) < count


class Complete(Section):
    """A direct link between every pair of devices; devices not listed join when first used."""
    rtt_ms: Float(0, MAX_RTT_MS)
    """Round-trip time of every link, ms (one-way latency rtt_ms / 2)."""
    bw_mbps: Bandwidth
    """Bandwidth of every link (each direction), Mb/s."""
    devices: Annotated[list[DeviceName], _shaped(list, "a list of device names")] = []
    """Devices present from the start (a failures row can only name these)."""

    def joins(self, a: str, b: str) -> bool:
        """Any two listed devices."""
        return a != b and a in self.devices and b in self.devices


class RttJitter(Section):
    """Random delay added to each message's RTT (its one-way latency gets half, never below 0)."""
    dist: Choice("normal", "uniform", "exponential")
    """Distribution: normal (scale is the std), uniform (half-width) or exponential (mean)."""
    scale_ms: Float(0, MAX_RTT_MS)
    """Its scale, ms."""


class BandwidthJitter(Section):
    """A random factor on each message's bandwidth."""
    dist: Choice("lognormal", "normal", "uniform")
    """Distribution: lognormal (mean 1), normal or uniform (both clipped at 0.05)."""
    scale_pct: Float(0, 300)
    """Its scale, % (the lognormal's sigma, the normal's std, the uniform's half-width)."""


class Jitter(Section):
    """Per-message randomness of the links (none by default)."""
    rtt: RttJitter | None = None
    """RTT jitter (None: every message gets the path's latency)."""
    bandwidth: BandwidthJitter | None = None
    """Bandwidth jitter (None: every message gets the max-min fair rate)."""


LINK_RULE = "[a, b]: two devices joined by a link of the topology"


def _pair(v):
    if not isinstance(v, list) or len(v) != 2:
        raise ConfigError("", v, LINK_RULE)
    return v


class Failure(Section):
    """A scheduled outage of one link (both directions)."""
    link: Annotated[list[DeviceName], BeforeValidator(_pair), Field(min_length=2, max_length=2)]
    """The two ends [a, b] of a link of the topology (clos switches are leafJ and spineI)."""
    start_s: Float(0)
    """When the link goes down, simulated seconds."""
    end_s: Float(0)
    """When it comes back (> start_s)."""

    @model_validator(mode="after")
    def _ends_after_start(self):
        if self.end_s <= self.start_s:
            raise ConfigError("end_s", self.end_s, f"> start_s ({self.start_s})")
        return self


class NetworkConfig(Section):
    """The fabric between clients, gateways and replicas: exactly one of links, clos or complete,
    and how messages cross it."""
    links: Annotated[list[Link], Field(min_length=1)] | None = None
    """Explicit links between named devices (paths are the lowest-latency ones)."""
    clos: Clos | None = None
    """A leaf-spine fabric."""
    complete: Complete | None = None
    """A complete graph over the devices."""
    serialization_overhead_us: Float(0) = 0.0
    """Fixed cost of each message before its first byte, microseconds."""
    loss_pct: Float(0, 99) = 0.0
    """Probability that a message is lost and sent again, %."""
    retransmit_timeout_ms: Float(0) = 200.0
    """Time from a lost message's last byte to its resend, ms."""
    max_retries: Int(0) | None = None
    """Resends before a message fails (a P/D request then fails; None: unlimited)."""
    jitter: Jitter = Jitter()
    """Per-message RTT and bandwidth jitter."""
    outage_policy: Choice("wait", "failover") = "wait"
    """During an outage, flows crossing the down link wait, or fail over to the best path avoiding it."""
    timeline_bin_s: Float(0, lo_open=True) = 1.0
    """Bin of the per-link utilisation timeline (plots/network.png), seconds."""
    failures: Annotated[list[Failure], _shaped(list, "a list of {link: [a, b], start_s, end_s}")] = []
    """Scheduled link outages."""

    @model_validator(mode="before")
    @classmethod
    def _one_topology(cls, data: Any) -> Any:
        if isinstance(data, dict) and all(k in cls.keys() for k in data):   # else Section's checks say why
            kinds = [k for k in KINDS if k in data]
            if len(kinds) != 1:
                raise ConfigError("", sorted(data, key=str), "exactly one of links, clos or complete",
                                  show_value=bool(kinds))
        return data

    @field_validator("links", mode="before")
    @classmethod
    def _some_links(cls, v):
        if not isinstance(v, list) or not v:
            raise ConfigError("", v, "a non-empty list of {src, dst, rtt_ms, bw_mbps}")
        return v

    @field_validator("clos", "complete", mode="before")
    @classmethod
    def _null_is_empty(cls, v):
        return {} if v is None else v        # written but empty: its own keys are then missing

    @field_validator("links", mode="after")
    @classmethod
    def _one_link_per_pair(cls, links):
        seen = set()
        for i, lk in enumerate(links):
            pair = frozenset((lk.src, lk.dst))
            if pair in seen:
                raise ConfigError(f"[{i}]", [lk.src, lk.dst], "one link per pair of devices")
            seen.add(pair)
        return links

    @model_validator(mode="after")
    def _failures_on_links(self):
        for i, f in enumerate(self.failures):
            if not self.joins(*f.link):
                raise ConfigError(f"failures[{i}].link", f.link, LINK_RULE)
        return self

    @property
    def kind(self) -> str:
        """Which topology: links, clos or complete."""
        return next(k for k in KINDS if getattr(self, k) is not None)

    def joins(self, a: str, b: str) -> bool:
        """Does the topology, as declared, have a link between ``a`` and ``b`` (either order)?
        Devices auto-attached at run time are not in it yet."""
        if self.links is not None:
            return any({lk.src, lk.dst} == {a, b} for lk in self.links)
        return getattr(self, self.kind).joins(a, b)


NetworkField = NetworkConfig | None
