"""Trained acceptance bundles: a classifier of per-position acceptance learned from profiling logs.

Profiling log (JSONL, one verify iteration per line; seed 002 section 5.4):
    {"context_len": 812, "k": 4, "accepted": 2, "temperature": 0.0,
     "drafter": "meta-llama/Llama-3.2-1B", "verifier": "meta-llama/Llama-3.1-8B", "dataset": "gsm8k"}
``accepted`` is the number of drafts accepted left to right (or ``accept_flags``: [1, 1, 0, ...]).
Each iteration gives one training row per position the verifier looked at (positions 0..accepted,
the last one rejected unless all k passed), so the classifier learns the *conditional* acceptance
a_i = P(position i accepted | positions before it accepted) that dsim's acceptance models answer.

Features: context_len, position, k, temperature, drafter id, verifier id (ids are the bundle's own
integer codes).  Model: gradient boosting (default) or a random forest with capped depth, n_jobs=1.
The bundle is a joblib file {model, features, drafters, verifiers, meta}.  At run time
``probabilities(context_len, k, temperature)`` predicts all k positions in one batched call and is
memoised on (context bin of 32 tokens, k, temperature).
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path

import numpy as np

from ..config.errors import ConfigError

FEATURES = ("context_len", "position", "k", "temperature", "drafter", "verifier")
BUNDLE_VERSION = "1.0"
CTX_BIN = 32


def read_logs(path) -> list:
    """Iterations from a profiling JSONL, validated (errors name file and line)."""
    from ..config.files import read_text
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(path), None, "an existing profiling log (JSONL)", show_value=False)
    rows = []
    for i, line in enumerate(read_text(p, str(path)).split("\n"), 1):   # bounded; bad bytes name the file
        if not line.strip():
            continue
        where = f"{path}:{i}"
        try:
            d = json.loads(line)
        except json.JSONDecodeError as e:
            raise ConfigError(where, None, f"a JSON object per line ({e.msg})", show_value=False) from None
        if not isinstance(d, dict):
            raise ConfigError(where, d, "a JSON object")
        k = d.get("k", d.get("spec_tokens"))
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ConfigError(f"{where}.k", k, "an integer >= 1 (drafted tokens)")
        if "accept_flags" in d:
            fl = d["accept_flags"]
            if not isinstance(fl, list) or len(fl) > k or any(x not in (0, 1, True, False) for x in fl):
                raise ConfigError(f"{where}.accept_flags", fl, f"a list of at most k={k} 0/1 flags")
            a = 0
            for x in fl:
                if not x:
                    break
                a += 1
        else:
            a = d.get("accepted")
            if isinstance(a, bool) or not isinstance(a, int) or not 0 <= a <= k:
                raise ConfigError(f"{where}.accepted", a, f"an integer in 0..k ({k})")
        ctx = d.get("context_len")
        if isinstance(ctx, bool) or not isinstance(ctx, (int, float)) or ctx < 0:
            raise ConfigError(f"{where}.context_len", ctx, "a length >= 0")
        t = d.get("temperature", 0.0)
        if isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0:
            raise ConfigError(f"{where}.temperature", t, "a number >= 0")
        rows.append({"context_len": float(ctx), "k": k, "accepted": a, "temperature": float(t),
                     "drafter": str(d.get("drafter", "")), "verifier": str(d.get("verifier", ""))})
    if not rows:
        raise ConfigError(str(path), None, "at least one iteration", show_value=False)
    return rows


def _codes(values) -> list:
    return sorted(set(values))


def position_rows(iters, drafters, verifiers):
    """(X, y) with one row per verified position (see the module docstring)."""
    dix = {d: i for i, d in enumerate(drafters)}
    vix = {v: i for i, v in enumerate(verifiers)}
    X, y = [], []
    for it in iters:
        k, a = it["k"], it["accepted"]
        d, v = dix.get(it["drafter"], -1), vix.get(it["verifier"], -1)
        for pos in range(min(a + 1, k)):
            X.append((it["context_len"], pos, k, it["temperature"], d, v))
            y.append(1 if pos < a else 0)
    return np.asarray(X, float), np.asarray(y, int)


def train(iters, model: str = "gbdt", max_depth: int = 3, seed: int = 0, meta=None) -> dict:
    from sklearn.ensemble import GradientBoostingClassifier, RandomForestClassifier
    drafters = _codes(it["drafter"] for it in iters)
    verifiers = _codes(it["verifier"] for it in iters)
    X, y = position_rows(iters, drafters, verifiers)
    if len(set(y.tolist())) < 2:
        raise ValueError("the logs hold only accepted or only rejected positions: nothing to learn")
    if model == "gbdt":
        clf = GradientBoostingClassifier(n_estimators=100, max_depth=max_depth, learning_rate=0.1,
                                         min_samples_leaf=100, subsample=0.8, random_state=seed)
    elif model == "rf":
        clf = RandomForestClassifier(n_estimators=100, max_depth=max_depth, min_samples_leaf=100, n_jobs=1,
                                     random_state=seed)
    else:
        raise ValueError(f"model must be gbdt or rf, not {model!r}")
    clf.fit(X, y)
    return {"version": BUNDLE_VERSION, "model": clf, "features": list(FEATURES), "drafters": drafters,
            "verifiers": verifiers,
            "meta": {"trained": datetime.now(timezone.utc).strftime("%Y-%m-%d"), "estimator": model,
                     "max_depth": max_depth, "iterations": len(iters), "positions": int(len(y)),
                     "train_acceptance_rate": float(y.mean()), **(meta or {})}}


def save_bundle(bundle: dict, path) -> None:
    import joblib
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(str(path) + ".tmp")
    joblib.dump(bundle, tmp)
    tmp.replace(path)


class Bundle:
    def __init__(self, data: dict, path: str = ""):
        self.d = data
        self.path = path
        self.model = data["model"]
        if hasattr(self.model, "n_jobs"):
            self.model.n_jobs = 1

    def meta_short(self) -> dict:
        m = self.d["meta"]
        return {"version": self.d["version"], "estimator": m.get("estimator"), "trained": m.get("trained")}

    def predict_positions(self, X) -> np.ndarray:
        return self.model.predict_proba(np.asarray(X, float))[:, 1]

    def acceptance(self, drafter=None, verifier=None):
        return BundleAcceptance(self, drafter, verifier)


class BundleAcceptance:
    """The bundle as a dsim acceptance model for one (drafter, verifier) pair."""

    def __init__(self, bundle: Bundle, drafter=None, verifier=None):
        ds, vs = bundle.d["drafters"], bundle.d["verifiers"]
        self.b = bundle
        self.d = ds.index(drafter) if drafter in ds else (0 if len(ds) == 1 or drafter is None else -1)
        self.v = vs.index(verifier) if verifier in vs else (0 if len(vs) == 1 or verifier is None else -1)
        self._memo = lru_cache(maxsize=8192)(self._predict)

    def _predict(self, cbin: int, k: int, t: float) -> tuple:
        ctx = cbin * CTX_BIN + CTX_BIN / 2
        X = [(ctx, pos, k, t, self.d, self.v) for pos in range(k)]
        return tuple(float(p) for p in self.b.predict_positions(X))

    def probabilities(self, context_len: int = 0, k: int = 1, temperature: float | None = None) -> tuple:
        return self._memo(int(context_len) // CTX_BIN, int(k), float(temperature or 0.0))


def load_bundle(path, where: str = "bundle") -> Bundle:
    import joblib
    p = Path(path)
    if not p.is_file():
        raise ConfigError(where, str(path), "an existing acceptance bundle (.joblib)")
    try:
        data = joblib.load(p)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file
        raise ConfigError(where, str(path), f"a joblib acceptance bundle ({type(e).__name__})") from None
    if not isinstance(data, dict) or "model" not in data or data.get("features") != list(FEATURES):
        raise ConfigError(where, str(path), f"a bundle written by `dsim acceptance train` (features {FEATURES})")
    return Bundle(data, str(path))


THRESHOLD = 0.5   # a position is predicted accepted when its probability is >= this


def _ratio(num: int, den: int):
    return num / den if den else None


def classification(p, y, threshold: float = THRESHOLD) -> dict:
    """Precision, recall and F1 of the per-position accept/reject classifier: the positive class is
    *accepted*, a position is predicted accepted when its probability is >= ``threshold``.  A ratio
    with an empty denominator (no predicted or no true acceptances) is None (JSON null); F1 is 0
    when precision and recall are both 0."""
    pred = np.asarray(p) >= threshold
    y = np.asarray(y).astype(bool)
    tp, fp = int((pred & y).sum()), int((pred & ~y).sum())
    fn, tn = int((~pred & y).sum()), int((~pred & ~y).sum())
    prec, rec = _ratio(tp, tp + fp), _ratio(tp, tp + fn)
    f1 = None if prec is None or rec is None else (2 * prec * rec / (prec + rec) if prec + rec else 0.0)
    return {"threshold": threshold, "precision": prec, "recall": rec, "f1": f1,
            "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn}}


def evaluate(bundle: Bundle, iters, bins: int = 10) -> dict:
    """Per-position accuracy, precision, recall and F1 (positive class = accepted, threshold 0.5),
    Brier score, expected calibration error, and the MAE / bias of the accepted count per iteration
    (predicted as the expected run length sum_i prod_{j<=i} a_j)."""
    X, y = position_rows(iters, bundle.d["drafters"], bundle.d["verifiers"])
    p = bundle.predict_positions(X)
    cls = classification(p, y)
    ece = 0.0
    edges = np.linspace(0, 1, bins + 1)
    for lo, hi in zip(edges[:-1], edges[1:]):
        m = (p >= lo) & ((p < hi) if hi < 1 else (p <= hi))
        if m.any():
            ece += m.mean() * abs(p[m].mean() - y[m].mean())
    # expected accepted count per iteration from the per-position predictions
    dix = {d: i for i, d in enumerate(bundle.d["drafters"])}
    vix = {v: i for i, v in enumerate(bundle.d["verifiers"])}
    Xi = []
    for it in iters:
        d, v = dix.get(it["drafter"], -1), vix.get(it["verifier"], -1)
        Xi += [(it["context_len"], pos, it["k"], it["temperature"], d, v) for pos in range(it["k"])]
    pi = bundle.predict_positions(Xi) if Xi else np.zeros(0)
    pred, j = [], 0
    for it in iters:
        run, e = 1.0, 0.0
        for a in pi[j:j + it["k"]]:
            run *= a
            e += run
        j += it["k"]
        pred.append(e)
    actual = np.asarray([it["accepted"] for it in iters], float)
    pred = np.asarray(pred)
    return {"iterations": len(iters), "positions": int(len(y)),
            "accuracy": float(((p >= THRESHOLD) == y).mean()),
            "precision": cls["precision"], "recall": cls["recall"], "f1": cls["f1"],
            "classifier_threshold": THRESHOLD, "confusion": cls["confusion"],
            "brier": float(((p - y) ** 2).mean()),
            "ece": float(ece), "true_acceptance_rate": float(y.mean()), "predicted_acceptance_rate": float(p.mean()),
            "accepted_count_mae": float(np.abs(pred - actual).mean()),
            "accepted_count_bias": float((pred - actual).mean()),
            "tokens_per_step_actual": float(actual.mean() + 1), "tokens_per_step_predicted": float(pred.mean() + 1)}
