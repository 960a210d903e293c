"""Replay real vLLM runs (../shared/data/real/) through dsim and report the error per metric.

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
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import dsim  # noqa: E402
from dsim.metrics.summary import stats  # noqa: E402

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


def lss_run(name, latency, overrides):
    model, dev, eng = LSS[name]
    rows = [json.loads(line) for line in (REAL / "llmservingsim-vllm" / name / "requests.jsonl").open()]
    q0 = min(r["queued_ts"] for r in rows)
    with tempfile.TemporaryDirectory() as td:
        tr = Path(td) / "trace.jsonl"
        tr.write_text("".join(json.dumps({"arrival_s": r["queued_ts"] - q0, "prompt_tokens": r["input_toks"],
                                          "output_tokens": r["output_toks"], "request_id": r["request_id"]}) + "\n"
                              for r in rows))
        scn = {"name": name, "seed": 42, "model": model, "hardware": dev, "engine": eng, "latency": latency,
               "workload": {"type": "trace", "path": str(tr)}, "output": {"plots": False}}
        res = dsim.run(scn, overrides=overrides)
    lat = res.latencies()
    real = {
        "ttft": [(r["first_token_ts"] - r["queued_ts"]) * 1e3 for r in rows],
        "tpot": [(r["last_token_ts"] - r["first_token_ts"]) * 1e3 / (r["output_toks"] - 1)
                 for r in rows if r["output_toks"] > 1],
        "e2e": [(r["last_token_ts"] - r["queued_ts"]) * 1e3 for r in rows],
    }
    sim = {"ttft": lat["ttft_ms"], "tpot": lat["tpot_ms"], "e2e": lat["e2e_ms"]}
    return [(name, "all", m, stats(real[m]), stats(sim[m])) for m in ("ttft", "tpot", "e2e")]


def run_all(latency, overrides):
    rows = []
    for name in LSS:
        rows += lss_run(name, latency, overrides)
    for folder in IPERF:
        rows += iperf_run(folder, latency, overrides)
    return rows


def iperf_run(folder, latency, overrides):
    model, tp = IPERF[folder]
    d = REAL / "inference-perf-h100" / folder
    prof = yaml.safe_load((d / "profile.yaml").read_text())
    sp = prof["data"]["shared_prefix"]
    stages = prof["load"]["stages"]
    scn = {
        "name": folder, "seed": 42, "model": model, "hardware": "H100-SXM",
        "engine": {"tensor_parallel_size": tp, "max_num_seqs": 128, "max_num_batched_tokens": 2048,
                   "max_model_len": 4096},
        "latency": latency,
        "workload": {"type": "staged", "stage_arrivals": "constant" if prof["load"]["type"] == "constant" else "poisson",
                     "stages": [{"rate": s["rate"], "duration_s": s["duration"]} for s in stages],
                     "shared_prefix": {"num_groups": sp["num_unique_system_prompts"],
                                       "users_per_group": sp["num_users_per_system_prompt"],
                                       "system_prompt_len": sp["system_prompt_len"], "multi_turn": False},
                     "prompt_tokens": sp["question_len"], "output_tokens": sp["output_len"]},
        "output": {"plots": False},
    }
    res = dsim.run(scn, overrides=overrides)
    out = []
    t0 = 0.0
    for i, st in enumerate(stages):
        f = d / "results" / f"stage_{i}_lifecycle_metrics.json"
        t1 = t0 + st["duration"]
        if not f.exists():
            t0 = t1
            continue
        L = json.loads(f.read_text())["successes"]["latency"]
        rs = [r for r in res.requests if t0 <= r.arrival < t1 and r.t_completion is not None]
        lat = dsim.metrics.summary.request_latencies(rs)
        for m, key, simkey in (("ttft", "time_to_first_token", "ttft_ms"), ("e2e", "request_latency", "e2e_ms")):
            real = {"mean": L[key]["mean"] * 1e3, "p50": L[key]["median"] * 1e3, "p90": L[key]["p90"] * 1e3}
            out.append((folder, f"stage {i} ({st['rate']} req/s)", m, real, stats(lat[simkey])))
        # inference-perf's own time_per_output_token counts ~2 tokens per generated token here
        # (E2E / TPOT ~ 2 x output_len, ITL median ~0.03 ms): derive TPOT from E2E and TTFT instead,
        # mean and median only (the percentiles of a difference are not the difference of percentiles)
        real_tpot = {q: (L["request_latency"][k] - L["time_to_first_token"][k]) * 1e3 / (sp["output_len"] - 1)
                     for q, k in (("mean", "mean"), ("p50", "median"))}
        real_tpot["p90"] = float("nan")
        out.append((folder, f"stage {i} ({st['rate']} req/s)", "tpot*", real_tpot, stats(lat["tpot_ms"])))
        t0 = t1
    return out


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
