"""Control plane: controllers are SimPy processes that observe the fleet on a tick and act.

Actions (seed 001's action set, seed 002's planner tick): ``ScaleOut``/``ScaleIn`` a pool (a new
replica is ready after its cold start; a removed one drains first), ``SetEngine`` (live
max_num_seqs / max_num_batched_tokens / long_prefill_token_threshold), ``SetSpeculation`` (mode
and k of a pool's speculative decoding), ``SetDrafter`` (the draft model a pool's conversations
draft with) and ``Rebalance`` (move unstarted requests from long
queues to short ones, or live-migrate running ones).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config.errors import ConfigError
from ..metrics.exact import percentiles
from ..metrics.fleet import spread
from ..metrics.measures import gpu_utilization, ledger_latencies
from ..core.invariant import check


@dataclass(frozen=True)
class ScaleOut:
    pool: str
    n: int = 1


@dataclass(frozen=True)
class ScaleIn:
    pool: str
    n: int = 1


@dataclass(frozen=True)
class SetEngine:
    pool: str
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    long_prefill_token_threshold: int | None = None


@dataclass(frozen=True)
class SetSpeculation:
    """Speculative decoding for a pool's conversations from their next round: ``mode`` "off" (plain
    decoding), "fused" or "distributed" (None: the scenario's selector), ``k`` drafts per round
    (None: the gamma policy); both None hands control back."""
    pool: str
    mode: str | None = None
    k: int | None = None


@dataclass(frozen=True)
class SetDrafter:
    """Switch a pool's draft model live (seed 002 5.5, drafter selection): from each conversation's
    next round, the pool's conversations draft with the portfolio drafter named ``drafter`` (its
    model's cost on the device or the target, its acceptance; escalation paused); None hands the
    choice back to the portfolio.  Needs ``speculation.portfolio``: its drafters are the models a
    pool can switch between, resident as the portfolio assumes (no load on a switch)."""
    pool: str
    drafter: str | None = None


@dataclass(frozen=True)
class Rebalance:
    pool: str
    migrate: bool = False            # also live-migrate running decoders (their KV is transferred)


def apply_action(fleet, a) -> dict:
    """Apply one action; returns what happened (for logs and the stepping API)."""
    if isinstance(a, ScaleOut):
        return {"action": "scale_out", "pool": a.pool, "changed": fleet.scale_out(a.pool, a.n)}
    if isinstance(a, ScaleIn):
        return {"action": "scale_in", "pool": a.pool, "changed": fleet.scale_in(a.pool, a.n)}
    if isinstance(a, SetEngine):
        knobs = {k: v for k, v in (("max_num_seqs", a.max_num_seqs),
                                   ("max_num_batched_tokens", a.max_num_batched_tokens),
                                   ("long_prefill_token_threshold", a.long_prefill_token_threshold))
                 if v is not None}
        for k, v in knobs.items():
            if not isinstance(v, int) or isinstance(v, bool) or v < (0 if k == "long_prefill_token_threshold" else 1):
                raise ValueError(f"SetEngine.{k}: expected a positive integer, got {v!r}")
        fleet.pool(a.pool).set_engine(**knobs)
        return {"action": "set_engine", "pool": a.pool, "changed": knobs}
    if isinstance(a, SetSpeculation):
        rt = fleet.speculation
        if rt is None:
            raise ValueError("SetSpeculation: the scenario has no speculation section")
        if a.mode not in (None, "off", "fused", "distributed"):
            raise ValueError(f"SetSpeculation.mode: expected off, fused, distributed or None, got {a.mode!r}")
        if a.k is not None and (not isinstance(a.k, int) or isinstance(a.k, bool) or not 0 <= a.k <= 64):
            raise ValueError(f"SetSpeculation.k: expected an integer in [0, 64] or None, got {a.k!r}")
        fleet.pool(a.pool)
        rt.set_override(a.pool, a.mode, a.k)
        return {"action": "set_speculation", "pool": a.pool, "changed": {"mode": a.mode, "k": a.k}}
    if isinstance(a, SetDrafter):
        rt = fleet.speculation
        if rt is None:
            raise ValueError("SetDrafter: the scenario has no speculation section")
        fleet.pool(a.pool)
        rt.set_drafter(a.pool, a.drafter)
        return {"action": "set_drafter", "pool": a.pool, "changed": {"drafter": a.drafter}}
    if isinstance(a, Rebalance):
        return {"action": "rebalance", "pool": a.pool, "changed": fleet.rebalance(a.pool, a.migrate)}
    raise ValueError(f"unknown action {a!r} (ScaleOut, ScaleIn, SetEngine, SetSpeculation, SetDrafter, Rebalance)")


class Window:
    """Observation over the interval since the previous ``observe`` call.

    Per pool, besides counts, KV usage and busy fraction, seed 001's "Metrics Exposed":
    ``prefilling`` / ``decoding`` (running requests with prompt tokens left / the rest, speculative
    decoders waiting for drafts included), ``queue_velocity`` ((waiting - waiting at the previous
    observation) / interval, req/s), ``gpu_utilization`` (percent: the compute load of the tokens
    the pool's replicas computed in the interval, dsim.metrics.measures.gpu_utilization),
    ``memory_utilization`` (percent of one GPU's memory holding KV, mean over the ready replicas,
    with ``_min`` / ``_max`` / ``_std`` over them) and ``memory_efficiency`` (mean / max of it, 1.0
    when no KV is in use).  Fleet-wide: ``queue_depth`` and ``queue_velocity``."""

    def __init__(self, fleet):
        self.fleet = fleet
        fleet.order_watchers += 1        # it reads rows in finish order: replicas keep same-time order
        self.t = fleet.sim.now
        self.n_seen = 0                  # ledger rows already observed
        self.n_rej = 0
        self.n_arr = 0
        self.busy = {}
        self.spec = {}                   # pool -> (verified, accepted) at the previous observation
        self.work = {}                   # pool -> gpu_utilization work (replica-seconds) so far
        self.depth = {}                  # pool -> waiting at the previous observation
        self.depth_all = 0

    def observe(self) -> dict:
        f = self.fleet
        now = f.sim.now
        dt = max(now - self.t, 1e-12)
        rows = f.ledger.since(self.n_seen)        # requests finished since the last observation
        is_done = rows.present("t_completion")
        n_new = int(is_done.sum())
        lat = ledger_latencies(rows, is_done)
        ttft, tpot = lat["ttft_ms"], lat["tpot_ms"]
        pools = {}
        depth_all = 0
        for name, p in f.pools.items():
            busy = sum(r.inst.busy_time for r in p.replicas)
            prev = self.busy.get(name, 0.0)
            self.busy[name] = busy
            tokens = [r.inst.log.token_totals() for r in p.replicas]
            work = p.work_s(sum(t[0] for t in tokens), sum(t[1] for t in tokens)) if any(map(any, tokens)) else 0.0
            prev_work = self.work.get(name, 0.0)
            self.work[name] = work
            ready = p.ready
            n = len(ready)
            waiting = sum(r.waiting for r in ready)
            prefilling = sum(r.inst.n_prefilling for r in ready)
            mem = spread([r.kv_usage * r.inst.kv.total for r in ready])
            to_pct = 100.0 * p.gpu_block_fraction
            pools[name] = {
                "ready": n, "starting": len(p.starting),
                "draining": sum(1 for r in p.replicas if r.state == "draining"),
                "waiting": waiting, "running": sum(r.running for r in ready),
                "prefilling": prefilling, "decoding": sum(r.running for r in ready) - prefilling,
                "queue_velocity": (waiting - self.depth.get(name, 0)) / dt,
                "kv_usage": sum(r.kv_usage for r in ready) / n if n else 0.0,
                "busy_fraction": (busy - prev) / (dt * max(1, n)),
                "gpu_utilization": gpu_utilization(work - prev_work, dt * max(1, n)),
                "memory_utilization": mem["mean"] * to_pct,
                "memory_utilization_min": mem["min"] * to_pct,
                "memory_utilization_max": mem["max"] * to_pct,
                "memory_utilization_std": mem["std"] * to_pct,
                "memory_efficiency": mem["efficiency"],
                "max_num_seqs": p.engine.max_num_seqs,
                "max_num_batched_tokens": p.engine.max_num_batched_tokens,
            }
            if f.speculation is not None:
                pools[name]["speculation"] = self._speculation(name, p)
            self.depth[name] = waiting
            depth_all += waiting
        obs = {
            "time_s": now,
            "interval_s": dt,
            "arrivals": f.arrived - self.n_arr,
            "completed": n_new,
            "rejected": f.n_rejected - self.n_rej,
            "in_flight": f.arrived - f.n_completed - f.n_rejected,
            "throughput_rps": n_new / dt,
            "ttft_p50_ms": float(percentiles(ttft, 50)) if len(ttft) else None,
            "ttft_p95_ms": float(percentiles(ttft, 95)) if len(ttft) else None,
            "tpot_mean_ms": float(np.mean(tpot)) if len(tpot) else None,
            "queue_depth": depth_all,
            "queue_velocity": (depth_all - self.depth_all) / dt,
            "pools": pools,
        }
        self.depth_all = depth_all
        self.t = now
        self.n_seen = f.ledger.n
        self.n_rej = f.n_rejected
        self.n_arr = f.arrived
        return obs


    def _speculation(self, name: str, pool) -> dict:
        """A speculative pool's window: drafts verified and accepted since the last observation, their
        ratio, and the conversations whose drafts wait for verification now (seed 002 A.2)."""
        tg = [t for t in (self.fleet.speculation.targets.get(r.name) for r in pool.replicas) if t is not None]
        ver, acc = sum(t.verified for t in tg), sum(t.accepted for t in tg)
        v0, a0 = self.spec.get(name, (0, 0))
        self.spec[name] = (ver, acc)
        return {"verified": ver - v0, "accepted": acc - a0,
                "acceptance_rate": (acc - a0) / (ver - v0) if ver > v0 else None,
                "verify_queue": sum(t.ready_n for t in tg),
                "drafter": self.fleet.speculation.pool_drafter.get(name)}


class Controller:
    """Subclass and implement ``act(observation) -> list of actions``; runs every ``interval_s``."""

    interval_s: float = 5.0

    def act(self, observation: dict) -> list:
        raise NotImplementedError


class ReactiveAutoscaler(Controller):
    """Scale a pool out when its queue or KV is under pressure, in when it idles.

    out: waiting per ready replica > ``scale_out_waiting`` or mean KV usage > ``scale_out_kv``,
    and no replica is already starting; in: nothing waiting, mean KV usage < ``scale_in_kv`` and
    busy fraction < ``scale_in_busy`` (a continuous-batching replica is busy whenever anything
    runs, so KV usage is the better idle signal; busy is off by default).  ``cooldown_s`` after
    every action.  Bounds: the pool's min/max_replicas.
    """

    def __init__(self, pool: str, interval_s: float = 5.0, scale_out_waiting: float = 4.0,
                 scale_out_kv: float = 0.9, scale_in_kv: float = 0.2, scale_in_busy: float = 1.0,
                 cooldown_s: float = 30.0):
        self.pool = pool
        self.interval_s = interval_s
        self.up_wait = scale_out_waiting
        self.up_kv = scale_out_kv
        self.down_kv = scale_in_kv
        self.down_busy = scale_in_busy
        self.cooldown = cooldown_s
        self.last_action = -float("inf")

    def act(self, obs: dict) -> list:
        p = obs["pools"][self.pool]
        now = obs["time_s"]
        if now - self.last_action < self.cooldown:
            return []
        n = max(1, p["ready"])
        if (p["waiting"] / n > self.up_wait or p["kv_usage"] > self.up_kv) and not p["starting"]:
            self.last_action = now
            return [ScaleOut(self.pool)]
        if (p["waiting"] == 0 and p["kv_usage"] < self.down_kv and p["busy_fraction"] < self.down_busy
                and p["ready"] > 1 and not p["starting"]):
            self.last_action = now
            return [ScaleIn(self.pool)]
        return []


def check_controllers(controllers) -> list:
    """Extra controllers given to ``dsim.run`` / ``ClusterEnv``: objects with ``act(observation)``
    and a positive finite ``interval_s`` (checked before the run, not when SimPy first wakes them)."""
    from ..config.fields import check_number
    from ..config.limits import MAX_TIME_S, MIN_TIMER_S
    if controllers is None:
        return []
    if isinstance(controllers, (str, bytes, dict)) or not hasattr(controllers, "__iter__"):
        raise ConfigError("controllers", controllers, "a list of dsim.Controller objects")
    controllers = list(controllers)
    for i, c in enumerate(controllers):
        if not callable(getattr(c, "act", None)):
            raise ConfigError(f"controllers[{i}]", c, "a dsim.Controller (an object with act(observation) and "
                              "interval_s)")
        check_number(getattr(c, "interval_s", None), f"controllers[{i}].interval_s", lo=MIN_TIMER_S, hi=MAX_TIME_S)
    return controllers


def run_controller(fleet, ctrl: Controller, log: list):
    """The SimPy process of one controller: observe, act, until the fleet is done."""
    env = fleet.sim.env
    win = Window(fleet)
    while True:
        yield env.timeout(ctrl.interval_s)
        if fleet.done:
            return
        obs = win.observe()
        for a in ctrl.act(obs) or ():
            rec = apply_action(fleet, a)
            rec["time_s"] = env.now
            log.append(rec)
