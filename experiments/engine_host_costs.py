"""Host (CPU) costs of the V0 vLLM-derived engine, from vidur's measured overheads: the numbers
behind the v0 generations in dsim/config/data/engine_generations.yaml.

    python experiments/engine_host_costs.py      # < 1 s; needs ../shared/data/profiling/vidur/cpu_overheads

vidur (commit 0633efa) ran its vLLM-derived engine (Python scheduler, every worker a Ray actor, no
CUDA graphs) on batches of 8-64 and timed each CPU operation per step.  RAY_COMM_TIME is what the
step's wall time leaves after the timed operations: the driver <-> worker Ray round trip.  Four
least-squares fits (ms, batch b, tensor-parallel degree TP, decoder layers L):

1. engine core = scheduling + sampler + input preparation + output processing + worker barrier
   (means) on [1, b, TP - 1]                          -> step_us, per_seq_us, per_worker_us
2. Ray round trip at TP 1 (one worker actor)  on [1, b] -> ray_step_us, ray_per_seq_us; the engine
   actor of --engine-use-ray is the same kind of call (one actor method per step returning the
   step's outputs), not measured here: engine_ray_us, engine_ray_per_seq_us take these values
3. Ray round trip at TP > 1, minus fit 2's prediction, on [1, b, TP - 2]
                                                       -> ray_tp_us, ray_tp_per_seq_us, ray_tp_per_worker_us
4. model execution (the CPU time of the eager forward call; medians: the means include the few
   large prefill steps, whose forward waits on the GPU) on [L, L x b]
                                                       -> eager_layer_us, eager_layer_per_seq_us
(and fit 1 without output processing, which vLLM 0.6 overlaps with the next step).  The whole
preset is then checked against the sum the previous single fit used (fits 1 + 2 + 3 with Ray
workers at every TP, as vidur ran them).
"""
from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiling" / "vidur" / "cpu_overheads"
CORE = ("SCHEDULE_MEAN", "SAMPLER_E2E_MEAN", "PREPARE_INPUTS_E2E_MEAN", "PROCESS_MODEL_OUTPUTS_MEAN",
        "POST_PREPARE_INPUTS_BARRIER_MEAN")
LAYERS = {"Llama-2-7b-hf": 32, "CodeLlama-34b-Instruct-hf": 48, "Llama-2-70b-hf": 80}


def lstsq(X, y):
    c = np.linalg.lstsq(X, y, rcond=None)[0]
    return c, float(np.mean(np.abs(X @ c - y) / np.abs(y)))


def derive(rows) -> dict:
    """Every preset term (microseconds) and each fit's MAPE."""
    b = np.array([float(r["batch_size"]) for r in rows])
    tp = np.array([int(r["tensor_parallel_degree"]) for r in rows])
    lay = np.array([LAYERS[r["model_name"].split("/")[-1]] for r in rows], dtype=float)
    col = lambda c: np.array([float(r[c]) for r in rows])                       # noqa: E731
    one = np.ones_like(b)
    core = sum(col(c) for c in CORE)
    c1, m1 = lstsq(np.c_[one, b, tp - 1], core)
    c1a, m1a = lstsq(np.c_[one, b, tp - 1], core - col("PROCESS_MODEL_OUTPUTS_MEAN"))
    ray = col("RAY_COMM_TIME_MEDIAN")
    # the v0-async-output preset's source: core + round trip without output processing, one fit
    c0, _ = lstsq(np.c_[one, b, tp - 1], core + ray - col("PROCESS_MODEL_OUTPUTS_MEAN"))
    t1 = tp == 1
    c2, m2 = lstsq(np.c_[one, b][t1], ray[t1])
    mt = ~t1
    extra = ray[mt] - (c2[0] + c2[1] * b[mt])
    c3, _ = lstsq(np.c_[one, b, tp - 2][mt], extra)
    m3 = float(np.mean(np.abs(c2[0] + c3[0] + (c2[1] + c3[1]) * b[mt] + c3[2] * (tp[mt] - 2) - ray[mt]) / ray[mt]))
    c4, m4 = lstsq(np.c_[lay, lay * b], col("MODEL_EXECUTION_E2E_MEDIAN"))
    us = lambda x: round(float(x) * 1e3, 1)                                    # noqa: E731
    terms = {"step_us": us(c1[0]), "per_seq_us": us(c1[1]), "per_worker_us": us(c1[2]),
             "ray_step_us": us(c2[0]), "ray_per_seq_us": us(c2[1]),
             "ray_tp_us": us(c3[0]), "ray_tp_per_seq_us": us(c3[1]), "ray_tp_per_worker_us": us(c3[2]),
             "engine_ray_us": us(c2[0]), "engine_ray_per_seq_us": us(c2[1]),
             "eager_layer_us": us(c4[0]), "eager_layer_per_seq_us": round(float(c4[1]) * 1e3, 3)}
    # the preset as vidur's engine ran (Ray workers at every TP) against the old single fit's sum
    pred = (terms["step_us"] + terms["per_seq_us"] * b + terms["per_worker_us"] * (tp - 1)
            + terms["ray_step_us"] + terms["ray_per_seq_us"] * b
            + (tp > 1) * (terms["ray_tp_us"] + terms["ray_tp_per_seq_us"] * b
                          + terms["ray_tp_per_worker_us"] * (tp - 2)))
    total = (core + ray) * 1e3
    return {"terms": terms, "mape": {"core": m1, "ray_tp1": m2, "ray_tp_gt1": m3, "eager": m4,
                                     "total": float(np.mean(np.abs(pred - total) / total))},
            "per_seq_without_output_processing_us": us(c1a[1]), "core_no_output_mape": m1a, "rows": len(rows),
            "with_ray_without_output_processing_us": us(c0[1])}


def main():
    for gpu in ("a100", "a40"):
        with (DATA / gpu / "cpu_overheads.csv").open() as f:
            d = derive(list(csv.DictReader(f)))
        t, m = d["terms"], d["mape"]
        print(f"{gpu} ({d['rows']} rows)")
        print(f"  1 engine core: {t['step_us']:.0f} us + {t['per_seq_us']:.1f} us x batch + {t['per_worker_us']:.0f} us "
              f"x (TP-1), MAPE {m['core']:.1%}; without output processing {d['per_seq_without_output_processing_us']:.1f}"
              f" us per sequence (MAPE {d['core_no_output_mape']:.1%}); with the round trip, without output processing "
              f"{d['with_ray_without_output_processing_us']:.0f} us per sequence (v0-async-output)")
        print(f"  2 Ray round trip, TP 1: {t['ray_step_us']:.0f} us + {t['ray_per_seq_us']:.2f} us x batch, MAPE {m['ray_tp1']:.1%}")
        print(f"  3 Ray executor, TP > 1, beyond fit 2: {t['ray_tp_us']:.0f} us + {t['ray_tp_per_seq_us']:.1f} us x batch "
              f"+ {t['ray_tp_per_worker_us']:.0f} us x (TP-2); round trip MAPE {m['ray_tp_gt1']:.1%}")
        print(f"  4 eager forward (CPU): layers x ({t['eager_layer_us']:.1f} us + {t['eager_layer_per_seq_us']:.3f} us "
              f"x batch), MAPE {m['eager']:.1%}")
        print(f"  preset with Ray workers (as measured) vs core + Ray round trip: MAPE {m['total']:.1%}")
        print("  yaml: " + ", ".join(f"{k}: {v}" for k, v in t.items()))


if __name__ == "__main__":
    main()
