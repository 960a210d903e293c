"""report.html of a ``dsim plan`` folder: the answer in words, every candidate (simulated ones on
the chart, hoverable with their configuration; pruned ones in the table with the reason), and
the Pareto front over the configurations that meet the SLOs only.

Reads plan.md (title, answer and budget lines) and candidates.csv (the Pareto fronts are its
front_tokens and front_cost columns)."""
from __future__ import annotations

from pathlib import Path

from . import charts
from .html import Page
from .sweep import read_csv

_META = ("screen", "reason", "est_tpot_ms", "est_ttft_floor_ms", "est_batch", "pass", "reasons", "request_goodput",
         "goodput_fraction", "efficiency_goodput_per_gpu_s", "efficiency_output_tokens_per_s_per_gpu",
         "efficiency_output_tokens_per_s_per_user", "efficiency_usd_per_hour", "p99_ttft_ms", "p99_tpot_ms",
         "front_tokens", "front_cost", "band_validated", "pessimistic_pass", "pessimistic_step_scale")


def _md(d: Path) -> tuple[str, str, str]:
    title, answer, budget = "plan", "", ""
    for ln in (d / "plan.md").read_text().splitlines():
        if ln.startswith("# Plan: ") and title == "plan":
            title = ln[len("# Plan: "):]
        elif ln.startswith("**") and ln.endswith("**") and not answer:
            answer = ln.strip("*")
        elif ln.startswith("Budget ") and not budget:
            budget = ln
    return title, answer, budget


def build(d: Path) -> str:
    title, answer, budget = _md(d)
    rows = read_csv(d / "candidates.csv")
    keys = [k for k in (rows[0] if rows else {}) if k not in _META and not k.startswith("window_")]
    page = Page(f"dsim plan: {title}", "plan")
    page.para(answer, "answer")
    if budget:
        page.para(budget, "note")
    sims = [r for r in rows if r.get("pass") is not None]
    for r in sims:
        r["mark"] = "ok" if r["pass"] is True else "misses SLO"
        r["configuration"] = ", ".join(f"{k}={r.get(k)}" for k in keys)
    ok = [r for r in sims if r["pass"] is True]
    x, y = "efficiency_output_tokens_per_s_per_user", "efficiency_output_tokens_per_s_per_gpu"
    tip = ["configuration", "mark", "gpus", "request_goodput", "efficiency_goodput_per_gpu_s", "p99_ttft_ms",
           "p99_tpot_ms", "efficiency_usd_per_hour", "pessimistic_pass"]
    # the Pareto fronts dsim plan marked (front_tokens: tokens/s per GPU and per user; front_cost: goodput and $/h)
    front = [r for r in ok if r.get("front_tokens") is True]
    front2 = [r for r in ok if r.get("front_cost") is True]
    panels = [charts.points_panel(sims, x, y, tooltip=tip, title="tokens/s per GPU vs per user (dashed: Pareto "
                                  "front of the SLO-meeting ones)", line=False, front=front,
                                  xlabel="output tokens/s per user", ylabel="output tokens/s per GPU"),
              charts.points_panel(sims, "efficiency_usd_per_hour", "request_goodput", tooltip=tip,
                                  title="goodput vs cost (dashed: Pareto front of the SLO-meeting ones)", line=False,
                                  front=front2, xlabel="$ per hour", ylabel="goodput (req/s)")]
    page.h2(f"{len(sims)} simulated configurations (hover a point for its configuration)")
    g = charts.grid(panels)
    if g is not None:
        page.chart(charts.finish(g))
    else:
        page.para("No configuration was simulated.", "note")
    page.data("candidates", [{k: r.get(k) for k in keys + ["screen", "pass", "reason"]} for r in rows])
    page.h2(f"Every candidate ({len(rows)})")
    cols = keys + ["screen", "pass", "efficiency_goodput_per_gpu_s", "p99_ttft_ms", "p99_tpot_ms", "reason"]
    page.table(cols, [[r.get(c) for c in cols] for r in rows], left=0)
    return page.render()
