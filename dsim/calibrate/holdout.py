"""``dsim cosim --holdout 0.2``: seed 000's end-to-end validation (Iteration 10): calibrate on the first
80 % of a real run, replay the run's arrival pattern with the fitted latency model, compare the last
20 % with KS < 0.15 and median error < 20 % per metric.

The split is by arrival time: the held-out requests are those arriving in the last ``fraction`` of
the run's arrival span (first to last arrival).  The run becomes two stages, the first fitted, the
second marked ``held_out``: its measurements enter neither stage 1 (its requests' decode windows are
not fitted) nor stage 2's loss, but its requests are replayed, so the fitted stage and the compared
one see the load they saw in reality.  The fit is ``dsim calibrate``'s (``command.fit_runs``), the
comparison ``dsim cosim``'s (``cosim.cosimulate``).
"""
from __future__ import annotations

import copy
import logging

import numpy as np

from ..config.errors import ConfigError
from .runs import RealRun, Stage, quantiles

_log = logging.getLogger(__name__)


def split_run(run: RealRun, fraction: float) -> RealRun:
    """A copy of ``run`` with two stages: the requests arriving before the last ``fraction`` of the
    arrival span, and the rest (``held_out``)."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < 1:
        raise ConfigError("--holdout", fraction, "a fraction in (0, 1), e.g. 0.2 (the last 20 % of the run)")
    per = run.meta.get("per_request")
    if run.trace_rows is None or run.meta.get("regenerate") or not per:
        raise ConfigError(run.path, None, "a per-request run with exact arrival times for --holdout (a meta.json + "
                          "requests.jsonl folder, a CSV/JSONL with --columns, or a vllm bench JSON with "
                          "start_times); aggregates or regenerated arrivals cannot be split by time", show_value=False)
    arr = np.array([r["arrival_s"] for r in run.trace_rows], float)
    lo, hi = float(arr.min()), float(arr.max())
    cut = lo + (1 - fraction) * (hi - lo)
    held = arr >= cut
    if held.all() or not held.any() or hi <= lo:
        raise ConfigError(run.path, None, "requests arriving at different times for --holdout (the split is by "
                          "arrival time)", show_value=False)

    def stage(name, mask, t0, t1, held_out):
        samples = {m: [v for v, k in zip(per[m], mask) if k and v is not None] for m in ("ttft", "tpot", "e2e")}
        a = arr[mask]
        span = float(a.max() - a.min())
        return Stage(name, t0, t1, {m: quantiles(v) for m, v in samples.items()}, samples,
                     rate=len(a) / span if span > 0 else None, held_out=held_out)
    out = copy.deepcopy(run)
    pct = round(100 * fraction, 6)
    out.stages = [stage(f"first {100 - pct:g} %", ~held, 0.0, cut, False),
                  stage(f"last {pct:g} % (held out)", held, cut, float("inf"), True)]
    if out.meta.get("token_times"):
        out.meta["token_times"]["held_out"] = [bool(h) for h in held]
    out.meta["holdout"] = {"fraction": fraction, "split_arrival_s": cut,
                           "requests": {"fitted": int((~held).sum()), "held_out": int(held.sum())}}
    out.notes = list(out.notes) + [
        f"80/20 replay: fitted on the {int((~held).sum())} requests arriving before {cut:.3f} s; the last "
        f"{pct:g} % of the arrival span ({int(held.sum())} requests) is held out (replayed, not fitted); "
        "throughput is not compared per split stage"]
    return out


def holdout_cosim(run: RealRun, fraction: float, base=None, overrides=(), seed=None, out_dir=None, plots=True,
                  kind: str = "roofline", max_evals: int = 40, jobs: int = 1, log=None, warn=None) -> dict:
    """Fit ``kind`` on the first part of ``run``, replay it whole, report the held-out part's pass marks."""
    from .command import fit_runs, replica_context, split_latency_sets
    from .cosim import cosimulate
    split = split_run(run, fraction)
    seed = 42 if seed is None else seed
    replay, lat_sets = split_latency_sets(list(overrides))
    ctxs = [replica_context(split, base, replay)]
    fit = fit_runs([split], ctxs, base, replay, lat_sets, kind, max_evals, jobs, seed, True, False,
                   log or _log.info, warn or _log.warning)
    h = dict(split.meta["holdout"])
    h.update({"latency_model": kind, "physical_issues": fit["physical_issues"],
              "fit": {"loss_before": fit["loss"]["before"], "loss_after": fit["loss"]["after"],
                      "evaluations": fit["stage2"]["evaluations"], "converged": fit["stage2"]["converged"],
                      "stage1_mape": (fit["stage1"] or {}).get("mape")},
              "criteria": "seed 000 Iteration 10: KS < 0.15 and |median error| < 20 % for each metric"})
    rep = cosimulate(split, base, replay, seed, out_dir, plots, latency=fit["fitted"],
                     extra={"holdout": h, "diagnostics": fit["diagnostics"]})
    return rep
