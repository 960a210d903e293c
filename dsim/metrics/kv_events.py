"""vLLM's KV cache events, recorded from dsim's prefix cache and written as ``kv_events.jsonl``.

vLLM (``--kv-events-config``) publishes one ``KVEventBatch`` per scheduler step: ``ts`` and a list
of events, ``BlockStored`` (a full block got a content hash and entered the prefix cache: its hashes,
the hash of the block before them, their token ids, the block size, LoRA id, storage medium),
``BlockRemoved`` (a cached block was reused for other content: its hash left the cache) and
``AllBlocksCleared``.  A subscriber writes each batch as one JSON line; the structs are msgspec
``array_like`` with the event class name as tag, so a line reads
``[ts, [["BlockStored", [h], parent, [tokens], 16, null, "GPU", null], ["BlockRemoved", [h], "GPU"]], 0]``
(the layout the inference-sim vLLM fork's runs carry; newer vLLM writes the same fields as objects
with a ``"type"`` key, which dsim.calibrate.kvevents reads too).

dsim's pool (dsim.serving.kvcache) has the same two moments: ``register`` (a filled block's hash
enters the cache) and ``_evict`` (a free cached block is taken for new content).  Differences that
a reader of dsim's file should know: dsim has no token ids (``token_ids`` is empty); hashes are
dsim's own (chained segment ids, dsim.serving.prefix), written as integers, or ``"u:RID:I"`` for
block I of request RID whose content nothing shares; and dsim hashes only blocks that can be
shared (prompt segments, preempted requests), where vLLM hashes every full block, so a request
whose prompt is unique stores nothing here.
"""
from __future__ import annotations

import json

from ..serving.kvcache import KVCache

STORED, REMOVED, CLEARED = "BlockStored", "BlockRemoved", "AllBlocksCleared"
MEDIUM_GPU = "GPU"


def external(h):
    """A dsim block hash as the file writes it (vLLM's ExternalBlockHash: an int, or bytes as text)."""
    if h is None or isinstance(h, int):
        return h
    return ":".join(str(x) for x in h)


class RecordedKVCache(KVCache):
    """A KVCache that logs (time, event, hash, parent) for each content hash entering and leaving it.
    Swapped in for a replica's pool before it runs (``record``); costs nothing when not used."""
    __slots__ = ("env", "log")

    def __init__(self, total_blocks: int, block_size: int, env):
        super().__init__(total_blocks, block_size)
        self.env = env
        self.log: list = []

    def register(self, h, parent=None) -> bool:
        if not super().register(h, parent):
            return False
        self.log.append((self.env.now, STORED, h, parent))
        return True

    def _evict(self, key) -> None:
        super()._evict(key)
        self.log.append((self.env.now, REMOVED, key, None))


def record(inst) -> RecordedKVCache:
    """Give replica ``inst`` a recording pool (before its first step: the pool must be empty)."""
    old = inst.kv
    if old.free_count != old.total or old.cached:
        raise ValueError("a KV pool is swapped for a recording one only before it holds blocks")
    kv = RecordedKVCache(old.total, old.block_size, inst.env)
    kv.tier = old.tier
    inst.kv = kv
    return kv


def batches(log, block_size: int, dp_rank: int = 0):
    """The log as vLLM's batches (array_like): events of one instant in one batch, a chain of hashes
    stored at one instant (each the parent of the next) in one BlockStored, one BlockRemoved per block."""
    out = []
    for t, kind, h, parent in log:
        if not out or out[-1][0] != t:
            out.append([t, [], dp_rank])
        evs = out[-1][1]
        if kind == STORED:
            last = evs[-1] if evs else None
            if last is not None and last[0] == STORED and last[1][-1] == external(parent):
                last[1].append(external(h))
                continue
            evs.append([STORED, [external(h)], external(parent), [], block_size, None, MEDIUM_GPU, None])
        else:
            evs.append([REMOVED, [external(h)], MEDIUM_GPU])
    return out


def write_jsonl(f, log, block_size: int) -> None:
    """Write ``log`` to the open text file ``f``, one batch per line."""
    for b in batches(log, block_size):
        f.write(json.dumps(b, separators=(",", ":")) + "\n")
