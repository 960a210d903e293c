"""Train and ship the latency head (seed 002 6.4.1), then compare it with static gamma, acceptance
backoff and Spec++ across RTT and load.

    python experiments/gamma_head.py [--jobs 2]    # ~10 min on 2 cores

Steps:
1. ``dsim specdec oracle`` on scenarios/mobile_cloud_distributed.yaml (phones and laptops drafting
   for an H100), distributed mode, RTT x {0.25, 0.5, 1, 2, 4} and arrival rate x {1, 2}.  The
   result goes to experiments/out/gamma-oracle/.
2. ``dsim specdec train-head`` on it.  The chosen head is written to
   dsim/data/heads/latency_head.yaml, which is the shipped default of ``gamma.policy: latency_head``.
3. Each policy runs on every condition.  Its regret is its mean TPOT over the oracle's labelled
   conversations of that condition, against the oracle's per-conversation best.  The results go to
   docs/gamma-head.{json,md,png}.
"""
from __future__ import annotations

import argparse
import csv
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
import numpy as np  # noqa: E402

import dsim  # noqa: E402
from dsim.explore.oracle import _condition, oracle  # noqa: E402
from dsim.specdec.headfit import train_head  # noqa: E402

SCENARIO = ROOT / "scenarios" / "mobile_cloud_distributed.yaml"
RTT = (0.25, 0.5, 1.0, 2.0, 4.0)
LOAD = (1.0, 2.0)
POLICIES = {
    "static k=2": {"policy": "static", "k": 2},
    "static k=4": {"policy": "static", "k": 4},
    "acceptance_backoff": {"policy": "acceptance_backoff", "k0": 4, "k_max": 8},
    "specpp (0.5)": {"policy": "specpp", "threshold": 0.5, "k_max": 8},
    "latency_head (trained)": {"policy": "latency_head"},
}
OUT = ROOT / "experiments" / "out" / "gamma-oracle"
HEAD = ROOT / "dsim" / "data" / "heads" / "latency_head.yaml"


def run_policy(raw, rm, lm, gamma) -> dict:
    doc = _condition(raw, rm, lm)
    doc["speculation"]["mode"] = "distributed"
    doc["speculation"]["gamma"] = gamma
    res = dsim.run(doc, plots=False)
    return {r.rid: (r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1) for r in res.requests
            if r.t_completion is not None and r.n_out > 1}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    meta = oracle(str(SCENARIO), OUT, rtt_mults=RTT, load_mults=LOAD, modes=("distributed",), jobs=args.jobs)
    print("oracle:", meta["rows"], "rows", meta["labels"])
    doc = train_head(OUT, OUT / "head.yaml")
    HEAD.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(OUT / "head.yaml", HEAD)
    rep = doc["report"]["chosen"]
    print("head:", rep["hidden_units"], "hidden units; validation", json.dumps(rep["validation"]))
    with open(OUT / "oracle.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    raw = dsim.load_scenario(str(SCENARIO)).raw
    table = []
    for rm in RTT:
        for lm in LOAD:
            mine = [r for r in rows if float(r["rtt_mult"]) == rm and float(r["load_mult"]) == lm]
            best = {int(r["rid"]): float(r[f"tpot_ms__{r['label']}"]) for r in mine}
            o = float(np.mean(list(best.values())))
            line = {"rtt_mult": rm, "load_mult": lm, "rtt_ms": {"phone": 60 * rm, "laptop": 12 * rm},
                    "oracle_tpot_ms": o, "policies": {}}
            for name, gamma in POLICIES.items():
                tp = run_policy(raw, rm, lm, gamma)
                got = [tp[rid] for rid in best if rid in tp]
                m = float(np.mean(got))
                line["policies"][name] = {"mean_tpot_ms": m, "regret": m / o - 1, "n": len(got)}
            table.append(line)
            print(rm, lm, {k: round(v["regret"] * 100, 1) for k, v in line["policies"].items()})
    out = {"scenario": "mobile_cloud_distributed", "oracle": meta, "head": {"hidden_units": rep["hidden_units"],
           "validation": rep["validation"], "train": rep["train"]}, "conditions": table}
    (ROOT / "docs" / "gamma-head.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    lines = ["| RTT phone / laptop (ms) | load | oracle TPOT (ms) | " + " | ".join(POLICIES) + " |",
             "|---|---|---|" + "---|" * len(POLICIES)]
    for t in table:
        lines.append(f"| {t['rtt_ms']['phone']:g} / {t['rtt_ms']['laptop']:g} | x{t['load_mult']:g} | "
                     f"{t['oracle_tpot_ms']:.1f} | "
                     + " | ".join(f"{t['policies'][p]['regret'] * 100:+.1f} %" for p in POLICIES) + " |")
    mean = {p: float(np.mean([t["policies"][p]["regret"] for t in table])) for p in POLICIES}
    lines.append("| mean | | | " + " | ".join(f"{mean[p] * 100:+.1f} %" for p in POLICIES) + " |")
    (OUT / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(1, len(LOAD), figsize=(10, 3.6), sharey=True)
    for i, lm in enumerate(LOAD):
        ts = [t for t in table if t["load_mult"] == lm]
        for p in POLICIES:
            ax[i].plot([t["rtt_ms"]["phone"] for t in ts], [t["policies"][p]["regret"] * 100 for t in ts],
                       marker="o", label=p)
        ax[i].set_xscale("log")
        ax[i].set_xticks([60 * r for r in RTT], [f"{60 * r:g}" for r in RTT])
        ax[i].minorticks_off()
        ax[i].set_xlabel("phone RTT (ms; laptops 1/5 of it)")
        ax[i].set_title(f"arrival rate x{lm:g}")
        ax[i].axhline(0, color="k", lw=0.8)
    ax[0].set_ylabel("TPOT regret vs oracle (%)")
    ax[-1].legend(fontsize=7)
    fig.subplots_adjust(left=0.07, right=0.99, bottom=0.14, top=0.9, wspace=0.05)
    fig.savefig(ROOT / "docs" / "gamma-head.png", dpi=110)


if __name__ == "__main__":
    main()
