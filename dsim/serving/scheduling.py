"""One scheduler iteration of a replica, after vLLM's ``Scheduler.schedule()``: which running
requests step (in order, under the token budget), which waiting ones are admitted, and who is
preempted when the KV cache runs out.  A mixin of ``Instance`` (dsim.serving.instance), which owns
the state it reads and the busy loop that calls ``_schedule`` once per step."""
from __future__ import annotations

from ..core.request import PREEMPTED, RUNNING
from .prefix import block_hashes, may_be_cached


def _sched_key(r):
    return r.sched_key


def _verify_key(r):
    """EDF verification (speculation.verify_order: edf): rounds whose drafts are here, earliest
    deadline first; everything else after them, in its order."""
    sp = r.spec
    return (0, sp.deadline) if sp is not None and sp.ready and not r.prefilling else (1, 0.0)


class PartialPrefills:
    """vLLM's concurrent partial prefills (``max_num_partial_prefills`` > 1; vLLM V0's scheduler,
    ``PartialPrefillMetadata``), fixed at the start of a step: the prefills it could schedule (running
    ones, then waiting ones in order, long ones only while fewer than ``max_long_partial_prefills`` are
    counted), at most N, share the token budget: each chunk is at most budget // that count (rounded
    down to whole blocks with the prefix cache).  A waiting prompt above the long threshold is passed
    over, keeping its place, while ``long`` prefills are in progress."""

    __slots__ = ("slot", "long", "max_long", "thr", "block")

    def __init__(self, inst):
        e = inst.engine
        thr, n_max, max_long = e.long_partial_threshold, e.max_num_partial_prefills, e.max_long_partial_prefills
        prefills = longs = 0
        for r in inst.running.values():
            if r.prefilling:
                prefills += 1
                if r.num_tokens - r.num_computed > thr:
                    longs += 1
        waiting_long = 0
        for r in inst.waiting:
            if prefills >= n_max:
                break
            if r.num_tokens - r.num_computed > thr:
                if longs + waiting_long >= max_long:
                    continue
                waiting_long += 1
            prefills += 1
        budget = e.max_num_batched_tokens
        self.slot = budget // min(prefills, n_max) if prefills else budget
        self.long = longs
        self.max_long = max_long
        self.thr = thr
        self.block = inst.bs if inst.cache_on else 1

    def cap(self, need: int, budget: int) -> int:
        """The chunk a prefill needing ``need`` tokens gets with ``budget`` tokens left in the step."""
        room = min(budget, self.slot) // self.block * self.block
        return need if need < room else room

    def passes_over(self, r) -> bool:
        return r.num_tokens - r.num_computed > self.thr and self.long >= self.max_long


class SchedulerIteration:
    def _preempt(self, victim, now: float) -> None:
        del self.running[victim.rid]
        if victim.prefilling:
            comp = victim.num_computed
            self.n_prefilling -= 1
            victim.prefilling = False
        elif victim.spec is not None:
            comp = victim.num_computed
            del self.spec_dec[victim.rid]
            victim.t_last_token = now
        else:
            comp = self._lazy_remove(victim)
            if victim.itl_gap:
                self.n_gap -= 1
            else:
                victim.t_last_token = now
        victim.preempt_times += (now,)
        self.num_preemptions += 1
        if self.swap is not None and victim.spec is None and self._swap_out(victim, comp):
            return                       # its KV went to CPU memory (dsim.serving.swap)
        self._release(victim, comp, self.cache_on)
        victim.num_computed = 0
        victim.kv_ready = 0              # recomputed here (vLLM does not re-fetch remote KV)
        victim.itl_gap = victim.n_out > 0
        victim.state = PREEMPTED
        self.waiting.appendleft(victim)

    # ---- admission of waiting requests ------------------------------------------------------
    def _admit(self, budget: int, prefills: list, now: float, whole_prompts: bool) -> int:
        e = self.engine
        kv = self.kv
        bs = self.bs
        waiting = self.waiting
        running = self.running
        max_seqs = e.max_num_seqs
        thr = e.long_prefill_token_threshold
        watermark = int(0.01 * kv.total) if whole_prompts else 0
        tier = self.tier
        cutoff = self._cutoff
        pp = self._partial if not whole_prompts else None
        passed = []                      # long prompts passed over (partial prefills), back in front after
        while waiting and budget > 0:
            if len(running) >= max_seqs:
                break
            r = waiting[0]
            if cutoff is not None and r.t_scheduled is None and r.t_queued > cutoff:
                break                    # arrived after this step was planned (async scheduling)
            if pp is not None and pp.passes_over(r):
                passed.append(waiting.popleft())
                continue
            n_tok = r.num_tokens
            uncomputed = n_tok - r.num_computed
            hit_hashes = ()
            loaded = ()                  # blocks loaded from the CPU tier for this admission (sync)
            held = 0                     # blocks held since an asynchronous load from the CPU tier
            hit = r.kv_ready             # P/D: prompt KV delivered by a prefill replica
            if tier is not None and r.rid in self.offload_held:
                hit = r.num_computed
                held = len(r.hashes)
            elif self.cache_on and not hit:
                full = (n_tok - 1) // bs
                if full and tier is None and not may_be_cached(r):
                    kv.queries += full * bs      # nothing to find (a CPU tier is still asked: asking settles it)
                elif full:
                    hs = block_hashes(r, full, bs)
                    nh = kv.num_cached_prefix(hs)
                    kv.queries += full * bs
                    if nh:
                        hit_hashes = hs[:nh]
                        hit = nh * bs
                    if tier is not None and nh < full:
                        loaded = tier.lookup(hs, nh, kv.cached)
                        if loaded and tier.overlap:
                            if not self._start_load(r, hit_hashes, loaded, watermark, now):
                                break
                            continue
                        hit += len(loaded) * bs
            need = n_tok - hit
            if whole_prompts:
                if need > budget:
                    break
            else:
                if 0 < thr < need:
                    need = thr
                if need > budget:
                    need = budget
                if pp is not None:
                    need = pp.cap(need, budget)
                    if need <= 0:
                        break
            new_blocks = -(-(hit + need) // bs) - len(hit_hashes) - len(loaded) - held
            evictable = kv.evictable_among(hit_hashes) if hit_hashes else 0
            if new_blocks + len(loaded) + evictable > kv.free_count - watermark:
                break
            waiting.popleft()
            if hit_hashes:
                kv.touch(hit_hashes)
                kv.hits += len(hit_hashes) * bs
            kv.allocate(new_blocks)
            if held:
                del self.offload_held[r.rid]
            else:
                r.hashes = list(hit_hashes)
                if loaded:                   # overlap false: the copy is part of this step
                    self._take_loaded(r, loaded)
                    self._load_wait = max(self._load_wait, tier.load(loaded, bs, r.rid) - now)
                    self._load_blocks += len(loaded)
            r.plain_blocks = new_blocks
            r.num_computed = hit
            if r.t_scheduled is None:
                r.t_scheduled = now
                r.cached_tokens = hit
            else:
                if len(r.resume_times) < len(r.preempt_times):
                    r.resume_times += ((now, "PREFILL"),)     # back after a recompute preemption
                if r.t_kv_ready is not None and r.t_decode_scheduled is None:
                    # P/D: first admission on the decode replica; deferred if a step of this replica
                    # started after the request queued here without admitting it
                    r.t_decode_scheduled = now
                    r.decode_deferred = self._step_t0 > r.t_enqueued
            r.state = RUNNING
            r.prefilling = True
            self.n_prefilling += 1
            running[r.rid] = r
            prefills.append((r, need))
            budget -= need
            if pp is not None and uncomputed > pp.thr:
                pp.long += 1
        for r in reversed(passed):
            waiting.appendleft(r)
        return budget

    # ---- one scheduler iteration -------------------------------------------------------------
    def _schedule(self, now: float):
        """Return (prefills [(req, chunk)], decode count, skipped decoders, gap emitters)."""
        e = self.engine
        kv = self.kv
        budget = e.max_num_batched_tokens
        prefills: list = []
        skipped: list = []
        gap_dec: list = []
        v0 = not e.enable_chunked_prefill
        self._spec_sched = spec = []
        self._spec_sums = None
        self._partial = pp = PartialPrefills(self) if e.max_num_partial_prefills > 1 else None
        if v0 and self.waiting and not self.swapped:
            # V0 policy: a prefill-only step whenever waiting prompts can be admitted (and none
            # is swapped out: those come back first).
            self._admit(budget, prefills, now, True)
            if prefills:
                return prefills, 0, skipped, gap_dec
        n_dec = self.n_dec
        if (self.n_prefilling == 0 and self.n_gap == 0 and n_dec <= budget and not self.spec_dec
                and self.boundary[self.D % self.bs] <= kv.free_count):
            nb = self.boundary[self.D % self.bs]                 # fast path: every decoder steps
            if nb:
                kv.allocate(nb)
            budget -= n_dec
            if self.swapped:
                budget, k = self._swap_in(budget, prefills, gap_dec, now, v0)
                n_dec += k
                if self.swapped:
                    return prefills, n_dec, skipped, gap_dec
            if not v0 and self.waiting:
                self._admit(budget, prefills, now, False)
            return prefills, n_dec, skipped, gap_dec
        # slow path: walk the running list in order, exactly as vLLM does; under a keyed policy
        # in key order, so the request preempted from the end is the largest key (priority: vLLM's
        # victim, the largest (priority, arrival); vLLM keeps admission order and un-schedules the
        # victim if it was already scheduled; here a step's budget also goes to the higher class first)
        order = list(self.running.values())
        if self.by_priority:
            order.sort(key=_sched_key)
        if self.verify_edf:
            order.sort(key=_verify_key)          # stable: the rest keep the order above
        if self.verify_cohort is not None:      # verify_order: context_cohort (dsim.specdec.cohorts)
            order = self.verify_cohort(order)
        bs = self.bs
        thr = e.long_prefill_token_threshold
        preempted = False
        scheduled_dec = 0
        i = 0
        if (len(order) == len(self.spec_dec) and pp is None and not self.mixed_drafts and self.draft_cost is None
                and self.one_walk):
            # every running request verifies drafts: the verify walk (dsim.serving.speculative)
            budget, preempted = self._verify_walk(order, budget, now, spec)
            i = len(order)               # (no plain decoder to rebase below)
        while i < len(order):
            r = order[i]
            i += 1
            if budget <= 0:
                if not r.prefilling and r.spec is None:
                    skipped.append(r)
                continue
            sp = r.spec
            if sp is not None and not r.prefilling:
                if not sp.ready:
                    continue                 # drafts not here yet: holds its KV, takes no tokens
                comp = r.num_computed
                k = min(sp.k, r.max_tokens - r.n_out - 1, budget - 1)
                need = k + 1
                blocks = -(-(comp + need) // bs) - -(-comp // bs)
            elif r.prefilling:
                comp = r.num_computed
                need = r.num_tokens - comp
                if 0 < thr < need:
                    need = thr
                if need > budget:
                    need = budget
                if pp is not None:
                    need = pp.cap(need, budget)
                    if need <= 0:
                        continue             # no room for a chunk of whole blocks: it waits a step
                blocks = -(-(comp + need) // bs) - len(r.hashes) - r.plain_blocks
            else:
                comp = r.c0 + self.D - r.d0
                need = 1
                blocks = 1 if comp % bs == 0 else 0
            victim_self = False
            while blocks > kv.free_count:
                victim = order.pop()
                self._preempt(victim, now)
                preempted = True
                if victim is r:
                    victim_self = True
                    break
            if victim_self:
                break
            kv.allocate(blocks)
            budget -= need
            if r.prefilling:
                r.plain_blocks += blocks
                prefills.append((r, need))
            elif sp is not None:
                spec.append([r, k, 0])
            else:
                scheduled_dec += 1
                if r.itl_gap:
                    gap_dec.append(r)
        # decoders left unscheduled keep their position: rebase them past this step
        for r in order[i:]:
            if not r.prefilling and r.spec is None:
                skipped.append(r)
        if not preempted and self.swapped:
            budget, k = self._swap_in(budget, prefills, gap_dec, now, v0)
            scheduled_dec += k
        if not preempted and not v0 and not self.swapped and self.waiting:
            self._admit(budget, prefills, now, False)
        return prefills, scheduled_dec, skipped, gap_dec
