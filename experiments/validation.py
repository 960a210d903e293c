"""Regenerate docs/validation.md (+ .json): how far dsim is from the shared real vLLM runs.

    python experiments/validation.py [--evals 40] [--jobs 2] [--stage-cap 150]

About 25 minutes on 2 cores.  Sections:
1. zero-shot: every latency model with its shipped defaults (roofline, dsim's default; unified5,
   physics and vidur), on every run, per GPU and per model, next to the baseline before issue 34
   (docs/baselines/); the per-stage errors of every model are also written to
   dsim/data/validation_errors.csv (by GPU, model family and engine generation), which the package
   ships;
2. `dsim calibrate` (roofline) on one run of a deployment, predicting the other runs of the same
   deployment (same GPU, model and TP; other workloads and loads);
3. leave-one-model-out: calibrated on the other models' runs on the same GPU, predicting the
   held-out model;
4. the saturation cliff of the overloaded runs;
5. step level, against ../shared/data/profiling/vidur: the roofline's linear-layer time against the
   measured operator timings, and the V0 host-cost preset against the measured CPU overheads;
6. the stage-1 round trip on simulated step traces.
Fits simulate staged runs with their stages cut to --stage-cap seconds (steady state is reached in
seconds); every reported error is from a full-length replay through `dsim cosim`'s code path.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
sys.path.insert(0, str(ROOT / "experiments"))
from dsim.calibrate.command import fit_runs, replica_context  # noqa: E402
from dsim.calibrate.cosim import cosim_report, simulate_run  # noqa: E402
from dsim.calibrate.cliff import saturation_cliff  # noqa: E402
from dsim.calibrate.realrun import load_real  # noqa: E402
from dsim.latency.unified5 import Unified5Model  # noqa: E402
from dsim.latency.credibility import BAND_COLUMNS  # noqa: E402
from dsim.metrics.band import model_kind, offered_load  # noqa: E402

SHARED = ROOT.parent / "shared" / "data"
REAL = SHARED / "real"
VIDUR = SHARED / "profiling" / "vidur"
DOCS = ROOT / "docs"
UNIFIED5_SEED = {"model": "unified5", "beta": list(Unified5Model.BETA), "alpha": list(Unified5Model.ALPHA_US)}
ZERO_SHOT = {"roofline (default)": None, "unified5 (seed 003)": UNIFIED5_SEED, "physics": {"model": "physics"},
             "vidur": {"model": "vidur"}}
BASELINE = DOCS / "baselines" / "validation-7172bf0.json"
ERRORS_CSV = ROOT / "dsim" / "data" / "validation_errors.csv"
KEYS = ("e2e", "ttft", "tpot")                 # E2E mean, TTFT p50, TPOT p50
ERR_KEYS = ("e2e", "e2e_p99", "ttft", "ttft_p99", "tpot", "tpot_p99", "throughput")   # in BAND_COLUMNS' order
VIDUR_GPUS = {"h100": "H100-SXM", "a100": "A100-80GB", "a40": "A40"}
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def evaluate(run, latency=None) -> list:
    """Per stage: signed errors of E2E mean, TTFT p50, TPOT p50 (the report's KEYS) and of the tails and
    throughput the error band also covers (BAND_KEYS), plus the simulated load (full-length replay)."""
    res, scn = simulate_run(run, None, (), 42, latency)
    slots = scn["engine"].get("max_num_seqs", 256)
    out = []
    for st in cosim_report(run, res, scn)["stages"]:
        m = st["metrics"]

        def err(metric, q):
            return m.get(metric, {}).get("error", {}).get(q)
        e2e_sim = m["e2e"]["sim"].get("mean")
        out.append({"stage": st["stage"], "overloaded": st["overloaded"], "rate": st["rate"],
                    # dsim.metrics.band.offered_load: the same measure a dsim run reports for itself
                    "load": offered_load(st["rate"], e2e_sim / 1e3, slots) if e2e_sim is not None else None,
                    "e2e": err("e2e", "mean"), "ttft": err("ttft", "p50"), "tpot": err("tpot", "p50"),
                    "e2e_p99": err("e2e", "p99"), "ttft_p99": err("ttft", "p99"), "tpot_p99": err("tpot", "p99"),
                    "throughput": st["throughput"].get("output_tokens_per_s", {}).get("error")})
    return out


def deployment(run) -> tuple:
    return run.hardware, run.model, run.scenario["engine"].get("tensor_parallel_size", 1)


def calibrate_on(train, evals, jobs, cap, log) -> dict:
    """`dsim calibrate`'s fit (roofline) on ``train``; returns the fitted latency section."""
    short = [r.shortened(cap) for r in train]
    rep = fit_runs(short, [replica_context(r) for r in short], None, [], [], "roofline", evals, jobs, 42,
                   True, False, lambda m: None, lambda m: None)
    log(f"    calibrated on {[r.name for r in train]}: loss {rep['loss']['before']:.3f} -> "
        f"{rep['loss']['after']:.3f} ({rep['stage2']['evaluations']} sims"
        f"{', non-physical: ' + '; '.join(rep['physical_issues']) if rep['physical_issues'] else ''})")
    return rep["fitted"]


def mape(rows) -> dict:
    ok = [r for r in rows if not r["overloaded"]]
    return {k: (float(np.mean([abs(r[k]) for r in ok if r[k] is not None])) if ok else None) for k in KEYS}


# ---- step level ---------------------------------------------------------------------------------------
def linear_ops_vs_roofline() -> list:
    """Per (GPU, model, TP): relative bias of the roofline's per-layer linear time (its GEMM
    efficiency curves, dsim/latency/efficiency.py) against vidur's measured attn/MLP projection kernels, over all token counts and
    split at <= 64 tokens (bandwidth-bound) and >= 1024 (compute-bound)."""
    from dsim.config.hardware import load_device
    from dsim.config.errors import ConfigError
    from dsim.config.model import load_model
    from dsim.latency.roofline import RooflineModel
    out = []
    for g, dev_name in VIDUR_GPUS.items():
        dev = load_device(dev_name)
        for f in sorted((VIDUR / "compute" / g).glob("*/*/mlp.csv")):
            name = f"{f.parent.parent.name}/{f.parent.name}"
            try:
                m = load_model(name)
            except ConfigError:          # not in dsim's catalogue (Qwen-72B, internlm-20b, phi-2, Llama-3)
                continue
            by_tp: dict = {}
            models: dict = {}
            with f.open() as fh:
                for r in csv.DictReader(fh):
                    tp, n = int(r["num_tensor_parallel_workers"]), int(r["num_tokens"])
                    real = sum(float(r[f"time_stats.{o}.median"]) for o in LINEAR_OPS) * 1e-3
                    rm = models.get(tp)
                    if rm is None:
                        rm = models[tp] = RooflineModel(m, dev, tp)
                    pred = rm.linear_time(n) / m.num_layers        # the shipped GEMM curves, per layer
                    by_tp.setdefault(tp, []).append((n, real, pred))
            for tp, v in sorted(by_tp.items()):
                a = np.array(v)

                def bias(sel):
                    s = a[sel]
                    return float(np.sum(s[:, 2] - s[:, 1]) / np.sum(s[:, 1])) if len(s) else None
                out.append({"gpu": dev_name, "model": name, "tp": tp, "rows": len(a), "all": bias(a[:, 0] > 0),
                            "small": bias(a[:, 0] <= 64), "large": bias(a[:, 0] >= 1024)})
    return out


def host_costs_vs_vidur() -> list:
    """The v0 generation's host cost per step against every measured cpu_overheads row."""
    from dsim.config.generations import generation_for
    h = generation_for("0.5.0").host
    parts = ("SCHEDULE_MEAN", "SAMPLER_E2E_MEAN", "PREPARE_INPUTS_E2E_MEAN", "PROCESS_MODEL_OUTPUTS_MEAN",
             "RAY_COMM_TIME_MEDIAN", "POST_PREPARE_INPUTS_BARRIER_MEAN")
    out = []
    for f in sorted((VIDUR / "cpu_overheads").rglob("*.csv")):
        with f.open() as fh:
            rows = list(csv.DictReader(fh))
        if not rows or "batch_size" not in rows[0]:
            continue
        real = np.array([sum(float(r[c]) for c in parts if r.get(c)) for r in rows])
        b = np.array([float(r["batch_size"]) for r in rows])
        tp = np.array([float(r["tensor_parallel_degree"]) for r in rows])
        pred = (h.step_us + h.per_seq_us * b + h.per_worker_us * (tp - 1)) * 1e-3
        out.append({"file": str(f.relative_to(VIDUR)), "rows": len(rows),
                    "mape": float(np.mean(np.abs(pred - real) / real)),
                    "bias": float(np.sum(pred - real) / np.sum(real))})
    return out


def round_trip():
    """Stage 1 on the traces of scenarios/trace_roundtrip.yaml (what tests/test_calibrate.py asserts)."""
    import yaml

    import dsim
    from dsim.calibrate.fit import fit_traces
    scn = yaml.safe_load((ROOT / "scenarios" / "trace_roundtrip.yaml").read_text())
    beta, alpha = scn["latency"]["beta"], scn["latency"]["alpha"]
    with tempfile.TemporaryDirectory() as td:
        res = dsim.run(scn, vllm_traces=True)
        p = Path(td) / "t.otlp.jsonl"
        res.write_vllm_traces(p)
        got, _ = fit_traces([p], "unified5")
    err = max(abs(g - t) / t for g, t in zip(got["beta"] + got["alpha"], beta + alpha))
    return beta + alpha, got["beta"] + got["alpha"], err


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--evals", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--stage-cap", type=float, default=150.0)
    ap.add_argument("--out", default=str(DOCS / "validation.md"))
    ap.add_argument("--coverage-only", action="store_true", help="only rewrite section 7 (error band coverage)")
    a = ap.parse_args(argv)
    if a.coverage_only:
        coverage_only(Path(a.out))
        return
    t_start = time.time()

    def log(m):
        print(f"[{time.time() - t_start:6.0f}s] {m}", flush=True)
    runs = [load_real(d) for d in sorted((REAL / "inference-perf-h100").iterdir())] + \
           [load_real(d) for d in sorted((REAL / "llmservingsim-vllm").iterdir())]
    ok = [r for r in runs if not r.overloaded]
    log(f"{len(runs)} runs, {len(ok)} not overloaded")

    zero = {name: {} for name in ZERO_SHOT}
    for name, lat in ZERO_SHOT.items():
        for r in runs:
            try:
                zero[name][r.name] = evaluate(r, lat)
            except Exception as e:          # a model that cannot run this deployment: say so, go on
                log(f"  {name} on {r.name}: not run ({type(e).__name__}: {e})")
        log(f"zero-shot {name} done")

    same, same_fit = {}, {}
    for dep in sorted({deployment(r) for r in ok}):
        group = [r for r in ok if deployment(r) == dep]
        if len(group) < 2:
            continue
        train = next((r for r in group if r.name.endswith("general")), group[0])
        log(f"same deployment {dep}: calibrate on {train.name}")
        lat = calibrate_on([train], a.evals, a.jobs, a.stage_cap, log)
        same_fit[train.name] = lat
        for r in group:
            if r is not train:
                same[r.name] = {"trained_on": train.name, "stages": evaluate(r, lat)}

    lomo, lomo_fit = {}, {}
    for hw in sorted({r.hardware for r in ok}):
        models = sorted({r.model for r in ok if r.hardware == hw})
        if len(models) < 2:
            continue
        for m in models:
            train = [r for r in ok if r.hardware == hw and r.model != m]
            log(f"LOMO {hw}: hold out {m}")
            lat = calibrate_on(train, a.evals, a.jobs, a.stage_cap, log)
            lomo_fit[f"{hw} without {m}"] = lat
            for r in runs:
                if r.hardware == hw and r.model == m:
                    lomo[r.name] = evaluate(r, lat)

    write_errors_csv(runs, zero, same, lomo)
    cliffs = []
    for r in runs:
        if r.overloaded and r.scenario["workload"].get("type") == "staged":
            c = saturation_cliff(r, None)
            rate, low = c.rate, c.low_ttft_s
            offered = max(s.rate for s in r.stages)
            cliffs.append({"run": r.name, "offered": offered, "failures": sum(s.failures for s in r.stages),
                           "cliff": rate, "low_ttft_ms": low * 1e3})
            log(f"cliff {r.name}: sim {rate} req/s vs offered {offered}")

    step = {"linear_ops": linear_ops_vs_roofline(), "host": host_costs_vs_vidur()}
    rt = round_trip()
    log(f"step level and round trip done (round trip max error {rt[2]:.2e})")
    write(Path(a.out), runs, zero, same, same_fit, lomo, lomo_fit, cliffs, step, rt, a, time.time() - t_start)
    log(f"wrote {a.out}")


def family(model: str) -> str:
    """Model family for the error table: the name's first word after the organisation (llama, qwen3, ...)."""
    import re
    name = model.split("/")[-1].lower()
    return re.split(r"[-_.]", name)[0] if not name.startswith("llama-") else "llama-" + name.split("-")[1]


def write_errors_csv(runs, zero, same, lomo) -> None:
    """Per latency model, study, run and stage: signed errors, keyed by what an answer's deployment shares
    with the run (GPU and whether its GEMM curves were measured on it, model kind, TP, engine generation,
    load), so a later answer can report the error of its class (dsim/metrics/band.py reads it)."""
    import subprocess

    from dsim.config.generations import generation_for
    from dsim.config.hardware import load_device
    from dsim.config.model import load_model
    from dsim.latency.efficiency import curve_for
    studies = [(name.split(" ")[0], "zero-shot", res) for name, res in zero.items()]
    studies += [("roofline", "calibrated-same-deployment", {k: v["stages"] for k, v in same.items()}),
                ("roofline", "calibrated-other-models", lomo)]
    rows = []
    for kind, study, res in studies:
        for r in runs:
            ver = r.scenario["engine"].get("vllm_version") or (r.meta or {}).get("vllm_version") or "0.15.1"
            profiled = int(not curve_for(load_device(r.hardware)).borrowed)
            for st in res.get(r.name, []):
                rows.append([kind, study, r.name, r.hardware, profiled, r.model, family(r.model),
                             model_kind(load_model(r.model)), r.scenario["engine"].get("tensor_parallel_size", 1),
                             ver, generation_for(str(ver)).name, st["stage"], f"{st['rate']:.4g}",
                             "" if st.get("load") is None else f"{st['load']:.4f}", int(bool(st["overloaded"])),
                             *("" if st.get(k) is None else f"{st[k]:.5f}" for k in ERR_KEYS)])
    with ERRORS_CSV.open("w", newline="") as f:
        w = csv.writer(f, lineterminator="\n")
        w.writerow(["latency_model", "study", "run", "gpu", "gpu_profiled", "model", "family", "kind", "tp",
                    "vllm_version", "generation", "stage", "rate", "load", "overloaded", *BAND_COLUMNS])
        w.writerows(rows)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    ERRORS_CSV.with_suffix(".meta.json").write_text(json.dumps({
        "generated_by": "python experiments/validation.py", "commit": commit,
        "data": ["../shared/data/real/inference-perf-h100 (inference-sim/training, Apache-2.0)",
                 "../shared/data/real/llmservingsim-vllm (casys-kaist/LLMServingSim, MIT)"],
        "error": "(sim - real) / real per stage", "runs": len(runs), "rows": len(rows)}, indent=1) + "\n")


# ---- report -------------------------------------------------------------------------------------------
def pct(x):
    return "n/a" if x is None else f"{x:+.1%}"


def fmt(x):
    return "n/a" if x is None else f"{x:.1%}"


def _grouped(runs, results: dict, key, header: str) -> list:
    lines = [f"| {header} | stages | E2E mean | TTFT p50 | TPOT p50 |", "|---|---|---|---|---|"]
    for g in sorted({key(r) for r in runs if r.name in results}):
        rows = [st for r in runs if r.name in results and key(r) == g for st in results[r.name]]
        n = sum(1 for st in rows if not st["overloaded"])
        if n:
            mp = mape(rows)
            lines.append(f"| {g} | {n} | {fmt(mp['e2e'])} | {fmt(mp['ttft'])} | {fmt(mp['tpot'])} |")
    return lines


def by_gpu(r):
    return r.hardware


def by_model(r):
    return f"{r.hardware}, {r.model}"


def _per_stage(runs, results: dict) -> list:
    lines = ["| run | stage | E2E mean | TTFT p50 | TPOT p50 |", "|---|---|---|---|---|"]
    for r in runs:
        for st in results.get(r.name, []):
            lines.append(f"| {r.name}{' (overloaded)' if st['overloaded'] else ''} | {st['stage']} | "
                         f"{pct(st['e2e'])} | {pct(st['ttft'])} | {pct(st['tpot'])} |")
    return lines


def _fitted(lat) -> str:
    h = lat.get("host", {})
    return (f"compute x{lat.get('compute_efficiency', 1.0):.3f}, memory x{lat.get('memory_efficiency', 1.0):.3f}, "
            f"step {h.get('step_us', 0):.0f} us, per seq {h.get('per_seq_us', 0):.1f} us, a0 {lat['alpha'][0] / 1e3:.1f} ms")


def _coverage() -> list:
    """experiments/band_coverage.py on the table just written."""
    from band_coverage import markdown, study
    with ERRORS_CSV.open(newline="") as f:
        rows = list(csv.DictReader(f))
    return markdown(study(rows), study(rows, "conformal"))


def coverage_only(path: Path) -> None:
    """Rewrite section 7 of an existing validation.md from the packaged table (no simulation)."""
    text = path.read_text()
    head, rest = text.split("## 7. Error band coverage", 1)
    tail = rest[rest.index("## Zero-shot per stage"):]
    path.write_text(head + "\n".join(["## 7. Error band coverage", ""] + _coverage()) + tail)


def write(path, runs, zero, same, same_fit, lomo, lomo_fit, cliffs, step, rt, a, secs):
    L = ["# Validation against real vLLM runs", "",
         f"Generated by `python experiments/validation.py` (--evals {a.evals} --stage-cap {a.stage_cap:g}; "
         f"{secs / 60:.0f} min on a 2-core machine). Every number is a full-length replay of a run in "
         "`../shared/data/real/` through `dsim cosim`'s code path; errors are (sim - real) / real per "
         "non-overloaded stage, MAPE = mean |error| over stages. Metrics: E2E mean, TTFT p50, TPOT p50 "
         "(inference-perf runs: TPOT from E2E and TTFT, because their ITL times SSE messages, two per token).", "",
         "Targets (issue 14): zero-shot E2E mean <= 10 % and TTFT p50 <= 15 % on every GPU; calibrated on one "
         "run and predicting the other runs of the same deployment: E2E mean <= 8 %, TTFT p50 <= 12 %, "
         "TPOT p50 <= 8 %.", "", "Targets (issue 34): zero-shot, per GPU, E2E mean <= 8 %, TTFT p50 <= 12 %, TPOT p50 "
         "<= 8 %.", "", "## 1. Zero-shot", ""]
    if BASELINE.is_file():
        base = json.loads(BASELINE.read_text())
        old = base["zero_shot"]["roofline (default)"]
        L += [f"**Before / after issue 34** (roofline default; before = commit {base['commit']}: {base['note']})", "",
              "| GPU | stages | E2E mean before | after | TTFT p50 before | after | TPOT p50 before | after |",
              "|---|---|---|---|---|---|---|---|"]
        new = zero["roofline (default)"]
        for g in sorted({r.hardware for r in runs}):
            rows_old = [st for r in runs if r.hardware == g for st in old.get(r.name, [])]
            rows_new = [st for r in runs if r.hardware == g for st in new.get(r.name, [])]
            mo, mn = mape(rows_old), mape(rows_new)
            n = sum(1 for st in rows_new if not st["overloaded"])
            L.append(f"| {g} | {n} | " + " | ".join(f"{fmt(mo[k])} | {fmt(mn[k])}" for k in KEYS) + " |")
        L += [""]
    for name, res in zero.items():
        L += [f"**{name}**", ""] + _grouped(runs, res, by_gpu, "GPU") + [""]
        L += _grouped(runs, res, by_model, "GPU, model") + [""]
    L += ["## 2. Calibrated on one run, predicting the same deployment's other runs", "",
          "`dsim calibrate` (roofline; stage 1 needs per-request timestamps, which these aggregate-only runs "
          "lack, so stage 2 does the work) on the deployment's `general` run; the other runs differ in "
          "prompt/output lengths, shared-prefix structure and load.", "",
          "| trained on | fitted |", "|---|---|"]
    L += [f"| {k} | {_fitted(v)} |" for k, v in same_fit.items()]
    res2 = {k: v["stages"] for k, v in same.items()}
    L += [""] + _grouped(runs, res2, by_model, "GPU, model") + [""] + _per_stage(runs, res2) + [""]
    L += ["## 3. Leave one model out (same GPU)", "", "| fitted on | fitted |", "|---|---|"]
    L += [f"| {k} | {_fitted(v)} |" for k, v in lomo_fit.items()]
    L += [""] + _grouped(runs, lomo, by_model, "GPU, model") + [""] + _per_stage(runs, lomo) + [""]
    L += ["## 4. Saturation cliff (overloaded runs, roofline defaults)", "",
          "The offered rate at which simulated TTFT p50 exceeds 3x its low-load value (bisected to 2 %, "
          "dsim.calibrate.cliff), against the rate at which the real server's requests failed.", "",
          "| run | offered req/s | real failures | simulated cliff req/s | low-load TTFT p50 (ms) | consistent |",
          "|---|---|---|---|---|---|"]
    for c in cliffs:
        cliff = "none found" if c["cliff"] is None else f"{c['cliff']:.3g}"
        agree = "yes" if c["cliff"] is not None and c["cliff"] <= c["offered"] else "no"
        L.append(f"| {c['run']} | {c['offered']:g} | {c['failures']} | {cliff} | {c['low_ttft_ms']:.0f} | {agree} |")
    L += ["", "## 5. Step level against vidur's measurements", "",
          "Roofline linear-layer time per decoder layer (its GEMM efficiency curves; the curves were fitted on these "
          "profiles, internlm-20b held out, so this is mostly in-sample) against the sum of vidur's measured "
          "qkv, output, up/gate and down projection kernels (median), as a relative bias (sim - real) / real "
          "summed over token counts:", "",
          "| GPU | model | TP | rows | all | <= 64 tokens | >= 1024 tokens |", "|---|---|---|---|---|---|---|"]
    for s in step["linear_ops"]:
        L.append(f"| {s['gpu']} | {s['model']} | {s['tp']} | {s['rows']} | {pct(s['all'])} | {pct(s['small'])} | "
                 f"{pct(s['large'])} |")
    L += ["", "The V0 host-cost preset (`engine.vllm_version` < 0.6) against vidur's measured CPU overheads "
          "(scheduling + sampler + input preparation + output processing + Ray round trip + barrier):", "",
          "| file | rows | MAPE | bias |", "|---|---|---|---|"]
    L += [f"| {h['file']} | {h['rows']} | {fmt(h['mape'])} | {pct(h['bias'])} |" for h in step["host"]]
    true, got, err = rt
    L += ["", "## 6. Stage-1 round trip", "",
          "dsim run with known unified5 coefficients, `--emit-vllm-traces`, then `dsim fit` on the traces: "
          f"largest relative error {err:.1e} over {len(true)} coefficients (test tolerance 2 %).", "",
          "## 7. Error band coverage", ""] + _coverage() + [
          "## Zero-shot per stage (roofline defaults)", ""] + _per_stage(runs, zero["roofline (default)"])
    path.write_text("\n".join(L) + "\n")
    path.with_suffix(".json").write_text(json.dumps(
        {"zero_shot": zero, "same_deployment": same, "same_deployment_fits": same_fit, "lomo": lomo,
         "lomo_fits": lomo_fit, "cliffs": cliffs, "step_level": step}, indent=1, default=str))


if __name__ == "__main__":
    main()
