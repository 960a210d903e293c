"""A gym-like stepping API over a scenario, for external controllers and RL agents.

    env = ClusterEnv("scenarios/autoscale_ramp.yaml", interval_s=5)
    obs = env.reset()
    while not env.done:
        obs, metrics = env.step([ScaleOut("a100")] if obs["pools"]["a100"]["waiting"] > 20 else [])
    result = env.result()

``step(actions)`` applies the actions now, runs the simulation ``interval_s`` further and returns
the observation (fleet state at the end of the interval) and the interval's metrics (arrivals,
completions, rejections, TTFT p50/p95, mean TPOT, the fleet's queue velocity; per pool busy fraction,
gpu_utilization and queue velocity).  Both are plain dicts.
Controllers declared in the scenario keep running alongside.
"""
from __future__ import annotations

from .cluster.control import Window, apply_action
from .config.errors import ConfigError
from .config.fields import check_number
from .config.limits import MAX_TIME_S, MIN_TIMER_S
from .config.scenario import Scenario, load_scenario


# the observation's per-pool quantities over the interval since the previous one: ``step`` returns
# them in its metrics (queue_velocity of a pool as queue_velocity_by_pool), not in the observation
INTERVAL_POOL_KEYS = ("busy_fraction", "gpu_utilization", "queue_velocity")


class ClusterEnv:
    """Step a scenario's simulation ``interval_s`` at a time, applying actions between steps.

    scenario, overrides, seed: as ``dsim.run``.  ``reset()`` builds the simulation and returns the
    first observation; ``step(actions)`` applies ``dsim.ScaleOut/ScaleIn/SetEngine/Rebalance``
    actions now and returns (observation, interval metrics); ``done`` says the run is over;
    ``result(out_dir)`` runs to the end and returns the usual ``Result``.  For a Gymnasium
    environment (vector observations, discrete scaling actions, a reward) see
    ``dsim.gym_env.DsimAutoscaleEnv``.
    """

    def __init__(self, scenario, overrides=None, seed: int | None = None, interval_s: float = 1.0,
                 check_invariants: bool = False):
        interval_s = check_number(interval_s, "interval_s", lo=MIN_TIMER_S, hi=MAX_TIME_S)
        if not isinstance(check_invariants, bool):
            raise ConfigError("check_invariants", check_invariants, "True or False")
        self.scn = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides, seed)
        self.interval_s = interval_s
        self.check = check_invariants
        self.session = None

    def reset(self) -> dict:
        """Build a fresh simulation at t = 0 and return its first observation."""
        from .runner import Session
        self.session = Session(self.scn, self.check)
        self.window = Window(self.session.fleet)
        self.actions: list = []
        return self._observation()

    def _observation(self) -> dict:
        obs = Window(self.session.fleet).observe()
        for k in ("interval_s", "arrivals", "completed", "rejected", "throughput_rps", "ttft_p50_ms",
                  "ttft_p95_ms", "tpot_mean_ms", "queue_velocity"):
            obs.pop(k)
        for p in obs["pools"].values():
            for k in INTERVAL_POOL_KEYS:
                p.pop(k)                 # interval quantities: reported in the step metrics
        return obs

    def _session(self, what: str):
        if self.session is None:
            raise RuntimeError(f"ClusterEnv.{what}: call reset() first (it builds the simulation)")
        return self.session

    @property
    def now(self) -> float:
        return self._session("now").sim.now

    @property
    def done(self) -> bool:
        """Every request has arrived and finished (or the scenario's horizon is reached)."""
        s = self._session("done")
        h = self.scn.horizon_s
        if h is not None and not self.scn.drain and s.sim.now >= h:
            return True
        return s.fleet.done

    def step(self, actions=()) -> tuple[dict, dict]:
        self._session("step")
        if self.done:
            raise RuntimeError("the simulation is over; call reset() to start again")
        fleet = self.session.fleet
        for a in actions or ():
            rec = apply_action(fleet, a)
            rec["time_s"] = self.now
            self.actions.append(rec)
        until = self.now + self.interval_s
        h = self.scn.horizon_s
        if h is not None and not self.scn.drain:
            until = min(until, h)
        self.session.advance(until)
        metrics = self.window.observe()
        pools = metrics["pools"]
        return self._observation(), {k: v for k, v in metrics.items() if k != "pools"} | {
            "busy_fraction": {p: v["busy_fraction"] for p, v in pools.items()},
            "gpu_utilization": {p: v["gpu_utilization"] for p, v in pools.items()},
            "queue_velocity_by_pool": {p: v["queue_velocity"] for p, v in pools.items()}}

    def result(self, out_dir=None):
        """Run to the end (if not done) and return the usual Result (and report with out_dir)."""
        from .runner import finish
        s = self._session("result")
        s.end = s.run_to_end()
        s.action_log = s.action_log + self.actions
        return finish(s, out_dir)
