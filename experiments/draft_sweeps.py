"""Seed 002 7.1 and 7.3 as `dsim sweep` runs: the single-target sanity sweep (draft boxes x router)
and the multi-cluster heterogeneous sweep (offered load x global router).

    python experiments/draft_sweeps.py [--jobs 2]    # ~6 min on 2 cores

Both go through dsim.explore.sweep, exactly as the commands in the two scenarios' headers do.  The
results go to experiments/out/draft-{single,multi}/, and the figures and the table to
docs/draft-sweeps.{md,png} and docs/draft-sweep-multicluster.png.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from dsim.explore.sweep import sweep  # noqa: E402

STUDIES = {
    "single": ("draft_sweep_single_target.yaml",
               ["speculation.drafts[0].count=5,10,20,40,80", "cluster.router=jsq,round_robin,random"], []),
    "multi": ("draft_sweep_multicluster.yaml",
              ["workload.rate=10,20,40,60,80", "cluster.router=jsq,round_robin,random"],
              ["workload.num_requests=600"]),
}
COLS = ("request_throughput", "p95_ttft_ms", "p95_tpot_ms", "goodput_fraction")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    lines = []
    for tag, (scn, grid, sets) in STUDIES.items():
        out = ROOT / "experiments" / "out" / f"draft-{tag}"
        rows = sweep(str(ROOT / "scenarios" / scn), grid, overrides=sets, jobs=args.jobs, out=out)
        shutil.copyfile(out / "plots" / "sweep.png",
                        ROOT / "docs" / ("draft-sweeps.png" if tag == "single" else "draft-sweep-multicluster.png"))
        keys = [g.split("=")[0] for g in grid]
        lines += [f"### {scn}", "", "| " + " | ".join(keys + list(COLS)) + " |",
                  "|" + "---|" * (len(keys) + len(COLS))]
        for r in rows:
            vals = [str(r[k]) for k in keys] + [f"{r[c]:.3g}" if isinstance(r.get(c), float) else str(r.get(c))
                                                for c in COLS]
            lines.append("| " + " | ".join(vals) + " |")
        lines.append("")
    (ROOT / "experiments" / "out" / "draft-sweeps-table.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
