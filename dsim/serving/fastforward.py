"""Quiet decode stretches in one go (a mixin of ``Instance``; issue 17).

Between two events of the rest of the simulation (an arrival, a transfer, a controller tick, the
run's stop), a replica whose running requests are all plain decoders, with nothing waiting,
changes only by its decode-step counter: each step allocates the blocks of the decoders crossing
a block boundary and its duration is the step model's time for the next context sum.  Such steps
are replayed here without a SimPy event each, up to the last one that ends strictly before the
next queued event; the stretch then takes one more step, its *tail*: the one that crosses that
event or finishes requests.  The replica sleeps once, until the tail's end, and ends the tail there
as the loop ends any step (counters, finished requests, the step row read at its end), so events
during the tail see the replica mid-step exactly as they would.  Every step is computed with the
same float operations in the same order (its duration from the step model's decode curve, which is
its step_time of the same batch bit for bit; its end as the previous end plus the duration), so
outputs are byte-identical to stepping one at a time.  Only step models without state qualify
(``pure = True``: an LUT counts energy per call, the physics model smooths preemptions, pipeline
and DP steps reserve shared stages).
"""
from __future__ import annotations

from heapq import heappush

from simpy.events import NORMAL, Event, Timeout

from ..core.simulation import ArrivalEvent
from ..latency.base import decode_curve


class QuietEnd(Event):
    """The end of a stretch of a replica whose steps nothing else sees (``_solo`` and ``quiet_done``):
    other replicas' stretches may run past it (``_horizon``)."""
    __slots__ = ("owner",)


class OwnTimeout(Timeout):
    """A timeout whose callbacks change only ``owner`` (a request entering its queue after the
    arrival-to-queue delay, the end of a step of a replica whose steps reach no one else): other
    replicas' stretches may run past it.  ``t0``: when it was made."""
    __slots__ = ("owner", "t0")

    def __init__(self, env, delay: float, owner):
        # Timeout.__init__ inlined (as SimPy inlines Event's): one per request; delay > 0 here
        self.env = env
        self.callbacks = []
        self._value = None
        self._delay = delay
        self._ok = True
        self.owner = owner
        self.t0 = now = env._now
        heappush(env._queue, (now + delay, NORMAL, next(env._eid), self))     # env.schedule, inline


def _horizon(queue, me, past: float, inf=float("inf")) -> tuple:
    """``(read, cut)``: the time of the first queued event that reads or changes ``me``, and the
    time ``me``'s stretch must stop stepping at.  Skipped by both: the quiet stretch ends and own
    timeouts of other replicas whose steps reach no one else (``_solo``: they stretch, hand nothing
    off, share no CPU tier) and whose completions are still quiet; processing such an event, and
    everything its owner does after it, changes and reads nothing of ``me``.  With ``past > 0`` an
    arrival reads ``me``'s queue counts only and enqueues nothing sooner than ``past`` after it: it
    is a reader at its time and cuts at its time + ``past``.  A long queue is scanned no further
    than its head."""
    if len(queue) > 64:
        h = queue[0][0]
        return h, h
    h = hc = inf
    for e in queue:
        t = e[0]
        if t < hc:
            ev = e[3]
            tp = type(ev)
            if tp is QuietEnd:
                if ev.owner.quiet_done():
                    continue
            elif tp is OwnTimeout:
                # what the owner does next must stay with it: a prefill replica hands its requests on
                # (only _solo replicas make step ends of this type)
                own = ev.owner
                if own is not me and own._solo and own.quiet_done():
                    continue
            elif tp is ArrivalEvent and past:
                if t < h:
                    h = t
                t += past
                if t < hc:
                    hc = t
                continue
            if t < h:
                h = t
            hc = t
    return h, hc


def _horizon_pd(queue, me, past: float, inf=float("inf")) -> float:
    """Where the stretch of ``me``, a decode replica of a P/D cluster (``Instance._pd``), must stop
    stepping.  Nothing reads such a replica but the handoffs (a prefill replica's step end), the
    decode router's refreshes and the KV deliveries into it, none of them skipped here.  Skipped, on
    top of ``_horizon``'s other quiet stretch ends and own timeouts: an enqueue into a busy prefill
    replica (it takes the request at its step end, which is queued: a cut), and an arrival up to
    ``past`` after it (it reads and changes only an entry replica, whose enqueue comes no sooner
    than ``past`` later: only a step begun from then on can hand a request off).  A long queue is
    scanned no further than its head, nor one whose head cuts."""
    if not queue:
        return inf
    e = queue[0]
    tp = type(e[3])
    if len(queue) > 64 or not (tp is QuietEnd or tp is OwnTimeout or tp is ArrivalEvent):
        return e[0]                       # the head cuts: nothing comes sooner (a third of the calls)
    hc = inf
    for e in queue:
        t = e[0]
        if t < hc:
            ev = e[3]
            tp = type(ev)
            if tp is QuietEnd:
                if ev.owner.quiet_done():
                    continue
            elif tp is OwnTimeout:
                own = ev.owner
                if own is not me:
                    if own._solo:
                        if own.quiet_done():
                            continue
                    elif own.role == "prefill" and own._wake is None:
                        continue                  # its loop is in a step (a queued timeout)
            elif tp is ArrivalEvent:
                t += past
                if t < hc:
                    hc = t
                continue
            hc = t
    return hc


class FastForward:
    def _can_stretch(self) -> bool:
        """Fixed at the first step: nothing observes or shares this replica's individual steps."""
        return (getattr(self.step_model, "pure", False) and self.tracer is None and self.dp_group is None
                and not self.check and self.role != "prefill")

    def _stretch(self, now: float):
        """Run the quiet decode steps from ``now`` and start the tail; return an event at the end of
        the last step started, or None when the first step is not quiet (the normal loop takes it).
        A stretch without a tail stopped before a step that needs blocks it cannot get, or after its
        last decoder finished.

        A step that finishes requests strictly before the next event is ended in place (as
        ``_end_tail`` would at its end) when ``quiet_done()`` says the replica's owner neither reads
        the clock nor schedules anything when told of a completion: nothing else runs between that
        step's end and the next event, so applying it before the clock gets there changes nothing."""
        if (self.waiting or self.n_prefilling or self.n_gap or self.stall_n or self.spec_dec or self._leaving
                or self._load_wait or self._load_blocks or self.n_dec != len(self.running) or not self.n_dec
                or self.swapped or self._swap_wait):
            return None
        n_dec = self.n_dec
        if n_dec > self.engine.max_num_batched_tokens:
            return None
        env = self.env
        inline = self.quiet_done is not None and self.quiet_done()
        queue = env._queue
        if not queue:
            h_arr = h_read = horizon = float("inf")
        elif self._pd is not None and inline and self.alone():
            # a P/D decode replica: what it skips reads none of it; steps finishing before the cut end in place
            h_arr = h_read = horizon = _horizon_pd(queue, self, self._pd)
        elif self.alone is not None and self.alone():
            h_arr, horizon = _horizon(queue, self, self._d_past if inline else 0.0)
            h_read = horizon if self._blind else h_arr     # arrivals that read nothing do not count
        else:
            h_arr = h_read = horizon = queue[0][0]
        pend = self._pend
        if pend:                                   # pending entries of this replica: readers and cuts
            tp = pend[0][0]
            if tp < horizon:
                horizon = tp
                if tp < h_read:
                    h_read = tp
                if tp < h_arr:
                    h_arr = tp
        log = self.log
        append = log.append
        # the varying columns per step; the constant ones once per run of rows (StepLog.quiet_rows)
        te_app, du_app, kv_app = log.t_end.append, log.dur.append, log.kv_used.append
        room = log.fold_at - len(log.running)      # rows before the chunk folds
        p = 0                                      # rows whose constant columns are pending
        bs = self.bs
        boundary = self.boundary
        finish = self.finish
        kv = self.kv
        curves = self._curves
        curve = curves.get(n_dec)                  # n_dec decoders, all running: step time of a context sum
        if curve is None:
            curve = curves[n_dec] = decode_curve(self.step_model, n_dec, n_dec)
        lazy = self.lazy_sum
        t = now
        k = 0
        D = self.D
        total = kv.total
        free0 = free = kv.free_count
        watts = self.watts
        w_tok = watts / n_dec                      # the loop's energy per token is dur * w_tok, bit for bit
        ecum = self.ecum
        busy = self.busy_time
        while True:
            nb = boundary[D % bs]
            if nb > free:
                break                                  # a step that preempts: not quiet
            dur = curve(lazy + n_dec * (D + 1))
            t_end = t + dur
            free -= nb
            if D + 1 in finish or not t_end < horizon:
                # finishing steps end in place only before the first reader (an arrival reads counts)
                if not (inline and t_end < h_read):
                    self._tail = (dur, n_dec)          # ended by _end_tail once the replica wakes
                    self._s = t                        # its start (Instance._take_in)
                    if h_arr < horizon and t >= h_arr and (pend is None or self._n_ev):
                        self._past = t                 # begun past an arrival: see _after_past (pending
                                                       # entries are taken in by Instance._take_in)
                    t = t_end
                    break
                # a step that finishes requests before the next event: end it here, as _end_tail does
                D += 1
                k += 1
                busy += dur
                ecum += dur * w_tok
                self.D, self.ecum, self.busy_time = D, ecum, busy
                kv.allocate(free0 - free)
                self._step_t0, self._step_t1 = t, t_end
                if p:
                    log.quiet_rows(p, n_dec)
                    p = 0
                self._finish_decoders(finish.pop(D), t_end + self.token_overhead)
                free0 = free = kv.free_count
                append(t_end, dur, 0, n_dec, n_dec, len(self.running), len(self.waiting), total - free)
                te_app, du_app, kv_app = log.t_end.append, log.dur.append, log.kv_used.append   # it may fold
                room = log.fold_at - len(log.running)
                t = t_end
                n_dec = self.n_dec
                if not n_dec:
                    break
                lazy = self.lazy_sum
                curve = curves.get(n_dec)
                if curve is None:
                    curve = curves[n_dec] = decode_curve(self.step_model, n_dec, n_dec)
                w_tok = watts / n_dec
                continue
            D += 1
            busy += dur
            ecum += dur * w_tok
            te_app(t_end)
            du_app(dur)
            kv_app(total - free)
            p += 1
            t = t_end
            k += 1
            if p == room:                              # the chunk is full at this row: fold as append does
                log.quiet_rows(p, n_dec)
                p = 0
                log.fold()
                te_app, du_app, kv_app = log.t_end.append, log.dur.append, log.kv_used.append
                room = log.fold_at - len(log.running)
        if p == 1:                                 # one row (most stretches among several replicas): as append
            log.prefill_tokens.append(0)
            log.decode_tokens.append(n_dec)
            log.itl_count.append(n_dec)
            log.running.append(n_dec)
            log.waiting.append(0)
        elif p:
            log.quiet_rows(p, n_dec)
        if free != free0:
            # the stretch's blocks in one call: the free queue hands them out and evicts in the
            # same order as one call per step would
            kv.allocate(free0 - free)
        self.D = D
        self.ecum = ecum
        self.busy_time = busy
        self.num_steps += k
        self.ff_steps += k
        if not k and self._tail is None:
            return None
        if inline and self._solo:
            ev = QuietEnd.__new__(QuietEnd)
            ev.owner = self
        else:
            ev = Event.__new__(Event)
        ev.env = env                               # Event.__init__, inline (once per stretch)
        ev.callbacks = []
        ev._ok, ev._value = True, None
        # at exactly t: a timeout's now + (t - now) may differ from t by an ulp
        heappush(env._queue, (t, NORMAL, next(env._eid), ev))
        return ev

    def _after_past(self) -> bool:
        """Woken at the end of a tail begun at ``_past``, after an arrival: does an enqueue of this
        replica at this very time come first when stepping one at a time?  It does when it was made
        no later than the tail began (its event then precedes the step's end; at the same instant
        the arrival, URGENT, runs before the step starts).  The stretch's event was made earlier,
        so such an enqueue is still queued: the replica lets it run first (``_after_past_event``)."""
        s = self._past
        self._past = None
        now = self.env._now
        for e in self.env._queue:
            if e[0] == now:
                ev = e[3]
                if type(ev) is OwnTimeout and ev.owner is self and ev.t0 <= s:
                    return True
        return False

    def _after_past_event(self):
        env = self.env
        ev = Event(env)
        ev._ok, ev._value = True, None
        heappush(env._queue, (env._now, NORMAL, next(env._eid), ev))
        return ev

    def _end_tail(self) -> None:
        """At the tail's end: what the loop does after a plain decode step, in the same order."""
        dur, n_dec = self._tail
        self._tail = None
        t_end = self.env._now
        self._step_t0, self._step_t1 = t_end - dur, t_end
        self.num_steps += 1
        self.ff_steps += 1
        self.busy_time += dur
        self.D = D = self.D + 1
        self.ecum += dur * (self.watts / n_dec)
        done = self.finish.pop(D, None)
        if done:
            self._finish_decoders(done, t_end + self.token_overhead)
        kv = self.kv
        log = self.log                             # StepLog.append, inline (once per stretch)
        log.t_end.append(t_end)
        log.dur.append(dur)
        log.prefill_tokens.append(0)
        log.decode_tokens.append(n_dec)
        log.itl_count.append(n_dec)
        log.running.append(len(self.running))
        log.waiting.append(len(self.waiting))
        log.kv_used.append(kv.total - kv.free_count)
        if len(log.running) >= log.fold_at:
            log.fold()
        if self._leaving:
            self._migrate_leaving(t_end)
