"""The `dsim calibrate` command: read runs, fill in what they do not say, fit, check, write.

Writes ``DIR/calibrated.yaml`` (a complete scenario: the base scenario, the first run's model,
hardware, engine and workload, and the fitted ``latency`` section), ``DIR/report.json`` and
``DIR/report.md`` (errors per run, stage, metric and quantile before and after, fitted values with
their uncertainty, leave-one-run-out errors), atomically: nothing is written when a step fails.
"""
from __future__ import annotations

import copy
import logging
import math
from pathlib import Path

import yaml

from ..config.errors import ConfigError
from ..config.scenario import apply_overrides
from .calibrate import (DEFAULT_OPTIMIZER, SPACES, evaluate, get_value, loss_of, physical_issues, run_errors,
                        set_value, space_for, stage1, stage1_problem, stage2, start_latency)
from ..metrics.writers import AtomicOutput, to_json
from .cliff import real_bracket
from .cosim import _merge, assumed_settings, replay_rows, trace_text

_log = logging.getLogger(__name__)


def replica_context(run, base=None, overrides=()):
    """LatencyContext of the replica that replays ``run``."""
    from ..config.scenario import load_scenario
    from ..latency.base import LatencyContext
    from .cosim import replay_scenario
    scn = replay_scenario(run, base, overrides, None, Path("unused.jsonl") if run.trace_rows is not None else None)
    scn["workload"] = {"type": "poisson", "rate": 1.0, "num_requests": 1, "prompt_tokens": 1, "output_tokens": 1}
    scn.pop("cluster", None)
    s = load_scenario(scn)
    return LatencyContext(s.model, s.device, s.engine, s.engine.kv_blocks(s.model, s.device))


def calibrate(runs, out_dir, base=None, overrides=(), kind="roofline", max_evals=40, jobs=1, seed=42,
              allow_nonphysical=False, loro=True, log=None, warn=None, optimizer=None,
              system=False, cliff_weight=0.0) -> dict:
    """Fit ``kind`` on ``runs`` (RealRun list) and write the calibrated scenario and report; progress
    goes to ``log`` and assumptions to ``warn`` (default: the ``dsim`` logger's INFO and WARNING)."""
    log = log or _log.info
    warn = warn or _log.warning
    if kind not in SPACES:
        raise ConfigError("--latency-model", kind, "one of " + ", ".join(SPACES))
    overrides, lat_sets = split_latency_sets(overrides)
    ctxs = [replica_context(r, base, overrides) for r in runs]       # every run replayable, or an error first
    with AtomicOutput(Path(out_dir)) as ao:                   # an unwritable --out fails before any simulation
        report = fit_runs(runs, ctxs, base, overrides, lat_sets, kind, max_evals, jobs, seed, allow_nonphysical,
                          loro, log, warn, optimizer, system, cliff_weight)
        scn = _scenario(runs[0], base, overrides, report["fitted"], seed)
        held = held_out_errors(report["leave_one_run_out"])
        if held:                               # the error band of every answer run on this calibration
            scn["latency"]["held_out_errors"] = held
        if runs[0].trace_rows is not None:
            ao.write_text("replay.jsonl", trace_text(replay_rows(runs[0], seed)))
        ao.write_text("calibrated.yaml", "# written by dsim calibrate; dsim run / dsim cosim --scenario accept it\n"
                      + yaml.safe_dump(scn, sort_keys=False))
        ao.write_text("report.json", to_json(report))
        ao.write_text("report.md", markdown(report))
        from ..report import write as write_html          # reads report.json, as `dsim report` does
        write_html(ao.tmp, "calibrate")
    report["out_dir"] = str(ao.out)
    return report


def split_latency_sets(overrides) -> tuple[list, list]:
    """(replay overrides, ``--set latency.*`` ones): the latter shape the fit's starting point (the fit
    replaces the replay's latency section)."""
    lat_sets = [o for o in overrides if o.strip().startswith("latency.")]
    return [o for o in overrides if o not in lat_sets], lat_sets


def fit_runs(runs, ctxs, base, overrides, lat_sets, kind, max_evals, jobs, seed, allow_nonphysical, loro, log,
             warn, optimizer=None, system=False, cliff_weight=0.0) -> dict:
    """Stages 1 and 2, the physical check and the errors before/after (no files); ``ctxs`` from
    ``replica_context``.  The report's ``fitted`` is the calibrated latency section; ``system``: add
    seed 003's system-level report (dsim.calibrate.system); ``cliff_weight`` > 0: stage 2's loss
    adds the saturation-cliff penalty (dsim.calibrate.cliff)."""
    ctx = ctxs[0]
    optimizer = optimizer or DEFAULT_OPTIMIZER.get(kind, "nelder-mead")
    assumed = {r.name: assumed_settings(r, base, overrides) for r in runs}
    for name, lines in assumed.items():
        for line in lines:
            warn(f"{name}: {line}")
    lat0 = start_latency(kind, ctx)
    if base and isinstance(base.get("latency"), dict) and base["latency"].get("model") == kind:
        lat0 = _merge(lat0, base["latency"])
    if lat_sets:
        lat0 = apply_overrides({"latency": lat0}, lat_sets)["latency"]
        if lat0.get("model") != kind:
            raise ConfigError("--set latency.model", lat0.get("model"), f"the --latency-model being fitted ({kind})")
        physical_issues(lat0, ctx)          # builds the model: a bad key or value is an error here
    before = evaluate(runs, base, overrides, seed, lat0, jobs)
    _check_loss(loss_of(before), runs, "before fitting")
    lat1 = copy.deepcopy(lat0)
    prob = stage1_problem(runs, ctxs, lat0)
    s1 = stage1(runs, ctxs, lat0, prob)
    if s1 is not None:
        for k, v in s1["values"].items():
            set_value(lat1, k, min(max(v, 0.0), 1.0) if k.endswith("efficiency") else v)
        log(f"stage 1 ({', '.join(s1['runs'])}): {s1['requests']} decode windows, relative MAPE {s1['mape']:.1%}: "
            + ", ".join(f"{k} {v:.4g}" for k, v in s1["values"].items()))
    space = space_for(kind, ctx)
    if all(r.meta.get("clock") == "engine" for r in runs):
        # engine-side timestamps carry no API-server time: a0 is not observable, keep the default
        space = tuple(p for p in space if p.name != "alpha.0")
    if s1 is not None and loss_of(evaluate(runs, base, overrides, seed, lat1, jobs)) > loss_of(before):
        log("stage 1's values fit the metrics worse than the defaults: stage 2 starts from the defaults")
        s1["used"] = False
        lat1 = copy.deepcopy(lat0)
    s2 = stage2(runs, base, overrides, seed, lat1, space, max_evals, jobs, log, optimizer, cliff_weight)
    lat = s2["latency"]
    issues = physical_issues(lat, ctx)
    if issues and not allow_nonphysical:
        raise ConfigError("calibrate", None, "a physical result; the fit is faster than the hardware: "
                          + "; ".join(issues) + " (rerun with --allow-nonphysical to write it anyway)",
                          show_value=False)
    after = evaluate(runs, base, overrides, seed, lat, jobs)
    _check_loss(loss_of(after), runs, "after fitting")
    loro_rows = []
    if loro and len(runs) > 1:
        for i, held in enumerate(runs):
            rest = [r for j, r in enumerate(runs) if j != i]
            if all(r.overloaded for r in rest):
                continue
            w = cliff_weight if any(real_bracket(r) for r in rest) else 0.0
            fit = stage2(rest, base, overrides, seed, lat1, space, max(8, max_evals // 2), jobs, optimizer=optimizer,
                         cliff_weight=w)
            rep = evaluate([held], base, overrides, seed, fit["latency"], jobs)[0]
            loro_rows.append({"held_out": held.name, "errors": run_errors(rep)})
    report = {"latency_model": kind, "runs": [r.name for r in runs], "assumed": assumed,
              "start": lat0, "stage1": s1, "stage2": {k: v for k, v in s2.items() if k != "latency"},
              "fitted": lat, "physical_issues": issues,
              "loss": {"before": loss_of(before), "after": loss_of(after)},
              "errors": [{"run": r.name, "before": run_errors(b), "after": run_errors(a)}
                         for r, b, a in zip(runs, before, after)],
              "leave_one_run_out": loro_rows}
    from .diagnostics import calibrate_diagnostics
    report["diagnostics"] = calibrate_diagnostics(prob, ctxs, kind, space, lat, s2["targets"],
                                                  stage1_used=bool(s1 and s1.get("used", True)), optimizer=optimizer)
    if system:
        from .system import system_report
        log("system-level report: replays done; saturation cliffs of the overloaded staged runs")
        report["system"] = system_report(runs, after, lat, base=base, overrides=overrides, seed=seed)
    return report


_COLUMN = {"e2e mean": "e2e_mean_err", "ttft p50": "ttft_p50_err", "tpot p50": "tpot_p50_err"}


def held_out_errors(loro_rows) -> dict:
    """Leave-one-run-out errors by error-band column (dsim.metrics.band): what this calibration got
    wrong on runs it was not fitted on."""
    out: dict = {}
    for row in loro_rows:
        for _stage, metric, e in row["errors"]:
            if metric in _COLUMN:
                out.setdefault(_COLUMN[metric], []).append(round(float(e), 6))
    return out


def _check_loss(loss: float, runs, when: str) -> None:
    """A fit with nothing to fit (no target quantile compared, so the loss is inf or NaN) is an
    error: it used to write calibrated.yaml with 'loss inf -> inf'."""
    if math.isfinite(loss):
        return
    raise ConfigError(", ".join(r.path for r in runs), None,
                      f"runs with a target to fit: the loss {when} is {loss} because no E2E mean, TTFT p50/p90 "
                      "or TPOT p50 of a non-overloaded stage could be compared (real values 0 or missing: "
                      "identical timestamps?)", show_value=False)


def _scenario(run, base, overrides, lat, seed) -> dict:
    from .cosim import replay_scenario
    scn = replay_scenario(run, base, overrides, seed, Path("replay.jsonl") if run.trace_rows is not None else None)
    scn["latency"] = copy.deepcopy(lat)
    if scn.get("hardware") and isinstance(scn["hardware"], str):
        scn["latency"]["fitted_on"] = scn["hardware"]       # dsim warns when it runs on another GPU
    scn["name"] = f"calibrated-{run.name}"
    scn.get("output", {}).pop("plots", None)
    if not scn.get("output"):
        scn.pop("output", None)
    return scn


def _pct(x):
    return "n/a" if x is None else f"{x:+.1%}"


def markdown(rep: dict) -> str:
    lines = [f"# dsim calibrate: {', '.join(rep['runs'])}", "",
             f"Latency model `{rep['latency_model']}`; loss (mean |log(sim/real)| over E2E mean, TTFT p50/p90, "
             f"TPOT p50 of the non-overloaded stages): {rep['loss']['before']:.4f} before, "
             f"{rep['loss']['after']:.4f} after.", ""]
    s2 = rep["stage2"]
    lines += [f"Stage 2 ({s2.get('optimizer', 'nelder-mead')}): {s2['evaluations']} simulations, "
              f"{'converged' if s2['converged'] else 'NOT converged'} ({s2['reason']}).", ""]
    if s2.get("cliff_penalty"):
        cp = s2["cliff_penalty"]
        lines += [f"Saturation-cliff penalty (weight {cp['weight']:g}, margin {cp['margin']:.0%}; in stage 2's loss, "
                  f"not in the losses above): {cp['start']['value']:.4f} at the start, {cp['result']['value']:.4f} "
                  "at the result; per run: " + ", ".join(f"{k} {v:.4f}" for k, v in cp["result"]["per_run"].items())
                  + ".", ""]
    if rep["stage1"]:
        s1 = rep["stage1"]
        lines += [f"Stage 1: {s1['requests']} decode windows (batch {s1['batch_range'][0]:.1f}-"
                  f"{s1['batch_range'][1]:.1f}), relative MAPE {s1['mape']:.1%}.", "",
                  "| parameter | stage 1 | std. error |", "|---|---|---|"]
        lines += [f"| {k} | {v:.4g} | {s1['stderr'][k]:.2g} |" for k, v in s1["values"].items()]
        lines.append("")
    lines += ["| fitted parameter | value | +- (half the final simplex's range) |", "|---|---|---|"]
    for k, u in s2["uncertainty"].items():
        lines.append(f"| {k} | {get_value(rep['fitted'], k):.4g} | {u:.2g} |")
    lines += ["", "## Errors (sim - real) / real", "", "| run | stage | metric | before | after |",
              "|---|---|---|---|---|"]
    for e in rep["errors"]:
        after = {(s, m): v for s, m, v in e["after"]}
        for s, m, v in e["before"]:
            lines.append(f"| {e['run']} | {s} | {m} | {_pct(v)} | {_pct(after.get((s, m)))} |")
    if rep["leave_one_run_out"]:
        lines += ["", "## Leave one run out (fitted on the others)", "", "| held out | stage | metric | error |",
                  "|---|---|---|---|"]
        for row in rep["leave_one_run_out"]:
            lines += [f"| {row['held_out']} | {s} | {m} | {_pct(v)} |" for s, m, v in row["errors"]]
    if rep.get("diagnostics"):
        from .diagnostics import markdown_lines
        lines += [""] + markdown_lines(rep["diagnostics"])
    if rep.get("system"):
        from .system import markdown_lines as system_lines
        lines += [""] + system_lines(rep["system"])
    if any(rep["assumed"].values()):
        lines += ["", "## Assumed settings", ""]
        for name, items in rep["assumed"].items():
            lines += [f"* {name}: {x}" for x in items]
    return "\n".join(lines) + "\n"


def calibrate_cli(args, columns) -> int:
    from ..config.scenario import read_scenario_file
    from .realrun import load_real
    from ..config.limits import MAX_EVALS, MAX_JOBS, MAX_SEED, check_flag
    check_flag("--max-evals", args.max_evals, 1, MAX_EVALS)
    check_flag("--jobs", args.jobs, 1, MAX_JOBS)
    check_flag("--seed", getattr(args, "seed", None), 0, MAX_SEED)
    if not (0 <= args.cliff_penalty < math.inf):
        raise ConfigError("--cliff-penalty", args.cliff_penalty, "a weight >= 0 (0: no penalty)")
    if (args.optimizer or DEFAULT_OPTIMIZER.get(args.latency_model)) == "bayesian":
        from .bayes import _optuna
        _optuna()               # before any run is read or simulated: not after stage 1
    base = read_scenario_file(args.scenario) if args.scenario else None
    runs = []
    for p in args.real:
        run = load_real(p, hardware=args.hardware, model=args.model, columns=columns, time_unit=args.time_unit)
        if args.model:
            run.scenario["model"] = args.model
        if args.hardware:
            run.scenario["hardware"] = args.hardware
        runs.append(run)
    out = args.out
    if out is None:
        from ..runner import inputs_out_dir
        settings = {
            "scenario": base, "overrides": args.overrides, "latency_model": args.latency_model,
            "max_evals": args.max_evals, "seed": args.seed, "hardware": args.hardware, "model": args.model,
            "columns": columns, "time_unit": args.time_unit, "allow_nonphysical": args.allow_nonphysical,
            "loro": not args.no_loro}
        if args.optimizer not in (None, "nelder-mead") or args.evaluate:   # a default run's folder keeps its name
            settings.update(optimizer=args.optimizer, evaluate=args.evaluate)
        if args.cliff_penalty:
            settings["cliff_penalty"] = args.cliff_penalty
        out = inputs_out_dir("calibrate", runs[0].name, args.real, settings)
    rep = calibrate(runs, Path(out), base, args.overrides, args.latency_model, args.max_evals, args.jobs, args.seed,
                    args.allow_nonphysical, not args.no_loro, optimizer=args.optimizer, system=args.evaluate,
                    cliff_weight=args.cliff_penalty)
    print(f"loss {rep['loss']['before']:.4f} -> {rep['loss']['after']:.4f}; "
          f"{'converged' if rep['stage2']['converged'] else 'NOT converged: ' + rep['stage2']['reason']}")
    from .diagnostics import console_lines
    for line in console_lines(rep["diagnostics"]):
        print(line)
    if rep.get("system"):
        from .system import console_lines as system_console
        for line in system_console(rep["system"]):
            print(line)
    print(f"wrote {rep['out_dir']}/calibrated.yaml, report.md, report.json")
    return 0
