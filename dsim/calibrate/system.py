"""`dsim calibrate --evaluate`: the system-level accuracy report of seed 003 Part 7.

With the fitted coefficients in the loop, on every run given:

* E2E MAPE < 15 %: mean |error| of the E2E mean over the non-overloaded stages;
* TTFT worst case < 100 % ("no false saturation"): the largest |error| of the TTFT mean, p50 and
  p90 over those stages;
* saturation cliff within 20 % of the real one: for each staged run with an overloaded stage, the
  real cliff lies between its highest stage that kept up and its lowest overloaded stage; the
  simulated cliff (``cliff.saturation_cliff``: the lowest offered rate at which TTFT p50 exceeds 3x
  its low-load value, bisected to 2 %) passes when it lies within 20 % of that bracket.
"""
from __future__ import annotations

import math

from .calibrate import run_errors
from .cliff import MARGIN as CLIFF
from .cliff import real_bracket

E2E_MAPE = 0.15
TTFT_WORST = 1.0


def system_report(runs, reports, lat: dict, cliffs: bool = True, base=None, overrides=(), seed: int = 42) -> dict:
    """``reports``: the cosim reports of ``runs`` replayed with the fitted latency section ``lat``."""
    e2e, ttft = [], []
    for run, rep in zip(runs, reports):
        for st in rep["stages"]:
            if st["overloaded"] or st.get("held_out"):
                continue
            m = st["metrics"]
            e = m.get("e2e", {}).get("error", {}).get("mean")
            if e is not None:
                e2e.append((run.name, st["stage"], float(e)))
            for q in ("mean", "p50", "p90"):
                e = m.get("ttft", {}).get("error", {}).get(q)
                if e is not None:
                    ttft.append((run.name, st["stage"], f"ttft {q}", float(e)))
    out = {"thresholds": {"e2e_mape": E2E_MAPE, "ttft_worst": TTFT_WORST, "cliff": CLIFF}}
    mape = sum(abs(e) for *_, e in e2e) / len(e2e) if e2e else None
    out["e2e_mape"] = {"value": mape, "stages": len(e2e), "pass": None if mape is None else mape < E2E_MAPE}
    worst = max(ttft, key=lambda r: abs(r[3])) if ttft else None
    out["ttft_worst"] = {"value": None if worst is None else abs(worst[3]),
                         "where": None if worst is None else f"{worst[0]} {worst[1]} {worst[2]}",
                         "pass": None if worst is None else abs(worst[3]) < TTFT_WORST}
    out["cliffs"] = [cliff_row(run, lat, base, overrides, seed) for run in runs
                     if cliffs and real_bracket(run) is not None]
    out["runs_compared"] = [r.name for r in runs]
    out["errors_after"] = {run.name: run_errors(rep) for run, rep in zip(runs, reports)}
    return out


def cliff_row(run, lat: dict, base=None, overrides=(), seed: int = 42) -> dict:
    """The real cliff's bracket and the simulated cliff of one staged run with an overloaded stage."""
    from .cliff import penalty, saturation_cliff
    lo, hi = real_bracket(run)
    c = saturation_cliff(run, lat, base, overrides, seed)
    ok = c.rate is not None and lo * (1 - CLIFF) <= c.rate <= hi * (1 + CLIFF)
    return {"run": run.name, "real_above_rps": lo, "real_at_most_rps": hi, "sim_cliff_rps": c.rate,
            "sim_keeps_up_rps": c.below, "simulations": c.simulations, "bisected": c.converged,
            "penalty": penalty(c, (lo, hi)),
            "low_load_ttft_ms": c.low_ttft_s * 1e3 if math.isfinite(c.low_ttft_s) else None, "pass": ok}


def _pct(v) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def _verdict(v) -> str:
    return "n/a" if v is None else ("pass" if v else "FAIL")


def markdown_lines(sysrep: dict) -> list:
    e, t = sysrep["e2e_mape"], sysrep["ttft_worst"]
    where = "" if t["where"] is None else f" ({t['where']})"
    lines = ["## System-level accuracy (seed 003 Part 7, `--evaluate`)", "",
             "| criterion | threshold | measured | verdict |", "|---|---|---|---|",
             f"| E2E mean MAPE over {e['stages']} non-overloaded stages | < {E2E_MAPE:.0%} | {_pct(e['value'])} | "
             f"{_verdict(e['pass'])} |",
             f"| TTFT worst case (mean, p50, p90) | < {TTFT_WORST:.0%} | {_pct(t['value'])}{where} | "
             f"{_verdict(t['pass'])} |"]
    for c in sysrep["cliffs"]:
        sim = (f"none up to {c['sim_keeps_up_rps']:.4g} req/s" if c["sim_cliff_rps"] is None else
               f"{c['sim_cliff_rps']:.4g} req/s (keeps up at {c['sim_keeps_up_rps']:.4g}, "
               f"{c['simulations']} simulations)")
        lines.append(f"| saturation cliff, {c['run']} | within {CLIFF:.0%} of ({c['real_above_rps']:g}, "
                     f"{c['real_at_most_rps']:g}] req/s | {sim} | {_verdict(c['pass'])} |")
    if not sysrep["cliffs"]:
        lines.append("| saturation cliff | - | no staged run with an overloaded stage was given | n/a |")
    return lines + [""]


def console_lines(sysrep: dict) -> list:
    e, t = sysrep["e2e_mape"], sysrep["ttft_worst"]
    out = [f"system level: E2E MAPE {_pct(e['value'])} (< {E2E_MAPE:.0%}: {_verdict(e['pass'])}), "
           f"TTFT worst {_pct(t['value'])} (< {TTFT_WORST:.0%}: {_verdict(t['pass'])})"]
    for c in sysrep["cliffs"]:
        sim = "none found" if c["sim_cliff_rps"] is None else f"{c['sim_cliff_rps']:.4g}"
        out.append(f"  cliff {c['run']}: sim {sim} req/s, real in ({c['real_above_rps']:g}, "
                   f"{c['real_at_most_rps']:g}]: {_verdict(c['pass'])}")
    return out
