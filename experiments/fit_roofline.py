"""Fit the roofline model's efficiency factors and step overhead on the H100 inference-perf runs
(training set) and report the held-out error on the RTX 4090 / RTX PRO 6000 per-request runs.

    python experiments/fit_roofline.py        # about 3 minutes on 2 cores

Loss: mean |log(sim / real)| over the mean TTFT, TPOT* and E2E of every stage of every training
run.  A coarse grid is enough: three knobs with clear physical ranges.
"""
from __future__ import annotations

import itertools
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cosim_real as C  # noqa: E402

GRID = {
    "compute_efficiency": [0.5, 0.6, 0.7, 0.8],
    "memory_efficiency": [0.7, 0.8, 0.9],
    "step_overhead_us": [0, 500, 1000, 2000],
}


def loss(rows):
    errs = [abs(math.log(sim["mean"] / real["mean"])) for _, _, _, real, sim in rows
            if real["mean"] == real["mean"] and sim.get("count")]
    return sum(errs) / len(errs)


def main():
    best = None
    for combo in itertools.product(*GRID.values()):
        ov = [f"latency.{k}={v}" for k, v in zip(GRID, combo)]
        rows = []
        for folder in C.IPERF:
            rows += C.iperf_run(folder, {"model": "roofline"}, ov)
        lo = loss(rows)
        print(f"{lo:.4f}  {' '.join(ov)}", flush=True)
        if best is None or lo < best[0]:
            best = (lo, ov)
    print(f"\nbest training loss {best[0]:.4f} with {' '.join(best[1])}")
    held = []
    for name in C.LSS:
        held += C.lss_run(name, {"model": "roofline"}, best[1])
    print(f"held-out loss (RTX runs) {loss(held):.4f}")


if __name__ == "__main__":
    main()
