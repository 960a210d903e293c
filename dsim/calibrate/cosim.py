"""Co-simulation: replay a real run through dsim and report, per stage, metric and quantile, how far
simulation and reality are apart.

Definitions (ms): TTFT = first token - arrival; TPOT = (last token - first token) / (output - 1);
E2E = last token (completion) - arrival; ITL = gap between consecutive tokens of a request,
weighted per token.  Signed error = (sim - real) / real; a metric's MAPE is the mean |error| over
the quantiles both sides have; KS = two-sample Kolmogorov-Smirnov statistic (per-request data only).
Pass mark per metric (seed 000 Iteration 10, End-to-End Validation Protocol): KS < 0.15 and
|median error| < 20 %.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import tempfile
from pathlib import Path

import numpy as np
import yaml

from ..config.errors import ConfigError
from ..config.scenario import apply_overrides, load_scenario
from ..core.rng import PartitionedRNG
from ..metrics.exact import weighted_stats
from ..metrics.measures import ledger_latencies, request_latencies
from ..metrics.writers import AtomicOutput, to_json
from .diagnostics import KS_PASS, MEDIAN_PASS, replay_pass
from .runs import METRICS, QUANTS, RealRun, quantiles

log = logging.getLogger(__name__)


def _merge(base: dict, top: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in top.items():
        if v is None:
            continue
        if isinstance(v, dict) and isinstance(out.get(k), dict) and k != "workload":
            out[k] = _merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def assumed_settings(run, base: dict | None, overrides) -> list:
    """What the replay takes from somewhere other than the run itself, as printable lines."""
    said = run.scenario
    set_keys = {o.split("=", 1)[0] for o in overrides}
    out = []
    for key in ("model", "hardware"):
        if not said.get(key):
            src = "--set" if key in set_keys else ("the base scenario" if (base or {}).get(key) else None)
            if src:
                out.append(f"{key} from {src}")
    eng = said.get("engine") or {}
    base_eng = (base or {}).get("engine") or {}
    for key in ("vllm_version", "max_num_seqs", "max_num_batched_tokens", "enable_chunked_prefill",
                "enable_prefix_caching", "gpu_memory_utilization", "tensor_parallel_size"):
        if key in eng:
            continue
        if f"engine.{key}" in set_keys:
            out.append(f"engine.{key} from --set")
        elif key in base_eng:
            out.append(f"engine.{key}={base_eng[key]} from the base scenario")
        else:
            out.append(f"engine.{key} is dsim's default (the run does not record it)")
    return out


def replay_rows(run: RealRun, seed: int) -> list:
    """The run's requests with arrival times: exact, or regenerated with the seed (vllm bench)."""
    rows = [dict(r) for r in run.trace_rows]
    regen = run.meta.get("regenerate")
    if regen:
        rate, burst = regen["rate"], regen["burstiness"]
        if math.isinf(rate):
            t = np.zeros(len(rows))
        else:
            g = PartitionedRNG(seed).stream("cosim.arrivals")
            t = np.cumsum(g.gamma(burst, 1.0 / (rate * burst), len(rows)))
            t -= t[0]
        for r, a in zip(rows, t):
            r["arrival_s"] = float(a)
    return rows


def replay_scenario(run: RealRun, base: dict | None, overrides=(), seed: int | None = None,
                    trace_path: Path | None = None) -> dict:
    """Scenario mapping for the replay: the base scenario (latency model, anything the run does not
    say), then what the run says (model, engine, workload), then ``--set`` overrides."""
    scn = _merge({"seed": 42, "latency": {"model": "roofline"}}, base or {})
    scn = _merge(scn, {k: v for k, v in run.scenario.items() if k != "workload"})
    scn["workload"] = dict(run.scenario["workload"])
    scn.setdefault("output", {})
    if isinstance(scn["output"], dict):
        scn["output"]["plots"] = False
    if seed is not None:
        scn["seed"] = seed
    if run.trace_rows is not None:
        if trace_path is None:
            raise ValueError("a per-request run needs trace_path")
        cap = run.scenario["workload"].get("max_concurrency")
        scn["workload"] = {"type": "trace", "path": str(trace_path), **({"max_concurrency": cap} if cap else {})}
    overrides = list(overrides)
    scn = apply_overrides(scn, overrides)
    # after --set, so the latency model is the one that will run (--set latency.model=physics
    # must not receive the 3-term alpha of the base's roofline); an alpha set with --set stays
    set_alpha = any(o.partition("=")[0].strip() in ("latency", "latency.alpha")
                    or o.partition("=")[0].strip().startswith("latency.alpha[") for o in overrides)
    if not set_alpha and "latency" in scn:
        scn["latency"] = engine_clock_latency(run, scn["latency"])
    for key in ("model", "hardware"):
        if not scn.get(key):
            raise ConfigError(key, None, f"the run does not say its {key}: pass --scenario base.yaml or "
                              f"--set {key}=...", show_value=False)
    return scn


TRACE_KEYS = ("arrival_s", "prompt_tokens", "output_tokens", "request_id")
TRACE_OPTIONAL = ("prefix_group", "session", "tenant", "segments")      # a capture's prompt structure


def trace_text(rows) -> str:
    """Replay rows as a dsim JSONL trace (the prompt-structure columns when a row has them)."""
    return "".join(json.dumps({**{k: r[k] for k in TRACE_KEYS}, **{k: r[k] for k in TRACE_OPTIONAL if k in r}})
                   + "\n" for r in rows)


def engine_clock_latency(run: RealRun, lat):
    """The latency section a replay of ``run`` uses: timestamps taken inside the engine (queue entry
    to token out) hold no API server, tokenizer or streaming time, so their replay leaves those
    costs out (physics' 11 alpha terms are queueing corrections, not API time: kept)."""
    if run.meta.get("clock") != "engine" or not isinstance(lat, dict) or lat.get("model", "roofline") == "physics":
        return lat
    a = list(lat.get("alpha") or [0.0, 0.0, 0.0])
    return dict(lat, alpha=[0.0, a[1] if lat.get("model") == "unified5" else 0.0, 0.0])


def simulate_run(run: RealRun, base=None, overrides=(), seed: int | None = None, latency=None,
                 kv_events: bool = False):
    """Run dsim on the real run's workload.  Returns (Result, scenario mapping used).  A ``latency``
    section given here replaces the scenario's, with the engine-clock rule applied to it too;
    ``kv_events``: the replay's pools record their prefix-cache events (Result.kv_logs)."""
    from ..runner import run as run_scenario
    with tempfile.TemporaryDirectory() as td:
        tr = Path(td) / "replay.jsonl"
        scn = replay_scenario(run, base, overrides, seed, tr if run.trace_rows is not None else None)
        if kv_events:
            scn["output"]["kv_events"] = True
        if latency is not None:
            scn["latency"] = engine_clock_latency(run, copy.deepcopy(latency))
        if run.trace_rows is not None:
            tr.write_text(trace_text(replay_rows(run, scn.get("seed", 42))))
        res = run_scenario(load_scenario(scn), keep_steps=True)
    return res, scn


def _sim_itl(res, t0: float, t1: float) -> list:
    """Per-token ITL samples (value, weight) from the replicas' step logs in [t0, t1)."""
    v, w = [], []
    whole = t0 <= 0 and math.isinf(t1)
    for rep in res.fleet.replicas():
        log = rep.inst.log
        if not log.keep_all:
            raise ValueError("co-simulation windows need every step's end time: run with keep_steps=True")
        te = np.asarray(log.t_end)
        keep = (te >= t0) & (te < t1)
        v += list(np.asarray(log.dur)[keep])
        w += list(np.asarray(log.itl_count)[keep])
        if whole:
            v += [x for x, _ in rep.inst.itl_extra]
            w += [n for _, n in rep.inst.itl_extra]
    return v, w


def compare(real: dict, sim: dict) -> dict:
    """Per quantile: real, sim, signed error; MAPE over the quantiles both sides have."""
    row = {"real": {}, "sim": {}, "error": {}}
    errs = []
    for q in QUANTS:
        r, s = real.get(q), sim.get(q)
        if r is None or s is None or not (r == r and s == s):
            continue
        row["real"][q], row["sim"][q] = r, s
        if r:
            e = (s - r) / r
            row["error"][q] = e
            errs.append(abs(e))
    row["mape"] = float(np.mean(errs)) if errs else None
    return row


def ks_statistic(a, b) -> float | None:
    if len(a) == 0 or len(b) == 0:
        return None
    import warnings

    from scipy.stats import ks_2samp
    with warnings.catch_warnings():       # exact p-values fall back to asymptotic; only the statistic is used
        warnings.simplefilter("ignore", RuntimeWarning)
        return float(ks_2samp(np.asarray(a, float), np.asarray(b, float)).statistic)


def cosim_report(run: RealRun, res, scn: dict) -> dict:
    """Compare a finished replay with the real run, stage by stage."""
    stages = []
    led = res.requests                      # columns: a stage window is a mask, no request rebuilt
    arrival, finished = led.col("arrival"), led.present("t_completion")
    for st in run.stages:
        inside = (st.t0 <= arrival) & (arrival < st.t1)
        done = inside & finished
        lat = ledger_latencies(led, done)
        sim_samples = {"ttft": lat["ttft_ms"], "tpot": lat["tpot_ms"], "e2e": lat["e2e_ms"]}
        v, w = _sim_itl(res, st.t0, st.t1)
        sim_stats = {m: quantiles(x) for m, x in sim_samples.items()}
        sim_stats["itl"] = weighted_stats(np.asarray(v) * 1e3, w)
        n_done = int(done.sum())
        metrics = {}
        for m in METRICS:
            if m not in st.real:
                continue
            c = compare(st.real[m], sim_stats.get(m, {}))
            if m in st.samples and m != "itl":
                c["ks"] = ks_statistic(st.samples[m], sim_samples[m])
            c["pass"] = replay_pass(c)
            c["count"] = {"real": st.real[m].get("count"), "sim": sim_stats.get(m, {}).get("count")}
            metrics[m] = c
        thr = {}
        if n_done and st.throughput:
            span = float(led.col("t_completion")[done].max() - arrival[inside].min())
            sim_thr = {"requests_per_s": n_done / span if span > 0 else None,
                       "output_tokens_per_s": int(led.col("n_out")[done].sum()) / span if span > 0 else None}
            for k, real_v in st.throughput.items():
                s = sim_thr.get(k)
                thr[k] = {"real": real_v, "sim": s,
                          "error": (s - real_v) / real_v if real_v and s is not None else None}
        stages.append({"stage": st.name, "rate": st.rate, "overloaded": st.overloaded, "failures": st.failures,
                       "held_out": st.held_out,
                       "requests": {"real": st.real.get("e2e", {}).get("count"), "sim_completed": n_done,
                                    "sim_arrived": int(inside.sum())},
                       "metrics": metrics, "throughput": thr, "passed": stage_passed(metrics)})
    mapes = [c["mape"] for s in stages if not s["overloaded"] for m, c in s["metrics"].items()
             if c["mape"] is not None and m != "itl"]
    return {"run": run.name, "source": run.source, "path": run.path, "overloaded": run.overloaded,
            "latency": scn.get("latency"), "seed": scn.get("seed"), "notes": run.notes,
            "stages": stages, "mean_mape": float(np.mean(mapes)) if mapes else None}


def stage_passed(metrics: dict) -> bool | None:
    """A stage passes when every metric with a pass mark passes; None when a mark cannot be evaluated."""
    marks = [c["pass"]["passed"] for c in metrics.values() if c.get("pass") and c.get("ks") is not None]
    return None if not marks or None in marks else all(marks)


def check_comparable(run: RealRun, rep: dict) -> None:
    """A comparison without one comparable number ("MAPE n/a" everywhere) is an error, not a report."""
    if any(c["mape"] is not None for st in rep["stages"] for c in st["metrics"].values()):
        return
    done = sum(st["requests"]["sim_completed"] for st in rep["stages"])
    arrived = sum(st["requests"]["sim_arrived"] for st in rep["stages"])
    why = (f"the replay completed none of its {arrived} requests (see the engine and KV settings)" if not done else
           "every real TTFT/TPOT/E2E/ITL value is 0 or missing (identical timestamps, or a time unit of 0?)")
    raise ConfigError(run.path, None, f"a run with at least one metric to compare: {why}", show_value=False)


def _fmt(x, pct=False):
    if x is None or x != x:
        return "n/a"
    return f"{x:+.1%}" if pct else f"{x:.1f}"


def _ks(x):
    return "n/a" if x is None else f"{x:.3f}"


def markdown(rep: dict) -> str:
    lines = [f"# Co-simulation: {rep['run']} ({rep['source']})", "",
             f"Latency model: `{json.dumps(rep['latency'], sort_keys=True)}`, seed {rep['seed']}."
             + (" **Overloaded run** (excluded from the mean MAPE)." if rep["overloaded"] else ""), ""]
    lines += [f"- {n}" for n in rep["notes"]] + [""]
    lines += ["| stage | metric | quantile | real (ms) | sim (ms) | error | MAPE | KS |", "|---|---|---|---|---|---|---|---|"]
    for st in rep["stages"]:
        for m, c in st["metrics"].items():
            for i, q in enumerate(c["real"]):
                lines.append(f"| {st['stage'] if i == 0 else ''} | {m.upper() if i == 0 else ''} | {q} | "
                             f"{_fmt(c['real'][q])} | {_fmt(c['sim'][q])} | {_fmt(c['error'].get(q), True)} | "
                             + (f"{c['mape']:.1%} | {_ks(c.get('ks'))} |" if i == 0 and c["mape"] is not None
                                else " | |"))
        for k, t in st["throughput"].items():
            lines.append(f"| {st['stage']} | {k} | | {_fmt(t['real'])} | {_fmt(t['sim'])} | {_fmt(t['error'], True)} | | |")
    mm = rep["mean_mape"]
    lines += ["", f"Mean MAPE over TTFT/TPOT/E2E of the non-overloaded stages: {'n/a' if mm is None else f'{mm:.1%}'}."]
    lines += ["", f"## Pass marks (seed 000 Iteration 10: KS < {KS_PASS} and |median error| < {MEDIAN_PASS:.0%} per "
              "metric)", ""]
    if rep.get("holdout"):
        h = rep["holdout"]
        lines += [f"80/20 replay: {h['latency_model']} fitted on the requests arriving before "
                  f"{h['split_arrival_s']:.2f} s ({h['requests']['fitted']}; loss {h['fit']['loss_before']:.4f} -> "
                  f"{h['fit']['loss_after']:.4f} in {h['fit']['evaluations']} simulations), the whole arrival "
                  f"pattern replayed, the last {h['fraction']:.0%} ({h['requests']['held_out']} requests) "
                  f"compared: **{_verdict(next(st['passed'] for st in rep['stages'] if st.get('held_out')))}**.",
                  ""]
    lines += ["| stage | metric | KS | KS < 0.15 | median error | < 20 % | pass |", "|---|---|---|---|---|---|---|"]
    for st in rep["stages"]:
        for m, c in st["metrics"].items():
            p = c.get("pass") or {}
            if not p:
                continue
            lines.append(f"| {st['stage']} | {m.upper()} | {_ks(p['ks']['value'])} | {_mark(p['ks']['passed'])} | "
                         f"{_fmt(p['median_error']['value'], True)} | {_mark(p['median_error']['passed'])} | "
                         f"{_mark(p['passed'])} |")
    kv = rep.get("kv_cache")
    if kv:
        lines += ["", f"## KV cache (vLLM's KV events, {kv['medium']}: `{kv['file']}`)", "", kv["note"] + ".", "",
                  "| figure | real | sim | error |", "|---|---|---|---|"]
        lines += [f"| {c['what']} | {_fmt(c['real'])} | {_fmt(c['sim'])} | {_fmt(c['error'], True)} |"
                  for c in kv["compared"].values()]
    return "\n".join(lines) + "\n"


def _verdict(x):
    return "not evaluated" if x is None else ("PASSED" if x else "FAILED")


def _mark(x):
    return "n/a" if x is None else ("pass" if x else "**FAIL**")


def cdf_plot(run: RealRun, res, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    led = res.requests
    lat = request_latencies(led)
    sim = {"ttft": lat["ttft_ms"], "tpot": lat["tpot_ms"], "e2e": lat["e2e_ms"]}
    arrival, finished = led.col("arrival"), led.present("t_completion")
    fig, grid = plt.subplots(2, 2, figsize=(9.5, 6.6))        # at most two panels a row (fits a page)
    axes = list(grid.flat)
    axes[3].set_visible(False)
    for ax, m in zip(axes, ("ttft", "tpot", "e2e")):
        for i, st in enumerate(run.stages):
            inside = (st.t0 <= arrival) & (arrival < st.t1) & finished
            s = np.sort(ledger_latencies(led, inside)[f"{m}_ms"]) if len(run.stages) > 1 else np.sort(sim[m])
            lab = "" if len(run.stages) == 1 else f" {st.name}"
            if s.size:
                ax.plot(s, np.arange(1, s.size + 1) / s.size, color=f"C{i}", label=f"sim{lab}")
            if m in st.samples and len(st.samples[m]):
                r = np.sort(st.samples[m])
                ax.plot(r, np.arange(1, r.size + 1) / r.size, color=f"C{i}", ls="--", label=f"real{lab}")
            elif m in st.real:
                qs = [(st.real[m][q], p) for q, p in (("p50", .5), ("p90", .9), ("p95", .95), ("p99", .99))
                      if q in st.real[m]]
                if qs:
                    ax.plot(*zip(*qs), "o", color=f"C{i}", mfc="none", label=f"real quantiles{lab}")
        ax.set_xlabel(f"{m.upper()} (ms)")
        ax.set_ylabel("CDF")
        ax.set_xscale("log")
        ax.grid(alpha=.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{run.name}: real vs simulated")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def cosimulate(run: RealRun, base=None, overrides=(), seed=None, out_dir=None, plots=True, latency=None,
               extra: dict | None = None) -> dict:
    """Replay, compare, and (with ``out_dir``) write cosim.json, cosim.md, scenario.yaml (+ the replay
    trace, so ``dsim run out/scenario.yaml`` reruns it) and plots/cdf.png, atomically.  ``latency``
    replaces the scenario's latency section (as in ``simulate_run``); ``extra`` is added to the report."""
    from .kvevents import cosim_kv, events_file
    kv_file = events_file(run)
    res, scn = simulate_run(run, base, overrides, seed, latency, kv_events=kv_file is not None)
    rep = cosim_report(run, res, scn)
    if kv_file is not None:           # the run recorded vLLM's KV events: check the KV-cache model with them
        rep["kv_cache"] = cosim_kv(run, res, kv_file)
    rep.update(extra or {})
    check_comparable(run, rep)
    rep["assumed"] = assumed_settings(run, base, overrides)
    rep["notes"] = list(rep.get("notes", [])) + [f"assumed: {a}" for a in rep["assumed"]]
    for line in rep["assumed"]:
        log.warning("%s: %s", run.name, line)
    if out_dir is not None:
        with AtomicOutput(Path(out_dir)) as ao:
            ao.write_text("cosim.json", to_json(rep))
            ao.write_text("cosim.md", markdown(rep))
            saved = copy.deepcopy(scn)
            if run.trace_rows is not None:
                ao.write_text("replay.jsonl", trace_text(replay_rows(run, scn.get("seed", 42))))
                saved["workload"] = {"type": "trace", "path": "replay.jsonl"}
            ao.write_text("scenario.yaml", yaml.safe_dump(saved, sort_keys=False))
            if plots:
                cdf_plot(run, res, ao.path("plots/cdf.png"))
                from ..report import write as write_html      # reads cosim.json, as `dsim report` does
                write_html(ao.tmp, "cosim")
        rep["out_dir"] = str(ao.out)
    return rep


_MARK = {True: "pass", False: "fail", None: "n/a"}


def cosim_cli(args, columns) -> int:
    """``dsim cosim``: one replay, or with ``--holdout`` the 80/20 replay (dsim.calibrate.holdout)."""
    from ..config.scenario import read_scenario_file
    from .realrun import load_real
    run = load_real(args.real, hardware=args.hardware, model=args.model, columns=columns, time_unit=args.time_unit)
    if args.model:
        run.scenario["model"] = args.model
    if args.hardware:
        run.scenario["hardware"] = args.hardware
    base = read_scenario_file(args.scenario) if args.scenario else None
    fit_opts = {"latency_model": args.latency_model, "max_evals": args.max_evals, "jobs": args.jobs}
    if args.holdout is None and any(v is not None for v in fit_opts.values()):
        given = next(k for k, v in fit_opts.items() if v is not None)
        raise ConfigError(f"--{given.replace('_', '-')}", fit_opts[given], "--holdout as well (it sets the fit "
                          "of the 80/20 replay)")
    out = args.out
    if out is None:
        from ..runner import inputs_out_dir
        out = inputs_out_dir("cosim", run.name, [args.real], {
            "scenario": base, "overrides": args.overrides, "seed": args.seed, "hardware": args.hardware,
            "model": args.model, "columns": args.columns, "time_unit": args.time_unit,
            **({"holdout": args.holdout, **fit_opts} if args.holdout is not None else {})})
    if args.holdout is not None:
        from ..config.limits import MAX_EVALS, MAX_JOBS, check_flag
        from .holdout import holdout_cosim
        max_evals, jobs = fit_opts["max_evals"] or 40, fit_opts["jobs"] or 1
        check_flag("--max-evals", max_evals, 1, MAX_EVALS)
        check_flag("--jobs", jobs, 1, MAX_JOBS)
        rep = holdout_cosim(run, args.holdout, base, args.overrides, args.seed, out, not args.no_plots,
                            fit_opts["latency_model"] or "roofline", max_evals, jobs)
    else:
        rep = cosimulate(run, base, args.overrides, args.seed, out, plots=not args.no_plots)
    for st in rep["stages"]:
        cells = "  ".join(f"{m.upper()} {c['mape']:.1%}" for m, c in st["metrics"].items() if c["mape"] is not None)
        print(f"{run.name} {st['stage']}: MAPE {cells}" + ("  (overloaded)" if st["overloaded"] else ""))
        marks = [(m, c["pass"]) for m, c in st["metrics"].items() if c.get("ks") is not None]
        if marks:
            print(f"{run.name} {st['stage']}: KS " + "  ".join(
                f"{m.upper()} {p['ks']['value']:.3f} {_MARK[p['passed']]}" for m, p in marks)
                + f"  (pass: KS < {KS_PASS} and |median error| < {MEDIAN_PASS:.0%}): stage "
                + _MARK[st["passed"]].upper())
    if rep.get("kv_cache"):
        from .kvevents import kv_lines
        for line in kv_lines(run.name, rep["kv_cache"]):
            print(line)
    mm = rep["mean_mape"]
    print(f"mean MAPE (TTFT/TPOT/E2E): {'n/a' if mm is None else f'{mm:.1%}'}; report: {rep['out_dir']}")
    return 0
