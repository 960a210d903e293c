"""Build dsim/data/acceptance/published_curves.yaml from ../shared/data/acceptance/published_acceptance.csv and
check that sampled verify steps reproduce each curve's tokens per verify step.

    python experiments/build_acceptance_curves.py      # a few seconds
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from dsim.specdec.acceptance import (SPEC_VERSION, curves_from_published, load_curves,  # noqa: E402
                                     sample_accepted)

CSV = ROOT.parent / "shared" / "data" / "acceptance" / "published_acceptance.csv"
OUT = ROOT / "dsim" / "data" / "acceptance" / "published_curves.yaml"


def main():
    curves = curves_from_published(CSV)
    head = ("# Acceptance curves built from ../shared/data/acceptance/published_acceptance.csv by\n"
            "# experiments/build_acceptance_curves.py (schema: acceptance/README.md).  Sources per curve.\n")
    OUT.write_text(head + yaml.safe_dump({"acceptance_curves": {"spec_version": SPEC_VERSION, "curves": curves}},
                                         sort_keys=False, width=120))
    loaded = load_curves(OUT)
    rng = np.random.default_rng(0)
    print("| curve | k | target tokens/step | sampled (100k steps) | error | published |")
    print("|---|---|---|---|---|---|")
    for c in curves:
        m = loaded[c["name"]]
        probs = m.probabilities(0, c["k"], c["temperature"])
        n = 100_000
        acc = np.fromiter((sample_accepted(rng, probs) for _ in range(n)), int, n)
        sim = 1 + acc.mean()
        tgt = c["tokens_per_verify_step"]
        pub = c.get("published_tokens_per_verify_step", tgt)
        print(f"| {c['name']} | {c['k']} | {tgt:.3f} | {sim:.3f} | {(sim - tgt) / tgt:+.2%} | {pub:g} |")


if __name__ == "__main__":
    main()
