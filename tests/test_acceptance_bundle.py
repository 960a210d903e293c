"""Trained acceptance bundles: `dsim acceptance train / evaluate`, run-time lookups, errors."""
import json

import numpy as np
import pytest
from helpers import scenario

import dsim
from dsim.cli import main
from dsim.specdec.acceptance import sample_accepted, tokens_per_step
from dsim.specdec.bundle import load_bundle, read_logs


# under pytest-xdist (`-n auto --dist loadgroup`) this module's tests share one
# worker, so its module-scoped fixture (trained bundle) runs once, not once per worker
pytestmark = pytest.mark.xdist_group("test_acceptance_bundle")


def rate(ctx):
    return 0.9 if ctx < 1000 else 0.5      # acceptance falls with context: the classifier must learn it


def write_logs(path, n, seed):
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for _ in range(n):
            k = int(rng.integers(1, 7))
            ctx = int(rng.integers(50, 4000))
            a = sample_accepted(rng, [rate(ctx)] * k)
            f.write(json.dumps({"context_len": ctx, "k": k, "accepted": a, "drafter": "d1", "verifier": "v1"}) + "\n")


@pytest.fixture(scope="module")
def bundle_path(tmp_path_factory):
    d = tmp_path_factory.mktemp("bundle")
    write_logs(d / "train.jsonl", 4000, 1)
    write_logs(d / "test.jsonl", 2000, 2)
    out = d / "b.joblib"
    assert main(["acceptance", "train", str(d / "train.jsonl"), "--out", str(out), "--meta", "note=test"]) == 0
    return out


def test_bundle_learns_the_conditional_rates(bundle_path):
    acc = load_bundle(bundle_path).acceptance("d1", "v1")
    assert np.allclose(acc.probabilities(400, 4), 0.9, atol=0.05)
    assert np.allclose(acc.probabilities(3000, 4), 0.5, atol=0.06)
    # memoised per 32-token context bin
    assert acc.probabilities(400, 4) is acc.probabilities(410, 4)


def test_evaluate_reports_calibrated_metrics(bundle_path, capsys):
    test = bundle_path.parent / "test.jsonl"
    out = bundle_path.parent / "m.json"
    assert main(["acceptance", "evaluate", str(bundle_path), str(test), "--json", str(out)]) == 0
    m = json.loads(out.read_text())
    assert m["iterations"] == 2000
    assert m["ece"] < 0.03 and m["brier"] < 0.22
    assert m["tokens_per_step_predicted"] == pytest.approx(m["tokens_per_step_actual"], rel=0.03)
    assert abs(m["accepted_count_bias"]) < 0.1
    # the classifier's precision / recall / F1 (positive = accepted, threshold 0.5) agree with its confusion counts
    c = m["confusion"]
    assert m["precision"] == pytest.approx(c["tp"] / (c["tp"] + c["fp"]))
    assert m["recall"] == pytest.approx(c["tp"] / (c["tp"] + c["fn"]))
    assert sum(c.values()) == m["positions"] and m["classifier_threshold"] == 0.5
    assert '"f1"' in capsys.readouterr().out


def test_bundle_drives_a_simulation(bundle_path):
    s = scenario(latency={"model": "roofline"},
                 workload={"type": "poisson", "rate": 4, "num_requests": 20, "prompt_tokens": 300, "output_tokens": 200},
                 speculation={"mode": "fused", "gamma": {"k": 4},
                              "acceptance": {"bundle": str(bundle_path), "drafter": "d1", "verifier": "v1"}})
    res = dsim.run(s)
    sp = res.summary["speculation"]
    assert sp["acceptance"]["model"] == "bundle"
    # contexts stay below 1000: tau of rate 0.9 at k = 4 (the last, capped rounds pull it down a little)
    assert sp["tokens_per_verify_step"] == pytest.approx(tokens_per_step([0.9] * 4), rel=0.05)


def test_bad_logs_exit_2_with_file_and_line(tmp_path, capsys):
    p = tmp_path / "bad.jsonl"
    p.write_text(json.dumps({"context_len": 10, "k": 2, "accepted": 1}) + "\n" +
                 json.dumps({"context_len": 10, "k": 2, "accepted": 5}) + "\n")
    assert main(["acceptance", "train", str(p), "--out", str(tmp_path / "x.joblib")]) == 2
    err = capsys.readouterr().err
    assert f"{p}:2.accepted" in err and not (tmp_path / "x.joblib").exists()
    assert main(["acceptance", "evaluate", str(tmp_path / "none.joblib"), str(p)]) == 2


def test_accept_flags_form(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_text(json.dumps({"context_len": 10, "k": 4, "accept_flags": [1, 1, 0, 1]}) + "\n")
    assert read_logs(p)[0]["accepted"] == 2


class _ByPosition:
    """A stand-in model: P(accept) depends on the position only (feature 1)."""

    P = {0: 0.9, 1: 0.6, 2: 0.4, 3: 0.2}

    def predict_proba(self, X):
        p = np.asarray([self.P[int(pos)] for pos in np.asarray(X)[:, 1]])
        return np.column_stack([1 - p, p])


def test_evaluate_precision_recall_f1_by_hand():
    from dsim.specdec.bundle import Bundle, evaluate
    b = Bundle({"model": _ByPosition(), "drafters": [""], "verifiers": [""], "version": "1.0", "meta": {}})
    # verified positions (position: label) -> predicted accepted when p >= 0.5, i.e. positions 0 and 1
    iters = [{"context_len": 100.0, "k": 4, "accepted": 4, "temperature": 0.0, "drafter": "", "verifier": ""},
             # 0:1 1:1 2:1 3:1 -> TP TP FN FN
             {"context_len": 100.0, "k": 4, "accepted": 1, "temperature": 0.0, "drafter": "", "verifier": ""},
             # 0:1 1:0 -> TP FP
             {"context_len": 100.0, "k": 3, "accepted": 0, "temperature": 0.0, "drafter": "", "verifier": ""},
             # 0:0 -> FP
             {"context_len": 100.0, "k": 4, "accepted": 2, "temperature": 0.0, "drafter": "", "verifier": ""}]
             # 0:1 1:1 2:0 -> TP TP TN
    m = evaluate(b, iters)
    assert m["positions"] == 10 and m["classifier_threshold"] == 0.5
    assert m["confusion"] == {"tp": 5, "fp": 2, "fn": 2, "tn": 1}
    assert m["precision"] == pytest.approx(5 / 7)                # TP / (TP + FP)
    assert m["recall"] == pytest.approx(5 / 7)                   # TP / (TP + FN)
    assert m["f1"] == pytest.approx(5 / 7)                       # 2PR / (P + R), P = R
    assert m["accuracy"] == pytest.approx(6 / 10)


def test_precision_recall_f1_edge_cases():
    from dsim.specdec.bundle import classification
    m = classification([0.9, 0.8, 0.1], [1, 0, 0])
    assert (m["precision"], m["recall"], m["f1"]) == (0.5, 1.0, pytest.approx(2 / 3))
    none_predicted = classification([0.1, 0.2], [1, 0])        # nothing predicted accepted: precision undefined
    assert none_predicted["precision"] is None and none_predicted["recall"] == 0.0 and none_predicted["f1"] is None
    wrong = classification([0.9, 0.1], [0, 1])                  # precision = recall = 0: F1 = 0
    assert (wrong["precision"], wrong["recall"], wrong["f1"]) == (0.0, 0.0, 0.0)
    assert classification([0.5], [1])["confusion"]["tp"] == 1  # the threshold is inclusive
