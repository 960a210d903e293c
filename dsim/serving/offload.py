"""A CPU tier for the prefix cache (``engine.kv_offload``), after vLLM's native CPU offloading.

vLLM 0.11 added an ``OffloadingConnector`` (``vllm/distributed/kv_transfer/kv_connector/v1/
offloading_connector.py``, ``vllm/v1/kv_offload/``).  Its scheduler side stores every newly
computed full block to pinned host memory with an asynchronous DMA, keeps the host blocks in an
LRU, and, when a new request's prefix misses in the GPU cache but continues in host memory,
allocates GPU blocks, starts an asynchronous load and lets the request wait (WAITING_FOR_REMOTE_
KVS) while other requests run.  The loaded tokens then count as computed.

This module holds the host side: an LRU of block contents with a capacity in blocks and the two
PCIe directions as FIFO channels (a block's copy takes ``block_bytes / effective PCIe bandwidth``,
every GPU of the TP group copying its shard in parallel).  A stored block becomes hittable when
its copy finishes.  ``policy: write_through`` stores blocks as the GPU cache registers them
(vLLM); ``on_evict`` stores a block only when the GPU cache reuses it (LMCache-style eviction
spill: fewer copies, the same capacity).  The replica (dsim.serving.instance) calls ``lookup``
and ``load`` at admission.
"""
from __future__ import annotations

from collections import OrderedDict, deque

from ..config.engine import OffloadConfig
from ..config.errors import ConfigError

class CpuTier:
    """Host-memory KV blocks: LRU contents, stores in flight, and the PCIe channels."""

    __slots__ = ("env", "capacity", "block_s", "write_through", "overlap", "lru", "pending", "in_flight",
                 "d2h_free", "h2d_free", "stored", "loaded", "evicted", "hit_tokens", "load_s", "loads", "events")

    def __init__(self, env, capacity_blocks: int, block_s: float, cfg: OffloadConfig):
        if capacity_blocks < 1:
            raise ConfigError("engine.kv_offload.cpu_gb", cfg.cpu_gb, "room for at least one KV block")
        self.env = env
        self.capacity = capacity_blocks
        self.block_s = block_s           # PCIe time of one block (each GPU copies its shard)
        self.write_through = cfg.policy == "write_through"
        self.overlap = cfg.overlap
        self.lru: OrderedDict = OrderedDict()     # resident contents, least recently used first
        self.pending: deque = deque()             # (copy done at, hash), in completion order
        self.in_flight: set = set()
        self.d2h_free = 0.0
        self.h2d_free = 0.0
        self.stored = 0                  # blocks that reached host memory
        self.loaded = 0                  # blocks copied back to a GPU
        self.evicted = 0                 # host blocks dropped for room
        self.hit_tokens = 0
        self.load_s = 0.0                # PCIe time spent loading
        self.loads = 0                   # requests that loaded from the tier
        # transfers for the OTLP KV-connector stream, recorded only when a run emits vLLM traces:
        # [direction, start, end, blocks, request id] (a step's stores are one transfer) and
        # ["evict", time, time, blocks, ""]
        self.events: list | None = None

    def store(self, h) -> None:
        """Copy GPU block content ``h`` to host memory (no-op if resident or already on its way)."""
        lru = self.lru
        if h in lru:
            lru.move_to_end(h)
            return
        if h in self.in_flight:
            return
        now = self.env.now
        t = (self.d2h_free if self.d2h_free > now else now) + self.block_s
        self.d2h_free = t
        self.pending.append((t, h))
        self.in_flight.add(h)
        ev = self.events
        if ev is not None:
            last = ev[-1] if ev else None
            if last is not None and last[0] == "gpu_to_cpu" and last[1] == now:
                last[2] = t
                last[3] += 1
            else:
                ev.append(["gpu_to_cpu", now, t, 1, ""])

    def _settle(self, now: float) -> None:
        p, lru = self.pending, self.lru
        while p and p[0][0] <= now:
            t, h = p.popleft()
            self.in_flight.discard(h)
            lru[h] = None
            self.stored += 1
            if len(lru) > self.capacity:
                lru.popitem(last=False)
                self.evicted += 1
                if self.events is not None:
                    self.events.append(["evict", t, t, 1, ""])

    def lookup(self, hashes, start: int, gpu_cached) -> list:
        """The blocks ``hashes[start:]`` resident here, up to the first one that is not (or that
        the GPU cache holds after all: it is hit there, not loaded)."""
        self._settle(self.env.now)
        lru = self.lru
        out = []
        for h in hashes[start:]:
            if h not in lru or h in gpu_cached:
                break
            out.append(h)
        return out

    def load(self, hashes, bs: int, rid: int = -1) -> float:
        """Start copying ``hashes`` back to the GPU; returns when the copy ends."""
        lru = self.lru
        for h in hashes:
            lru.move_to_end(h)
        now = self.env.now
        d = len(hashes) * self.block_s
        t = (self.h2d_free if self.h2d_free > now else now) + d
        self.h2d_free = t
        self.loaded += len(hashes)
        self.hit_tokens += len(hashes) * bs
        self.load_s += d
        self.loads += 1
        if self.events is not None:
            self.events.append(["cpu_to_gpu", t - d, t, len(hashes), str(rid)])
        return t

    def check(self) -> None:
        """Tier conservation: resident <= capacity; a block is resident or in flight, not both."""
        from ..core.invariant import check
        self._settle(self.env.now)
        check(len(self.lru) <= self.capacity, (len(self.lru), self.capacity))
        check(len(self.in_flight) == len(self.pending))
        check(not any(h in self.lru for h in self.in_flight))
        check(self.stored - self.evicted == len(self.lru), (self.stored, self.evicted, len(self.lru)))

    def summary(self) -> dict:
        """Counts at the current time: copies still on the PCIe link are ``in_flight_blocks``."""
        self._settle(self.env.now)
        return {"capacity_blocks": self.capacity, "resident_blocks": len(self.lru), "stored_blocks": self.stored,
                "in_flight_blocks": len(self.pending),
                "loaded_blocks": self.loaded, "evicted_blocks": self.evicted, "hit_tokens": self.hit_tokens,
                "requests_loaded": self.loads, "load_s": self.load_s}


def block_bytes_per_gpu(model, engine) -> float:
    """One KV block's bytes on one GPU of the TP group (its KV-head shard)."""
    return model.kv_bytes_per_token / engine.tensor_parallel_size * engine.block_size


def pcie_block_s(model, device, engine) -> float:
    """Host-link time of one KV block: every GPU of the TP group copies its shard in parallel at the
    device's effective PCIe rate (the CPU tier's copies and swap preemption's, dsim.serving.swap)."""
    return block_bytes_per_gpu(model, engine) / (device.pcie_bytes_s * device.pcie_efficiency)


def build_tier(env, cfg: OffloadConfig | None, model, device, engine) -> CpuTier | None:
    """The replica's CPU tier: ``cpu_gb`` of host memory over the TP group's blocks (each GPU holds
    its KV-head shard of a block), copied at the device's effective PCIe rate per GPU."""
    if cfg is None:
        return None
    return CpuTier(env, cfg.capacity_blocks(model, engine), pcie_block_s(model, device, engine), cfg)


class TierAdmission:
    """The replica's side of the CPU tier (a mixin of ``Instance``): admission calls these when a
    waiting request's prefix continues in host memory."""

    def _take_loaded(self, r, loaded) -> None:
        """GPU blocks for content coming back from the CPU tier, held by r and cached again."""
        kv = self.kv
        kv.allocate(len(loaded))
        prev = r.hashes[-1] if r.hashes else None
        for h in loaded:
            kv.register(h, prev)
            prev = h
        r.hashes.extend(loaded)

    def _start_load(self, r, hit_hashes, loaded, watermark: int, now: float) -> bool:
        """vLLM's asynchronous load: r takes its blocks, leaves the queue while the copy runs and
        comes back to its head with the loaded tokens computed.  Only started when the whole
        prompt's blocks are free now, so a loaded request is not left holding half of what it needs."""
        kv, bs = self.kv, self.bs
        m = len(loaded)
        rest = -(-r.num_tokens // bs) - len(hit_hashes) - m
        evictable = kv.evictable_among(hit_hashes) if hit_hashes else 0
        if m + rest + evictable > kv.free_count - watermark:
            return False
        self.waiting.popleft()
        if hit_hashes:
            kv.touch(hit_hashes)
            kv.hits += len(hit_hashes) * bs
        r.hashes = list(hit_hashes)
        self._take_loaded(r, loaded)
        r.plain_blocks = 0
        r.num_computed = len(r.hashes) * bs
        self.offload_held[r.rid] = r
        self.loading += 1
        ev = self.env.timeout(self.tier.load(loaded, bs, r.rid) - now)
        ev.callbacks.append(lambda _e, r=r: self._loaded(r))
        return True

    def _loaded(self, r) -> None:
        self.loading -= 1
        self.waiting.appendleft(r)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _drop_loaded(self) -> None:
        """Nothing runs and no waiting request fits beside the loaded ones: give their blocks back
        (the contents stay cached on the GPU, so they hit there when admitted)."""
        for r in list(self.offload_held.values()):     # all back in the queue: no load is in flight
            if r in self.waiting:
                self.kv.free(0, r.hashes)
                r.hashes = ()
                r.num_computed = 0
                del self.offload_held[r.rid]
