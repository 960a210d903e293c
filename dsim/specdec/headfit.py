"""Train the latency head (``gamma.policy: latency_head``) on oracle labels (dsim.explore.oracle).

Seed 002 6.4.1: a tiny regressor from the nine telemetry features to gamma.  It is linear or has
one hidden layer of SiLU units, optionally wrapped in the design's residual block
(``y = x + Linear(SiLU(Linear(x)))``, then a linear output: ``--residual``), it is trained with the
Smooth L1 (Huber) loss, and it is served with smoothing.

Inputs are standardised for training, and the scaling is folded into the first layer, so the
written head reads raw features exactly as ``LatencyHead`` computes them.

Validation is by condition: whole (RTT, load) groups are held out, never single rows of a group
the head has seen.  It reports label accuracy (the head's action is the oracle's) and latency
regret: the TPOT of the action the head picks, from the oracle's per-action columns, over the
oracle's best.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

from ..config.errors import ConfigError
from .gamma import LatencyHead

FEATURES = LatencyHead.FEATURES
HUBER_DELTA = 1.0
L2 = 1e-3
FUSED_BELOW = 1.5


def _huber(r):
    a = np.abs(r)
    return np.where(a <= HUBER_DELTA, 0.5 * r * r, HUBER_DELTA * (a - 0.5 * HUBER_DELTA)), \
        np.clip(r, -HUBER_DELTA, HUBER_DELTA)


def _silu(z):
    s = 1.0 / (1.0 + np.exp(-z))
    return z * s, s * (1.0 + z * (1.0 - s))          # value, derivative


def fit(X, y, hidden: int = 0, seed: int = 0, residual: bool = False) -> dict:
    """Weights on standardised inputs: {"w", "b"} (linear), {"W", "c", "w", "b"} (SiLU MLP) or,
    ``residual``, {"W", "c", "V", "w", "b"}: ``out = w . (x + V SiLU(W x + c)) + b`` (the second
    Linear's bias would only add w . e to b, so it is b's); minimising mean Huber loss + L2 by
    L-BFGS from a seeded start (deterministic)."""
    n, d = X.shape
    rng = np.random.default_rng(seed)
    if hidden == 0:
        shapes = [(d,), ()]
    elif residual:
        shapes = [(hidden, d), (hidden,), (d, hidden), (d,), ()]
    else:
        shapes = [(hidden, d), (hidden,), (hidden,), ()]
    sizes = [int(np.prod(s)) for s in shapes]

    def unpack(theta):
        out, i = [], 0
        for s, m in zip(shapes, sizes):
            out.append(theta[i:i + m].reshape(s) if s else theta[i])
            i += m
        return out

    def loss(theta):
        if hidden == 0:
            w, b = unpack(theta)
            pred = X @ w + b
            val, g = _huber(pred - y)
            gw = X.T @ g / n + 2 * L2 * w
            return float(val.mean() + L2 * w @ w), np.concatenate([gw, [g.mean()]])
        if residual:
            return _residual_loss(X, y, *unpack(theta))
        W, c, w, b = unpack(theta)
        z = X @ W.T + c
        h, dh = _silu(z)
        pred = h @ w + b
        val, g = _huber(pred - y)
        gw = h.T @ g / n + 2 * L2 * w
        gz = (g[:, None] * w[None, :]) * dh / n
        gW = gz.T @ X + 2 * L2 * W
        gc = gz.sum(axis=0)
        reg = L2 * (np.sum(W * W) + w @ w)
        return float(val.mean() + reg), np.concatenate([gW.ravel(), gc, gw, [g.mean()]])
    theta0 = np.zeros(sum(sizes))
    if hidden and residual:              # V starts at zero: the block starts as the identity (a linear head)
        theta0[:sizes[0]] = rng.normal(0, 1 / np.sqrt(d), sizes[0])
    elif hidden:
        theta0[:sizes[0]] = rng.normal(0, 1 / np.sqrt(d), sizes[0])
        theta0[sizes[0] + sizes[1]:sizes[0] + sizes[1] + sizes[2]] = rng.normal(0, 1 / np.sqrt(hidden), sizes[2])
    theta0[-1] = float(np.median(y))
    res = minimize(loss, theta0, jac=True, method="L-BFGS-B", options={"maxiter": 2000})
    parts = unpack(res.x)
    if hidden and residual:
        return {"W": parts[0], "c": parts[1], "V": parts[2], "w": parts[3], "b": float(parts[4])}
    return {"w": parts[0], "b": float(parts[1])} if hidden == 0 else \
        {"W": parts[0], "c": parts[1], "w": parts[2], "b": float(parts[3])}


def _residual_loss(X, y, W, c, V, w, b):
    """Mean Huber loss + L2 of the residual head and its gradient (W, c, V, w, b order)."""
    n = len(y)
    z = X @ W.T + c
    h, dh = _silu(z)
    Y = X + h @ V.T                      # the residual block's output
    val, g = _huber(Y @ w + b - y)
    g = g / n
    gw = Y.T @ g + 2 * L2 * w
    gY = g[:, None] * w[None, :]
    gV = gY.T @ h + 2 * L2 * V
    gz = (gY @ V) * dh
    gW = gz.T @ X + 2 * L2 * W
    reg = L2 * (np.sum(W * W) + np.sum(V * V) + w @ w)
    return float(val.mean() + reg), np.concatenate([gW.ravel(), gz.sum(axis=0), gV.ravel(), gw, [g.sum()]])


def to_raw(model: dict, mu, sd) -> dict:
    """Fold the standardisation x' = (x - mu) / sd into the weights: the head then reads raw features.
    A residual block folds exactly too: with y = sd * y' + mu, y = x + (sd V) SiLU((W / sd) x + c - (W / sd) mu)
    and the output reads y with weights w / sd."""
    if "W" not in model:
        w = model["w"] / sd
        return {"weights": w.tolist(), "bias": float(model["b"] - w @ mu), "hidden": None}
    if "V" in model:
        W = model["W"] / sd[None, :]
        w = model["w"] / sd
        return {"weights": w.tolist(), "bias": float(model["b"] - w @ mu),
                "hidden": [W.tolist(), (model["c"] - W @ mu).tolist()],
                "residual": (model["V"] * sd[:, None]).tolist()}
    W = model["W"] / sd[None, :]
    c = model["c"] - W @ mu
    return {"weights": model["w"].tolist(), "bias": model["b"], "hidden": [W.tolist(), c.tolist()]}


def predict(head: dict, X) -> np.ndarray:
    """The head's raw output on raw features (as LatencyHead.raw computes it)."""
    if head["hidden"] is None:
        return X @ np.asarray(head["weights"]) + head["bias"]
    W, c = (np.asarray(a) for a in head["hidden"])
    z = X @ W.T + c
    h = z / (1.0 + np.exp(-z))
    if head.get("residual") is not None:
        return (X + h @ np.asarray(head["residual"]).T) @ np.asarray(head["weights"]) + head["bias"]
    return h @ np.asarray(head["weights"]) + head["bias"]


def decide(g, modes, gammas, fused_k: int, k_max: int) -> list:
    """The action LatencyHead takes for raw outputs g (snapped to the oracle's candidate gammas)."""
    out = []
    cand = np.asarray(gammas)
    for v in np.clip(g, 1.0, k_max):
        if len(modes) > 1 and v <= FUSED_BELOW:
            out.append(f"fused_{fused_k}")
            continue
        k = int(cand[np.argmin(np.abs(cand - round(float(v))))])
        out.append(f"{'distributed' if len(modes) > 1 else modes[0]}_{k}")
    return out


def load_oracle(path):
    p = Path(path)
    meta_p, csv_p = p / "oracle.json", p / "oracle.csv"
    if not meta_p.is_file() or not csv_p.is_file():
        raise ConfigError(str(path), None, "an oracle folder (oracle.csv and oracle.json, from dsim specdec oracle)",
                          show_value=False)
    try:
        meta = json.loads(meta_p.read_text())
        ok = isinstance(meta, dict) and all(isinstance(meta.get(k), list) and meta[k]
                                            for k in ("modes", "gammas", "actions"))
    except (ValueError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise ConfigError(str(meta_p), None, "the oracle's JSON with its modes, gammas and actions (as dsim "
                          "specdec oracle writes it)", show_value=False)
    try:
        with open(csv_p, newline="") as f:
            rows = list(csv.DictReader(f))
    except (UnicodeDecodeError, csv.Error):
        rows = None
    if not rows:
        raise ConfigError(str(csv_p), None, "a CSV with at least one labelled row", show_value=False)
    need = ["rtt_mult", "load_mult", "rid", *FEATURES, "label", "label_mode", "label_k", "label_target",
            "label_meets_slo"] + [f"{m}__{a}" for a in meta["actions"] for m in ("tpot_ms", "meets")]
    missing = [c for c in need if c not in rows[0]]
    if missing:
        raise ConfigError(str(csv_p), None, f"the oracle's columns (missing: {', '.join(missing[:4])})",
                          show_value=False)
    numeric = [c for c in need if c not in ("label", "label_mode")]
    for i, r in enumerate(rows):
        try:
            bad = not all(np.isfinite(float(r[c])) for c in numeric) or r["label"] not in meta["actions"]
        except (TypeError, ValueError):
            bad = True
        if bad:
            raise ConfigError(f"{csv_p}:{i + 2}", None, "finite numbers and a label among the oracle's actions",
                              show_value=False)
    return meta, rows


def evaluate(head: dict, rows, meta, fused_k: int, k_max: int) -> dict:
    X = np.array([[float(r[f]) for f in FEATURES] for r in rows])
    acts = decide(predict(head, X), meta["modes"], meta["gammas"], fused_k, k_max)
    hit = [a == r["label"] for a, r in zip(acts, rows)]
    tp = np.array([float(r[f"tpot_ms__{a}"]) for a, r in zip(acts, rows)])
    best = np.array([float(r[f"tpot_ms__{r['label']}"]) for r in rows])
    meets = np.array([int(r[f"meets__{a}"]) for a, r in zip(acts, rows)])
    static = {a: float(np.mean([float(r[f"tpot_ms__{a}"]) for r in rows]) / best.mean() - 1)
              for a in meta["actions"]}
    return {"rows": len(rows), "label_accuracy": float(np.mean(hit)), "mean_tpot_ms": float(tp.mean()),
            "oracle_mean_tpot_ms": float(best.mean()), "regret": float(tp.mean() / best.mean() - 1),
            "meets_slo": float(meets.mean()),
            "oracle_meets_slo": float(np.mean([int(r["label_meets_slo"]) for r in rows])),
            "static_regret": static, "best_static": min(static, key=lambda a: (static[a], a))}


def train_head(oracle_dir, out, *, hidden=(0, 8, 16), seed: int = 0, smoothing: float = 0.5,
               residual: bool = False) -> dict:
    """Fit a linear head and SiLU MLPs (``residual``: each hidden layer in the residual block), pick
    by held-out regret, write the head YAML; return its report."""
    import yaml
    out = Path(out)
    if not out.parent.is_dir() or out.is_dir():
        raise ConfigError(str(out), None, "a head file to write, in an existing folder", show_value=False)
    meta, rows = load_oracle(oracle_dir)
    groups = sorted({(float(r["rtt_mult"]), float(r["load_mult"])) for r in rows})
    if len(groups) >= 2:        # every third condition held out (at least one)
        held = set(groups[1::3]) or {groups[-1]}
        is_val = [(float(r["rtt_mult"]), float(r["load_mult"])) in held for r in rows]
        how = f"held-out conditions {sorted(held)}"
    else:
        is_val = [int(r["rid"]) % 4 == 0 for r in rows]
        how = "one condition: every fourth conversation held out"
    train = [r for r, v in zip(rows, is_val) if not v]
    val = [r for r, v in zip(rows, is_val) if v] or train
    X = np.array([[float(r[f]) for f in FEATURES] for r in train])
    y = np.array([float(r["label_target"]) for r in train])
    mu, sd = X.mean(axis=0), X.std(axis=0)
    sd[sd < 1e-9] = 1.0
    k_max = max(meta["gammas"])
    fused = [int(r["label_k"]) for r in train if r["label_mode"] == "fused"]
    fused_k = int(np.bincount(fused).argmax()) if fused else 1
    cands = []
    for h in hidden:
        head = to_raw(fit((X - mu) / sd, y, h, seed, residual), mu, sd)
        rep = {"hidden_units": h, "residual": bool(h and residual), "train": evaluate(head, train, meta, fused_k, k_max),
               "validation": evaluate(head, val, meta, fused_k, k_max)}
        cands.append((rep["validation"]["regret"], h, head, rep))
    _, h, head, rep = min(cands, key=lambda c: (c[0], c[1]))
    doc = {"latency_head": {"weights": head["weights"], "bias": head["bias"], "hidden": head["hidden"],
                            **({"residual": head["residual"]} if "residual" in head else {}),
                            "k_max": k_max, "fused_below": FUSED_BELOW if len(meta["modes"]) > 1 else 0.0,
                            "fused_k": fused_k, "smoothing": smoothing},
           "features": list(FEATURES),
           "provenance": {"oracle": meta, "split": how, "train_rows": len(train), "validation_rows": len(val),
                          "loss": f"Huber (delta {HUBER_DELTA}) + L2 {L2}, L-BFGS, seed {seed}"},
           "report": {"chosen": rep, "candidates": [c[3] for c in cands]}}
    tmp = out.with_name(f".{out.name}.tmp")
    try:                                   # all or nothing: no half-written head under its name
        tmp.write_text(yaml.safe_dump(doc, sort_keys=False, default_flow_style=None))
        tmp.replace(out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ConfigError(str(out), None, f"a head file that can be written ({e.strerror})", show_value=False) \
            from None
    return doc
