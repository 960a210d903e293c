"""A Gymnasium environment over ``dsim.ClusterEnv``: autoscaling as a reinforcement-learning task.

Install with ``pip install "dsim[gym]"``.  One step is ``interval_s`` of simulated time.

- **Action**: ``MultiDiscrete([3] * pools)``: per pool 0 = hold, 1 = add a replica, 2 = remove one
  (the pool's ``min_replicas``/``max_replicas`` bound what actually changes).
- **Observation**: float32 vector, per pool ``[ready, starting, waiting, running, kv_usage]``, then
  ``[in_flight, throughput_rps, ttft_p95_ms]`` of the last interval (0 when nothing finished).
- **Reward** per interval: completed requests - ``gpu_cost`` x GPU-seconds provisioned -
  ``slo_penalty`` x (1 if the interval's TTFT p95 exceeds the scenario's TTFT SLO).  The defaults
  make one idle GPU-second cost a tenth of a completed request; tune them to your trade-off.
- **Termination**: every request has arrived and finished (or the horizon is reached).

The simulation is deterministic for a given scenario seed; ``reset(seed=...)`` replaces the seed.
"""
from __future__ import annotations

import numpy as np

try:
    import gymnasium as gym
    from gymnasium import spaces
except ImportError as e:          # pragma: no cover - exercised only without the extra
    raise ImportError("dsim.gym_env needs gymnasium: pip install 'dsim[gym]'") from e

from .cluster.control import ScaleIn, ScaleOut
from .cluster_env import ClusterEnv
from .config.errors import ConfigError
from .config.fields import check_number
from .config.limits import MAX_TIME_S, MIN_TIMER_S
from .config.scenario import load_scenario

POOL_FIELDS = ("ready", "starting", "waiting", "running", "kv_usage")


class DsimAutoscaleEnv(gym.Env):
    metadata = {"render_modes": []}

    def __init__(self, scenario, overrides=None, interval_s: float = 5.0, gpu_cost: float = 0.1,
                 slo_penalty: float = 10.0):
        self.source, self.overrides = scenario, list(overrides or ())
        self.scn = load_scenario(scenario, self.overrides)
        interval_s = check_number(interval_s, "interval_s", lo=MIN_TIMER_S, hi=MAX_TIME_S)
        self.interval_s, self.gpu_cost, self.slo_penalty = interval_s, gpu_cost, slo_penalty
        self.pools = [p.name for p in self.scn.fleet.pools]
        self._tp = {p.name: p.engine.tensor_parallel_size for p in self.scn.fleet.pools}
        self.action_space = spaces.MultiDiscrete([3] * len(self.pools))
        n = len(self.pools) * len(POOL_FIELDS) + 3
        self.observation_space = spaces.Box(0.0, np.inf, shape=(n,), dtype=np.float32)
        self.env = None

    def _vector(self, obs: dict, metrics: dict | None) -> np.ndarray:
        v = []
        for name in self.pools:
            p = obs["pools"][name]
            v += [p[k] for k in POOL_FIELDS]
        m = metrics or {}
        v += [obs["in_flight"], m.get("throughput_rps", 0.0), m.get("ttft_p95_ms") or 0.0]
        return np.asarray(v, dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.env = ClusterEnv(self.scn if seed is None else load_scenario(self.source, self.overrides, seed),
                              interval_s=self.interval_s)
        obs = self.env.reset()
        return self._vector(obs, None), {"time_s": obs["time_s"]}

    def _check(self, action) -> list:
        """The action as one int per pool; anything outside the action space is an error (it was
        a silent no-op: an agent emitting [3] or nan learned nothing about its bug)."""
        n = len(self.pools)
        want = f"{n} integer{'s' if n > 1 else ''} in 0..2 (0 hold, 1 add, 2 remove a replica)"
        try:
            arr = np.asarray(action, dtype=float).reshape(-1)
        except (TypeError, ValueError):
            raise ConfigError("action", action, want) from None
        if arr.size != n or not all(v in (0.0, 1.0, 2.0) for v in arr.tolist()):
            raise ConfigError("action", action, want)
        return [int(v) for v in arr.tolist()]

    def step(self, action):
        if self.env is None:
            raise RuntimeError("call reset() first")
        acts = []
        for name, a in zip(self.pools, self._check(action)):
            if a == 1:
                acts.append(ScaleOut(name))
            elif a == 2:
                acts.append(ScaleIn(name))
        obs, m = self.env.step(acts)
        gpus = sum((obs["pools"][p]["ready"] + obs["pools"][p]["starting"]) * self._tp[p] for p in self.pools)
        slo = self.scn.slo_ttft_ms
        missed = slo is not None and (m.get("ttft_p95_ms") or 0.0) > slo
        reward = m["completed"] - self.gpu_cost * gpus * m["interval_s"] - (self.slo_penalty if missed else 0.0)
        return self._vector(obs, m), float(reward), self.env.done, False, {"metrics": m, "gpus": gpus}
