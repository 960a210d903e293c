"""Replay real vLLM runs (../shared/data/real/) through dsim and report the error per metric
(mean / p50 / p90 table used by latency_error_table.py and the fit_* scripts; the readers and the
replay are dsim.calibrate's, as in `dsim cosim`).

    python experiments/cosim_real.py [--latency roofline] [--set latency.compute_efficiency=0.5 ...]
                                     [--out docs/accuracy-roofline.md]

llmservingsim-vllm runs: each request's engine-side queue time (queued_ts) is replayed as its
arrival, with its real prompt and output lengths; compared per request population: TTFT
(first_token_ts - queued_ts), TPOT ((last - first) / (out - 1)), E2E (last_token_ts - queued_ts).
inference-perf-h100 runs: the profile's shared-prefix workload and load stages are regenerated
(no per-request data exists); compared per stage against inference-perf's own percentiles.
Error = (sim - real) / real.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
from dsim.calibrate.cosim import cosim_report, simulate_run  # noqa: E402
from dsim.calibrate.realrun import load_real  # noqa: E402
from dsim.metrics.measures import request_latencies, stats  # noqa: E402

REAL = ROOT.parent / "shared" / "data" / "real"

LSS = {  # run folder -> (catalogue model, device, engine)
    "RTX4090_Llama-3.1-8B": ("meta-llama/Llama-3.1-8B", "RTX4090",
                             {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "max_model_len": 32768}),
    "RTXPRO6000_Llama-3.1-8B": ("meta-llama/Llama-3.1-8B", "RTXPRO6000",
                                {"max_num_seqs": 128, "max_num_batched_tokens": 2048, "max_model_len": 32768}),
    "RTXPRO6000_Qwen3-32B": ("Qwen/Qwen3-32B", "RTXPRO6000",
                             {"tensor_parallel_size": 2, "max_num_seqs": 128, "max_num_batched_tokens": 2048,
                              "max_model_len": 32768}),
}
IPERF = {
    "20260217-231439-llama-2-7b-tp1-general": ("meta-llama/Llama-2-7b-hf", 1),
    "20260218-130541-mixtral-8x7b-v0-1-tp2-general": ("mistralai/Mixtral-8x7B-v0.1", 2),
    "20260217-202857-llama-2-70b-tp4-general": ("meta-llama/Llama-2-70b-hf", 4),
}
QS = ("mean", "p50", "p90")


def _err(sim, real):
    return (sim - real) / real if real else float("nan")


def _rows(run, latency, overrides, tpot_label="tpot"):
    """(run, slice, metric, real {mean,p50,p90}, sim stats) per stage, through dsim.calibrate's cosim."""
    res, scn = simulate_run(run, None, overrides, 42, latency)
    rep = cosim_report(run, res, scn)
    out = []
    for st, real_st in zip(rep["stages"], run.stages):
        inside = [r for r in res.requests if real_st.t0 <= r.arrival < real_st.t1]
        lat = request_latencies(inside)
        for m in ("ttft", "tpot", "e2e"):
            if m not in real_st.real:
                continue
            real = {q: real_st.real[m].get(q, float("nan")) for q in QS}
            label = tpot_label if m == "tpot" else m
            out.append((run.name, st["stage"], label, real, stats(lat[f"{m}_ms"])))
    return out


def lss_run(name, latency, overrides):
    return _rows(load_real(REAL / "llmservingsim-vllm" / name), latency, overrides)


def run_all(latency, overrides):
    rows = []
    for name in LSS:
        rows += lss_run(name, latency, overrides)
    for folder in IPERF:
        rows += iperf_run(folder, latency, overrides)
    return rows


def iperf_run(folder, latency, overrides):
    # inference-perf's own time_per_output_token counts streamed chunks: the reader derives TPOT from
    # E2E and TTFT at the mean and median (no p90)
    return _rows(load_real(REAL / "inference-perf-h100" / folder), latency, overrides, "tpot*")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", default="roofline")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    latency = {"model": a.latency}
    rows = run_all(latency, a.overrides)
    lines = [f"Latency model: `{a.latency}` {' '.join(a.overrides)}", "",
             "| run | slice | metric | real mean / p50 / p90 (ms) | sim mean / p50 / p90 (ms) | error mean / p50 / p90 |",
             "|---|---|---|---|---|---|"]
    abs_errs = []
    for run, sl, m, real, sim in rows:
        errs = [_err(sim.get(q, float("nan")), real[q]) if real[q] == real[q] else float("nan") for q in QS]
        abs_errs += [abs(e) for e in errs if e == e]
        lines.append(f"| {run} | {sl} | {m.upper()} | " + " / ".join("n/a" if real[q] != real[q] else f"{real[q]:.1f}" for q in QS) + " | "
                     + " / ".join(f"{sim.get(q, float('nan')):.1f}" for q in QS) + " | "
                     + " / ".join("n/a" if e != e else f"{e:+.0%}" for e in errs) + " |")
    lines += ["", f"Mean absolute error over all cells: {np.mean(abs_errs):.0%}; median {np.median(abs_errs):.0%}."]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.out:
        Path(a.out).write_text(text)


if __name__ == "__main__":
    main()
