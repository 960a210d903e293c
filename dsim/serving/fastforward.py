"""Quiet decode stretches in one go (a mixin of ``Instance``; issue 17).

Between two events of the rest of the simulation (an arrival, a transfer, a controller tick, the
run's stop), a replica whose running requests are all plain decoders, with nothing waiting,
changes only by its decode-step counter: each step allocates the blocks of the decoders crossing
a block boundary and its duration is the step model's time for the next context sum.  Such steps
are replayed here without a SimPy event each, up to the last one that ends strictly before the
next queued event and before a step that finishes a request; the replica then sleeps once until
that step's end.  Every step is computed with the same float operations in the same order (its
duration from the same ``BatchShape``, its end as the previous end plus the duration), so outputs
are byte-identical to stepping one at a time.  Only step models without state qualify
(``pure = True``: an LUT counts energy per call, the physics model smooths preemptions, pipeline
and DP steps reserve shared stages).
"""
from __future__ import annotations

from heapq import heappush

from simpy.events import NORMAL, Event

from ..latency.base import BatchShape


class FastForward:
    def _can_stretch(self) -> bool:
        """Fixed at the first step: nothing observes or shares this replica's individual steps."""
        return (getattr(self.step_model, "pure", False) and self.tracer is None and self.dp_group is None
                and not self.check and self.role != "prefill")

    def _stretch(self, now: float):
        """Run the quiet decode steps from ``now``; return an event at the last one's end, or None
        when the next step is not quiet (the normal loop takes it).  The step after a stretch is
        never quiet (it finishes a request, needs blocks it cannot get, or crosses the next event)."""
        if (self.waiting or self.n_prefilling or self.n_gap or self.stall_n or self.spec_dec or self._leaving
                or self._load_wait or self._load_blocks or self.n_dec != len(self.running) or not self.n_dec):
            return None
        env = self.env
        horizon = env.peek()
        log = self.log
        if log.dur and horizon - now < 2.0 * log.dur[-1]:
            return None                                # not two steps' room before the next event
        n_dec = self.n_dec
        if n_dec > self.engine.max_num_batched_tokens:
            return None
        bs = self.bs
        boundary = self.boundary
        finish = self.finish
        kv = self.kv
        step_time = self.step_model.step_time
        lazy = self.lazy_sum
        running = len(self.running)
        t = now
        k = 0
        while True:
            D = self.D
            nb = boundary[D % bs]
            if D + 1 in finish or nb > kv.free_count:
                break                                  # a step that finishes or preempts: not quiet
            shape = BatchShape(0, 0, 0, 0, n_dec, lazy + n_dec * (D + 1), n_dec, 0, running, 0, 0, 0, 0, 0)
            dur = step_time(shape)
            t_end = t + dur
            if not t_end < horizon:
                self.ff_trial = (shape, dur)           # the normal loop takes this step: spare it the model
                break                                  # something else happens first
            if nb:
                kv.allocate(nb)
            self.num_steps += 1
            self.busy_time += dur
            self.D = D + 1
            log.append(t_end, dur, 0, n_dec, n_dec, running, 0, kv.total - kv.free_count)
            t = t_end
            k += 1
        if not k:
            return None
        self.ff_steps += k
        ev = Event(env)
        ev._ok, ev._value = True, None
        # at exactly t: a timeout's now + (t - now) may differ from t by an ulp
        heappush(env._queue, (t, NORMAL, next(env._eid), ev))
        return ev
