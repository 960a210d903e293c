"""KV-cache transfer between a prefill and a decode replica.

``send(src, dst, nbytes)`` returns a SimPy event whose value is a transfer record; with a
``network:`` section the fleet's NetworkTransfer makes the same call over dsim.network's shared
links (jitter, loss).  This one is a dedicated path per transfer: latency + bytes / bandwidth, no contention.

With pipeline parallelism every stage holds its layers' KV on its own GPUs (and NICs), so a
handoff between a prefill group of Pp stages and a decode group of Pd stages moves in
min(Pp, Pd) parallel streams: each decode stage receives its layers' share, and a group of fewer
stages receives (or sends) the whole of it through its own NICs.
"""
from __future__ import annotations

from typing import NamedTuple


class TransferRecord(NamedTuple):
    """One message's journey (the value of a send event), shared with dsim.network."""
    src: str
    dst: str
    nbytes: float
    start: float
    end: float
    retries: int = 0
    path: tuple = ()
    waited_s: float = 0.0            # time stalled by link outages


class DirectTransfer:
    def __init__(self, env, latency_s: float, bandwidth_bytes_s: float):
        self.env = env
        self.latency_s = latency_s
        self.bw = bandwidth_bytes_s
        self.bytes = 0.0
        self.count = 0
        self.busy_s = 0.0

    def duration(self, nbytes: float, streams: int = 1) -> float:
        """One transfer; ``streams`` paths in parallel (pipeline stages, each its own NIC) carry
        nbytes / streams each."""
        return self.latency_s + (nbytes if streams == 1 else nbytes / streams) / self.bw

    def send(self, src: str, dst: str, nbytes: float, src_pool: str = "", dst_pool: str = "", streams: int = 1,
             then=None):
        """The transfer's event (its value a TransferRecord); ``then(ev)`` is called when it ends."""
        now = self.env.now
        d = self.duration(nbytes, streams)
        self.bytes += nbytes
        self.count += 1
        self.busy_s += d
        ev = self.env.timeout(d, TransferRecord(src, dst, nbytes, now, now + d, 0, (src, dst)))
        if then is not None:
            ev.callbacks.append(then)
        return ev

    def summary(self) -> dict:
        return {"transfers": self.count, "bytes": self.bytes, "total_transfer_s": self.busy_s,
                "latency_ms": self.latency_s * 1e3, "bandwidth_gb_s": self.bw / 1e9}


def build_transfer(spec, env) -> DirectTransfer:
    """The path of a typed ``schema.cluster.KvTransferConfig`` (None: its defaults, one 200 Gb/s
    RDMA NIC: ``{latency_ms: 0.1, bandwidth_gb_s: 25}``)."""
    if spec is None:
        from ..config.schema.cluster import KvTransferConfig
        spec = KvTransferConfig()
    return DirectTransfer(env, spec.latency_ms / 1e3, spec.bandwidth_gb_s * 1e9)
