"""Build the example trained acceptance bundle shipped in acceptance/ and report its held-out quality.

    python experiments/build_acceptance_bundle.py      # ~30 s; writes acceptance/example_llama31_8b.joblib
                                                        # and docs/acceptance-bundle.md
    python experiments/build_acceptance_bundle.py --docs-only   # keep the shipped bundle, rewrite the page

The page also compares the bundle with the two alternatives seed 002 section 5.4 names (a regressor
of the accepted count per iteration, and per-group experts behind a dispatcher), trained on the same
logs with the same estimator settings, to show why dsim keeps one per-position classifier.

No real per-iteration profiler logs (seed 002 section 5.4) are available to this project, so the
logs here are *sampled* from published per-position curves (dsim/data/acceptance/published_curves.yaml): two
drafters for Llama-3.1-8B (EAGLE-3 at T=0 and T=1 on MT-bench, and a Llama-3.2-1B-class draft
model), k in 1..8, context lengths log-uniform in 64..4096.  The bundle therefore learns those
curves back; the point is the pipeline (`dsim acceptance train / evaluate`, run-time lookups), which
takes real profiler logs in the same JSONL format unchanged.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from dsim.specdec.acceptance import load_curves, sample_accepted  # noqa: E402

PAIRS = [("eagle-3", 0.0, "eagle-3-llama-3.1-8b-mt-bench-t0"),
         ("eagle-3", 1.0, "eagle-3-llama-3.1-8b-mt-bench-t1"),
         ("meta-llama/Llama-3.2-1B", 0.0, "draft-model-llama-3.1-8b-instruct-cnn-dm-gsm8k-humaneval-held-out")]
VERIFIER = "meta-llama/Llama-3.1-8B"


def synth_logs(path: Path, n: int, seed: int) -> None:
    curves = load_curves(ROOT / "dsim" / "data" / "acceptance" / "published_curves.yaml")
    rng = np.random.default_rng(seed)
    with path.open("w") as f:
        for _ in range(n):
            drafter, t, name = PAIRS[int(rng.integers(len(PAIRS)))]
            k = int(rng.integers(1, 9))
            ctx = int(np.exp(rng.uniform(np.log(64), np.log(4096))))
            a = sample_accepted(rng, curves[name].probabilities(ctx, k, t))
            f.write(json.dumps({"context_len": ctx, "k": k, "accepted": a, "temperature": t, "drafter": drafter,
                                "verifier": VERIFIER, "source": name}) + "\n")


def alternatives(train: Path, test: Path, bundle: Path) -> dict:
    """Held-out errors of the design's alternatives next to the bundle's (same logs, same GBDT settings):
    a regressor of the accepted count per iteration (squared loss: the mean; absolute loss: the
    median), and one classifier per (drafter, temperature) group behind a dispatcher."""
    from sklearn.ensemble import GradientBoostingClassifier, GradientBoostingRegressor

    from dsim.specdec import bundle as B
    b = B.load_bundle(bundle)
    tr, te = B.read_logs(train), B.read_logs(test)
    ds, vs = b.d["drafters"], b.d["verifiers"]

    def it_features(its):     # the per-position features without the position
        return np.asarray([(it["context_len"], it["k"], it["temperature"], ds.index(it["drafter"]),
                            vs.index(it["verifier"])) for it in its], float)

    y_tr = np.asarray([it["accepted"] for it in tr], float)
    y_te = np.asarray([it["accepted"] for it in te], float)
    out = {"bundle_count_mae": B.evaluate(b, te)["accepted_count_mae"]}
    for loss, name in (("squared_error", "mean"), ("absolute_error", "median")):
        reg = GradientBoostingRegressor(loss=loss, n_estimators=100, max_depth=3, learning_rate=0.1,
                                        min_samples_leaf=100, subsample=0.8, random_state=0)
        pred = reg.fit(it_features(tr), y_tr).predict(it_features(te))
        out[f"regressor_{name}_count_mae"] = float(np.abs(pred - y_te).mean())
        out[f"regressor_{name}_count_bias"] = float((pred - y_te).mean())
    Xtr, ytr = B.position_rows(tr, ds, vs)
    Xte, yte = B.position_rows(te, ds, vs)
    p_one = b.predict_positions(Xte)
    p_exp = np.zeros(len(yte))
    groups = []
    for g in sorted({(r[4], r[3]) for r in Xtr.tolist()}):
        mtr = (Xtr[:, 4] == g[0]) & (Xtr[:, 3] == g[1])
        mte = (Xte[:, 4] == g[0]) & (Xte[:, 3] == g[1])
        clf = GradientBoostingClassifier(n_estimators=100, max_depth=3, learning_rate=0.1, min_samples_leaf=100,
                                         subsample=0.8, random_state=0).fit(Xtr[mtr], ytr[mtr])
        p_exp[mte] = clf.predict_proba(Xte[mte])[:, 1]
        groups.append({"drafter": ds[int(g[0])], "temperature": g[1], "train_positions": int(mtr.sum()),
                       "brier_bundle": float(((p_one[mte] - yte[mte]) ** 2).mean()),
                       "brier_expert": float(((p_exp[mte] - yte[mte]) ** 2).mean())})
    out["groups"] = groups
    out["brier_bundle"] = float(((p_one - yte) ** 2).mean())
    out["brier_experts"] = float(((p_exp - yte) ** 2).mean())
    return out


def main(argv=None):
    docs_only = "--docs-only" in (sys.argv[1:] if argv is None else argv)
    out = ROOT / "acceptance" / "example_llama31_8b.joblib"
    with tempfile.TemporaryDirectory() as d:
        train, test = Path(d) / "train.jsonl", Path(d) / "test.jsonl"
        synth_logs(train, 20000, 1)
        synth_logs(test, 5000, 2)
        dsim = [sys.executable, "-m", "dsim.cli"]
        if not docs_only:
            subprocess.run(dsim + ["acceptance", "train", str(train), "--out", str(out), "--meta",
                                   "source=sampled from acceptance/published_curves.yaml (synthetic profiler logs)",
                                   "--meta", f"verifier={VERIFIER}"], check=True)
        res = json.loads(subprocess.run(dsim + ["acceptance", "evaluate", str(out), str(test)], check=True,
                                        capture_output=True, text=True).stdout)
        alt = alternatives(train, test, out)
    lines = ["# Example acceptance bundle (`acceptance/example_llama31_8b.joblib`)", "",
             "Built by `python experiments/build_acceptance_bundle.py`: gradient boosting (depth 3) on 20,000 "
             "verify iterations sampled from three published curves for Llama-3.1-8B (EAGLE-3 MT-bench at T=0 and "
             "T=1; the held-out draft-model curve); evaluated on 5,000 fresh iterations with "
             "`dsim acceptance evaluate`. The logs are synthetic stand-ins for profiler output (none is available "
             "to the project); real logs in the same JSONL format go through the same commands.", "",
             "| metric | held-out value |", "|---|---|"]
    c = res["confusion"]
    for k in ("iterations", "positions", "accuracy", "precision", "recall", "f1", "brier", "ece",
              "true_acceptance_rate", "predicted_acceptance_rate", "accepted_count_mae", "accepted_count_bias",
              "tokens_per_step_actual", "tokens_per_step_predicted"):
        v = res[k]
        lines.append(f"| {k} | {v:.4f} |" if isinstance(v, float) else f"| {k} | {v} |")
    lines += ["", "The accepted-count MAE is dominated by the randomness of a single verify step (the best possible "
              "predictor of a Bernoulli run has a large per-iteration error); the calibration (ECE) and the mean "
              "tokens per step are what a simulation consumes. Use it in a scenario with "
              "`speculation.acceptance: {bundle: ../acceptance/example_llama31_8b.joblib, drafter: eagle-3}`.", "",
              f"Precision, recall and F1 are those of the per-position accept/reject classifier: the positive class "
              f"is *accepted*, and a position counts as predicted accepted when its probability is >= "
              f"{res['classifier_threshold']} (confusion counts: {c['tp']} true positives, {c['fp']} false positives, "
              f"{c['fn']} false negatives, {c['tn']} true negatives). Every published curve this bundle learned "
              f"accepts each position with probability above 0.5, so the best classifier at that threshold predicts "
              f"*accepted* everywhere: recall is 1 and precision equals the true acceptance rate. That is the right "
              f"answer, not a fault; for a bundle fed to a simulation the Brier score and the ECE say more, because "
              f"the simulation samples from the probabilities and never thresholds them.", "",
              "## Why one per-position classifier", "",
              "Seed 002 section 5.4 (\"Aggregation & Interpreter Pipeline\") describes a random-forest ensemble that "
              "predicts accepted-token counts *and* per-position acceptance, and the component table names a "
              "mixture-of-experts GBDT with a run-time dispatcher that routes each query to its group's expert. "
              "dsim deliberately trains one classifier of per-position acceptance, with the drafter, verifier and "
              "temperature as features, and derives the accepted count from it:", "",
              "- **The simulation needs the per-position probabilities.** Each verify round samples how many of "
              "k drafts pass (left to right), Spec++ reads a_1..a_k to choose k, the drafter portfolio compares "
              "drafters by their tokens per step at k, and tree drafts walk the chain per level. An accepted-count regressor gives one expected count "
              "per (context, k): a round cannot sample from it, and it cannot tell Spec++ at which position the run "
              "is likely to break. The seed itself found the same "
              "(Appendix B.3): its simulator only used the classifier's probabilities, and the regressor's output "
              "was skipped as unused.", "",
              "- **A count regressor would only repeat the classifier.** The expected accepted count is "
              "sum_i prod_{j<=i} a_j of the classifier's own probabilities (`accepted_count_mae` above). On the "
              "same held-out iterations, a GBDT regressor trained on the same iterations (same settings) is no more "
              f"accurate: MAE {alt['regressor_mean_count_mae']:.4f} for the mean (squared loss, bias "
              f"{alt['regressor_mean_count_bias']:+.4f}) against {alt['bundle_count_mae']:.4f} for the bundle. A median "
              f"regressor (absolute loss) gets {alt['regressor_median_count_mae']:.4f}, but it is biased "
              f"({alt['regressor_median_count_bias']:+.4f} tokens a round), and throughput follows the mean. A second "
              "model of the same quantity could also disagree with the first.", "",
              "- **One ensemble does what experts behind a dispatcher do.** The trees split on the drafter, "
              "verifier and temperature codes, so each group gets its own fit where the data asks for it, while "
              "the context and position effects are learned from all groups together. One expert per "
              "(drafter, temperature) group, same settings, trained on the same rows, scores held-out Brier "
              f"{alt['brier_experts']:.4f} against the bundle's {alt['brier_bundle']:.4f}:", "",
              "| drafter | temperature | training positions | Brier, bundle | Brier, expert |", "|---|---|---|---|---|"]
    for g in alt["groups"]:
        lines.append(f"| {g['drafter']} | {g['temperature']:g} | {g['train_positions']} | {g['brier_bundle']:.4f} "
                     f"| {g['brier_expert']:.4f} |")
    lines += ["", "An expert of a group with few profiled rows would be fitted on those rows alone. A dispatcher adds nothing "
              "for speed either: dsim memoises predictions per 32-token context bin, k and temperature.", "",
              "Numbers from `python experiments/build_acceptance_bundle.py --docs-only` (the shipped bundle, the "
              "held-out logs above, and the alternatives trained on the bundle's 20,000 training iterations)."]
    (ROOT / "docs" / "acceptance-bundle.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
