"""Router vs offered load on a heterogeneous fleet, as one `dsim.sweep`.

Three replicas of Llama-3.1-8B on an H100, an A100-40GB and an A40 behind one router.  Each run
offers Poisson load for ``--horizon`` seconds and stops there (no drain), so throughput is what
the fleet completes in that window: beyond saturation a router that keeps sending a third of the
load to the slowest replica plateaus lower than one that follows the queues.

    python experiments/router_hetero_sweep.py            # ~1 min on 2 cores
    python experiments/router_hetero_sweep.py --out docs/router-hetero.png --table docs/router-hetero.md

The same sweep from the command line (scenario written to a file first):
    dsim sweep hetero.yaml --grid cluster.router=jsq,least_outstanding,... --grid workload.rate=10,20,... --out DIR
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[1]))    # an installed dsim wins over the checkout
import dsim  # noqa: E402

ROUTERS = ("jsq", "least_outstanding", "weighted_power_of_two", "round_robin", "random")
RATES = (10, 20, 30, 40, 50, 60, 70, 80, 100, 120)


def scenario(horizon: float, seed: int) -> dict:
    return {
        "name": "hetero", "seed": seed,
        "model": "meta-llama/Llama-3.1-8B",
        "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
        "latency": {"model": "roofline"},
        "cluster": {"router": "jsq", "pools": [
            {"name": "h100", "hardware": "H100-SXM", "replicas": 1},
            {"name": "a100", "hardware": "A100-40GB", "replicas": 1},
            {"name": "a40", "hardware": "A40", "replicas": 1},
        ]},
        "workload": {"type": "poisson", "rate": 10, "duration_s": horizon,
                     "prompt_tokens": {"dist": "normal", "mean": 800, "std": 300, "min": 16, "max": 3000},
                     "output_tokens": {"dist": "normal", "mean": 250, "std": 100, "min": 1, "max": 800}},
        "horizon_s": horizon, "drain": False,
        "output": {"plots": False},
    }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--horizon", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", default=None, help="plot (PNG)")
    ap.add_argument("--table", default=None, help="markdown table")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    grid = [f"cluster.router={','.join(ROUTERS)}", f"workload.rate={','.join(map(str, RATES))}"]
    table_rows = dsim.sweep(scenario(a.horizon, a.seed), grid, jobs=a.jobs)
    rows = [{"router": r["cluster.router"], "rate": r["workload.rate"], "completed": r["completed"],
             "throughput_rps": r["completed"] / a.horizon, "ttft_p95_ms": r.get("p95_ttft_ms"),
             "tpot_p95_ms": r.get("p95_tpot_ms")} for r in table_rows]
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    lines = ["| offered req/s | " + " | ".join(ROUTERS) + " |", "|---" * (len(ROUTERS) + 1) + "|"]
    for x in RATES:
        cells = []
        for r in ROUTERS:
            row = next(o for o in rows if o["router"] == r and o["rate"] == x)
            p95 = row["ttft_p95_ms"]
            cells.append(f"{row['throughput_rps']:.1f} ({p95 / 1e3:.2f} s)" if p95 is not None else "-")
        lines.append(f"| {x} | " + " | ".join(cells) + " |")
    table = ("Completed requests/s in a 60 s window (TTFT p95 in parentheses), H100 + A100-40GB + A40, "
             "Llama-3.1-8B, roofline.\n\n" + "\n".join(lines) + "\n")
    print(table)
    if a.table:
        Path(a.table).write_text(table)
    if a.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(1, 2, figsize=(11, 4))
        for r in ROUTERS:
            rs = [o for o in rows if o["router"] == r]
            ax[0].plot([o["rate"] for o in rs], [o["throughput_rps"] for o in rs], marker="o", label=r)
            ax[1].plot([o["rate"] for o in rs], [o["ttft_p95_ms"] / 1e3 for o in rs], marker="o", label=r)
        ax[0].set_ylabel("completed req/s (60 s window)")
        ax[1].set_ylabel("TTFT p95 (s)")
        ax[1].set_yscale("log")
        for x in ax:
            x.set_xlabel("offered load (req/s)")
            x.grid(alpha=0.3)
        ax[0].legend()
        fig.suptitle("Heterogeneous fleet (H100 + A100-40GB + A40): router vs load")
        fig.tight_layout()
        fig.savefig(a.out, dpi=90, metadata={"Software": None})
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
