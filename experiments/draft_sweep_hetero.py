"""Seed 002 7.2 on `dsim sweep`: the heterogeneous single cluster (three target servers of three
speeds, four closed-loop draft cohorts) with the draft count scaled across the cohorts together,
crossed with the gateway's router.

    python experiments/draft_sweep_hetero.py [--jobs 2]    # ~10 min on 2 cores

Each draft count is one dsim.explore.sweep over the router (the four cohort counts and the request
count set by --set, as in the scenario's header).  Results go to experiments/out/draft-hetero/, the
figure to docs/draft-sweep-hetero.png and the table to experiments/out/draft-sweep-hetero-table.md
(docs/draft-sweeps.md quotes it).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from dsim.explore.sweep import sweep  # noqa: E402

SCENARIO = ROOT / "scenarios" / "draft_sweep_hetero.yaml"
PER_COHORT = (4, 16, 48, 96, 160)          # boxes per cohort; four cohorts
ROUTERS = ("jsq", "round_robin", "random")
CONVERSATIONS_PER_BOX = 3                  # each closed-loop box opens this many conversations
COLS = ("request_throughput", "p95_ttft_ms", "p95_tpot_ms", "goodput_fraction")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    rows = []
    for n in PER_COHORT:
        sets = [f"speculation.drafts[{i}].count={n}" for i in range(4)]
        sets.append(f"workload.num_requests={4 * n * CONVERSATIONS_PER_BOX}")
        out = ROOT / "experiments" / "out" / "draft-hetero" / f"boxes-{4 * n}"
        for r in sweep(str(SCENARIO), [f"cluster.router={','.join(ROUTERS)}"], overrides=sets, jobs=args.jobs,
                       out=out):
            rows.append({"boxes": 4 * n, "router": r["cluster.router"], **{c: r.get(c) for c in COLS}})
    lines = ["| draft boxes | router | completed conv/s | TTFT p95 (ms) | TPOT p95 (ms) | meets SLO |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['boxes']} | {r['router']} | {r['request_throughput']:.2f} | {r['p95_ttft_ms']:.0f} | "
                     f"{r['p95_tpot_ms']:.1f} | {r['goodput_fraction']:.2f} |")
    (ROOT / "experiments" / "out" / "draft-sweep-hetero-table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, ROOT / "docs" / "draft-sweep-hetero.png")


def plot(rows, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for ax, (col, label) in zip(axes, (("request_throughput", "completed conversations / s"),
                                       ("p95_ttft_ms", "TTFT p95 (ms)"), ("p95_tpot_ms", "TPOT p95 (ms)"))):
        for router in ROUTERS:
            pts = [(r["boxes"], r[col]) for r in rows if r["router"] == router]
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=router)
        ax.set_xlabel("draft boxes (four cohorts)")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle("Seed 002 7.2: heterogeneous single cluster (H100 70B, A100 70B, A40 34B; 4090/A10/L4/CPU drafts)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
