"""Stop a plan's simulation once it has certainly missed a percentile SLO (or rejected a request).

Most candidates a plan simulates fail, and the overloaded ones are the slowest runs: their queues
grow for the whole trace.  A probe judges p-th percentiles over the window's finished requests
(numpy's linear interpolation, capacity.probe), so once enough of them are known to be over the
bound no later request can bring the percentile back.  The rule, exact rather than a margin:

    W = requests arriving in the window (known before the run: arrivals are generated up front),
    n <= W = the window requests that will have finished, V = finished ones already above the bound.
    The percentile at q is x[floor(q (n - 1))] + a non-negative share of the gap to the next value,
    so it is above the bound when V >= n - floor(q (n - 1)).  That count never decreases with n,
    so V >= W - floor(q (W - 1)) settles it for every n the run could end with.

A request counts only when its value exceeds the bound by a relative 1e-9 (rounding in the
interpolation cannot bring it back below).

A request need not have finished to count (``pending``): one that arrived in the window more than
the TTFT bound ago and has no first token yet will have a TTFT above it, since its first token comes
at a step end not before now (``Instance`` sets ``t_first_token`` when the step's timeout fires); one
more than the E2E bound ago will have an E2E latency above it.  It will finish: a run without a
horizon ends with every request completed or rejected (``runner._final_invariants`` checks it; a
rejection stops the run anyway), so it is one of the n finished ones the rule counts.  At each
completion a pointer walks the requests in arrival order up to now - bound and classifies each one
once (finished already: counted as it finished; else certain or not); a classified request that
finishes later leaves the pending set as it joins the finished count, so none counts twice.  An
overloaded run's requests over the TTFT bound used to count only once they had also decoded every
output token; counted while they wait, the run stops sooner by about a request's time in the system.
Nothing is scheduled in the simulation until it stops, so a run that is not stopped is the same run,
byte for byte, as without the watch; a stopped one is reported as stopped, never as passing.
"""
from __future__ import annotations

import math

import numpy as np
import simpy
from simpy.core import StopSimulation
from simpy.events import URGENT

from ..core.request import COMPLETED

STOPPABLE = ("ttft", "tpot", "e2el")
PENDING = ("ttft", "e2el")            # bounded below by now - arrival before the request finishes


def certain_miss_count(window: int, q: float) -> int:
    """Values above the bound among ``window`` possible ones that put the q-quantile (0..1) above it."""
    return window - math.floor(q * (window - 1)) if window else 1


def _quantile(stat: str) -> float | None:
    if stat == "median":
        return 0.5
    if stat.startswith("p"):
        return float(stat[1:]) / 100
    return None                                # mean: not stoppable


class Watch:
    """Counts, as requests finish, the window requests above each stoppable SLO; stops the
    simulation (an URGENT StopSimulation event now) when one SLO is certainly missed."""

    def __init__(self, env, arrivals: np.ndarray, slos: dict, warmup: float, live: dict | None = None,
                 rids: np.ndarray | None = None):
        arr = np.sort(arrivals)
        self.env = env
        self.t0, self.t1 = float(arr[0]), float(arr[-1])
        self.tw = self.t0 + warmup * (self.t1 - self.t0)
        w = int(((arrivals >= self.tw) & (arrivals <= self.t1)).sum())
        self.window = w
        self.rules = []                        # [metric, bound, needed, count, slo key, bound as given]
        for key, bound in slos.items():
            stat, metric = key[:-3].split("_", 1)
            q = _quantile(stat)
            if q is not None and metric in STOPPABLE:
                self.rules.append([metric, bound * (1 + 1e-9), certain_miss_count(w, q), 0, key, bound])
        self.reason = None
        self.stopped_at = None
        # pending: per TTFT/E2E rule [rule, pointer, ids counted unfinished]; requests by arrival
        self.pending = []
        if live is not None and rids is not None:
            order = np.argsort(arrivals, kind="stable")
            self.live, self.finished = live, set()
            self.by_arrival = list(zip((arrivals[order] * 1e3).tolist(), rids[order].tolist()))
            self.pending = [[rule, 0, set()] for rule in self.rules if rule[0] in PENDING]

    def see(self, r) -> None:
        if self.reason is not None:
            return
        if r.state != COMPLETED:
            self._stop(f"request {r.rid} rejected ({r.reject_reason or 'no reason given'})")
            return
        if self.pending:
            self.finished.add(r.rid)
            for p in self.pending:
                p[2].discard(r.rid)            # counted unfinished: now counted below, as finished
        if self.tw <= r.arrival <= self.t1:
            for rule in self.rules:
                metric, over = rule[0], rule[1]
                if metric == "ttft":
                    v = (r.t_first_token - r.arrival) * 1e3
                elif metric == "e2el":
                    v = (r.t_completion - r.arrival) * 1e3
                elif r.n_out > 1:
                    v = (r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1)
                else:
                    continue
                if v > over:
                    rule[3] += 1
                    if rule[3] >= rule[2]:
                        self._stop(f"{rule[3]} of the {self.window} window requests already have "
                                   f"{metric.upper()} > {rule[5]:g} ms, so {rule[4]} > {rule[5]:g} whatever the "
                                   "others do")
                        return
        for p in self.pending:
            self._walk(p)
            rule, late = p[0], p[2]
            if rule[3] + len(late) >= rule[2]:
                what = "their first token" if rule[0] == "ttft" else "their last token"
                self._stop(f"{rule[3] + len(late)} of the {self.window} window requests already have "
                           f"{rule[0].upper()} > {rule[5]:g} ms ({len(late)} of them still waiting for {what}), "
                           f"so {rule[4]} > {rule[5]:g} whatever the others do")
                return

    def _walk(self, p) -> None:
        """Classify, in arrival order, the requests that arrived more than the bound before now."""
        rule, i, late = p
        metric, over = rule[0], rule[1]
        now_ms = self.env.now * 1e3
        seq, live, done, tw, t1 = self.by_arrival, self.live, self.finished, self.tw, self.t1
        while i < len(seq) and now_ms - seq[i][0] > over:
            rid = seq[i][1]
            q = live.get(rid)
            if q is None:
                if rid not in done:            # not arrived yet (a client slot): wait for it
                    break
            else:
                a = q.arrival
                if (self.env.now - a) * 1e3 <= over:          # its own clock: not old enough yet
                    break
                f = q.t_first_token if metric == "ttft" else q.t_completion
                if tw <= a <= t1 and (f is None or (f - a) * 1e3 > over):   # f is None: f >= now
                    late.add(rid)
            i += 1
        p[1] = i

    def _stop(self, why: str) -> None:
        self.reason, self.stopped_at = why, self.env.now
        ev = simpy.Event(self.env)
        ev._ok, ev._value = True, None
        self.env.schedule(ev, URGENT, 0)
        ev.callbacks.append(StopSimulation.callback)


def run_watched(scn, slos: dict, warmup: float, pending: bool = True):
    """(Result, None) of a run that was not stopped -- the same as ``dsim.run(scn)`` -- or (None, the
    stop record) of one stopped early.  Runs that cannot be watched (a horizon that cuts the run,
    speculative decoding, no requests) simply run.  ``pending=False``: only finished requests count
    (the rule before unfinished ones did; the tests compare the two)."""
    from ..runner import Session, finish
    ses = Session(scn)
    arrivals = ses.workload.arrival_times() if ses.spec is None else None
    if scn.horizon_s is not None or arrivals is None or len(arrivals) < 2:
        ses.end = ses.run_to_end()
        return finish(ses), None
    watch = Watch(ses.sim.env, arrivals, slos, warmup, ses.fleet.live if pending else None,
                  ses.workload.rids() if pending else None)
    ledger = ses.fleet.ledger
    # a done hook (not a wrapper of the ledger): the replicas then know a completion is watched at
    # its time, so quiet stretches stop at it (dsim.serving.fastforward)
    hooks = ses.fleet.done_hooks
    hooks.append(watch.see)
    ses.sim.run()                               # returns when the queue empties, or at the stop
    hooks.remove(watch.see)
    if watch.reason is None:
        ses.end = ses.run_to_end()              # nothing left to simulate: seals and checks as usual
        return finish(ses), None
    return None, {"early_stopped": True, "stopped_at_s": watch.stopped_at, "window_requests": watch.window,
                  "finished_requests": ledger.n, "stop_reason": watch.reason}
