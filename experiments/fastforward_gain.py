"""What the quiet-stretch fast-forward (dsim/serving/fastforward.py) saves: CPU seconds of
simulate() on the bench workload with stretches on and off, at several arrival rates.

    python experiments/fastforward_gain.py [--repeat 5] [--requests 20000]

Runs alternate on/off in one process (the same code, `_can_stretch` replaced by False for off), so
a noisy machine moves both alike; each figure is a median.  Outputs are the same either way
(tests/test_fastforward.py).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from dsim.bench import BENCH_SCENARIO
from dsim.config.scenario import load_scenario
from dsim.runner import simulate
from dsim.serving.fastforward import FastForward


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--requests", type=int, default=20_000)
    a = ap.parse_args(argv)
    on = FastForward._can_stretch
    print("| rate (req/s) | steps in stretches | CPU s off | CPU s on | off / on |")
    print("|---|---|---|---|---|")
    for rate in (5, 20, 60):
        doc = json.loads(json.dumps(BENCH_SCENARIO))
        doc["workload"].update(num_requests=a.requests, rate=rate)
        scn = load_scenario(doc)
        cpu = {True: [], False: []}
        share = None
        for _ in range(a.repeat):
            for stretch in (True, False):
                FastForward._can_stretch = on if stretch else (lambda self: False)
                t = time.process_time()
                ses = simulate(scn)
                cpu[stretch].append(time.process_time() - t)
                if stretch:
                    inst = ses.fleet.replicas()[0].inst
                    share = inst.ff_steps / inst.num_steps
        FastForward._can_stretch = on
        off, fast = statistics.median(cpu[False]), statistics.median(cpu[True])
        print(f"| {rate} | {share:.0%} | {off:.2f} | {fast:.2f} | {off / fast:.2f} |", flush=True)


if __name__ == "__main__":
    main()
