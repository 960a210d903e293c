"""Every speed figure of the README and the speed issue in one command: simulated requests per
wall-second and peak RSS of `dsim bench` (single replica and 4 replicas) and of the network and
speculative scenarios at 10x their request count, no plots.

    python experiments/bench_all.py [--repeat 3] [--pythonpath OTHER_CHECKOUT] [--memory]
    python experiments/bench_all.py --pair OLD_CHECKOUT [--repeat 3] [--only hybrid_rtt ...] [--outside]

Each figure is the median of --repeat runs, each in its own process (`dsim bench` times from
process start, imports included).  --pythonpath runs another checkout of dsim the same way.
--pair alternates this checkout and OLD run by run (new, old, new, old, ...), so that a noisy
machine slows both alike, and reports each side's median and the median of the per-pair ratios
of `dsim bench`'s wall time (new / old; below 1 = faster).  --outside times each run from outside the
process instead (start to exit, peak RSS from the kernel's accounting of the child) and runs the
scenario cases as `dsim run SCENARIO --no-plots --quiet --set workload.num_requests=10N`, so that it
also measures checkouts older than `dsim bench --scenario` (such as 39f6e11, before the speed issue).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from dsim.bench import BENCH_SCENARIO

ROOT = Path(__file__).resolve().parents[1]
CASES = [("bench", []), ("bench --replicas 4", ["--replicas", "4"])] + [
    (name, ["--scenario", str(ROOT / "scenarios" / f"{name}.yaml")])
    for name in ("pd_network", "hybrid_rtt", "mobile_cloud_distributed", "datacenter_fused")]


def requests_x10(args) -> list:
    """--requests at 10x the scenario's own num_requests (bench cases keep their 20,000)."""
    if "--scenario" not in args:
        return []
    doc = yaml.safe_load(Path(args[args.index("--scenario") + 1]).read_text())
    n = (doc.get("workload") or {}).get("num_requests")
    return ["--requests", str(10 * n)] if n else []


def one(args, pythonpath) -> dict:
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run([sys.executable, "-m", "dsim.cli", "bench", *args, *requests_x10(args)], env=env,
                         capture_output=True, text=True, cwd="/tmp", check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def outside(args, pythonpath) -> dict:
    """One whole process timed from outside: wall from spawn to exit, that child's peak RSS."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    with tempfile.TemporaryDirectory() as tmp:
        if "--scenario" in args:
            n = int(requests_x10(args)[1])
            cmd = ["run", args[args.index("--scenario") + 1], "--no-plots", "--quiet",
                   "--set", f"workload.num_requests={n}", "--out", tmp]
        else:
            cmd, n = ["bench", *args], BENCH_SCENARIO["workload"]["num_requests"]
        err = Path(tmp) / "stderr"
        with open(err, "wb") as fe:        # a file, not a pipe: a chatty child cannot block on it
            t0 = time.perf_counter()
            p = subprocess.Popen([sys.executable, "-m", "dsim.cli", *cmd], env=env, cwd="/tmp",
                                 stdout=subprocess.DEVNULL, stderr=fe)
            _, status, ru = os.wait4(p.pid, 0)
            wall = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        if p.returncode:
            raise RuntimeError(f"{cmd}: exit {p.returncode}: {err.read_text()[-2000:]}")
    return {"requests": n, "wall_s": wall, "sim_req_per_wall_s": n / wall, "peak_rss_mb": ru.ru_maxrss / 1024}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--pythonpath", default=None)
    ap.add_argument("--memory", action="store_true",
                    help="also the bench workload at 10^5 and 10^6 requests, once each (peak RSS; ~5 min)")
    ap.add_argument("--pair", default=None, metavar="OLD_CHECKOUT",
                    help="alternate this checkout with OLD run by run and report new/old wall ratios")
    ap.add_argument("--only", nargs="+", default=None, choices=[n for n, _ in CASES], metavar="CASE",
                    help=f"cases to run (default: all): {', '.join(n for n, _ in CASES)}")
    ap.add_argument("--outside", action="store_true",
                    help="time whole processes from outside (dsim run for scenarios): works on old checkouts")
    a = ap.parse_args(argv)
    for flag, d in (("--pair", a.pair), ("--pythonpath", a.pythonpath)):
        if d is not None and not (Path(d) / "dsim" / "cli.py").is_file():
            ap.error(f"{flag} {d}: not a dsim checkout (no dsim/cli.py)")
    measure = outside if a.outside else one
    cases = [(n, args) for n, args in CASES if a.only is None or n in a.only]
    if a.pair:
        return paired(cases, a.pair, a.repeat, measure)
    print("| case | requests | sim req/s (median) | runs | peak RSS MB |")
    print("|---|---|---|---|---|")
    for name, args in cases:
        runs = [measure(args, a.pythonpath) for _ in range(a.repeat)]
        rates = [r["sim_req_per_wall_s"] for r in runs]
        print(f"| {name} | {runs[0]['requests']} | {statistics.median(rates):,.0f} | "
              f"{' / '.join(f'{x:,.0f}' for x in rates)} | {max(r['peak_rss_mb'] for r in runs):.0f} |", flush=True)
    if a.memory:
        for n in (100_000, 1_000_000):
            r = one(["--requests", str(n)], a.pythonpath)
            print(f"| bench | {n} | {r['sim_req_per_wall_s']:,.0f} | 1 | {r['peak_rss_mb']:.0f} |", flush=True)


def paired(cases, old: str, repeat: int, measure=one) -> None:
    here = str(ROOT)
    print("| case | requests | sim req/s old (median) | new (median) | new/old wall (median of pairs) | pairs "
          "| peak RSS MB old / new |")
    print("|---|---|---|---|---|---|---|")
    for name, args in cases:
        pairs = [(measure(args, here), measure(args, old)) for _ in range(repeat)]
        new_r = statistics.median(n["sim_req_per_wall_s"] for n, _ in pairs)
        old_r = statistics.median(o["sim_req_per_wall_s"] for _, o in pairs)
        ratio = statistics.median(n["wall_s"] / o["wall_s"] for n, o in pairs)
        rss = (max(o["peak_rss_mb"] for _, o in pairs), max(n["peak_rss_mb"] for n, _ in pairs))
        print(f"| {name} | {pairs[0][0]['requests']} | {old_r:,.0f} | {new_r:,.0f} | {ratio:.2f} | {repeat} "
              f"| {rss[0]:.0f} / {rss[1]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
