"""report.html of ``dsim cosim`` (sim vs real per metric and percentile, per stage) and ``dsim
calibrate`` (the errors before and after the fit, per run, stage, metric and percentile).

Reads cosim.json, or report.json of a calibration."""
from __future__ import annotations

import json
from pathlib import Path

from . import charts
from .html import Page


def build_cosim(d: Path) -> str:
    rep = json.loads((d / "cosim.json").read_text())
    page = Page(f"dsim cosim: {rep.get('run')} ({rep.get('source')})", "cosim")
    mm = rep.get("mean_mape")
    page.para(f"Mean absolute percentage error of the simulation over TTFT/TPOT/E2E percentiles of the "
              f"non-overloaded stages: {'n/a' if mm is None else f'{mm:.1%}'}"
              + (" (the real run was overloaded)" if rep.get("overloaded") else "") + ".", "answer")
    page.para(f"Latency model: {json.dumps(rep.get('latency'), sort_keys=True)}; seed {rep.get('seed')}.", "note")
    for n in rep.get("notes", []):
        page.para(n, "note")
    panels, table = [], []
    for st in rep.get("stages", []):
        for m, c in st.get("metrics", {}).items():
            rows = []
            for q in c.get("real", {}):
                for side in ("real", "sim"):
                    v = c[side].get(q)
                    rows.append({"quantile": q, "side": side, "ms": v, "error": c.get("error", {}).get(q),
                                 "stage": st["stage"], "metric": m.upper()})
                table.append([st["stage"], m.upper(), q, c["real"].get(q), c["sim"].get(q),
                              None if c.get("error", {}).get(q) is None else f"{c['error'][q]:+.1%}"])
            mape = c.get("mape")
            panels.append(charts.bars(rows, x="quantile", y="ms", color="side", column_title="statistic",
                                      title=f"{m.upper()}, stage {st['stage']}" + ("" if mape is None else
                                                                                  f" (MAPE {mape:.1%})")
                                      + (" overloaded" if st.get("overloaded") else ""),
                                      ylabel="ms", tooltip=["stage", "metric", "quantile", "side", "ms", "error"]))
    page.h2("Real vs simulated, per metric and percentile (hover a bar)")
    g = charts.grid(panels)
    if g is not None:
        page.chart(charts.finish(g))
    page.h2("Every comparison")
    page.table(["stage", "metric", "statistic", "real (ms)", "sim (ms)", "error"], table, left=3)
    marks = [[st["stage"], m.upper(), c["pass"]["ks"]["value"], _mark(c["pass"]["ks"]["passed"]),
              None if c["pass"]["median_error"]["value"] is None else f"{c['pass']['median_error']['value']:+.1%}",
              _mark(c["pass"]["median_error"]["passed"]), _mark(c["pass"]["passed"])]
             for st in rep.get("stages", []) for m, c in st.get("metrics", {}).items() if c.get("pass")]
    if marks:
        page.h2("Pass marks (seed 000 Iteration 10: KS < 0.15 and |median error| < 20 % per metric)")
        if rep.get("holdout"):
            h = rep["holdout"]
            page.para(f"80/20 replay: {h['latency_model']} fitted on the {h['requests']['fitted']} requests arriving "
                      f"before {h['split_arrival_s']:.2f} s, the last {h['fraction']:.0%} "
                      f"({h['requests']['held_out']} requests) held out.", "note")
        page.table(["stage", "metric", "KS", "KS < 0.15", "median error", "< 20 %", "pass"], marks, left=2)
    thr = [[st["stage"], k, t.get("real"), t.get("sim"), None if t.get("error") is None else f"{t['error']:+.1%}"]
           for st in rep.get("stages", []) for k, t in st.get("throughput", {}).items()]
    if thr:
        page.h2("Throughput")
        page.table(["stage", "quantity", "real", "sim", "error"], thr, left=2)
    if rep.get("diagnostics"):                  # --holdout: the fit on the first part
        _diagnostics(page, rep["diagnostics"])
    return page.render()


def _mark(x):
    return "n/a" if x is None else ("pass" if x else "FAIL")


def pct(x) -> str:
    """A share as a percentage with one decimal, "n/a" for None (the calibration diagnostics' form)."""
    return "n/a" if x is None else f"{x:.1%}"


def acceptance_line(a: dict) -> str:
    """One acceptance criterion of a fit (dsim.calibrate.diagnostics) as a line of the report and console."""
    if a["threshold"] is None:
        verdict = "not evaluated" if a["passed"] is None else ("passed" if a["passed"] else
                                                                 "FAILED: " + ", ".join(a["failed"]))
        return f"{a['criterion']} ({a['metric']}): {verdict}"
    head = f"{a['applies_to']} {a['criterion']} < {a['threshold']:.0%}"
    if a["passed"] is None:
        return f"{head}: not evaluated ({a['not_evaluated']})"
    n = len(a["values"])
    return (f"{head}: worst {pct(a['worst'])} of {n} configuration{'s' if n > 1 else ''} "
            f"{'passed' if a['passed'] else 'FAILED'} [{a['metric']}]")


def _diagnostics(page, diag: dict) -> None:
    """df and the acceptance criteria of a fit (dsim.calibrate.diagnostics)."""
    page.h2("Diagnostics (seed 000 training pipeline)")
    for side, x in diag.get("degrees_of_freedom", {}).items():
        if "df" in x:
            page.para(f"Effective degrees of freedom ({side}): {x['df']:.2f} of {x.get('coefficients')} coefficients "
                      f"on {x['rows']} rows ({x['method']}).", "note")
    page.table(["acceptance criterion (seed 000 Iteration 9 Note 4)"], [[acceptance_line(a)] for a in
                                                                        diag.get("acceptance", [])], left=1)


def build_calibrate(d: Path) -> str:
    rep = json.loads((d / "report.json").read_text())
    page = Page(f"dsim calibrate: {', '.join(rep.get('runs', []))}", "calibrate")
    loss, s2 = rep.get("loss", {}), rep.get("stage2", {})
    page.para(f"Latency model {rep.get('latency_model')} fitted: loss (mean |log(sim/real)|) "
              f"{loss.get('before', float('nan')):.4f} before, {loss.get('after', float('nan')):.4f} after; stage 2 "
              f"{'converged' if s2.get('converged') else 'did NOT converge'} ({s2.get('reason', '')}).", "answer")
    rows, table = [], []
    for e in rep.get("errors", []):
        after = {(s, m): v for s, m, v in e.get("after", [])}
        for s, m, v in e.get("before", []):
            a = after.get((s, m))
            for when, val in (("before", v), ("after", a)):
                rows.append({"run": e["run"], "stage": s, "metric": f"{m} ({s})" if s != "all" else m, "when": when,
                             "error_pct": None if val is None else round(val * 100, 4)})
            table.append([e["run"], s, m, None if v is None else f"{v:+.1%}", None if a is None else f"{a:+.1%}"])
    panels = []
    for run in dict.fromkeys(r["run"] for r in rows):
        panels.append(charts.bars([r for r in rows if r["run"] == run], x="metric", y="error_pct", color="when",
                                  column_title="metric and percentile", title=f"{run}: (sim - real) / real",
                                  ylabel="error (%)", tooltip=["run", "stage", "metric", "when", "error_pct"],
                                  log=False, zero_rule=True))
    page.h2("Sim vs real before and after the fit, per metric and percentile (hover a bar)")
    g = charts.grid(panels)
    if g is not None:
        page.chart(charts.finish(g))
    page.h2("Errors (sim - real) / real")
    page.table(["run", "stage", "metric", "before", "after"], table, left=3)
    loro = [[r["held_out"], s, m, None if v is None else f"{v:+.1%}"] for r in rep.get("leave_one_run_out", [])
            for s, m, v in r.get("errors", [])]
    if loro:
        page.h2("Leave one run out (fitted on the others)")
        page.table(["held out", "stage", "metric", "error"], loro, left=3)
    if rep.get("diagnostics"):
        _diagnostics(page, rep["diagnostics"])
    return page.render()
