"""The online planner: forecast candidate configurations by simulation inside the run (seed 002,
"Planner Tick Behavior"; issue 41).

On a cadence, or early when a trigger fires, the planner forks the running simulation once per
candidate (``os.fork``: the child is the exact state of the run, queues, running requests, KV,
prefix caches and random streams, at no copying cost), applies the candidate's actions in the
child, simulates ``horizon_s`` and reports how the requests arriving meanwhile did.
The parent applies the cheapest candidate that meets the objective.  A fork is the snapshot: it
cannot drift from the run it was taken of, which a rebuilt state could.

What a child sees of the future is ``forecast``: ``recent`` replays the last ``horizon_s`` of
arrivals shifted forward (the planner knows nothing of what comes), ``oracle`` the run's true next
arrivals (an upper bound on any forecaster).  The objective (``choose``): candidates whose share
of judged requests meeting their SLO is at least ``min_attainment`` (and whose p99 TTFT is within
``max_ttft_p99_ms``) are feasible; the feasible one with the fewest GPUs wins, then the higher
attainment, then the nearer to the current configuration; with none feasible, the most GPUs win.
Candidates that cannot win are not forecast, and a forecast stops once its candidate cannot be
feasible (``prune``; the choice is the one full forecasts give).  Applied plans change new work only: scaling out pays the pool's cold start
(weights load plus ``cold_start_s``), scaling in drains, engine knobs apply from the next step.
"""
from __future__ import annotations

import heapq
import itertools
import json
import math
import os
import sys

import numpy as np

from ..config.errors import ConfigError
from ..core.request import PENDING, REJECTED, Request
from ..core.simulation import arrival_timeout
from ..metrics.exact import percentiles
from .control import ScaleIn, ScaleOut, SetEngine, SetSpeculation, Window, apply_action

KNOBS = ("max_num_seqs", "max_num_batched_tokens")
SPEC = ("speculation_mode", "speculation_k")     # None: the scenario's selector / gamma policy
MAX_SPACE = 200_000              # candidate configurations a tick may enumerate (it keeps max_candidates)
FAIR_MIN = 10                    # judged requests a tenant needs to count in the fairness gap
TREND_BOUNDS = (0.25, 4.0)       # a trend forecast scales the recent rate by at most this much
WATCH_CHECKS = 16                # a forecast counts late first tokens this often per horizon


def judge(arrival, first, last, done, n_out, rejected, ttft_slo, tpot_slo, t_end: float, tenant=None) -> dict:
    """SLO outcome of requests as of ``t_end`` (arrays; times NaN when not reached, SLOs NaN when
    unbounded).  Judged: rejected, finished, or past its TTFT bound (a first token, or none yet
    and already late); a request still running within its bounds is not judged yet."""
    with np.errstate(invalid="ignore"):
        seen = first <= t_end
        fin = done <= t_end
        ttft = np.where(seen, (first - arrival) * 1e3, (t_end - arrival) * 1e3)
        has_ttft = ~np.isnan(ttft_slo)
        ttft_ok = ~(ttft > ttft_slo)
        multi = fin & (n_out > 1)
        tpot = np.where(multi, (last - first) * 1e3 / np.maximum(n_out - 1, 1), np.nan)
        tpot_ok = ~(tpot > tpot_slo)
        judged = rejected | fin | (has_ttft & (seen | ~ttft_ok))
        met = judged & ~rejected & seen & ttft_ok & (tpot_ok | ~fin)
    n = int(judged.sum())
    ttfts = ttft[judged & ~rejected]         # a judged request without a token yet waits at least this long
    out = {"judged": n, "met": int(met.sum()), "attainment": float(met.sum()) / n if n else 1.0,
           "ttft_p99_ms": float(percentiles(ttfts, 99)) if ttfts.size else None}
    if tenant is not None:
        tenant = np.asarray(tenant, dtype=object)
        shares = []
        for name in sorted(set(tenant[judged].tolist())):
            mine = judged & (tenant == name)
            if mine.sum() >= FAIR_MIN:
                shares.append(float(met[mine].sum()) / int(mine.sum()))
        out["fairness_gap"] = max(shares) - min(shares) if len(shares) > 1 else 0.0
    return out


def _request_arrays(reqs) -> tuple:
    def col(get):
        return np.array([math.nan if v is None else v for v in map(get, reqs)], dtype=float)
    return (col(lambda r: r.arrival), col(lambda r: r.t_first_token), col(lambda r: r.t_last_token),
            col(lambda r: r.t_completion), np.array([r.n_out for r in reqs], dtype=float),
            np.array([r.state == REJECTED for r in reqs], dtype=bool).reshape(-1),
            col(lambda r: r.ttft_slo_ms), col(lambda r: r.tpot_slo_ms))


def _tenants(reqs) -> list:
    return [r.tenant for r in reqs]


def feasible(f: dict, min_attainment: float, max_p99: float | None, max_gap: float | None = None) -> bool:
    """Does a forecast meet the objective's constraints (one stopped early never does)?"""
    if f.get("skipped") or f.get("stopped_early"):
        return False
    p99 = f["ttft_p99_ms"]
    return (f["attainment"] >= min_attainment and (max_p99 is None or p99 is None or p99 <= max_p99)
            and (max_gap is None or f.get("fairness_gap", 0.0) <= max_gap))


def choose(forecasts: list, min_attainment: float, max_p99: float | None, max_gap: float | None = None) -> int:
    """Index of the winning forecast (see the module docstring): the feasible one with the fewest
    GPUs (``gpus``: the cost the objective minimises, GPUs or dollars per hour), then the higher
    attainment; with none feasible, the one with the most (the SLO is out of reach: provide what
    capacity there is); ties go to the lower index (the nearer candidate).  Skipped candidates
    (they could not win) are never chosen.  So a forecast stopped early (its attainment partial)
    decides nothing it would not decide in full."""
    keys = []
    for i, f in enumerate(forecasts):
        if f.get("skipped"):
            continue
        if feasible(f, min_attainment, max_p99, max_gap):
            keys.append((0, f["gpus"], -f["attainment"], i))
        else:                            # cost only: a stopped forecast's attainment is partial
            keys.append((1, -f["gpus"], i))
    return min(keys)[-1]


class SimulationPlanner:
    """The ``type: planner`` controller: a SimPy process of its own (``run``), not a Window-driven
    ``Controller``, because its ticks fork the simulation."""

    prune = True        # skip candidates that cannot win and stop doomed forecasts (False: forecast all, in full)

    def __init__(self, cfg, fleet, session, path: str):
        if not hasattr(os, "fork"):
            raise ConfigError(f"{path}.type", "planner", "a platform with os.fork (Linux or macOS): the "
                              "planner forecasts by forking the running simulation", show_value=True)
        if cfg.forecast != "oracle" and session.spec is not None:
            raise ConfigError(f"{path}.forecast", cfg.forecast, "oracle with speculation (a speculative workload's "
                              "conversations are bound up front and cannot be replayed)")
        if cfg.forecast != "oracle" and getattr(session.scn.config.workload, "max_concurrency", None) is not None:
            raise ConfigError(f"{path}.forecast", cfg.forecast, "oracle with a closed-loop workload "
                              "(workload.max_concurrency): its requests are sent as clients free up, not at "
                              "times a replay could shift")
        if session.scn.slo_ttft_ms is None and session.scn.slo_tpot_ms is None and not session.scn.slo_classes:
            raise ConfigError(f"{path}", None, "an SLO to plan for: slo.ttft_ms, slo.tpot_ms or slo.classes",
                              show_value=False)
        if cfg.cost == "usd":
            for p in fleet.pools.values():
                if p.spec.device.usd_per_gpu_hour is None:
                    raise ConfigError(f"{path}.cost", "usd", f"a price for every pool's GPU (pool {p.name}: "
                                      f"{p.spec.device.name} has no usd_per_gpu_hour)")
        spec_keys = any(sp.speculation_k is not None or sp.speculation_mode is not None for sp in cfg.pools.values())
        if spec_keys and session.spec is None:
            raise ConfigError(f"{path}.pools", None, "a speculation section for speculation_k / speculation_mode "
                              "candidates", show_value=False)
        size = 1
        for name, p in fleet.pools.items():
            sp = cfg.pools.get(name)
            reps = (len(sp.replicas) if sp is not None and sp.replicas is not None else
                    p.spec.max_replicas - p.spec.min_replicas + 1 if p.spec.max_replicas is not None else 3)
            size *= reps + 1
            for k in KNOBS + SPEC:
                size *= len(getattr(sp, k, None) or ()) + 1 if sp is not None else 1
        if size > MAX_SPACE:
            raise ConfigError(f"{path}.pools", None, f"a candidate space of at most {MAX_SPACE:,} configurations "
                              f"(this one has up to {size:,}: list fewer values, or bound pools' max_replicas)",
                              show_value=False)
        self.cfg, self.fleet, self.session, self.path = cfg, fleet, session, path
        self.interval_s = cfg.interval_s
        # by default a forecast looks past the slowest cold start, or a scale-out could never pay
        self.horizon = cfg.horizon_s or cfg.cadence_s + max(p.cold_start_s() for p in fleet.pools.values())
        self.dwell = cfg.cadence_s if cfg.min_dwell_s is None else cfg.min_dwell_s
        self.ticks: list = []
        self.last_change = -math.inf
        self.forked = False
        self._arrivals = None
        self._acc_now: dict = {}          # pool -> acceptance rate of its latest window with verifications
        self._acc_tick: dict = {}         # ... as it was at the last tick

    # ---- the process -------------------------------------------------------------------------
    def run(self, log: list):
        env = self.fleet.sim.env
        cfg = self.cfg
        win = Window(self.fleet)
        next_tick = cfg.cadence_s
        last_busy: dict = {}
        while True:
            yield env.timeout(self.interval_s)
            if self.forked or self.fleet.done:
                return
            now = env.now
            obs = win.observe()
            busy = {k: p["busy_fraction"] for k, p in obs["pools"].items()}
            for k, p in obs["pools"].items():      # a window without verifications keeps the last rate
                rate = (p.get("speculation") or {}).get("acceptance_rate")
                if rate is not None:
                    self._acc_now[k] = rate
            trigger = "cadence" if now >= next_tick - 1e-9 else self._trigger(obs, busy, last_busy)
            if trigger is None or now - self.last_change < self.dwell - 1e-9:
                continue
            next_tick = now + cfg.cadence_s
            last_busy = busy
            self._acc_tick = dict(self._acc_now)
            self._tick(now, trigger, log)

    def _trigger(self, obs: dict, busy: dict, last_busy: dict) -> str | None:
        cfg = self.cfg
        for name, p in obs["pools"].items():
            if cfg.trigger_waiting is not None and p["waiting"] / max(1, p["ready"]) > cfg.trigger_waiting:
                return f"waiting:{name}"
            if (cfg.trigger_busy_swing is not None and name in last_busy
                    and abs(busy[name] - last_busy[name]) > cfg.trigger_busy_swing):
                return f"busy_swing:{name}"
            if (cfg.trigger_acceptance_drop is not None and name in self._acc_tick and name in self._acc_now
                    and self._acc_now[name] < self._acc_tick[name] - cfg.trigger_acceptance_drop):
                return f"acceptance_drop:{name}"
        return None

    # ---- one tick ----------------------------------------------------------------------------
    def _tick(self, now: float, trigger: str, log: list) -> None:
        current = self._current()
        cands = self.candidates(current)
        forecasts = self._forecast_all(cands, [self._gpus(c) for c in cands])
        best = choose(forecasts, self.cfg.min_attainment, self.cfg.max_ttft_p99_ms, self.cfg.max_fairness_gap)
        actions = self.actions(current, cands[best])
        for a in actions:
            rec = apply_action(self.fleet, a)
            rec["time_s"] = now
            rec["by"] = "planner"
            log.append(rec)
        if actions:
            self.last_change = now
        self.ticks.append({"time_s": now, "trigger": trigger, "horizon_s": self.horizon, "chosen": best,
                           "changed": bool(actions),
                           "candidates": [{"config": c, **f} for c, f in zip(cands, forecasts)]})

    def _current(self) -> dict:
        out = {}
        for name, p in self.fleet.pools.items():
            spec = (self.session.spec.overrides.get(name) if self.session.spec is not None else None) or (None, None)
            out[name] = {"replicas": len(p.ready) + len(p.starting),
                         **{k: getattr(p.engine, k) for k in KNOBS}, **dict(zip(SPEC, spec))}
        return out

    def candidates(self, current: dict) -> list:
        """The current configuration first (each axis holds the current value besides the listed
        ones), then the others nearest first (fewest changed replicas, then fewest changed knobs),
        at most ``max_candidates``."""
        cfg = self.cfg
        axes = []
        for name, p in self.fleet.pools.items():
            cur = current[name]
            space = cfg.pools.get(name)
            lo, top = p.spec.min_replicas, p.spec.max_replicas
            hi = top if top is not None else cur["replicas"] + cfg.step
            if space is not None and space.replicas is not None:     # a list: tried as given (within bounds)
                reps = sorted({n for n in space.replicas if lo <= n <= (top or n)} | {cur["replicas"]})
            elif top is not None:                 # a bounded pool: every count it may have
                reps = sorted(set(range(lo, top + 1)) | {cur["replicas"]})
            else:
                reps = sorted({n for n in (cur["replicas"] - cfg.step, cur["replicas"], cur["replicas"] + cfg.step)
                               if lo <= n <= hi} | {cur["replicas"]})
            knob_vals = [[cur[k]] + [v for v in (getattr(space, k, None) or []) if v != cur[k]]
                         if space is not None else [cur[k]] for k in KNOBS + SPEC]
            axes.append([(name, r, *kv) for r in reps for kv in itertools.product(*knob_vals)])

        def distance(combo):
            return (sum(abs(r - current[n]["replicas"]) for n, r, *_ in combo),
                    sum(v != current[n][k] for n, _r, *kv in combo for k, v in zip(KNOBS + SPEC, kv)))
        combos = heapq.nsmallest(cfg.max_candidates, itertools.product(*axes), key=distance)
        return [{n: {"replicas": r, **dict(zip(KNOBS + SPEC, kv))} for n, r, *kv in combo} for combo in combos]

    def actions(self, current: dict, target: dict) -> list:
        out = []
        for name, want in target.items():
            have = current[name]
            if want["replicas"] > have["replicas"]:
                out.append(ScaleOut(name, want["replicas"] - have["replicas"]))
            elif want["replicas"] < have["replicas"]:
                out.append(ScaleIn(name, have["replicas"] - want["replicas"]))
            knobs = {k: want[k] for k in KNOBS if want[k] != have[k]}
            if knobs:
                out.append(SetEngine(name, **knobs))
            if any(want.get(k) != have.get(k) for k in SPEC):
                out.append(SetSpeculation(name, want.get("speculation_mode"), want.get("speculation_k")))
        return out

    def _gpus(self, cand: dict) -> float:
        """The candidate's cost: its GPUs, or (cost: usd) its dollars per hour."""
        pools = self.fleet.pools
        if self.cfg.cost == "usd":
            return sum(c["replicas"] * pools[n].spec.gpus_per_replica * pools[n].spec.device.usd_per_gpu_hour
                       for n, c in cand.items())
        return sum(c["replicas"] * pools[n].spec.gpus_per_replica for n, c in cand.items())

    # ---- forecasts: one forked child per candidate --------------------------------------------
    def _forecast_all(self, cands: list, gpus: list) -> list:
        """Forecast in order of GPUs (fewest first), ``jobs`` at a time.  Once a wave has found a
        feasible candidate, those needing more GPUs cannot win and are skipped (branch and bound:
        the choice is the one a forecast of every candidate would give)."""
        sys.stdout.flush()
        sys.stderr.flush()
        cfg = self.cfg
        out: list = [None] * len(cands)
        order = sorted(range(len(cands)), key=lambda i: (gpus[i], i))
        bound = math.inf                     # GPUs of the cheapest feasible candidate found so far
        k = 0
        while k < len(order):
            wave = [i for i in order[k:k + cfg.jobs] if gpus[i] <= bound]
            if not wave:
                break
            k += cfg.jobs
            jobs = []
            for i in wave:
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:                 # the child: never returns
                    os.close(r)
                    self._child(cands[i], w)
                os.close(w)
                jobs.append((i, pid, r))
            try:
                for job in jobs:
                    self._collect(job, out)
            finally:                             # never leave a child unreaped or a pipe open
                for i, pid, r in jobs:
                    if out[i] is None:
                        _reap(pid, r)
            for i in wave:
                out[i]["gpus"] = gpus[i]
                if self.prune and feasible(out[i], cfg.min_attainment, cfg.max_ttft_p99_ms, cfg.max_fairness_gap):
                    bound = min(bound, gpus[i])
        for i, f in enumerate(out):
            if f is None:
                out[i] = {"skipped": True, "gpus": gpus[i]}
        return out

    def _collect(self, job: tuple, out: list) -> None:
        i, pid, r = job
        with os.fdopen(r, "rb") as f:
            data = f.read()
        _, status = os.waitpid(pid, 0)
        msg = json.loads(data.decode()) if data else {"error": f"exit status {status}"}
        if "error" in msg:
            raise RuntimeError(f"{self.path}: the forecast of candidate {i} failed: {msg['error']}")
        out[i] = msg

    def _child(self, cand: dict, w: int) -> None:
        code = 0
        try:
            from ..core.spill import SpillFile
            SpillFile.go_private()               # the parent's spill file is shared: write elsewhere
            msg = self._simulate(cand)
        except BaseException as e:             # anything, reported to the parent: the child must exit
            msg, code = {"error": f"{type(e).__name__}: {e}"}, 1
        try:
            data = json.dumps(msg).encode()
            while data:
                data = data[os.write(w, data):]
        finally:
            os._exit(code)

    def _simulate(self, cand: dict) -> dict:
        """In the child: apply ``cand``, run ``horizon`` simulated seconds, judge the requests that
        arrived meanwhile (the work a plan changes: those already in flight sit on the replicas
        that took them, whatever the plan).  Stops early once so many have missed their SLO that
        the candidate cannot be feasible whatever the others do (its attainment is then partial)."""
        self.forked = True
        ses, fleet = self.session, self.fleet
        ses.progress.enabled = False
        now = fleet.sim.now
        t_end = now + self.horizon
        judged: list = []                    # the new work the plan changes: arrivals within the horizon
        for a in self.actions(self._current(), cand):
            apply_action(fleet, a)
        ids: set = set()                     # rids of the judged requests (the miss watch counts only these)
        if self.cfg.forecast != "oracle":
            ses.cut_arrivals()
            clones = self._recent(now)
            judged += clones
            ids.update(c.rid for c in clones)
            n_total = len(judged)
            fleet.sim.process(_replay(fleet, clones))
        else:
            n_total = max(0, int(np.searchsorted(self._arrival_times(), t_end, "left")) - ses.sent)
            arrive = fleet.arrive

            def seen(r, arrive=arrive):
                judged.append(r)
                ids.add(r.rid)
                arrive(r)
            fleet.arrive = seen
        allow = (1 - self.cfg.min_attainment) * n_total
        if self.prune and allow < n_total:
            _watch_misses(fleet, ids, allow, self.horizon / WATCH_CHECKS)
        try:
            ses.advance(t_end)
        except _Decided:
            out = judge(*_request_arrays(judged), fleet.sim.now, tenant=_tenants(judged))
            return {**out, "stopped_early": True, "stopped_at_s": fleet.sim.now}
        return judge(*_request_arrays(judged), t_end, tenant=_tenants(judged))

    def _arrival_times(self) -> np.ndarray:
        if self._arrivals is None:
            self._arrivals = np.asarray(self.session.workload.arrival_times(), dtype=float)
        return self._arrivals

    def _recent(self, now: float) -> list:
        """Fresh copies of the requests that arrived in the last horizon, replayed over the next
        one: as they came (``recent``), or with their rate extrapolated linearly from the horizon
        before (``trend``: the window is time-compressed, or stretched, by the rate ratio and
        repeated to fill the horizon)."""
        ses, h = self.session, self.horizon
        arr = self._arrival_times()
        j0 = int(np.searchsorted(arr, now - h, "left"))
        j1 = ses.sent
        span = min(h, now)                   # the history there is (less than a horizon early on)
        factor = 1.0
        prev_span = min(h, now - h)
        if self.cfg.forecast == "trend" and j1 > j0 and prev_span >= h / 4:
            rate = (j1 - j0) / span
            prev = (j0 - int(np.searchsorted(arr, now - h - prev_span, "left"))) / prev_span
            factor = min(max((2 * rate - prev) / rate, TREND_BOUNDS[0]), TREND_BOUNDS[1])
        window = [(float(arr[j0 + k]), r) for k, r in zip(range(j1 - j0), ses.workload.tail(j0))]
        period = span / factor               # how long one replay of the window takes
        out, base = [], len(ses.workload)
        for rep in range(math.ceil(h / period) if window and period > 0 else 0):
            for a, r in window:
                t = now + (a - (now - span)) / factor + rep * period
                if t >= now + h:
                    break
                c = Request(base + len(out), t, r.prompt_len, r.max_tokens, r.segments, r.prefix_group, r.label)
                c.session, c.tenant, c.priority, c.slo_class = r.session, r.tenant, r.priority, r.slo_class
                c.ttft_slo_ms, c.tpot_slo_ms, c.sampling = r.ttft_slo_ms, r.tpot_slo_ms, r.sampling
                out.append(c)
        return [c for c in out if c.arrival >= now]

    # ---- the report --------------------------------------------------------------------------
    def report(self, led) -> dict:
        """Every tick, with what then happened to the same kind of request set (those arriving
        within its horizon, judged at its end) and the forecast's error."""
        arr, first, last, done = (led.col(k) for k in ("arrival", "t_first_token", "t_last_token", "t_completion"))
        n_out = led.col("n_out").astype(float)
        state = led.col("state")
        rejected = state == REJECTED
        sent = state != PENDING
        stop = getattr(self.session, "end", None)
        ttft_slo, tpot_slo = led.col("ttft_slo_ms"), led.col("tpot_slo_ms")
        tenants = np.asarray(led.strings("tenant"), dtype=object)
        errs = []
        for t in self.ticks:
            t0, t_end = t["time_s"], t["time_s"] + t["horizon_s"]
            if stop is not None:
                t_end = min(t_end, stop)         # a run stopped at its horizon judges no further
            sel = (arr >= t0) & (arr < t_end) & sent
            actual = judge(arr[sel], first[sel], last[sel], done[sel], n_out[sel], rejected[sel], ttft_slo[sel],
                           tpot_slo[sel], t_end, tenant=tenants[sel])
            fc = t["candidates"][t["chosen"]]
            t["actual"] = actual
            if fc.get("stopped_early"):          # a partial forecast: no error to report
                t["attainment_error"] = None
                continue
            t["attainment_error"] = fc["attainment"] - actual["attainment"]
            errs.append(abs(t["attainment_error"]))
        return {"kind": "simulate", "forecast": self.cfg.forecast, "ticks": len(self.ticks),
                "changes": sum(t["changed"] for t in self.ticks),
                "mean_abs_attainment_error": float(np.mean(errs)) if errs else None,
                "tick_log": self.ticks}


def _reap(pid: int, r: int) -> None:
    try:
        os.close(r)
    except OSError:
        pass
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:
        pass


class _Decided(Exception):
    """Raised inside a forecast's simulation once its candidate is certainly infeasible."""


def _missed(r) -> bool:
    """A finished (or rejected) request missed its SLO (the rule of ``judge``)."""
    if r.state == REJECTED or r.t_first_token is None:
        return True
    if r.ttft_slo_ms is not None and (r.t_first_token - r.arrival) * 1e3 > r.ttft_slo_ms:
        return True
    return (r.tpot_slo_ms is not None and r.n_out > 1
            and (r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1) > r.tpot_slo_ms)


def _watch_misses(fleet, ids: set, allow: float, every: float) -> None:
    """In a forecast: count the judged requests (rids in ``ids``) that finished missing their SLO
    and, every ``every`` seconds, those still waiting for a first token past their TTFT bound;
    more than ``allow`` stops the forecast (``_Decided``)."""
    done = [0]

    def on_done(r):
        if r.rid in ids and _missed(r):
            done[0] += 1
            if done[0] > allow:
                raise _Decided

    def late():
        env = fleet.sim.env
        while True:
            yield env.timeout(every)
            now = env.now
            n = sum(1 for r in fleet.live.values() if r.rid in ids and r.t_first_token is None
                    and r.ttft_slo_ms is not None and (now - r.arrival) * 1e3 > r.ttft_slo_ms)
            if done[0] + n > allow:
                raise _Decided
    fleet.done_hooks.append(on_done)
    fleet.sim.process(late())


def _replay(fleet, clones):
    """The arrival process of a forecast's replayed requests."""
    env = fleet.sim.env
    for r in clones:
        dt = r.arrival - env.now
        if dt > 0:
            yield arrival_timeout(env, dt)
        r.arrival = env.now
        fleet.arrive(r)
