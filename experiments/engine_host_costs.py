"""Host (CPU) cost per decode step of the V0 vLLM-derived engine, from vidur's measured overheads:
the numbers behind the v0 generations in dsim/config/data/engine_generations.yaml.

    python experiments/engine_host_costs.py      # < 1 s; needs ../shared/data/profiling/vidur/cpu_overheads

host(batch, TP) = scheduling + sampler + input preparation + output processing + worker barrier
+ Ray round trip (ms), least squares on [1, batch, TP - 1]; and the same without output processing
(vLLM 0.6+ overlaps it with the next step).
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiling" / "vidur" / "cpu_overheads"
PARTS = ("SCHEDULE_MEAN", "SAMPLER_E2E_MEAN", "PREPARE_INPUTS_E2E_MEAN", "PROCESS_MODEL_OUTPUTS_MEAN",
         "RAY_COMM_TIME_MEDIAN", "POST_PREPARE_INPUTS_BARRIER_MEAN")


def fit(rows, parts):
    X = np.array([[1.0, float(r["batch_size"]), int(r["tensor_parallel_degree"]) - 1] for r in rows])
    y = np.array([sum(float(r[c]) for c in parts if r.get(c)) for r in rows])
    c = np.linalg.lstsq(X, y, rcond=None)[0]
    return c, float(np.mean(np.abs(X @ c - y) / y))


def main():
    for gpu in ("a100", "a40"):
        with (DATA / gpu / "cpu_overheads.csv").open() as f:
            rows = list(csv.DictReader(f))
        c, mape = fit(rows, PARTS)
        c2, mape2 = fit(rows, [p for p in PARTS if p != "PROCESS_MODEL_OUTPUTS_MEAN"])
        print(f"{gpu} ({len(rows)} rows): host = {c[0]:.3f} ms + {c[1]:.4f} ms x batch + {c[2]:.3f} ms x (TP-1), "
              f"MAPE {mape:.1%}; without output processing: {c2[0]:.3f} + {c2[1]:.4f} x batch + "
              f"{c2[2]:.3f} x (TP-1), MAPE {mape2:.1%}")


if __name__ == "__main__":
    main()
