"""Refit the default physics jointly on every shared real run, with leave-one-model-out.

    python experiments/fit_roofline.py [--evals 60] [--fold-evals 25] [--stage-s 100]   # ~40 min, 2 cores

What is fitted is what no measurement in the repository gives directly: the newest engine
generation's host costs per step (``step_us``), per request in the step (``per_seq_us``), per
extra tensor-parallel worker (``per_worker_us``: V1's multiprocessing executor broadcasts each
step to its workers and gathers their outputs), the API server's cost before queueing (``a0_us``,
``a1_us`` per prompt token; only runs timed by an HTTP client see it). The GEMM efficiencies are not fitted here: they come from vidur's
measured kernels (dsim/latency/efficiency.py); ``memory_efficiency`` and ``compute_efficiency``
are multipliers on those curves and stay free only with ``--free-efficiency``.

Data: the non-overloaded stages of ``../shared/data/real/`` (H100 inference-perf runs of vLLM
0.15.1, read through their resolved client config; RTX 4090 / RTX PRO 6000 per-request runs of
vLLM 0.19.0), stages cut to --stage-s seconds (steady state is reached in seconds). Loss: mean
|log(sim / real)| of TTFT p50, TPOT p50 and E2E mean. Leave-one-model-out: for each model, refit
on the other models' runs (warm start, --fold-evals evaluations) and score the held-out model.
Writes docs/roofline-fit.json; the fitted values go into
dsim/config/data/engine_generations.yaml (v1) and RooflineModel.DEFAULTS by hand, with this
file's name as their provenance.
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
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from dsim.calibrate.cosim import cosim_report, simulate_run  # noqa: E402
from dsim.calibrate.realrun import load_real  # noqa: E402

REAL = ROOT.parent / "shared" / "data" / "real"
# name -> (start, low, high): fitted in log space between the bounds (logit for fractions)
HOST = {"step_us": (600.0, 50.0, 5000.0), "per_seq_us": (5.0, 0.5, 400.0), "per_worker_us": (300.0, 5.0, 5000.0),
        "a0_us": (12000.0, 1000.0, 40000.0), "a1_us": (1.0, 0.01, 30.0)}
EFF = {"compute_efficiency": (1.0, 0.5, 1.2), "memory_efficiency": (1.0, 0.5, 1.2)}
METRICS = (("ttft", "p50"), ("tpot", "p50"), ("e2e", "mean"))


def latency(p: dict) -> dict:
    lat = {"model": "roofline", "alpha": [p["a0_us"], p["a1_us"], 0.0],
           "host": {"step_us": p["step_us"], "per_seq_us": p["per_seq_us"], "per_worker_us": p["per_worker_us"]}}
    for k in EFF:
        if k in p:
            lat[k] = p[k]
    return lat


def errors(runs, lat) -> list:
    """(run, model, GPU, stage, metric, sim/real - 1) over the non-overloaded stages."""
    out = []
    for run in runs:
        res, scn = simulate_run(run, None, (), 42, lat)
        for st in cosim_report(run, res, scn)["stages"]:
            if st["overloaded"]:
                continue
            for m, q in METRICS:
                e = st["metrics"].get(m, {}).get("error", {}).get(q)
                if e is not None:
                    out.append((run.name, run.model, run.hardware, st["stage"], f"{m} {q}", e))
    return out


def loss(errs) -> float:
    return float(np.mean([abs(math.log1p(e)) for *_, e in errs])) if errs else math.inf


class Space:
    """Bounded parameters as an unbounded vector (log for positive values, logit for fractions)."""

    def __init__(self, spec: dict):
        self.spec = spec
        self.names = list(spec)

    def _frac(self, k):
        return self.spec[k][2] < 1.0

    def unpack(self, x) -> dict:
        out = {}
        for k, v in zip(self.names, x):
            _, lo, hi = self.spec[k]
            s = 1 / (1 + math.exp(-v))
            out[k] = lo + (hi - lo) * s if self._frac(k) else math.exp(math.log(lo) + (math.log(hi) - math.log(lo)) * s)
        return out

    def pack(self, p: dict) -> np.ndarray:
        x = []
        for k in self.names:
            _, lo, hi = self.spec[k]
            v = min(max(p[k], lo * 1.0001), hi * 0.9999)
            s = (v - lo) / (hi - lo) if self._frac(k) else (math.log(v) - math.log(lo)) / (math.log(hi) - math.log(lo))
            x.append(math.log(s / (1 - s)))
        return np.array(x)


def fit(space: Space, runs, start: dict, evals: int, tag: str) -> tuple[dict, float]:
    hist = []

    def f(x):
        lo = loss(errors(runs, latency(space.unpack(x))))
        hist.append(lo)
        print(f"[{tag}] eval {len(hist)}: {lo:.4f} "
              f"{json.dumps({k: round(v, 4) for k, v in space.unpack(x).items()})}", flush=True)
        return lo
    x0 = space.pack(start)
    n = len(x0)
    simplex = np.vstack([x0] + [x0 + 0.6 * np.eye(n)[i] for i in range(n)])
    opt = minimize(f, x0, method="Nelder-Mead",
                   options={"maxfev": evals, "xatol": 1e-3, "fatol": 1e-4, "initial_simplex": simplex})
    return space.unpack(opt.x), float(opt.fun)


def mape_by(errs, key_index: int) -> dict:
    out: dict = {}
    for e in errs:
        out.setdefault(e[key_index], {}).setdefault(e[4], []).append(abs(e[5]))
    return {k: {m: round(100 * float(np.mean(v)), 1) for m, v in d.items()} for k, d in out.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--evals", type=int, default=60)
    ap.add_argument("--fold-evals", type=int, default=25)
    ap.add_argument("--stage-s", type=float, default=100.0)
    ap.add_argument("--free-efficiency", action="store_true")
    ap.add_argument("--no-folds", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "docs" / "roofline-fit.json"))
    a = ap.parse_args()
    spec = dict(HOST, **(EFF if a.free_efficiency else {}))
    space = Space(spec)
    paths = sorted((REAL / "inference-perf-h100").iterdir()) + sorted((REAL / "llmservingsim-vllm").iterdir())
    runs = [r for r in (load_real(p).shortened(a.stage_s) for p in paths) if not r.overloaded]
    start = {k: v[0] for k, v in spec.items()}
    best, best_loss = fit(space, runs, start, a.evals, "all")
    ins = errors(runs, latency(best))
    doc = {"fitted": best, "start": start, "bounds": {k: v[1:] for k, v in spec.items()},
           "loss": {"start": loss(errors(runs, latency(start))), "fitted": loss(ins)},
           "runs": [r.name for r in runs], "stage_s": a.stage_s,
           "in_sample_mape_by_gpu": mape_by(ins, 2), "in_sample_mape_by_model": mape_by(ins, 1),
           "in_sample_errors": ins}
    if not a.no_folds:
        folds = {}
        held_all = []
        for model in sorted({r.model for r in runs}):
            train = [r for r in runs if r.model != model]
            test = [r for r in runs if r.model == model]
            p, _ = fit(space, train, best, a.fold_evals, f"without {model}")
            held = errors(test, latency(p))
            held_all += held
            folds[model] = {"fitted": p, "held_out_mape": mape_by(held, 1).get(model, {}),
                            "in_sample_mape": mape_by([e for e in ins if e[1] == model], 1).get(model, {})}
        doc["leave_one_model_out"] = folds
        doc["held_out_mape_by_gpu"] = mape_by(held_all, 2)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps({k: doc[k] for k in ("fitted", "loss", "in_sample_mape_by_gpu")}, indent=1))
    if "held_out_mape_by_gpu" in doc:
        print(json.dumps(doc["held_out_mape_by_gpu"], indent=1))


if __name__ == "__main__":
    main()
