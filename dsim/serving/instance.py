"""Instance: one vLLM replica's engine-core busy loop as a single SimPy process.

Each iteration mirrors vLLM V1's ``Scheduler.schedule()`` (vllm/v1/core/sched/scheduler.py; the
iteration itself is in dsim.serving.scheduling):

* one token budget ``max_num_batched_tokens`` per step;
* RUNNING requests first, in admission order: a decoding request asks for 1 token, a request
  still in (chunked) prefill for ``min(remaining prompt, budget)`` tokens;
* when ``allocate_slots`` cannot get the blocks, the *last* running request is preempted
  (recompute: its blocks are freed and it goes back to the *front* of the waiting queue) until
  the allocation fits, or the request itself was the victim;
* WAITING requests (FCFS) are admitted only if no request was preempted this step, while the
  budget lasts and fewer than ``max_num_seqs`` run; a request's prefix-cache hit is capped so
  that at least one token is computed; with chunked prefill disabled a prompt that does not fit
  the remaining budget stops admission;
* tokens appear at the end of the step: the first token when a request's prefill completes, then
  one per decode step; a request finishes (and frees its blocks) with its last token.

Roles (prefill/decode disaggregation): a ``prefill`` replica hands a request off after its first
token (its KV blocks stay held until ``release_handoff``); a ``decode`` replica admits requests
whose prompt KV arrived from elsewhere (``Request.kv_ready``) and only computes the tokens after
the first.  A decode replica never emits a first token and a prefill replica never emits a
second one (checked in ``check_invariants``).  A request preempted on a decode replica is
recomputed there, as vLLM does.

``enable_chunked_prefill: false`` selects the older (V0) policy instead: if waiting prompts fit,
the step is prefill-only with whole prompts; otherwise every running request decodes.

Speed: decoding requests are kept in a *lazy* form.  All of them advance one token per step, so
their context lengths are ``c0 + (D - d0)`` for the replica's decode-step counter D; the sum of
contexts, the number crossing a KV-block boundary (bucketed by phase modulo block_size) and the
step at which each one finishes are maintained in O(1) per step.  Per-request work happens only
when a request is admitted, preempted, skipped, or completes.

Speculative decoding: a request with ``r.spec`` set (see dsim.specdec) is an *eager* decoder
instead: its context is explicit and a step verifies ``k`` drafted tokens for it (``k + 1``
query tokens after its context, costed like a prefill chunk of ``k + 1``; ``k = 0`` is a plain
decode token; with ``r.spec.tree`` set, the k drafted nodes of a tree under its attention mask).
``r.spec.accept_all(rows)`` decides how many drafts of each verified (r, k) row pass, all of a step's
rows at once (``round_done`` is told after every round);
the step emits the accepted ones plus one token from the target and frees the KV of the rejected
positions (a tree's rejected branches included).  A speculative
decoder that is not ``ready`` (its drafts are still on their way from a device) holds its KV and
takes no tokens.  With ``draft_model`` set, drafters that run on this replica (``r.spec.fused``)
add ``k`` sequential draft-model decode steps to the step time.
"""
from __future__ import annotations

from collections import deque
from heapq import heappush

from ..core.request import COMPLETED, QUEUED, REJECTED
from ..latency.base import AlphaModel, BatchShape, LoadView
from .checks import ReplicaChecks
from .handoff import Handoff
from .kvcache import KVCache
from .lazy import LazyDecoders
from .offload import TierAdmission
from .scheduling import SchedulerIteration
from .swap import SwapPreemption
from .speculative import SpeculativeSteps
from .entries import PendingEntries
from .fastforward import FastForward, OwnTimeout
from .steplog import StepLog
from .prefix import block_hashes, may_be_cached
from .policies import make_policy
from .queues import PriorityWaiting

ROLES = ("mixed", "prefill", "decode")


def _noop(*_a) -> None:
    return None


class Instance(SchedulerIteration, LazyDecoders, FastForward, PendingEntries, TierAdmission, SwapPreemption,
               SpeculativeSteps, Handoff, ReplicaChecks):
    """One replica.  ``on_done(r)`` is called when a request completes or is rejected here,
    ``on_handoff(r)`` when a prefill replica has produced a request's first token."""

    def __init__(self, sim, engine, step_model, queueing, num_blocks: int, name: str = "replica0",
                 check_invariants: bool = False, role: str = "mixed", on_done=None, on_handoff=None,
                 cpu_tier=None, keep_steps: bool = False, swap_space=None):
        if role not in ROLES:
            raise ValueError(f"role {role!r} not in {ROLES}")
        self.sim = sim
        self.env = sim.env
        self.name = name
        self.role = role
        self.on_done = on_done or _noop
        self.on_handoff = on_handoff or _noop
        self.engine = engine
        self.step_model = step_model
        self.queueing = queueing
        self.token_overhead = queueing.output_token_overhead()
        post = getattr(queueing, "completion_overhead", None)
        self.post_overhead = post() if post else 0.0
        self.alpha_state = getattr(queueing, "needs_state", False)
        self.bs = engine.block_size
        self.kv = KVCache(num_blocks, engine.block_size)
        self.tier = self.kv.tier = cpu_tier          # dsim.serving.offload.CpuTier or None
        self.offload_held: dict = {}     # rid -> request holding blocks loaded from the CPU tier, not running
        self.loading = 0                 # of those, loads still in flight
        self._load_wait = 0.0            # kv_offload.overlap false: this step waits for its loads
        self._load_blocks = 0            # ... of these blocks (the physics model costs them itself)
        self._model_loads = bool(getattr(step_model, "charges_kv_loads", False))
        self.swap = swap_space           # dsim.serving.swap.SwapSpace (preemption_mode: swap) or None
        self._swap_wait = 0.0            # this step's swap copies, seconds (part of the step)
        self.cache_on = engine.enable_prefix_caching
        self.check = check_invariants
        self.policy = make_policy(engine, getattr(step_model, "unpipelined", step_model))  # None = FCFS
        self.by_priority = self.policy is not None
        self.verify_edf = False          # set by dsim.specdec: ready rounds by deadline (seed 002 6.2)
        self.mixed_drafts = False        # set by dsim.specdec: tree drafts or several drafters to cost
        self.draft_cost = None           # set by dsim.specdec: (inst, spec rows) -> fused draft seconds (levels)
        self.verify_cohort = None        # set by dsim.specdec: order -> order (verify_order: context_cohort)
        self.verify_padding = None       # set by dsim.specdec: spec rows -> (extra pairs, extra ctx) (padded attention)
        self.waiting = PriorityWaiting() if self.by_priority else deque()
        self.swapped = PriorityWaiting() if self.by_priority else deque()   # swapped out, oldest first
        self.running: dict = {}          # rid -> Request, in admission order
        self.n_prefilling = 0
        # lazy decode state
        self.D = 0
        self.n_dec = 0
        self.lazy_sum = 0                # sum of (c0 - d0) over lazy decoders
        self.boundary = [0] * self.bs    # decoders by (d0 - c0) % bs
        self.finish: dict = {}           # decode-step count -> {rid: req}
        self.n_gap = 0                   # decoders whose next ITL is not one step
        # bookkeeping
        self.submitted = 0
        self.n_completed = 0
        self.n_rejected = 0
        self.in_alpha = 0                # submitted, still in the arrival-to-queue delay
        self.transferring: dict = {}     # rid -> Request handed off, KV still held (prefill role)
        self.handed_off = 0              # handed off and released
        self.moved_out = 0               # taken back unstarted (rebalancing)
        self.log = StepLog(keep_steps)
        self.itl_extra: list = []        # (ITL seconds, count) samples that are not one step long
        self.stall_n = 0                 # decoders idle through V0 prefill-only steps
        self.ff_steps = 0                # steps run inside quiet stretches (dsim.serving.fastforward)
        self._tail = None                # (duration, decoders) of a stretch's last step, under way
        self._curves: dict = {}          # decoders -> the step model's decode_curve (stretches)
        self.quiet_done = None           # () -> True while on_done neither reads the clock nor schedules
                                         # anything: stretches then end finishing steps in place
        self.alone = None                # () -> True while nothing reads the order of same-time events of
                                         # different replicas: stretches run past other quiet stretch ends
        self._solo = False               # set at the first step: this replica's steps reach no other replica
        self.arrival_reads = None        # () -> what an arrival reads of a replica: 2 anything, 1 queue
                                         # counts, 0 nothing (dsim.cluster.fleet.Fleet.arrival_reads)
        self._d_past = 0.0               # set at the first step: stretches may run this far past an arrival
                                         # (a lower bound of the arrival-to-queue delay), 0 = not past
        self._blind = False              # ... and arrivals read nothing of it (finishing steps end in place)
        self.decode_past = None          # () -> a decode replica's bound past arrivals, or None (Fleet.decode_past)
        self._pd = None                  # set at the first step: that bound (stretches use _horizon_pd)
        self._past = None                # start of a tail begun past an arrival (a same-time enqueue may
                                         # have to run before its end: FastForward._after_past)
        self.entries_unread = None       # () -> True while only queue-count readers look at this replica
                                         # between an arrival and its next step (Fleet.entries_unread)
        self._pend = None                # set at the first step on that route: pending queue entries, a heap
                                         # of (time, event id, made at, request), taken in at step ends
        self._n_ev = 0                   # ... entries of this replica that are events (made while parked)
        self._s = 0.0                    # start of a stretch's tail (the same-time rule of _take_in)
        self.stall_t = 0.0
        self.num_preemptions = 0
        self.num_steps = 0
        self.busy_time = 0.0
        self._wake = None
        self._last_now = 0.0
        self._async = self.engine.async_scheduling
        self._step_t0 = self._step_t1 = -1.0   # the last step's start and end (async scheduling's cutoff)
        self._cutoff = None
        self.on_check = None             # fleet-level check run after this replica's invariants
        self.dp_group = None             # dsim.serving.dataparallel.DPGroup of a DP rank
        self._leaving: dict = {}         # rid -> callback: running requests to migrate at the step end
        self.tracer = None               # optional step observer: before(inst, prefills, skipped, shape), after(...)
        self.spec_dec: dict = {}         # rid -> speculative (eager) decoder, admission order
        self._spec_sched: list = []      # this step's [(req, k, accepted)]
        self.draft_model = None          # StepTimeModel of a drafter running on this replica (fused)
        # per-request energy and KV footprint (Request.energy_j, kv_peak_bytes): a step's energy is
        # its duration x ``watts`` (the replica's GPUs at TDP; 0 for a bare replica), or with an LUT
        # the table's energy of the step (``lut_j`` sums them); ``ecum`` is the energy per token summed
        # over the steps that advanced the lazy decoders (each of them gets the difference since it
        # joined); ``kv_block_bytes``: one block's KV bytes over the replica's GPUs
        self.watts = 0.0
        self.kv_block_bytes = 0
        self.ecum = 0.0
        self.lut_j = 0.0
        self._step_wpt = 0.0             # the step's energy per token, for _verified
        self.proc = self.env.process(self._loop())

    # ---- arrivals ---------------------------------------------------------------------------
    def submit(self, r, at_arrival: bool = False) -> None:
        """A request reaches the server: reject what can never run, else queue after alpha.
        ``at_arrival``: submitted by the gateway at the request's arrival (before every NORMAL event
        of that instant), the condition of pending entries (``_take_in``)."""
        self.submitted += 1
        r.replica = self.name
        e = self.engine
        if r.prompt_len + r.max_tokens > e.max_model_len:
            self._reject(r, "too_long")
            return
        if -(-(r.prompt_len + r.max_tokens - 1) // self.bs) > self.kv.total:
            self._reject(r, "kv_capacity")
            return
        if (not e.enable_chunked_prefill
                and -(-r.prompt_len // self.bs) > self.kv.total - int(0.01 * self.kv.total)):
            # V0 admits whole prompts above a 1 % free-block watermark: a prompt needing more can
            # never be scheduled (vLLM ignores it), and waiting for it would stall the replica
            self._reject(r, "kv_capacity")
            return
        d = self.queueing.delay(r, self.load_view(r) if self.alpha_state else None)
        if d > 0:
            self.in_alpha += 1
            pend = self._pend
            if pend is None:
                ev = OwnTimeout(self.env, d, self)       # env.timeout's scheduling, seen by this replica only
                ev.callbacks.append(lambda _ev, r=r: self._enqueue(r, True))
            elif self._wake is None and not self._n_ev and at_arrival:
                env = self.env                           # busy: pending until a step end takes it in
                now = env._now                           # (dsim.serving.entries), with its event's id
                heappush(pend, (now + d, next(env._eid), now, r))
            else:
                self._entry_event(r, d)                  # parked, or own entries are events
        else:
            self._enqueue(r)

    def _reject(self, r, reason: str) -> None:
        r.state = REJECTED
        r.reject_reason = reason
        self.n_rejected += 1
        self.on_done(r)

    def _enqueue(self, r, delayed: bool = False) -> None:
        if delayed:
            self.in_alpha -= 1
        r.state = QUEUED
        r.t_enqueued = now = self.env._now
        if r.t_queued is None:           # P/D and rebalancing: keep the first queueing time
            r.t_queued = now
        if self.by_priority:
            r.sched_key = self.policy.key(r)
        self.waiting.append(r)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ---- load view for routers, alpha models and reports ------------------------------------
    def load_view(self, r=None) -> LoadView:
        hit = 0
        if r is not None and self.cache_on and r.num_tokens > self.bs and may_be_cached(r):
            full = (r.num_tokens - 1) // self.bs
            hit = self.kv.num_cached_prefix(block_hashes(r, full, self.bs)) * self.bs
        return LoadView(len(self.running), len(self.waiting) + len(self.swapped), self.kv.total - self.kv.free_count,
                        self.kv.total, hit)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)

    def _register_full(self, r, full: int, plain: int) -> int:
        """Give r's anonymous blocks content hashes up to block ``full`` (prefix caching);
        returns how many anonymous blocks remain.  Stops at the first hash already cached."""
        hashes = r.hashes
        if full > len(hashes) and plain:
            if not isinstance(hashes, list):
                hashes = r.hashes = list(hashes)
            hs = block_hashes(r, full, self.bs)
            register = self.kv.register
            for i in range(len(hashes), full):
                if not plain or not register(hs[i], hs[i - 1] if i else None):
                    break
                hashes.append(hs[i])
                plain -= 1
        return plain

    def _release(self, r, comp: int, keep_content: bool) -> None:
        """Free r's blocks; with keep_content its full blocks stay cached (hittable) when freed."""
        held = -(-comp // self.bs)
        if held * self.kv_block_bytes > r.kv_peak_bytes:
            r.kv_peak_bytes = held * self.kv_block_bytes
        plain = held - len(r.hashes)
        if keep_content:
            plain = self._register_full(r, comp // self.bs, plain)
        self.kv.free(plain, r.hashes)
        r.hashes = ()
        r.plain_blocks = 0

    # ---- the busy loop -------------------------------------------------------------------------
    def _loop(self):
        env = self.env
        log = self.log
        step_time = self.step_model.step_time
        tok_over = self.token_overhead
        bs = self.bs
        ff = self._can_stretch()
        self._solo = ff and self.tier is None and self.swap is None
        q = self.queueing
        reads = self.arrival_reads() if self._solo and self.arrival_reads is not None else 2
        if reads < 2 and type(q) is AlphaModel and q.a0 > 0 and q.a1 >= 0:
            self._d_past = q.a0          # delay(r) = a0 + a1 x prompt >= a0: no enqueue sooner after an arrival
            self._blind = reads == 0
        if (self._solo and self.role == "mixed" and not self.alpha_state and self.entries_unread is not None
                and self.entries_unread()):
            self._pend = []              # queue entries without events (docs/performance.md, second pass)
            self.sim.stop_hooks.append(self._take_in_before)
        if self._solo and self.role == "decode" and self.decode_past is not None:
            self._pd = self.decode_past()
        pend = self._pend
        sm = self.step_model
        lut = getattr(sm, "energy_mj", None) is not None      # the model gives each step's energy
        ej = 0.0
        watts = self.watts                   # set by the pool before the first step
        while True:
            if not self.running and not self.waiting and not self.swapped:
                if pend:
                    self._entries_to_events()
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            now = env._now                   # the clock (Environment.now's value, without the call)
            if ff and not self.waiting:          # (a stretch never starts with requests waiting)
                ev = self._stretch(now)          # quiet decode steps up to the next event, in one go
                if ev is not None:
                    yield ev
                    if pend and pend[0][0] <= env._now:
                        self._take_in(self._s)
                    if self._past is not None and self._after_past():
                        yield self._after_past_event()
                    if self._tail is not None:
                        self._end_tail()
                    continue
            n_pre0 = self.num_preemptions
            # async scheduling: this step was planned while the previous one ran, so requests that
            # arrived after that one started wait a step (unless nothing else would run)
            self._cutoff = self._step_t0 if self._async and self._step_t1 == now else None
            prefills, n_dec, skipped, gap_dec = self._schedule(now)
            if self._cutoff is not None and not prefills and not n_dec and not self._spec_sched:
                self._cutoff = None
                prefills, n_dec, skipped, gap_dec = self._schedule(now)
            if not prefills and not n_dec and not self._spec_sched:
                if self.spec_dec and len(self.spec_dec) == len(self.running):
                    # every running request waits for drafts from its device: sleep until one arrives
                    self._wake = env.event()
                    yield self._wake
                    self._wake = None
                    continue
                if (self.transferring or self.loading) and not self.running:
                    # blocks held by outgoing KV transfers free up when they finish
                    # (release_handoff wakes us), loads from the CPU tier bring requests back
                    # (_loaded wakes us): wait for that instead of declaring a stall
                    self._wake = env.event()
                    yield self._wake
                    self._wake = None
                    continue
                if self.offload_held and not self.running:
                    self._drop_loaded()
                    continue
                if self.swapped and not self.running and self.num_preemptions != n_pre0:
                    continue                     # the last running request was swapped out: it comes back
                if self.running or self.waiting or self.swapped:
                    raise RuntimeError(f"{self.name}: scheduler made no progress at t={now}")
                continue
            # batch shape for the latency model
            p_tok = p_pairs = p_ctx = n_samp = p_sq = 0
            for r, c in prefills:
                p = r.num_computed
                p_tok += c
                p_sq += c * c
                p_pairs += c * p + c * (c + 1) // 2
                p_ctx += p
                if p + c == r.prompt_len + r.n_out:     # r.num_tokens
                    n_samp += 1
            dec_ctx = 0
            if n_dec:
                # contexts of all lazy decoders, minus those skipped this step
                dec_ctx = self.lazy_sum + self.n_dec * (self.D + 1)
                for r in skipped:
                    dec_ctx -= r.c0 + self.D - r.d0 + 1
            spec = self._spec_sched
            p_tok0 = p_tok
            n_pf = len(prefills)
            v_n = v_ctx = 0
            d_tok = n_dec
            extra = 0.0
            sums = self._spec_sums if spec else None
            if sums is not None:                 # the rows summed by the verify walk (dsim.serving.speculative)
                s_tok, s_sq, s_pairs, v_n, v_ctx, s_dec, s_dctx, _ = sums
                p_tok += s_tok
                p_sq += s_sq
                p_pairs += s_pairs
                p_ctx += v_ctx
                n_pf += v_n
                d_tok += s_dec
                dec_ctx += s_dctx
            elif spec:
                # verification: k + 1 query tokens after the context (a chunk); k = 0 decodes
                for row in spec:
                    r, k = row[0], row[1]
                    p = r.num_computed
                    if k:
                        c = k + 1
                        p_tok += c
                        p_sq += c * c
                        tree = r.spec.tree
                        # a tree's tokens see only their ancestors (the tree attention mask)
                        p_pairs += c * p + (c * (c + 1) // 2 if tree is None else tree.attention_pairs(k))
                        p_ctx += p
                        n_pf += 1
                        v_n += 1
                        v_ctx += p
                    else:
                        d_tok += 1
                        dec_ctx += p + 1
            if spec:
                if self.verify_padding is not None:     # shape divergence (dsim.specdec.cohorts)
                    xp, xc = self.verify_padding(spec)
                    p_pairs += xp
                    p_ctx += xc
                extra += spec[0][0].spec.accept_all(spec)
                n_samp += len(spec)
                if self.draft_model is not None:
                    extra += self._draft_time(spec)
            shape = BatchShape(p_tok, n_pf, p_pairs, p_ctx, d_tok, dec_ctx, n_samp + n_dec,
                               p_sq, len(self.running), self.num_preemptions - n_pre0, v_n, p_tok - p_tok0, v_ctx,
                               self._load_blocks)
            if lut:
                ej = sm.energy_mj
                dur = step_time(shape) + extra
                ej = (sm.energy_mj - ej) * 1e-3
            else:
                dur = step_time(shape) + extra
            if self._load_wait:
                if not self._model_loads:
                    dur += self._load_wait
                self._load_wait = 0.0
                self._load_blocks = 0
            if self._swap_wait:                  # swap copies run before the forward pass (dsim.serving.swap)
                dur += self._swap_wait
                self.swap.copy_s += self._swap_wait
                self._swap_wait = 0.0
            if self.tracer is not None:
                snap = self.tracer.before(self, prefills, skipped, shape)
                n_done0 = self.n_completed + self.handed_off + len(self.transferring)
            if self.dp_group is None:
                # a solo replica's step end changes only it: other replicas' stretches may run past it
                yield OwnTimeout(env, dur, self) if self._solo else env.timeout(dur)
            else:                            # DP ranks step together (dsim.serving.dataparallel)
                dur = yield self.dp_group.join(dur, shape.prefill_tokens + shape.decode_tokens)
            t_end = env._now
            if pend and pend[0][0] <= t_end:
                self._take_in(now)
            self._step_t0, self._step_t1 = now, t_end
            self.num_steps += 1
            self.busy_time += dur
            # the step's energy per token it computed (Request.energy_j; p_tok + d_tok: the shape's tokens)
            if lut:
                self.lut_j += ej
                wpt = ej / (p_tok + d_tok)
            else:
                wpt = dur * (watts / (p_tok + d_tok))     # as a quiet stretch computes it (fastforward)
            # skipped decoders do not advance: rebase them to the post-step counter
            advanced = n_dec > 0 or bool(skipped)
            for r in skipped:
                self._lazy_remove(r)
                if not r.itl_gap:
                    r.itl_gap = True
                    r.t_last_token = now
                    self.n_gap += 1
            itl_regular = n_dec - len(gap_dec)
            if advanced:
                self.D += 1
                self.ecum += wpt
                if self.stall_n:
                    # V0 prefill-only steps stalled these decoders: one longer gap each
                    k = min(self.stall_n, itl_regular)
                    self.itl_extra.append((self.stall_t + dur, k))
                    itl_regular -= k
                    self.stall_n, self.stall_t = 0, 0.0
            elif self.n_dec:
                if not self.stall_n:
                    self.stall_n = self.n_dec - self.n_gap
                self.stall_t += dur
            for r in skipped:
                self._lazy_add(r)
            emit_t = t_end + tok_over
            for r in gap_dec:
                self.itl_extra.append((t_end - r.t_last_token, 1))
                r.itl_gap = False
                self.n_gap -= 1
            # prefill chunks: progress, first tokens, conversions to decoders
            for r, c in prefills:
                r.num_computed += c
                r.energy_j += c * wpt
                if self.cache_on and r.segments is not None:
                    r.plain_blocks = self._register_full(r, min(r.num_computed, r.prompt_len) // bs,
                                                         r.plain_blocks)
                if r.num_computed < r.num_tokens:
                    continue
                r.prefilling = False
                self.n_prefilling -= 1
                if r.n_out == 0:
                    r.t_first_token = emit_t
                else:
                    self.itl_extra.append((t_end - r.t_last_token, 1))
                    r.itl_gap = False
                r.n_out += 1
                if r.n_out >= r.max_tokens:
                    self._complete(r, r.num_computed, emit_t)
                elif self.role == "prefill":
                    self._handoff(r, emit_t)
                else:
                    self._lazy_add(r)
            # decoders whose last token came out this step
            done = self.finish.pop(self.D, None) if advanced else None
            if done:
                self._finish_decoders(done, emit_t)
                done = None                      # finished requests leave with the fleet (memory)
            if spec:
                self._step_wpt = wpt
                self._verified(spec, t_end, emit_t)
            # StepLog.append, inline
            log.t_end.append(t_end)
            log.dur.append(dur)
            log.prefill_tokens.append(p_tok0)
            log.decode_tokens.append(shape.decode_tokens + shape.prefill_tokens - p_tok0 if spec else n_dec)
            log.itl_count.append(itl_regular)
            log.running.append(len(self.running))
            log.waiting.append(len(self.waiting))
            log.kv_used.append(self.kv.total - self.kv.free_count)
            if len(log.running) >= log.fold_at:
                log.fold()
            if self.tracer is not None and snap is not None:
                self.tracer.after(self, snap, now, t_end,
                                  self.n_completed + self.handed_off + len(self.transferring) - n_done0)
            if self._leaving:
                self._migrate_leaving(t_end)
            if self.check:
                self.check_invariants()

    def settle_metrics(self) -> None:
        """At the end of a run: give the requests still here their decode energy so far and the KV
        they hold now (lazy decoders keep both implicit while they decode)."""
        bs, kb = self.bs, self.kv_block_bytes
        for r in self.running.values():
            comp = r.num_computed
            if not r.prefilling and r.spec is None:
                comp = r.c0 + self.D - r.d0
                r.energy_j += self.ecum - r.e0
                r.e0 = self.ecum
            r.kv_peak_bytes = max(r.kv_peak_bytes, -(-comp // bs) * kb)
        for r in list(self.transferring.values()) + list(self.offload_held.values()):
            r.kv_peak_bytes = max(r.kv_peak_bytes, -(-r.num_computed // bs) * kb)

    def wake(self) -> None:
        """Something outside (drafts arriving) made a waiting or running request schedulable."""
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _finish_decoders(self, done: dict, emit_t: float) -> None:
        """Decoders whose last token came out of the step that just ended."""
        for r in done.values():
            comp = self._lazy_detach(r)
            r.n_out = r.max_tokens
            self._complete(r, comp, emit_t)

    def _complete(self, r, comp: int, emit_t: float) -> None:
        del self.running[r.rid]
        r.num_computed = comp
        self._release(r, comp, self.cache_on and r.segments is not None)
        r.block_hashes = None        # the cache keeps its own references; ~2 KB per finished request
        r.state = COMPLETED
        r.t_completion = emit_t + self.post_overhead
        r.t_last_token = emit_t
        self.n_completed += 1
        self.on_done(r)

    def set_engine(self, engine) -> None:
        """Live change of scheduler knobs (max_num_seqs, max_num_batched_tokens, ...): the next
        step uses them; KV capacity and block size stay as built."""
        if engine.block_size != self.bs:
            raise ValueError("block_size cannot change on a running replica")
        if (engine.scheduling_policy, engine.age_weight) != (self.engine.scheduling_policy, self.engine.age_weight):
            raise ValueError("scheduling_policy and age_weight cannot change on a running replica")
        self.engine = engine

    @property
    def idle(self) -> bool:
        """Nothing waiting, running, in the arrival delay or in KV transfer."""
        return not (self.running or self.waiting or self.in_alpha or self.transferring or self.offload_held
                    or self.swapped)
