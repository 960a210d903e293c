"""Overload and long runs: 10x capacity for 10^5 requests on one replica and on a 4-replica
cluster, with and without admission control, drained and stopped at the end of the arrivals.

    python experiments/overload.py [--requests 100000]       # ~3 min on 2 cores

quickstart (Llama-3.1-8B on H100) serves ~123 req/s per replica (`dsim capacity`), so 1,230 req/s
per replica is 10x.  Each variant runs in its own process; printed per variant: wall seconds, peak
RSS, the request counts (completed + rejected + unfinished must equal submitted), whether the
summary says overloaded, and its warnings.
"""
from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PER_REPLICA = 1230.0
CLUSTER = {"router": "jsq", "pools": [{"name": "p", "replicas": 4}]}
VARIANTS = {
    "1 replica, drained": (None, True),
    "1 replica, stopped": (None, False),
    "4 replicas, drained": (CLUSTER, True),
    "4 replicas, stopped": (CLUSTER, False),
    "4 replicas + queue_cap 256, drained": ({**CLUSTER, "admission": {"policy": "queue_cap", "max_waiting": 256}},
                                            True),
    "4 replicas + queue_cap 256, stopped": ({**CLUSTER, "admission": {"policy": "queue_cap", "max_waiting": 256}},
                                            False),
}


def one(name: str, n: int) -> dict:
    import yaml

    sys.path.append(str(ROOT))
    import dsim
    cluster, drain = VARIANTS[name]
    doc = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    reps = 4 if cluster else 1
    rate = PER_REPLICA * reps
    doc["workload"].update(rate=rate, num_requests=n)
    doc["drain"] = drain
    if not drain:
        doc["horizon_s"] = n / rate               # stop when the arrivals end
    if cluster:
        doc["cluster"] = cluster
    t = time.perf_counter()
    res = dsim.run(doc, plots=False)
    wall = time.perf_counter() - t
    s = res.summary
    return {"variant": name, "wall_s": round(wall, 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "requests": s["requests"], "overloaded": s["stability"]["overloaded"],
            "queue_delay_trend_ms_per_s": s["stability"]["queue_delay_trend_ms_per_s"],
            "warnings": s.get("warnings", [])}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.one:
        print(json.dumps(one(a.one, a.requests)))
        return 0
    bad = 0
    for name in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--requests", str(a.requests), "--one", name],
                             capture_output=True, text=True)
        if out.returncode:
            print(f"{name}: exit {out.returncode}: {out.stderr.strip().splitlines()[-1:]}")
            bad += 1
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        q = r["requests"]
        ok = q["completed"] + q["rejected"] + q["unfinished"] == q["submitted"]
        said = r["overloaded"] or any("unfinished" in w or "rejected" in w for w in r["warnings"])
        bad += not (ok and said)
        print(f"| {name} | {r['wall_s']} | {r['peak_rss_mb']} | {q['submitted']} | {q['completed']} | "
              f"{q['rejected']} | {q['unfinished']} | {'yes' if ok else 'NO'} | "
              f"{'yes' if r['overloaded'] else 'no'} ({r['queue_delay_trend_ms_per_s']:.0f} ms/s) | "
              f"{'; '.join(w.split(':')[0] for w in r['warnings'])} |", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
