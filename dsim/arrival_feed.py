"""The arrival process of a session: sends the workload's requests to the fleet at their times.

It is the callbacks of its own events rather than a SimPy generator process: the same events with the
same keys (its start is the URGENT event a process's Initialize would be; each wait is an
``arrival_timeout``, or a closed-loop client's free-slot event), without a process resume and a
generator switch per arrival (docs/performance.md, "Round three, second pass").
"""
from __future__ import annotations

from simpy.events import URGENT, Event

from .core.simulation import arrival_timeout


class ArrivalFeed:
    def __init__(self, ses):
        self.ses = ses
        self.env = ses.sim.env
        self.fleet = ses.fleet
        self.horizon = ses.scn.horizon_s
        self.cap = ses.max_concurrency
        self.it = enumerate(ses.reqs)
        self.pending = None              # ((i, r), stage) sent when the event it waits for fires:
                                         # stage 0 its time, 1 a free client slot (max_concurrency)
        self.last = None                 # time of the last arrival (simultaneous ones stay simultaneous)

    def start(self) -> None:
        ev = Event(self.env)
        ev._ok, ev._value = True, None
        ev.callbacks.append(self)
        self.env.schedule(ev, URGENT)

    def __call__(self, _ev=None) -> None:
        ses = self.ses
        env = self.env
        fleet = self.fleet
        horizon = self.horizon
        cap = self.cap
        item = self.pending
        while True:
            if item is None:             # the next request: wait for its time unless that is now
                item = next(self.it, None)
                if item is None or (horizon is not None and item[1].arrival >= horizon):
                    fleet.arrivals_done = True
                    return
                t = item[1].arrival
                dt = t - env._now
                if dt > 0 and t != self.last:
                    self.pending = (item, 0)
                    arrival_timeout(env, dt).callbacks.append(self)
                    return
                stage = 0
            else:
                item, stage = item
            i, r = item
            if stage == 0:
                self.last = r.arrival
            if cap is not None:
                # like `vllm bench serve --max-concurrency`: a request waits for a free client,
                # and its latency clock starts when it is sent
                if ses.in_flight >= cap:
                    self.pending = (item, 1)
                    ses._slot = env.event()
                    ses._slot.callbacks.append(self)
                    return
                ses.in_flight += 1
                ses.peak_in_flight = max(ses.peak_in_flight, ses.in_flight)
            self.pending = None
            if ses._cut:
                return
            r.arrival = env._now         # the clock's sum may differ from t by 1 ulp
            fleet.arrive(r)
            ses._cursor = i + 1
            if ses.progress.enabled and not i % 256:
                ses.progress.tick(fleet.n_completed)
            item = None
