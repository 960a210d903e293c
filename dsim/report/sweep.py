"""report.html of a ``dsim sweep`` folder: every point hoverable with its configuration, points
that miss the scenario's SLO or are overloaded marked, one panel per headline metric.

Reads sweep.yaml (the grid, --set, the scenario's name) and results.csv (one row per point and seed)."""
from __future__ import annotations

import csv
from pathlib import Path


from ..config.files import read_yaml
from ..metrics.plots import run_title
from . import charts
from .html import Page

PANELS = (("p99_ttft_ms", "TTFT p99 (ms)", "goodput_slo_ttft_ms"), ("p99_tpot_ms", "TPOT p99 (ms)", "goodput_slo_tpot_ms"),
          ("p99_e2el_ms", "E2E p99 (ms)", None), ("output_throughput", "output tokens/s", None),
          ("request_goodput", "goodput (req/s meeting the SLO)", None),
          ("goodput_fraction", "share of requests meeting the SLO", None))


def value(text: str):
    """A results.csv cell as the number or text it was."""
    if text == "":
        return None
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return [{k: value(v) for k, v in r.items()} for r in csv.DictReader(f)]


def mark(r: dict) -> str:
    """ok, misses SLO (p99 TTFT or TPOT above the scenario's SLO) or overloaded (queue still growing)."""
    if r.get("stability_overloaded") is True:
        return "overloaded"
    for m, b in (("p99_ttft_ms", "goodput_slo_ttft_ms"), ("p99_tpot_ms", "goodput_slo_tpot_ms")):
        if isinstance(r.get(m), (int, float)) and isinstance(r.get(b), (int, float)) and r[m] > r[b]:
            return "misses SLO"
    return "ok"


def keys_of(spec: dict) -> list[str]:
    return list((spec.get("range") or {}) if spec.get("random") else []) + list(spec.get("grid") or {})


def build(d: Path) -> str:
    spec = read_yaml((d / "sweep.yaml").read_text()) or {}
    rows = read_csv(d / "results.csv")
    keys = keys_of(spec)
    name = spec.get("name") or Path(str(spec.get("scenario", "sweep"))).stem
    page = Page(f"dsim sweep: {run_title(name, spec.get('set'))}", "sweep")
    grid = spec.get("grid") or {}
    what = " x ".join(f"{k} = {', '.join(str(v) for v in vals)}" for k, vals in grid.items())
    if spec.get("random"):
        what = f"{spec['random']} random points of " + ", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi)
                                                                 in (spec.get("range") or {}).items())
    ok = [r for r in rows if r.get("status") == "ok"]
    for r in ok:
        r["mark"] = mark(r)
    n_over = sum(r["mark"] == "overloaded" for r in ok)
    n_miss = sum(r["mark"] == "misses SLO" for r in ok)
    bad = [r for r in rows if r.get("status") != "ok"]
    page.para(f"{len(rows)} rows ({what or 'one point'}; {spec.get('seeds', 1)} seed(s) each): {len(ok) - n_over - n_miss} "
              f"within the SLO, {n_miss} miss it (p99 TTFT or TPOT above the scenario's SLO), {n_over} overloaded "
              f"(the queue still grows)" + (f", {len(bad)} failed" if bad else "") + ".", "answer")
    x = keys[0] if keys else None
    others = keys[1:]
    if ok and x is not None:
        for r in ok:
            r["setting"] = ", ".join(f"{k}={r.get(k)}" for k in others) if others else "all"
        xnom = not all(isinstance(r.get(x), (int, float)) and not isinstance(r.get(x), bool) for r in ok)
        metrics = [m for m, *_ in PANELS if any(isinstance(r.get(m), (int, float)) for r in ok)]
        tip = keys + ["seed", "mark"] + metrics
        panels = []
        for m, label, slo_key in PANELS:
            if m not in metrics:
                continue
            slo = next((r[slo_key] for r in ok if slo_key and isinstance(r.get(slo_key), (int, float))), None)
            panels.append(charts.points_panel(
                ok, x, m, tooltip=tip, title=label, color="setting" if others else None, slo=slo,
                line=not spec.get("random") and spec.get("seeds", 1) == 1, ylabel=label, xnominal=xnom))
        page.h2("Metrics against " + x + (f" (one line per {', '.join(others)})" if others else "")
                + "; hover a point for its configuration")
        g = charts.grid(panels)
        if g is not None:
            page.chart(charts.finish(g))
    page.data("points", [{k: r.get(k) for k in keys + ["seed", "status", "mark", "error"] + [m for m, *_ in PANELS]}
                         for r in rows])
    page.h2("Every point")
    cols = keys + ["seed", "status"] + [m for m, *_ in PANELS if any(m in r for r in rows)]
    page.table(cols + ["point"], [[r.get(c) for c in cols] + [r.get("mark") or r.get("error")] for r in rows],
               left=len(keys))
    return page.render()
