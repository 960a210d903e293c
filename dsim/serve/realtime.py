"""The scenario's simulation driven by the wall clock (``dsim serve``).

Simulated time is ``speed x`` the wall-clock seconds since ``start()``.  Everything runs in one asyncio
loop: ``drive()`` sleeps until the simulation's next event is due (``env.peek()``) or something new
happens, then runs the SimPy environment up to the current time (each event due, then the clock); an HTTP
request calls ``submit`` (the simulation is first brought to now, then the request arrives at the
gateway, whose routers pick its replica, or at the replica behind the port it came in on) and a
``/metrics`` scrape calls ``advance`` before it reads the replicas.

Tokens: every replica carries a step observer (the ``tracer`` hook of ``Instance``), which also turns off
the replicas' fast-forward through quiet decode stretches (``dsim.serving.fastforward``: it advances
the decode counter of many steps at once, before their time), so each step ends at its own event.  At
a step's end the observer counts the tokens each request of this server holds so far and queues the
new ones with their simulated emission time (the step's end plus the latency model's per-token
overhead); the finished request's last token and its end come from the fleet's done hook.  The HTTP
side releases each item when the wall clock reaches its simulated time, so a client sees the latencies
of the simulation, queueing, batching, KV pressure, prefix hits and preemption included.  Decode steps
are milliseconds long, so one event per step costs little at real-time speed.

Not SimPy's ``RealtimeEnvironment``: it sleeps with ``time.sleep`` between events, so arrivals at
arbitrary wall times would need a second thread and locks; advancing the ordinary environment from the
event loop gives the same event times with one thread.

Scenario parts that need arrivals known in advance are refused: the workload is replaced by HTTP
clients, speculative decoding binds its conversations up front.
"""
from __future__ import annotations

import asyncio
import json
import time
from bisect import bisect_left
from collections import deque

from ..config.errors import ConfigError
from ..config.scenario import Scenario, load_scenario
from ..core.request import COMPLETED, REJECTED, Request
from ..workload.generator import apply_slo_targets

# the workload's requests never arrive (cut): a one-request stand-in keeps the build cheap
_NO_WORKLOAD = ("workload={type: poisson, rate: 1, num_requests: 1, prompt_tokens: {dist: constant, value: 1}, "
                "output_tokens: {dist: constant, value: 1}}")

RECENT = 100_000     # finished requests whose simulated times RealtimeSim.recent keeps (tests, measurements)

# vLLM's histogram buckets (vllm/v1/metrics/loggers.py)
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
               480.0, 960.0, 1920.0, 7680.0)


class Hist:
    """A cumulative histogram (Prometheus semantics: bucket i counts values <= bounds[i])."""
    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, v: float, n: int = 1) -> None:
        self.counts[bisect_left(self.bounds, v)] += n
        self.sum += v * n
        self.count += n

    def buckets(self) -> list:
        out, c = [], 0
        for b, k in zip(self.bounds + (float("inf"),), self.counts):
            c += k
            out.append((b, c))
        return out


LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class ReplicaStats:
    """What /metrics reports of one replica beyond its live state: request counters and histograms."""

    def __init__(self):
        self.ttft = Hist(TTFT_BUCKETS)
        self.itl = Hist(ITL_BUCKETS)
        self.e2e = Hist(E2E_BUCKETS)
        self.queue = Hist(E2E_BUCKETS)
        self.success = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0


class Stream:
    """One HTTP request's simulated request and the items its handler releases, in time order:
    ("tokens", t, n) n new tokens at simulated time t; ("done", t, None) the request ended at t;
    ("error", t, reason) the simulation rejected it."""
    __slots__ = ("req", "items", "event", "sent", "t_last", "ttft_seen", "released")

    def __init__(self, req: Request):
        self.req = req
        self.items: deque = deque()
        self.event = asyncio.Event()
        self.sent = 0              # tokens queued so far
        self.t_last = None         # simulated time of the last queued token
        self.ttft_seen = False
        self.released = False      # the HTTP side no longer counts it in flight

    def push(self, item) -> None:
        self.items.append(item)
        self.event.set()


class _StepObserver:
    """``Instance.tracer``: told at every step's end (and, being set, keeps fast-forward off)."""
    __slots__ = ("rt",)

    def __init__(self, rt):
        self.rt = rt

    def before(self, inst, prefills, skipped, shape):
        return True

    def after(self, inst, snap, t0, t_end, n_done):
        self.rt._step_end(inst, t_end)


def load_serve_scenario(source, overrides=()) -> Scenario:
    """The scenario as dsim serve simulates it: its workload replaced (arrivals come from HTTP)."""
    scn = load_scenario(source, list(overrides) + [_NO_WORKLOAD])
    if scn.slo_classes:                       # the stand-in request has a class (an edf policy asks for targets)
        one = _NO_WORKLOAD.split("=", 1)[1][1:-1]
        scn = load_scenario(source, list(overrides) + [
            f"workload={{type: mix, classes: [{{name: http, slo_class: {json.dumps(next(iter(scn.slo_classes)))}, "
            f"{one}}}]}}"])          # the class name quoted: a comma or colon in it stays part of the name
    if scn.spec is not None:
        raise ConfigError("speculation", None, "no speculation section with dsim serve (speculative decoding "
                          "binds its conversations to the workload up front)", show_value=False)
    return scn


class RealtimeSim:
    """A built session advanced to the wall clock; see the module docstring."""

    def __init__(self, scn: Scenario, speed: float = 1.0):
        from ..runner import Session
        if not 0 < speed <= 1e6:
            raise ConfigError("--speed", speed, "a factor in (0, 1e6]")
        self.scn = scn
        self.speed = float(speed)
        self.session = ses = Session(scn)
        ses.cut_arrivals()
        self.fleet = fleet = ses.fleet
        self.env = ses.sim.env
        self.streams: dict = {}                 # rid -> Stream of a request in flight
        self.stats: dict = {}                   # replica name -> ReplicaStats
        self.next_rid = len(ses.workload)
        obs = _StepObserver(self)
        for rep in fleet.replicas():
            rep.inst.tracer = obs
        fleet.tracer_factory = lambda inst: obs     # replicas the autoscaler adds later
        fleet.done_hooks.append(self._done)
        self.recent: dict = {}                  # rid -> (arrival, first token, completion), the last RECENT finished
        self.t0 = None
        self._wakeup = None                     # the future drive() sleeps on
        self.lag = Hist(LAG_BUCKETS)            # wall seconds a token went out after its simulated time
        self.failure = None                     # the exception the simulation raised, if it did
        self.on_failure = None                  # f(exception): the server stops serving

    # ---- clock ---------------------------------------------------------------------------------
    def start(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        """Simulated time now: speed x wall seconds since start."""
        return (time.monotonic() - self.t0) * self.speed

    def advance(self) -> float:
        """Run the simulation up to now; returns the simulated time reached.  Not ``env.run(until=t)``:
        SimPy leaves its stop event queued at t, which ``env.peek()`` would then report as due."""
        if self.failure is not None:          # a simulation that raised once is not run on
            raise self.failure
        t = self.now()
        env = self.env
        q = env._queue
        step = env.step
        try:
            while q and q[0][0] <= t:
                step()
        except Exception as e:                # SimPy has dropped the failing event: stop, do not serve on
            self.failure = e
            if self.on_failure is not None:
                self.on_failure(e)
            raise
        if t > env._now:
            env._now = t                    # no event before t: the clock moves on, as run(until=t) does
        return env._now

    def wall_delay(self, t_sim: float) -> float:
        """Wall seconds until simulated time t_sim (<= 0: due)."""
        return (t_sim - self.now()) / self.speed

    async def drive(self) -> None:
        """Keep the simulation at the wall clock until cancelled."""
        env = self.env
        loop = asyncio.get_running_loop()
        while True:
            self.advance()
            nxt = env.peek()
            delay = 0.5 if nxt == float("inf") else min(0.5, max(0.0, self.wall_delay(nxt)))
            fut = self._wakeup = loop.create_future()
            timer = loop.call_later(delay, _wake, fut)
            try:
                await fut
            finally:
                timer.cancel()

    def kick(self) -> None:
        """Something was added to the simulation: its next event may be sooner than drive() thinks."""
        _wake(self._wakeup)

    async def release_at(self, t_sim: float) -> None:
        """Return at simulated time t_sim (at once if it is past); how late is recorded in ``lag``."""
        d = self.wall_delay(t_sim)
        if d > 0:
            await asyncio.sleep(d)
            d = self.wall_delay(t_sim)
        self.lag.observe(max(0.0, -d))

    # ---- requests ------------------------------------------------------------------------------
    def submit(self, prompt_len: int, max_tokens: int, segments=None, replica=None, priority: int = 0,
               slo_class: str = ""):
        """A request arrives now; returns its Stream, or the simulation's reject reason (a str).  Its SLO
        targets are its class's (``slo.classes``), else the scenario's ``slo``."""
        self.advance()
        r = Request(self.next_rid, self.env.now, prompt_len, max_tokens, segments=segments)
        r.priority = priority
        r.slo_class = slo_class
        apply_slo_targets((r,), self.scn.slo_classes, self.scn.slo_ttft_ms, self.scn.slo_tpot_ms)
        self.next_rid += 1
        st = Stream(r)
        self.streams[r.rid] = st
        self.fleet.arrive(r, replica)
        if r.state == REJECTED:                 # at the door: admission, too long, no KV room
            self.streams.pop(r.rid, None)
            return r.reject_reason or "rejected"
        self.kick()                             # the next event may be sooner now
        return st

    def _step_end(self, inst, t_end: float) -> None:
        streams = self.streams
        if not streams:
            return
        t_tok = t_end + inst.token_overhead
        D = inst.D
        for group in (inst.running, inst.transferring):
            for rid, r in group.items():
                st = streams.get(rid)
                if st is None:
                    continue
                if r.prefilling or r.spec is not None or group is inst.transferring:
                    n = r.n_out
                else:                           # a lazy decoder (dsim.serving.lazy)
                    n = r.c0 + D - r.d0 - r.prompt_len + 1
                self._tokens(st, inst, min(n, r.max_tokens), t_tok)

    def _tokens(self, st: Stream, inst, n: int, t: float) -> None:
        new = n - st.sent
        if new <= 0:
            return
        r = st.req
        stats = self._stats(inst.name)
        if not st.ttft_seen:
            st.ttft_seen = True
            t = r.t_first_token if r.t_first_token is not None else t
            stats.ttft.observe(t - r.arrival)
            if r.t_scheduled is not None and r.t_queued is not None:
                stats.queue.observe(r.t_scheduled - r.t_queued)
            if new > 1:
                stats.itl.observe(0.0, new - 1)
        else:
            stats.itl.observe(t - st.t_last)
            if new > 1:
                stats.itl.observe(0.0, new - 1)
        st.sent = n
        st.t_last = t
        st.push(("tokens", t, new))

    def _done(self, r) -> None:
        st = self.streams.pop(r.rid, None)
        if st is None:
            return
        if r.state == COMPLETED:
            name = r.replica
            self._tokens(st, _Named(name), r.max_tokens, r.t_last_token)
            stats = self._stats(name)
            stats.e2e.observe(r.t_completion - r.arrival)
            stats.success += 1
            stats.prompt_tokens += r.prompt_len
            stats.generation_tokens += r.n_out
            st.push(("done", r.t_completion, None))
            rec = self.recent
            rec[r.rid] = (r.arrival, r.t_first_token, r.t_completion)
            if len(rec) > RECENT:
                del rec[next(iter(rec))]
        else:
            st.push(("error", self.env.now, r.reject_reason or "rejected"))

    def _stats(self, name: str) -> ReplicaStats:
        s = self.stats.get(name)
        if s is None:
            s = self.stats[name] = ReplicaStats()
        return s

    # ---- views ---------------------------------------------------------------------------------
    def replicas(self) -> list:
        return self.fleet.replicas()

    def model_names(self) -> list:
        seen = []
        for p in self.fleet.pools.values():
            if p.spec.model.name not in seen:
                seen.append(p.spec.model.name)
        return seen

    def max_model_len(self) -> int:
        return min(p.engine.max_model_len for p in self.fleet.pools.values())


def _wake(fut) -> None:
    if fut is not None and not fut.done():
        fut.set_result(None)


class _Named:
    """A replica's name where ``_tokens`` wants an instance (only ``.name`` is read)."""
    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name


def build(source, overrides=(), speed: float = 1.0) -> RealtimeSim:
    return RealtimeSim(load_serve_scenario(source, overrides), speed)
