"""The comparison table of docs/planner.md: one day of load (scenarios/online_planner.yaml, or the
same with --set overrides), served by fixed pool sizes, the reactive autoscaler, the Dynamo-style
interpolating planner with each load predictor and the simulation planner with each forecast.  Prints a Markdown table; deterministic (every run is seeded).

    python experiments/online_planner_compare.py
    python experiments/online_planner_compare.py --scenario scenarios/online_planner.yaml --sizes 1 2 3 4 5

Columns: SLO attainment over all requests (share meeting TTFT and TPOT), GPU-hours actually held
(replicas alive, cold starts included), goodput per GPU-hour (requests meeting the SLO per GPU-hour),
scale events, and for the planners the ticks, the changes and the mean absolute error of the
forecast attainment against what then happened.  Wall seconds per run are printed beside it (they
depend on the machine).
"""
from __future__ import annotations

import argparse
import time

import dsim

AUTOSCALER = {"type": "autoscaler", "interval_s": 5, "scale_out_waiting": 4, "scale_in_kv": 0.15, "cooldown_s": 15}


def row(name: str, scenario: str, overrides: list) -> dict:
    t0 = time.perf_counter()
    s = dsim.run(scenario, overrides=overrides, plots=False).summary
    wall = time.perf_counter() - t0
    gp, cost = s["goodput"], s["cost"]
    p = s.get("planner") or {}
    return {"configuration": name, "attainment": gp["fraction"], "gpu_hours": cost["gpu_hours"],
            "goodput_per_gpu_hour": gp["requests_meeting_slo"] / cost["gpu_hours"],
            "scale_events": len(s.get("scale_events") or []), "ticks": p.get("ticks", ""),
            "changes": p.get("changes", ""), "forecast_error": p.get("mean_abs_attainment_error", ""),
            "wall_s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="scenarios/online_planner.yaml")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    ap.add_argument("--set", action="append", default=[], help="extra overrides for every run")
    a = ap.parse_args()
    rows = []
    for n in a.sizes:
        rows.append(row(f"fixed {n} replicas", a.scenario, a.set + ["cluster.controllers=[]",
                                                                     f"cluster.pools[0].replicas={n}"]))
    pool = dsim.load_scenario(a.scenario).fleet.pools[0].name
    auto = {**AUTOSCALER, "pool": pool}
    rows.append(row("reactive autoscaler", a.scenario, a.set + [f"cluster.controllers=[{_flow(auto)}]"]))
    for pred in ("constant", "arima"):
        rows.append(row(f"interpolating planner ({pred})", a.scenario,
                        a.set + ["cluster.controllers[0].kind=interpolate", f"cluster.controllers[0].predictor={pred}"]))
    for fc in ("recent", "trend", "oracle"):
        rows.append(row(f"simulation planner ({fc})", a.scenario,
                        a.set + [f"cluster.controllers[0].forecast={fc}"]))
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(_fmt(r[c]) for c in cols) + " |")


def _flow(d: dict) -> str:
    return "{" + ", ".join(f"{k}: {v}" for k, v in d.items()) + "}"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:,.0f}"
    return str(v)


if __name__ == "__main__":
    main()
