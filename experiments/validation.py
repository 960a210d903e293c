"""Regenerate docs/validation.md: co-simulation of every shared real run, stage-2 fits evaluated
leave-one-model-out and leave-one-run-out, the saturation cliff on the overloaded runs, and the
stage-1 round trip.

    python experiments/validation.py [--evals 40] [--loro-evals 25] [--jobs 2] [--stage-cap 150]

About 11 minutes on 2 cores with the defaults.  Fits simulate each staged run with its stages cut
to --stage-cap seconds (steady state is reached in seconds); every reported error is from the
full-length replay.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from dsim.calibrate.cosim import cosim_report, simulate_run  # noqa: E402
from dsim.calibrate.fit import refine, saturation_cliff  # noqa: E402
from dsim.calibrate.realrun import load_real  # noqa: E402
from dsim.latency.unified5 import Unified5Model  # noqa: E402

REAL = ROOT.parent / "shared" / "data" / "real"
DOCS = ROOT / "docs"
SEED_BETA, SEED_ALPHA = list(Unified5Model.BETA), list(Unified5Model.ALPHA_US)


def u5(beta, alpha):
    return {"model": "unified5", "beta": list(beta), "alpha": list(alpha)}


def evaluate(run, latency):
    """Per non-overloaded stage: (E2E mean error, TTFT p50 error, TPOT mean error)."""
    res, scn = simulate_run(run, None, (), 42, latency)
    rep = cosim_report(run, res, scn)
    out = []
    for st in rep["stages"]:
        m = st["metrics"]
        out.append({"stage": st["stage"], "overloaded": st["overloaded"],
                    "e2e": m["e2e"]["error"].get("mean"), "ttft": m["ttft"]["error"].get("p50"),
                    "tpot": m.get("tpot", {}).get("error", {}).get("mean"),
                    "ks_ttft": m["ttft"].get("ks"), "ks_e2e": m["e2e"].get("ks")})
    return out


def fit(train, evals, jobs, cap, log):
    short = [r.shortened(cap) for r in train]
    b, a, l0, l1, n = refine(short, "unified5", SEED_BETA, SEED_ALPHA, evals, jobs)
    log(f"    fit on {len(train)} runs: loss {l0:.3f} -> {l1:.3f} ({n} sims)")
    return b, a


def pct(x):
    return "n/a" if x is None else f"{x:+.1%}"


def mape(rows, key):
    v = [abs(r[key]) for r in rows if r[key] is not None and not r["overloaded"]]
    return float(np.mean(v)) if v else None


def round_trip():
    """Stage 1 on the traces of scenarios/trace_roundtrip.yaml (what tests/test_calibrate.py asserts)."""
    import dsim
    from dsim.calibrate.fit import fit_traces
    import yaml
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
    ap.add_argument("--loro-evals", type=int, default=25)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--stage-cap", type=float, default=150.0)
    ap.add_argument("--out", default=str(DOCS / "validation.md"))
    a = ap.parse_args(argv)
    t_start = time.time()

    def log(m):
        print(f"[{time.time() - t_start:6.0f}s] {m}", flush=True)
    runs = [load_real(d) for d in sorted((REAL / "inference-perf-h100").iterdir())] + \
           [load_real(d) for d in sorted((REAL / "llmservingsim-vllm").iterdir())]
    ok = [r for r in runs if not r.overloaded]
    models = sorted({r.model for r in runs})
    log(f"{len(runs)} runs, {len(ok)} not overloaded, models {models}")

    # 1. baselines: roofline defaults and seed 003's published unified5 coefficients
    base = {}
    for name, lat in (("roofline", {"model": "roofline"}), ("unified5 (seed 003)", u5(SEED_BETA, SEED_ALPHA))):
        base[name] = {r.name: evaluate(r, lat) for r in runs}
        log(f"baseline {name} done")

    # 2. leave-one-model-out: fit on the other models' runs on the same GPU (or, alone on its GPU,
    #    on every run of the other models)
    lomo, lomo_coeffs = {}, {}
    for hw in sorted({r.hardware for r in runs}):
        for m in sorted({r.model for r in runs if r.hardware == hw}):
            train = [r for r in ok if r.hardware == hw and r.model != m] or [r for r in ok if r.model != m]
            key = (hw, m)
            log(f"LOMO hold out {m} on {hw}: train {[r.name for r in train]}")
            lomo_coeffs[key] = fit(train, a.evals, a.jobs, a.stage_cap, log)
            for r in runs:
                if r.hardware == hw and r.model == m:
                    lomo[r.name] = evaluate(r, u5(*lomo_coeffs[key]))

    # 3. leave-one-run-out on the H100 runs
    loro = {}
    h100 = [r for r in ok if r.hardware == "H100-SXM"]
    for r in h100:
        log(f"LORO hold out {r.name}")
        b, al = fit([x for x in h100 if x is not r], a.loro_evals, a.jobs, a.stage_cap, log)
        loro[r.name] = evaluate(r, u5(b, al))

    # 4. saturation cliff of the overloaded runs, with their model's LOMO coefficients
    cliffs = []
    for r in runs:
        if r.overloaded and r.scenario["workload"].get("type") == "staged":
            lat = u5(*lomo_coeffs[(r.hardware, r.model)])
            rate, low = saturation_cliff(r, lat)
            offered = max(s.rate for s in r.stages)
            fails = sum(s.failures for s in r.stages)
            cliffs.append((r.name, offered, fails, rate, low))
            log(f"cliff {r.name}: sim {rate} req/s vs offered {offered}")

    rt_true, rt_got, rt_err = round_trip()
    log(f"round trip max error {rt_err:.2e}")
    write(a.out, runs, base, lomo, loro, lomo_coeffs, cliffs, (rt_true, rt_got, rt_err), a, time.time() - t_start)
    log(f"wrote {a.out}")


def _table(runs, results: dict) -> list:
    lines = ["| run | stage | E2E mean | TTFT p50 | TPOT mean | KS TTFT / E2E |", "|---|---|---|---|---|---|"]
    for r in runs:
        for st in results.get(r.name, []):
            ks = "" if st["ks_ttft"] is None else f"{st['ks_ttft']:.2f} / {st['ks_e2e']:.2f}"
            lines.append(f"| {r.name}{' (overloaded)' if st['overloaded'] else ''} | {st['stage']} | {pct(st['e2e'])} | "
                         f"{pct(st['ttft'])} | {pct(st['tpot'])} | {ks} |")
    return lines


def _summary(results: dict) -> tuple:
    rows = [st for v in results.values() for st in v]
    return mape(rows, "e2e"), mape(rows, "ttft"), mape(rows, "tpot")


def _verdict(lomo) -> str:
    e, t, _ = _summary(lomo)
    ok = e is not None and t is not None and e <= 0.10 and t <= 0.20
    return (f"Leave-one-model-out here: E2E {e:.1%}, TTFT p50 {t:.1%}: "
            + ("both targets met." if ok else "**targets not met** (see the split by GPU below)."))


def _split(base, lomo, fmt) -> list:
    """The same MAPEs split by GPU family: the H100 runs (9) and the RTX runs (4)."""
    out = ["By GPU (E2E mean / TTFT p50 MAPE):", "", "| coefficients | H100 runs | RTX 4090 / PRO 6000 runs |",
           "|---|---|---|"]
    for name, res in list(base.items()) + [("unified5 fitted leave-one-model-out", lomo)]:
        cells = []
        for rtx in (False, True):
            e, t, _ = _summary({k: v for k, v in res.items() if k.startswith("RTX") == rtx})
            cells.append(f"{fmt(e)} / {fmt(t)}")
        out.append(f"| {name} | {cells[0]} | {cells[1]} |")
    return out


def write(path, runs, base, lomo, loro, coeffs, cliffs, rt, a, secs):
    def fmt(x):
        return "n/a" if x is None else f"{x:.1%}"
    L = ["# Validation against real vLLM runs", "",
         "Generated by `python experiments/validation.py` "
         f"(--evals {a.evals} --loro-evals {a.loro_evals} --stage-cap {a.stage_cap}; {secs / 60:.0f} min on this machine).",
         "Every number is a full-length replay of a run in `../shared/data/real/` through `dsim cosim`'s code path;",
         "errors are (sim - real) / real per non-overloaded stage; MAPE = mean |error| over stages.", "",
         "## Summary (MAPE over the non-overloaded stages of all 13 usable runs)", "",
         "| coefficients | E2E mean | TTFT p50 | TPOT mean |", "|---|---|---|---|"]
    for name, res in list(base.items()) + [("unified5 fitted leave-one-model-out", lomo)]:
        e, t, p = _summary(res)
        L.append(f"| {name} | {fmt(e)} | {fmt(t)} | {fmt(p)} |")
    e, t, p = _summary(loro)
    L += [f"| unified5 fitted leave-one-run-out (H100 runs only) | {fmt(e)} | {fmt(t)} | {fmt(p)} |", ""]
    L += _split(base, lomo, fmt)
    L += ["",
          "Targets (issue 4): E2E mean MAPE <= 10 % and TTFT p50 MAPE <= 20 % with coefficients fitted without the "
          "evaluated run's model.", _verdict(lomo), "",
          "Fitting: stage 2 of `dsim fit` (Nelder-Mead on log-multipliers of the five betas and a0, starting from "
          "seed 003's H100 coefficients; loss MAPE(E2E mean) + 0.3 MAPE(TTFT p50)). Leave-one-model-out trains on "
          "the other models' runs on the same GPU; the RTX 4090 has only a Llama-3.1-8B run, so its coefficients "
          "are fitted on every run of the other models (H100 and RTX PRO 6000: a cross-GPU transfer).", "",
          "## Leave-one-model-out coefficients", "", "| GPU | held-out model | beta | a0 (us) |", "|---|---|---|---|"]
    for (hw, m), (b, al) in coeffs.items():
        L.append(f"| {hw} | {m} | {', '.join(f'{x:.3g}' for x in b)} | {al[0]:.0f} |")
    for title, res in (("Leave-one-model-out, per stage", lomo), ("Leave-one-run-out (H100), per stage", loro),
                       ("Baseline: unified5 with seed 003 coefficients", base["unified5 (seed 003)"]),
                       ("Baseline: roofline defaults", base["roofline"])):
        L += ["", f"## {title}", ""] + _table(runs, res)
    L += ["", "## Saturation cliff (overloaded runs)", "",
          "The rate at which simulated TTFT p50 exceeds 3x its low-load value, with the model's leave-one-model-out "
          "coefficients, against the rate the real server was offered when its requests failed.", "",
          "| run | offered req/s | real failures | simulated cliff req/s | low-load TTFT p50 (ms) | consistent |",
          "|---|---|---|---|---|---|"]
    for name, offered, fails, rate, low in cliffs:
        L.append(f"| {name} | {offered:g} | {fails} | {'none found' if rate is None else f'{rate:g}'} | "
                 f"{low * 1e3:.0f} | {'yes' if rate is not None and rate <= offered else 'no'} |")
    true, got, err = rt
    L += ["", "## Stage-1 round trip", "",
          "dsim run with known unified5 coefficients, `--emit-vllm-traces`, then `dsim fit` on the traces:", "",
          f"- true  beta + alpha: {', '.join(f'{x:g}' for x in true)}",
          f"- fitted beta + alpha: {', '.join(f'{x:.6g}' for x in got)}",
          f"- largest relative error: {err:.1e} (test tolerance 2 %)", "",
          "## Notes", "",
          "- inference-perf runs carry aggregates only: arrivals are regenerated at the stage rates; TPOT is derived "
          "from E2E and TTFT (mean and median), because inference-perf's own TPOT counts streamed chunks.",
          "- The LLMServingSim runs replay each request's engine queue time exactly; TTFT/E2E are measured from it.",
          "- The Qwen3-30B-A3B run used data parallelism 2 with expert parallelism; dsim models two full replicas.",
          ]
    Path(path).write_text("\n".join(L) + "\n")
    Path(path).with_suffix(".json").write_text(json.dumps({"baseline": base, "lomo": lomo, "loro": loro,
                                                           "cliffs": cliffs}, indent=1, default=str))


if __name__ == "__main__":
    main()
