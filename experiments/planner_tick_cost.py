"""Wall time of the online planner's ticks (issue 41: a tick on a 4-pool fleet <= 1 s), measured in
process around ``SimulationPlanner._tick`` with time.perf_counter; prints one JSON line.

    python experiments/planner_tick_cost.py SCENARIO [--set KEY=VALUE ...]

The figure depends on the machine (2 cores here) and on candidates x horizon x load: each tick
simulates ``horizon_s`` once per candidate, ``jobs`` at a time.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import dsim
from dsim.cluster import planner


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario")
    ap.add_argument("--set", action="append", default=[])
    a = ap.parse_args()
    walls, sizes = [], []
    tick = planner.SimulationPlanner._tick

    def timed(self, now, trigger, log):
        t0 = time.perf_counter()
        tick(self, now, trigger, log)
        walls.append(time.perf_counter() - t0)
        sizes.append(len(self.ticks[-1]["candidates"]))
    planner.SimulationPlanner._tick = timed
    t0 = time.perf_counter()
    s = dsim.run(a.scenario, overrides=a.set, plots=False).summary
    total = time.perf_counter() - t0
    print(json.dumps({"ticks": len(walls), "candidates_per_tick": statistics.median(sizes) if sizes else 0,
                      "tick_wall_s_median": statistics.median(walls) if walls else None,
                      "tick_wall_s_max": max(walls) if walls else None, "run_wall_s": total,
                      "requests": s["requests"]["submitted"], "attainment": s["goodput"]["fraction"]}))


if __name__ == "__main__":
    main()
