"""How well dsim's tree-draft model turns a measured chain acceptance into a tree's tokens per
verify step, against public pairs of chain and tree measurements of one drafter on one dataset.

    python experiments/tree_vs_chain.py        # < 1 s; prints the table of docs/tree-drafts.md

For each pair (dsim/data/acceptance/tree_vs_chain.csv): the chain's tokens per step gives a
geometric per-position rate a (chain length k); the tree is the top-``tokens`` nodes of a
topk-ary tree of the given depth (dsim.specdec.tree).  Reported: the sibling acceptance beta that
reproduces the tree's measured figure, and the tree figure dsim predicts with the shipped default
beta (error against the measurement).
"""
from __future__ import annotations

import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from scipy.optimize import brentq  # noqa: E402

from dsim.specdec.acceptance import geometric_rate_for_tau  # noqa: E402
from dsim.specdec.config import SIBLING_ACCEPTANCE  # noqa: E402
from dsim.specdec.tree import DraftTree  # noqa: E402

DATA = ROOT / "dsim" / "data" / "acceptance" / "tree_vs_chain.csv"


def rows():
    with open(DATA, newline="") as f:
        yield from csv.DictReader(f)


def evaluate(row, beta=SIBLING_ACCEPTANCE) -> dict:
    a = geometric_rate_for_tau(float(row["chain_tokens_per_step"]), int(row["chain_k"]))
    depth, topk, tokens = int(row["tree_depth"]), int(row["tree_topk"]), int(row["tree_tokens"])

    def tau(b):
        return DraftTree((a,) * depth, topk, tokens, b).expected_tokens()
    target = float(row["tree_tokens_per_step"])
    fit = brentq(lambda b: tau(b) - target, 0.0, 1.0) if tau(0.0) <= target <= tau(1.0) else None
    pred = tau(beta)
    return {"a": a, "beta_fit": fit, "tau_beta1": tau(1.0), "pred": pred, "err": pred / target - 1, "target": target}


def main():
    print(f"| drafter / dataset / T | chain tau (k) | tree (topk, nodes, depth) | measured tree tau | "
          f"beta that fits | dsim at beta={SIBLING_ACCEPTANCE} | error |")
    print("|---|---|---|---|---|---|---|")
    for row in rows():
        e = evaluate(row)
        fit = f"{e['beta_fit']:.2f}" if e["beta_fit"] is not None else f"none (beta = 1 gives {e['tau_beta1']:.2f})"
        print(f"| {row['drafter']} / {row['dataset']} / {row['temperature']} | {row['chain_tokens_per_step']} "
              f"({row['chain_k']}) | {row['tree']} ({row['tree_topk']}, {row['tree_tokens']}, {row['tree_depth']}) | "
              f"{row['tree_tokens_per_step']} | {fit} | {e['pred']:.2f} | {e['err'] * 100:+.1f} % |")


if __name__ == "__main__":
    main()
