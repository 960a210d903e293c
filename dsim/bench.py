"""``dsim bench``: simulated requests per wall-second on a fixed single-replica workload."""
from __future__ import annotations

import json
import resource
import time

BENCH_SCENARIO = {
    "name": "bench",
    "seed": 1,
    "model": "meta-llama/Llama-3.1-8B",
    "hardware": "H100-SXM",
    "engine": {"tensor_parallel_size": 1, "max_num_seqs": 256, "max_num_batched_tokens": 2048},
    "latency": {"model": "roofline"},
    "workload": {
        "type": "poisson", "rate": 20, "num_requests": 20000,
        "prompt_tokens": {"dist": "normal", "mean": 256, "std": 100, "min": 2, "max": 800},
        "output_tokens": {"dist": "normal", "mean": 256, "std": 100, "min": 1, "max": 1024},
    },
    "output": {"plots": False},
}


def _process_age_s() -> float | None:
    """Seconds since this process started (Linux /proc), so start-up and imports count too."""
    try:
        import os
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _events(env) -> int | None:
    """SimPy events scheduled so far (its event-id counter), or None if SimPy hides it."""
    try:
        return int(repr(env._eid)[len("count("):-1])
    except (AttributeError, ValueError):
        return None


def bench(num_requests: int | None = None, t_start: float | None = None, replicas: int = 1,
          router: str = "jsq", rate: float | None = None, scenario=None, overrides=()) -> dict:
    """Run the fixed benchmark (or ``scenario`` with ``overrides``); wall time counts from process
    start where the OS tells it, so start-up and imports count too.

    ``replicas > 1``: the same workload at 20 req/s per replica (or ``rate``), behind ``router``."""
    from .config.scenario import load_scenario
    from .core.spill import SpillFile
    from .runner import run
    if scenario is None:
        scn = json.loads(json.dumps(BENCH_SCENARIO))
        if num_requests is not None:
            scn["workload"]["num_requests"] = num_requests
        if replicas > 1:
            scn["cluster"] = {"router": router, "pools": [{"name": "h100", "replicas": replicas}]}
            scn["workload"]["rate"] = 20 * replicas
        if rate is not None:
            scn["workload"]["rate"] = rate
        name = "bench"
    else:
        ovs = list(overrides) + ["output.plots=false"]
        if num_requests is not None:
            ovs.append(f"workload.num_requests={num_requests}")
        if rate is not None:
            ovs.append(f"workload.rate={rate}")
        scn = load_scenario(scenario, ovs)
        name = scn.name
    age0 = _process_age_s()
    t0 = time.perf_counter()
    if age0 is not None:
        t0 -= age0
    elif t_start is not None:
        t0 = t_start
    t_sim = time.perf_counter()
    spilled0 = SpillFile.written
    res = run(scn, plots=False)
    t_sim = time.perf_counter() - t_sim
    wall = time.perf_counter() - t0
    n = res.summary["requests"]["completed"]
    steps = sum(r.inst.num_steps for r in res.fleet.replicas())
    events = _events(res.fleet.sim.env)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "scenario": name, "replicas": len(res.fleet.replicas()), "router": router if replicas > 1 else None,
        "requests": n, "wall_s": round(wall, 3), "sim_req_per_wall_s": round(n / wall, 1),
        "sim_steps": steps, "steps_per_wall_s": round(steps / wall, 1),
        "fast_forwarded_steps": sum(r.inst.ff_steps for r in res.fleet.replicas()),
        "events_per_wall_s": None if events is None else round(events / t_sim, 1),
        "simulation_s": round(t_sim, 3),
        "peak_rss_mb": round(rss_kb / 1024, 1),
        "spilled_mb": round((SpillFile.written - spilled0) / 2**20, 1),
        "simulated_s": round(res.summary["throughput"]["duration_s"], 3),
    }
