"""A draft device's memory: the drafter's KV kept across rounds and a session's turns
(``speculation.draft_kv``; seed 002 section 3.2, "prefix-similarity hints to reuse KV"), and the
drafter's weights loaded or not, with warm devices preferred (``speculation.draft_load``; seed 002
section 6.4 and Appendix A item 6, checkpoint locality).

KV.  dsim's drafting convention: a round at context c drafts k tokens in k forwards, the first
reading the KV of c tokens and writing one more.  A device holds, per conversation, the KV of
``valid`` tokens.  A round needs c; the ``c - valid`` it lacks are computed in its first forward,
which then runs c - valid + 1 tokens after the ``valid`` cached ones (one decode step when nothing
is missing, as without this section).  After drafting the device holds c + k; after the
verification, whose a accepted drafts and the target's token make the next context c + a + 1, the
valid prefix is c + a + 1, less one when all k were accepted (the last draft was never fed back).
So a conversation drafted every round pays nothing extra, or one token when everything passed; a
round after fused rounds (hybrid) or after an eviction re-prefills what it lacks.

The cache holds at most ``cache_tokens`` tokens over all its conversations, least recently used
evicted first.  A finished conversation stays cached under its session: the session's next turn
opened on this device reuses the prefix its prompt shares with the cached prompt and answer (by the
requests' segments: two prompts share KV up to the first differing segment; a request's answer is
the segment ``-(rid + 1)``, the workload's convention), up to the tokens actually held.

Weights.  A cold device loads the drafter (its weights as deployed: ``weight_bits`` per weight)
from storage at ``storage_gb_s`` before its next round; the round waits, once.  It stays warm for
``warm_retention_s`` after its last round, then unloads (and its KV with it).  ``placement:
warm_first`` chooses, for each new conversation of an open-loop group, a warm device (loaded or
loading) with the fewest active conversations while it has fewer than ``max_active``, else the
device with the fewest, warm before cold.
"""
from __future__ import annotations

import math
from collections import OrderedDict

from ..latency.base import BatchShape


def shared_prefix(a, b) -> int:
    """Tokens two segment sequences share from their start (0 if either is None)."""
    if a is None or b is None:
        return 0
    n = 0
    for (sa, la), (sb, lb) in zip(a, b):
        if sa != sb:
            break
        n += min(la, lb)
        if la != lb:
            break
    return n


class KVEntry:
    __slots__ = ("rid", "segs", "valid", "ctx")

    def __init__(self, rid: int, segs, valid: int):
        self.rid = rid
        self.segs = segs                 # what the KV holds: the prompt's segments and the answer
        self.valid = valid               # tokens of KV held
        self.ctx = 0                     # the context of the round last drafted


class DeviceMemory:
    """One device's drafter weights and KV cache."""

    def __init__(self, device, kv_cfg, load_cfg, load_s: float, warm: bool):
        self.dev = device
        self.cap = kv_cfg.cache_tokens if kv_cfg is not None else None
        self.session_reuse = kv_cfg.session_reuse if kv_cfg is not None else False
        self.kv: OrderedDict = OrderedDict()
        self.used = 0
        self.load_s = load_s
        self.retention = load_cfg.warm_retention_s if load_cfg is not None else math.inf
        self.warm_until = (self.retention if warm else -math.inf) if load_cfg is not None else math.inf
        self.loading_until = None        # a load in progress ends then
        self.active = 0                  # conversations opened here and not finished
        self.cold_starts = 0
        self.load_wait_s = 0.0
        self.prefill_tokens = 0          # drafter prefill charged (tokens the cache lacked)
        self.reused_tokens = 0           # tokens a session's new turn found cached
        self.evictions = 0

    # ---- weights -----------------------------------------------------------------------------
    def warm(self, now: float) -> bool:
        """Loaded (or loading) now."""
        return now <= self.warm_until or self.loading_until is not None

    def cold_wait(self, now: float) -> float:
        """Seconds a round starting now waits for the weights (0: loaded; starts the load)."""
        if now <= self.warm_until:
            return 0.0
        if self.loading_until is None:
            self._unload()
            self.cold_starts += 1
            self.load_wait_s += self.load_s
            self.loading_until = now + self.load_s
            return self.load_s
        if now >= self.loading_until:
            self.loading_until = None
            self.warm_until = now + self.retention
            return 0.0
        return self.loading_until - now

    def drafted(self, t_end: float) -> None:
        if self.retention != math.inf:
            self.warm_until = t_end + self.retention

    def _unload(self) -> None:
        self.kv.clear()
        self.used = 0

    # ---- KV ------------------------------------------------------------------------------------
    # A live conversation's entry is keyed ("r", rid); a finished one's, when its session may come
    # back, ("s", session) (the session's latest turn; two turns of one session running at once
    # keep entries of their own).
    def extra_seconds(self, model, r, ctx: int, k: int) -> float:
        """A round of k drafts at context ctx for request r: the time its first forward takes beyond
        the decode step it replaces (the tokens the cache lacks), and the cache's update."""
        if self.cap is None:
            return 0.0
        key = ("r", r.rid)
        e = self.kv.get(key)
        if e is None:
            prev = self.kv.pop(("s", r.session), None) if self.session_reuse and r.session >= 0 else None
            e = self.kv[key] = KVEntry(r.rid, None, 0)
            if prev is not None:         # the session's next turn: the shared prefix is reusable
                keep = min(prev.valid, shared_prefix(prev.segs, r.segments))
                self.reused_tokens += keep
                self.used -= prev.valid - keep
                e.valid = keep
            if r.segments is not None:
                e.segs = tuple(r.segments) + ((-(r.rid + 1), r.max_tokens),)
        self.kv.move_to_end(key)
        have = min(e.valid, ctx)
        miss = ctx - have
        self.used += ctx + k - e.valid
        e.valid = ctx + k
        e.ctx = ctx
        self._evict(key)
        if not miss:
            return 0.0
        self.prefill_tokens += miss
        c = miss + 1
        chunk = model.step_time(BatchShape(prefill_tokens=c, num_prefill=1,
                                           prefill_attn_pairs=c * have + c * (c + 1) // 2, prefill_ctx_tokens=have,
                                           num_sampled=1, prefill_chunk_sq=c * c, running=1))
        return chunk - model.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=ctx + 1, num_sampled=1, running=1))

    def verified(self, r, a: int, k: int) -> None:
        """The round's verification: keep the valid prefix (see the module's docstring)."""
        e = self.kv.get(("r", r.rid))
        if e is None:
            return
        valid = min(e.valid, e.ctx + a + 1 - (a == k))
        self.used -= e.valid - valid
        e.valid = valid

    def finished(self, r) -> None:
        """A finished conversation's KV stays for its session's next turn, or is freed."""
        e = self.kv.pop(("r", r.rid), None)
        if e is None:
            return
        if self.session_reuse and r.session >= 0:
            old = self.kv.pop(("s", r.session), None)
            if old is not None:
                self.used -= old.valid
            self.kv[("s", r.session)] = e
        else:
            self.used -= e.valid

    def _evict(self, keep) -> None:
        while self.used > self.cap and self.kv:
            key = next(iter(self.kv))
            if key == keep and len(self.kv) > 1:
                self.kv.move_to_end(key)
                key = next(iter(self.kv))
            e = self.kv.pop(key)
            self.used -= e.valid
            self.evictions += 1


class DeviceMemories:
    """The runtime's side (a mixin of ``SpecRuntime``): each device's memory, the warm-first choice
    of a device, and the counts for summary.json."""

    def _devmem_init(self) -> None:
        cfg = self.cfg
        kv, load = cfg.draft_kv, cfg.draft_load
        self.devmem = kv is not None or load is not None
        self._pooled: set = set()
        if not self.devmem:
            return
        index: dict = {}
        for dev in self.devices:
            i = index[dev.group.name] = index.get(dev.group.name, -1) + 1
            nbytes = self.cfg.drafter.weight_bytes * dev.prof.weight_bits / (8 * self.cfg.drafter.bytes_per_param)
            if cfg.levels is not None:
                nbytes += sum(lv.model.weight_bytes * dev.prof.weight_bits / (8 * lv.model.bytes_per_param)
                              for lv in cfg.levels.levels)
            gbs = dev.prof.storage_gb_s or (load.storage_gb_s if load is not None else 1.0)
            warm = load is None or load.warm_at_start is None or i < load.warm_at_start
            dev.mem = DeviceMemory(dev, kv, load, nbytes / (gbs * 1e9), warm)
        self.fleet.done_hooks.append(self._devmem_finished)

    def _devmem_finished(self, r) -> None:
        st = self.states.get(r.rid)
        if st is not None and st.device is not None and st.device.mem is not None:
            st.device.mem.finished(r)
            if r.rid in self._pooled:    # opened by the warm-first choice: no longer active there
                self._pooled.discard(r.rid)
                st.device.mem.active -= 1

    # ---- warm-first placement ----------------------------------------------------------------------
    def _warm_pools(self) -> dict:
        """{group name: its devices} for the groups a warm-first choice places."""
        load = self.cfg.draft_load
        if load is None or load.placement != "warm_first":
            return {}
        out: dict = {}
        for d in self.devices:
            out.setdefault(d.group.name, []).append(d)
        return out

    def _pick(self, devs, now: float):
        cap = self.cfg.draft_load.max_active
        warm = [d for d in devs if d.mem.warm(now) and d.mem.active < cap]
        if warm:
            return min(warm, key=lambda d: d.mem.active)
        return min(devs, key=lambda d: (d.mem.active, not d.mem.warm(now)))

    def _issue_pool(self, devs):
        """The open-loop issue loop of a warm-first group: each request goes, at its arrival, to the
        device its trace row names (draft_id) or its session is on, else to the one ``_pick`` chooses."""
        env = self.env
        named = {r.rid: d for d in devs for r in d.requests if r.draft_id}
        reqs = sorted((r for d in devs for r in d.requests), key=lambda r: (r.arrival, r.rid))
        for d in devs:
            d.requests = []
        session: dict = {}
        for r in reqs:
            if self.horizon is not None and r.arrival >= self.horizon:
                self.unissued += 1
                continue
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            r.arrival = env.now
            dev = named.get(r.rid) or (session.get(r.session) if r.session >= 0 else None)
            if dev is None:
                dev = self._pick(devs, env.now)
                if r.session >= 0:
                    session[r.session] = dev
            dev.requests.append(r)
            dev.mem.active += 1
            self._pooled.add(r.rid)
            self._upload(dev, r, None)
        self.devices_done += len(devs)
        self._maybe_done()

    def devmem_summary(self) -> dict:
        """summary.json ``speculation.draft_memory``: per device group."""
        out: dict = {}
        for d in self.devices:
            m = d.mem
            g = out.setdefault(d.group.name, {"devices": 0, "cold_starts": 0, "load_wait_s": 0.0, "prefill_tokens": 0,
                                              "reused_tokens": 0, "evictions": 0, "conversations": 0})
            g["devices"] += 1
            g["cold_starts"] += m.cold_starts
            g["load_wait_s"] += m.load_wait_s
            g["prefill_tokens"] += m.prefill_tokens
            g["reused_tokens"] += m.reused_tokens
            g["evictions"] += m.evictions
            g["conversations"] += len(d.requests)
        return out
