"""report.html of a ``dsim capacity`` folder: the answer in words at the top, every probe on
throughput and SLO-percentile charts (pass / fail marked, the SLOs dashed, the answer dotted).

Reads capacity.json, and the answer's words from capacity.md (``dsim capacity`` writes both)."""
from __future__ import annotations

import json
from pathlib import Path

from ..metrics.plots import run_title
from . import charts
from .html import Page


def _answer(d: Path) -> str:
    """The answer in words: the capacity card's bold line (explore.capacity's ``answer_line``)."""
    f = d / "capacity.md"
    for ln in (f.read_text().splitlines() if f.is_file() else ()):
        if ln.startswith("**") and ln.endswith("**") and len(ln) > 4:
            return ln[2:-2]
    return ""


def build(d: Path) -> str:
    rec = json.loads((d / "capacity.json").read_text())
    page = Page(f"dsim capacity: {run_title(rec.get('scenario', ''), rec.get('overrides'))}", "capacity")
    answer_words = _answer(d)
    if answer_words:
        page.para(answer_words, "answer")
    crit = rec.get("criteria", {})
    page.para(f"Searched {rec['vary']}; a probe passes when, over {crit.get('window', 'the run')}, every SLO holds ("
              + ", ".join(f"{k} <= {v:g}" for k, v in rec["slos"].items())
              + f"), the queueing delay grows by less than {crit.get('queue_delay_trend_limit', '?')} and no request "
              "is rejected" + (f", and at least {rec['min_goodput']:.0%} of requests meet the SLOs"
                               if rec.get("min_goodput") else "") + ".", "note")
    vary = rec["vary"]
    answer = rec.get("max_value", rec.get("min_value"))
    rows = []
    for p in rec.get("probes", []):
        r = {vary: p.get("value"), "passes": "yes" if p.get("pass") else "no",
             "mark": "ok" if p.get("pass") else "overloaded" if any("queueing delay" in w for w in p.get("reasons", []))
             else "misses SLO", "why not": "; ".join(p.get("reasons", []))}
        for k in ("request_throughput", "request_goodput", "output_throughput", "goodput_fraction",
                  "scheduler_busy_fraction", "kv_cache_peak_usage"):
            r[k] = p.get(k)
        for k in rec["slos"]:
            r[k] = p.get(f"window_{k}", p.get(k))
        rows.append(r)
    tip = [vary, "passes", "why not", "request_throughput", "request_goodput"] + list(rec["slos"])
    panels = [charts.points_panel(rows, vary, "request_throughput", tooltip=tip, title="completed requests/s",
                                  ylabel="completed req/s", vline=answer),
              charts.points_panel(rows, vary, "request_goodput", tooltip=tip, title="goodput (req/s meeting the SLOs)",
                                  ylabel="goodput req/s", vline=answer)]
    for k, bound in rec["slos"].items():
        panels.append(charts.points_panel(rows, vary, k, tooltip=tip, title=f"{k} over the window (SLO dashed)",
                                          ylabel=k, slo=bound, vline=answer))
    page.h2("Probes (hover a point; circles pass, triangles miss an SLO, crosses are overloaded)")
    g = charts.grid(panels)
    if g is not None:
        page.chart(charts.finish(g))
    page.h2("Every probe")
    cols = [vary, "passes", "request_throughput", "request_goodput"] + list(rec["slos"]) + ["why not"]
    page.table(cols, [[r.get(c) for c in cols] for r in rows], left=0)
    return page.render()
