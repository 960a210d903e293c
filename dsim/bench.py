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


def bench(num_requests: int | None = None, t_start: float | None = None, replicas: int = 1,
          router: str = "jsq") -> dict:
    """Run the fixed benchmark; wall time counts from process start where the OS tells it.

    ``replicas > 1``: the same workload at 20 req/s per replica, behind ``router``."""
    from .runner import run
    scn = json.loads(json.dumps(BENCH_SCENARIO))
    if num_requests:
        scn["workload"]["num_requests"] = num_requests
    if replicas > 1:
        scn["cluster"] = {"router": router, "pools": [{"name": "h100", "replicas": replicas}]}
        scn["workload"]["rate"] = 20 * replicas
    age0 = _process_age_s()
    t0 = time.perf_counter()
    if age0 is not None:
        t0 -= age0
    elif t_start is not None:
        t0 = t_start
    res = run(scn)
    wall = time.perf_counter() - t0
    n = res.summary["requests"]["completed"]
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {
        "scenario": "bench", "replicas": replicas, "router": router if replicas > 1 else None, "requests": n, "wall_s": round(wall, 3),
        "sim_req_per_wall_s": round(n / wall, 1),
        "sim_steps": res.instance.num_steps,
        "peak_rss_mb": round(rss_kb / 1024, 1),
        "simulated_s": round(res.summary["throughput"]["duration_s"], 3),
    }
