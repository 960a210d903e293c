"""Fit the roofline's GPU knobs and the newest engine generation's host and API costs on the H100
inference-perf runs (vLLM 0.15.1), and report the held-out error on the RTX 4090 / RTX PRO 6000
per-request runs (vLLM 0.19.0).

    python experiments/fit_roofline.py [--evals 120] [--stage-s 150]     # ~6 minutes on 2 cores

Parameters (physical ranges enforced through a log/logit parametrisation): compute_efficiency
in (0, 0.8] (dense BF16 GEMMs reach about 80 % of the H100's datasheet peak; an unbounded fit
drifts to 0.97 and trades it against the API cost), memory_efficiency in (0, 0.92], overlap in
(0, 1) (roofline GPU time), host step_us and per_seq_us (dsim.latency.host),
and the API-side alpha a0 (fixed, before queueing) and a1 (per prompt token). Loss: mean over the
non-overloaded stages of |log(sim / real)| of TTFT p50, TPOT mean and E2E mean. The result is
what `dsim/config/data/engine_generations.yaml` (generation v1) and RooflineModel.DEFAULTS carry.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
from scipy.optimize import minimize

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dsim.calibrate.cosim import cosim_report, simulate_run  # noqa: E402
from dsim.calibrate.realrun import load_real  # noqa: E402

REAL = ROOT.parent / "shared" / "data" / "real"
NAMES = ("compute_efficiency", "memory_efficiency", "overlap", "step_us", "per_seq_us", "a0_us", "a1_us")
X0 = (0.75, 0.8, 0.9, 500.0, 0.0, 10000.0, 1.0)


def latency(p: dict) -> dict:
    return {"model": "roofline", "compute_efficiency": p["compute_efficiency"],
            "memory_efficiency": p["memory_efficiency"], "overlap": p["overlap"],
            "alpha": [p["a0_us"], p["a1_us"], 0.0],
            "host": {"step_us": p["step_us"], "per_seq_us": p["per_seq_us"]}}


def errors(runs, lat) -> list:
    """(run, stage, metric, sim/real - 1) for the non-overloaded stages."""
    out = []
    for run in runs:
        res, scn = simulate_run(run, None, (), 42, lat)
        rep = cosim_report(run, res, scn)
        for st in rep["stages"]:
            if st["overloaded"]:
                continue
            for m, q in (("ttft", "p50"), ("tpot", "mean"), ("e2e", "mean")):
                e = st["metrics"].get(m, {}).get("error", {}).get(q)
                if e is not None:
                    out.append((run.name, st["stage"], f"{m} {q}", e))
    return out


def loss(errs) -> float:
    return float(np.mean([abs(math.log1p(e)) for *_, e in errs])) if errs else math.inf


def unpack(x) -> dict:
    s = lambda v: 1 / (1 + math.exp(-v))    # noqa: E731  (0, 1)
    return {"compute_efficiency": 0.8 * s(x[0]), "memory_efficiency": 0.92 * s(x[1]), "overlap": s(x[2]),
            "step_us": math.exp(x[3]), "per_seq_us": math.exp(x[4]), "a0_us": math.exp(x[5]),
            "a1_us": math.exp(x[6])}


def pack(p) -> np.ndarray:
    lg = lambda v: math.log(v / (1 - v))    # noqa: E731
    return np.array([lg(p[0] / 0.8 * 0.999), lg(p[1] / 0.92), lg(min(p[2], 0.95)), math.log(p[3]), math.log(max(p[4], 1.0)),
                     math.log(p[5]), math.log(p[6])])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--evals", type=int, default=120)
    ap.add_argument("--stage-s", type=float, default=150.0)
    ap.add_argument("--out", default=str(ROOT / "docs" / "roofline-fit.json"))
    a = ap.parse_args()
    train = [load_real(p).shortened(a.stage_s) for p in sorted((REAL / "inference-perf-h100").iterdir())]
    train = [r for r in train if not r.overloaded]
    held = [load_real(p) for p in sorted((REAL / "llmservingsim-vllm").iterdir())]
    hist = []

    def f(x):
        lo = loss(errors(train, latency(unpack(x))))
        hist.append(lo)
        print(f"eval {len(hist)}: {lo:.4f} {json.dumps({k: round(v, 4) for k, v in unpack(x).items()})}", flush=True)
        return lo
    x0 = pack(X0)
    start = f(x0)
    opt = minimize(f, x0, method="Nelder-Mead", options={"maxfev": a.evals, "xatol": 1e-3, "fatol": 1e-4,
                                                         "initial_simplex": np.vstack([x0] + [x0 + 0.5 * np.eye(7)[i]
                                                                                              for i in range(7)])})
    best = unpack(opt.x)
    tr = errors(train, latency(best))
    ho = errors(held, latency(best))
    ho0 = errors(held, latency(unpack(x0)))
    doc = {"fitted": best, "start": dict(zip(NAMES, X0)), "train_loss": {"start": start, "fitted": loss(tr)},
           "held_out_loss": {"start": loss(ho0), "fitted": loss(ho)}, "evaluations": len(hist),
           "train_errors": tr, "held_out_errors": ho}
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("fitted", "train_loss", "held_out_loss")}, indent=1))


if __name__ == "__main__":
    main()
