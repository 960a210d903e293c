"""Queue entries without events (a mixin of ``Instance``; docs/performance.md, "Round three, second
pass").

A request reaches its replica's waiting queue after the arrival-to-queue delay.  On the general path
that entry is a SimPy event of its own (an ``OwnTimeout`` calling ``_enqueue``): a quarter of the events
of a plain run.  When nothing but queue-count readers looks at the replica between an arrival and its
next step end (``Fleet.entries_unread``, fixed at the loop's first step), a busy replica keeps its
entries on a small heap instead, ``(due time, event id, made at, request)``, and takes them in when a
step ends, in the order their events would have run; the counts routers read (``in_alpha`` plus the
queue) do not change at an entry, so nothing else can tell.  A replica about to park idle turns its
pending entries back into the very events they would have been (their own keys), so it wakes as
before; while any own entry is an event, new ones are events too.  A run stopped at ``t`` takes in
the entries due before ``t`` (``Simulation.stop_hooks``), as SimPy would have left them.
"""
from __future__ import annotations

from heapq import heappop, heappush

from simpy.events import NORMAL

from ..core.request import QUEUED
from .fastforward import OwnTimeout


class PendingEntries:
    # Instance.submit pushes ``(now + d, next(env._eid), now, r)`` on ``_pend`` while the replica is busy
    # (not parked, no entry of its own an event) and r was submitted at its arrival (the same-time
    # rule of ``_take_in`` assumes that); otherwise the entry is an event:

    def _entry_event(self, r, d: float) -> None:
        self._n_ev += 1
        ev = OwnTimeout(self.env, d, self)
        ev.callbacks.append(lambda _ev, r=r: self._enqueue_ev(r))

    def _enqueue_ev(self, r) -> None:
        self._n_ev -= 1
        self._enqueue(r, True)

    def _take_in(self, s: float) -> None:
        """At the end (now) of a step begun at ``s``: enqueue the pending entries whose events would have
        run before that step's end event, each as ``_enqueue`` would at its own time: those due before
        now, and those due now made no later than ``s`` (made at ``s`` by an arrival, which runs before
        any NORMAL event of its instant; made later, their events come after the step's)."""
        pend = self._pend
        now = self.env._now
        while pend:
            e = pend[0]
            t = e[0]
            if t > now or (t == now and e[2] > s):
                break
            heappop(pend)
            self._enter(e[3], t)

    def _take_in_before(self, t_stop: float) -> None:
        """A run stopped at ``t_stop`` before the NORMAL events of that instant (Simulation.stop_hooks):
        the entries due before it are in the queue, as SimPy would have left them."""
        pend = self._pend
        while pend and pend[0][0] < t_stop:
            t, _, _, r = heappop(pend)
            self._enter(r, t)

    def _enter(self, r, t: float) -> None:
        """``_enqueue(r, True)`` at time t, without waking the loop (it is busy or being woken)."""
        self.in_alpha -= 1
        r.state = QUEUED
        r.t_enqueued = t
        if r.t_queued is None:
            r.t_queued = t
        if self.by_priority:
            r.sched_key = self.policy.key(r)
        self.waiting.append(r)

    def _entries_to_events(self) -> None:
        """Parking idle: each pending entry becomes the event it would have been, with its own key."""
        env = self.env
        queue = env._queue
        for t, eid, t0, r in self._pend:
            ev = OwnTimeout.__new__(OwnTimeout)      # OwnTimeout.__init__, with the key drawn at submit
            ev.env = env
            ev.callbacks = [lambda _ev, r=r: self._enqueue_ev(r)]
            ev._value = None
            ev._delay = t - t0
            ev._ok = True
            ev.owner = self
            ev.t0 = t0
            heappush(queue, (t, NORMAL, eid, ev))
        self._n_ev += len(self._pend)
        self._pend.clear()
