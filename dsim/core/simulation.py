"""Simulation: owns the simpy.Environment, the RNG partitions and the clock checks (BC-5)."""
from __future__ import annotations

from heapq import heappush

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import URGENT

from .rng import PartitionedRNG

# events without the clock moving before the watchdog stops a run: far above any legitimate burst
# (10^5 requests arriving at one instant schedule a few times that many)
STALL_EVENTS = 20_000_000


class Simulation:
    def __init__(self, seed: int, seeds: dict | None = None):
        self.env = simpy.Environment()
        self.rng = PartitionedRNG(seed, seeds)
        self.seed = seed
        self.stall_limit = STALL_EVENTS
        self.stop_hooks: list = []       # f(t) after a run stops at t, before the NORMAL events of t
                                         # (replicas' pending queue entries: Instance._take_in_before)

    @property
    def now(self) -> float:
        return self.env.now

    def process(self, gen):
        return self.env.process(gen)

    def run(self, until=None) -> None:
        """SimPy's run loop with a watchdog: a model that keeps scheduling events without the clock
        ever moving (a zero-delay loop) would spin forever; after ``stall_limit`` such events the
        run stops with an error naming the process that was about to run."""
        env = self.env
        if until is not None:
            at = float(until)
            if not at > env.now:
                raise ValueError(f"until ({at}) must be greater than the current simulation time")
            stop = simpy.Event(env)
            stop._ok, stop._value = True, None
            env.schedule(stop, URGENT, at - env.now)
            stop.callbacks.append(StopSimulation.callback)
        step = env.step
        limit = self.stall_limit
        t_seen, n, n_seen = env.now, 0, 0
        try:
            while True:
                step()
                n += 1
                if n & 0xFFFF == 0:                     # every 65,536 events: has the clock moved?
                    if env.now != t_seen:
                        t_seen, n_seen = env.now, n
                    elif n - n_seen >= limit:
                        raise RuntimeError(f"simulated time stuck at {env.now!r} s for {n - n_seen:,} events "
                                           f"(next: {_next_process(env)}): a zero-delay loop")
        except StopSimulation:
            for f in self.stop_hooks:
                f(env._now)
            return
        except EmptySchedule:
            if until is not None:
                raise RuntimeError(f"no events left before {until}") from None


class ArrivalEvent(simpy.Event):
    """The arrivals process's timeout (a marker type: replicas' quiet stretches may run past it when
    routing reads only queue counts, dsim.serving.fastforward)."""
    __slots__ = ()


def arrival_timeout(env, delay: float):
    """A timeout for an arrival: scheduled URGENT, so an arrival at the same instant as a replica's
    step end is processed first and that step's successor can admit it (seed 004's same-time order:
    arrival < route < step < completion; routing happens inside the arrival, completions at the
    end of the step that produced them).  Otherwise SimPy orders same-time events by creation."""
    ev = ArrivalEvent.__new__(ArrivalEvent)      # Event.__init__ and env.schedule, inline (one per request)
    ev.env = env
    ev.callbacks = []
    ev._ok, ev._value = True, None
    heappush(env._queue, (env._now + delay, URGENT, next(env._eid), ev))
    return ev


def _next_process(env) -> str:
    """The process the next queued event resumes, e.g. ``Instance._busy_loop`` (best effort)."""
    try:
        event = env._queue[0][3]
        for cb in event.callbacks or ():
            gen = getattr(getattr(cb, "__self__", None), "_generator", None)
            if gen is not None:
                return gen.gi_code.co_qualname
        return type(event).__name__
    except (IndexError, AttributeError, TypeError):
        return "unknown"
