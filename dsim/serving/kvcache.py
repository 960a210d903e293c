"""Paged KV-cache block pool with prefix caching, mirroring vLLM V1's BlockPool.

Blocks are counted, not named: what matters for scheduling is how many are free and which
cached contents survive.  The free queue keeps vLLM's order (freed blocks go to the tail, the
head is reused first, a request's blocks are freed tail-first) at run granularity: an entry is
either a run of anonymous blocks or one block whose content hash is still cached and can be hit.
"""
from __future__ import annotations

from collections import OrderedDict
from ..core.invariant import check


class KVCache:
    __slots__ = ("total", "block_size", "free_q", "free_count", "cached", "_run_id", "hits", "queries", "tier")

    def __init__(self, total_blocks: int, block_size: int):
        self.total = total_blocks
        self.block_size = block_size
        self.free_q: OrderedDict = OrderedDict()
        self.free_q[("p", 0)] = total_blocks
        self._run_id = 1
        self.free_count = total_blocks
        self.cached: dict = {}      # content hash -> reference count (0 = free but hittable)
        self.hits = 0               # prefix-cache hit tokens (stats)
        self.queries = 0            # prefix-cache queried tokens (stats)
        self.tier = None            # dsim.serving.offload.CpuTier: told of new and evicted contents

    @property
    def used(self) -> int:
        return self.total - self.free_count

    def allocate(self, n: int) -> bool:
        """Take n blocks from the head of the free queue, evicting cached contents there."""
        if n > self.free_count:
            return False
        if n == 0:
            return True
        self.free_count -= n
        q = self.free_q
        for key in q:                     # the head, read in place: a run longer than n just shrinks
            cnt = q[key]
            if cnt > n:
                q[key] = cnt - n
                return True
            break
        while n:
            key, cnt = q.popitem(last=False)
            if cnt:                       # anonymous run
                if cnt > n:
                    q[key] = cnt - n
                    q.move_to_end(key, last=False)
                    return True
                n -= cnt
            else:                         # cached block: evict its content
                self._evict(key)
                n -= 1
        return True

    def _evict(self, key) -> None:
        """A free cached block is reused: its content leaves the cache (to the CPU tier, if any)."""
        del self.cached[key]
        if self.tier is not None and not self.tier.write_through:
            self.tier.store(key)

    def num_cached_prefix(self, hashes) -> int:
        """Leading blocks of ``hashes`` whose content is cached (in use or free)."""
        cached = self.cached
        n = 0
        for h in hashes:
            if h not in cached:
                break
            n += 1
        return n

    def evictable_among(self, hashes) -> int:
        cached = self.cached
        return sum(1 for h in hashes if cached[h] == 0)

    def touch(self, hashes) -> None:
        """Take a reference on cached blocks (hits); free ones leave the free queue."""
        cached, q = self.cached, self.free_q
        for h in hashes:
            c = cached[h]
            if c == 0:
                del q[h]
                self.free_count -= 1
            cached[h] = c + 1

    def register(self, h, parent=None) -> bool:
        """A block a request just filled gets content hash h; False if h is already cached.
        ``parent``: the hash of the block before it (None: the first), for the KV event log
        (dsim.metrics.kv_events); the pool itself does not need it."""
        if h in self.cached:
            return False
        self.cached[h] = 1
        if self.tier is not None and self.tier.write_through:
            self.tier.store(h)
        return True

    def free(self, plain: int, hashes) -> None:
        """Return a request's blocks: anonymous tail blocks first, then hashed ones in reverse."""
        q = self.free_q
        if plain:
            key = ("p", self._run_id)
            self._run_id += 1
            q[key] = plain
            self.free_count += plain
        cached = self.cached
        for h in reversed(hashes):
            c = cached[h] - 1
            cached[h] = c
            if c == 0:
                q[h] = 0
                self.free_count += 1

    def check(self, held_by_requests: int) -> None:
        """KV block conservation (BC-13): allocated + free == total, free queue consistent."""
        vals = list(self.free_q.values())          # a run's length, or 0 for one cached block
        free_in_q = sum(vals) + vals.count(0)
        check(free_in_q == self.free_count, (free_in_q, self.free_count))
        check(self.free_count + held_by_requests == self.total, (self.free_count, held_by_requests, self.total))
