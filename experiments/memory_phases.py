"""Resident memory of a bench run by phase (setup, simulation, summary), sampled every 50 ms.

    python experiments/memory_phases.py [--requests 1000000] [--trace-summary]

Peak RSS (``dsim bench``) says how much a run needs; this says where: a run whose peak is in the
summary holds its per-request arrays there, one whose peak is in the simulation holds state that
grows with the requests seen.  Linux only (reads /proc/self/status).
"""
from __future__ import annotations

import argparse
import functools
import json
import resource
import threading
import time
import tracemalloc

SUMMARY_STEPS = ("ledger_latencies", "stats", "_itl_stats", "busy_and_kv", "stability", "health_warnings")


def trace_summary_steps() -> None:
    """Wrap the summary's steps so each prints its tracemalloc peak above its starting point."""
    import dsim.metrics.summary as sm

    def traced(name, f):
        @functools.wraps(f)
        def g(*args, **kwargs):
            base = tracemalloc.get_traced_memory()[0]
            tracemalloc.reset_peak()
            out = f(*args, **kwargs)
            held, peak = tracemalloc.get_traced_memory()
            print(f"{name}: peak +{(peak - base) / 1e6:.1f} MB, kept +{(held - base) / 1e6:.1f} MB", flush=True)
            return out
        return g
    for name in SUMMARY_STEPS:
        setattr(sm, name, traced(name, getattr(sm, name)))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--trace-summary", action="store_true")
    a = ap.parse_args(argv)
    phase = ["imports"]
    peaks: dict = {}

    def sample():
        while True:
            peaks[phase[0]] = max(peaks.get(phase[0], 0.0), rss_mb())
            time.sleep(0.05)
    threading.Thread(target=sample, daemon=True).start()

    import dsim.runner as runner
    from dsim.bench import BENCH_SCENARIO
    from dsim.config.scenario import load_scenario
    scn = json.loads(json.dumps(BENCH_SCENARIO))
    scn["workload"]["num_requests"] = a.requests
    phase[0] = "setup"
    ses = runner.Session(load_scenario(scn))
    phase[0] = "simulation"
    ses.end = ses.run_to_end()
    phase[0] = "summary"
    if a.trace_summary:
        trace_summary_steps()
        tracemalloc.start()
    runner.finish(ses, None, False)
    phase[0] = "done"
    time.sleep(0.2)
    print(json.dumps({"requests": a.requests, **{k: round(v, 1) for k, v in peaks.items()},
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


if __name__ == "__main__":
    main()
