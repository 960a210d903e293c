"""How long `dsim plan` takes on the 70B / Azure prefill-decode question (issue 38's speed targets:
>= 2,000 candidates planned in <= 10 min with --jobs 2; the screen alone over >= 10,000 in <= 30 s).

    python experiments/plan_speed.py screen [--gpus 32 48] [--repeat 3]
    python experiments/plan_speed.py plan [--pair OLD_CHECKOUT] [--repeat 1] [--jobs 2]

``screen`` times stage 1 alone (explore.plan_pd.screen_space: every candidate of
scenarios/spaces/pd_70b.yaml within each GPU budget, judged from the latency model) in this process,
the workload's requests built once per repeat as a plan does; it prints candidates, pruned and the
median seconds.  ``plan`` times the whole command, start to exit, as a user runs it:

    dsim plan scenarios/capacity_70b_azure.yaml --gpus 32 --space scenarios/spaces/pd_70b.yaml \\
        --slo ttft_p99_ms=500 --slo tpot_p99_ms=50 --jobs 2 --quiet

and with --pair OLD alternates this checkout and OLD run by run (new, old, new, old, ...) so that a
busy machine slows both alike, printing each side's median and the plan line of each run.  One pair
takes minutes on 2 cores: --repeat 1 is the default.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "capacity_70b_azure.yaml"
SPACE = ROOT / "scenarios" / "spaces" / "pd_70b.yaml"
SLOS = ["ttft_p99_ms=500", "tpot_p99_ms=50"]


def time_screen(gpus: int, repeat: int) -> dict:
    from dsim.explore.capacity import parse_slos
    from dsim.explore.pd_space import load_pd_space
    from dsim.explore.plan_pd import screen_space
    sp = load_pd_space(str(SPACE))
    walls, cands = [], []
    for _ in range(repeat):
        t = time.perf_counter()
        cands, *_ = screen_space(str(SCENARIO), sp, gpus, None, parse_slos(SLOS), [])
        walls.append(time.perf_counter() - t)
    return {"gpus": gpus, "candidates": len(cands), "pruned": sum(c["screen"] == "pruned" for c in cands),
            "median_s": statistics.median(walls), "runs_s": [round(x, 2) for x in walls]}


def time_plan(checkout: Path, jobs: int, out: Path) -> tuple[float, str]:
    cmd = [sys.executable, "-m", "dsim.cli", "plan", str(checkout / "scenarios" / "capacity_70b_azure.yaml"),
           "--gpus", "32", "--space", str(checkout / "scenarios" / "spaces" / "pd_70b.yaml"),
           *[a for s in SLOS for a in ("--slo", s)], "--jobs", str(jobs), "--quiet", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    t = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=checkout)
    wall = time.perf_counter() - t
    if done.returncode != 0:
        raise SystemExit(f"{checkout}: exit {done.returncode}: {done.stderr.strip()[-500:]}")
    return wall, done.stdout.splitlines()[0] if done.stdout else ""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("screen")
    s.add_argument("--gpus", type=int, nargs="+", default=[32, 48])
    s.add_argument("--repeat", type=int, default=3)
    p = sub.add_parser("plan")
    p.add_argument("--pair", type=Path, default=None, metavar="OLD_CHECKOUT")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2)
    a = ap.parse_args(argv)
    if a.what == "screen":
        for g in a.gpus:
            r = time_screen(g, a.repeat)
            print(f"screen, {g} GPUs: {r['candidates']:,} candidates, {r['pruned']:,} pruned, median "
                  f"{r['median_s']:.2f} s of {r['runs_s']}")
        return 0
    sides = [("new", ROOT)] + ([("old", a.pair.resolve())] if a.pair else [])
    walls: dict = {name: [] for name, _ in sides}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(a.repeat):
            for name, checkout in sides:
                wall, line = time_plan(checkout, a.jobs, Path(tmp) / f"{name}{i}")
                walls[name].append(wall)
                print(f"{name} run {i + 1}: {wall:.1f} s: {line}", flush=True)
    for name, ws in walls.items():
        print(f"{name}: median {statistics.median(ws):.1f} s over {len(ws)} run(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
