"""report.html of a ``dsim run`` folder: the headline and error band, latency CDFs with SLO lines,
the timeline (running, waiting, KV, arrivals), tails per tenant or SLO class, conversations, and
per-replica / per-pool tables.

Reads summary.json, manifest.json, requests.csv and timeline.csv."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

from ..metrics.exact import percentiles
from ..metrics.plots import run_title
from . import charts
from .html import Page


def read_latencies(path: Path) -> dict:
    """Per completed request (ms): TTFT, TPOT, E2E and queueing from requests.csv."""
    cols = {"ttft_ms": "ttft_ms", "tpot_ms": "tpot_ms", "e2el_ms": "e2e_ms", "queue_ms": "queue_ms"}
    out: dict = {k: [] for k in cols}
    arrivals = []
    with open(path, newline="") as f:
        rd = csv.reader(f)
        head = next(rd, [])
        idx = {}
        for k, old in cols.items():
            name = k if k in head else old          # e2el_ms, or e2e_ms in older reports
            if name in head:
                idx[k] = head.index(name)
        ia = head.index("arrival_s") if "arrival_s" in head else None
        st = head.index("state") if "state" in head else None
        for row in rd:
            for k, i in idx.items():
                if i < len(row) and row[i] != "":
                    out[k].append(float(row[i]))
            if ia is not None and row[ia] != "" and (st is None or row[st] != "pending"):
                arrivals.append(float(row[ia]))
    out["_arrivals"] = arrivals
    return out


def read_classes(path: Path) -> tuple[str, dict] | None:
    """(grouping, class -> {"ttft_ms", "tpot_ms", "e2e_ms"} of its completed requests) from
    requests.csv: by tenant when the run has two or more, else by SLO class; None with fewer than
    two classes either way (a tail plot per class says nothing then)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    for col, kind in (("tenant", "tenant"), ("slo_class", "SLO class")):
        names = sorted({r.get(col) or "" for r in rows} - {""})
        if len(names) < 2:
            continue
        out = {n: {"ttft_ms": [], "tpot_ms": [], "e2e_ms": []} for n in names}
        for r in rows:
            c = out.get(r.get(col) or "")
            if c is None:
                continue
            for k, v in (("ttft_ms", r.get("ttft_ms")), ("tpot_ms", r.get("tpot_ms")),
                         ("e2e_ms", r.get("e2el_ms") or r.get("e2e_ms"))):       # e2e_ms in older reports
                if v:
                    c[k].append(float(v))
        return kind, out
    return None


def read_timeline(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    with open(path, newline="") as f:
        for r in csv.DictReader(f):
            rows.append({"replica": r["replica"], "series": r["series"], "time_s": float(r["time_s"]),
                         "value": float(r["value"])})
    return rows


def _g(d, *keys):
    for k in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(k)
    return d


def _ms(v):
    return "n/a" if v is None else (f"{v:,.0f} ms" if v >= 100 else f"{v:.3g} ms")


def build(d: Path) -> str:
    s = json.loads((d / "summary.json").read_text())
    m = json.loads((d / "manifest.json").read_text())
    title = run_title(m.get("scenario", s.get("scenario", "run")), m.get("overrides"))
    page = Page(f"dsim run: {title}", "run")
    pools = m.get("pools")
    what = (", ".join(f"{p['replicas']} x {p['model']} on {p['hardware']} ({n}, {p['role']})" for n, p in pools.items())
            if pools else f"{_g(m, 'model', 'name')} on {m.get('hardware')}")
    req = s.get("requests", {})
    page.para(f"{what}; seed {m.get('seed')}; {req.get('completed', 0)} of {req.get('submitted', 0)} requests "
              f"completed" + (f", {req['rejected']} rejected" if req.get("rejected") else "")
              + (f", {req['unfinished']} unfinished" if req.get("unfinished") else "") + ".", "note")
    lat = s.get("latency_ms", {})
    slo_ttft, slo_tpot = _g(s, "goodput", "slo_ttft_ms"), _g(s, "goodput", "slo_tpot_ms")
    thr = s.get("throughput", {})
    items = [("requests/s", f"{thr.get('requests_per_s', 0):.3g}"),
             ("output tokens/s", f"{thr.get('output_tokens_per_s', 0):,.0f}"),
             ("TTFT p50 / p99", f"{_ms(_g(lat, 'ttft', 'p50'))} / {_ms(_g(lat, 'ttft', 'p99'))}"),
             ("TPOT p50 / p99", f"{_ms(_g(lat, 'tpot', 'p50'))} / {_ms(_g(lat, 'tpot', 'p99'))}"),
             ("E2E p50 / p99", f"{_ms(_g(lat, 'e2e', 'p50'))} / {_ms(_g(lat, 'e2e', 'p99'))}")]
    if _g(s, "goodput", "fraction") is not None:
        slo = ", ".join(x for x in (f"TTFT <= {slo_ttft:g} ms" if slo_ttft else "",
                                     f"TPOT <= {slo_tpot:g} ms" if slo_tpot else "") if x)
        items.append((f"meet the SLO ({slo})" if slo else "meet the SLO", f"{s['goodput']['fraction']:.1%}"))
    page.headline(items)
    band = _g(s, "error_band", "statement")
    if band:
        page.para(f"Error band: {band}", "band")
    if _g(s, "stability", "overloaded"):
        page.para(f"Overloaded: the queueing delay grows {s['stability']['queue_delay_trend_ms_per_s']:.0f} ms per "
                  "second of arrivals; the percentiles describe a queue that is still growing.", "warn")
    for w in s.get("warnings", []):
        page.para(f"Warning: {w}", "warn")

    samples = read_latencies(d / "requests.csv")
    page.h2("Latency distributions (hover a line for the percentile)")
    panels = []
    for key, name, slo in (("ttft_ms", "TTFT", slo_ttft), ("tpot_ms", "TPOT", slo_tpot), ("e2el_ms", "E2E", None),
                           ("queue_ms", "queueing", None)):
        rows = charts.quantile_rows(samples[key], name, name)
        panels.append(charts.cdf_panel(rows, f"{name} CDF ({len(samples[key])} requests)", slo))
    g = charts.grid(panels)
    if g is not None:
        page.chart(charts.finish(g))
    else:
        page.para("No request completed: no latency to draw.", "warn")

    tl = read_timeline(d / "timeline.csv")
    page.h2("Timeline (scroll or drag to zoom and pan time, double-click to reset)")
    if tl:
        page.chart(charts.finish(charts.timeline(tl, charts.arrival_bins(samples["_arrivals"]))))
    else:
        page.para("No timeline.csv in this folder (reports written before every run wrote one).", "note")
    _class_tails(page, d / "requests.csv")
    _conversations(page, s.get("conversations"))
    _tables(page, s)
    return page.render()


def _class_tails(page: Page, requests_csv: Path) -> None:
    """p95 / p99 per tenant (or SLO class), the numbers of plots/tails.png."""
    classes = read_classes(requests_csv)
    if classes is None:
        return
    kind, per = classes
    page.h2(f"Tails by {kind}")
    rows = []
    for name, v in per.items():
        row = [name, len(v["e2e_ms"])]
        for k in ("ttft_ms", "tpot_ms", "e2e_ms"):
            q = percentiles(np.asarray(v[k], dtype=float), [95, 99]) if v[k] else (None, None)
            row += [_ms(None if x is None else float(x)) for x in q]
        rows.append(row)
    page.table([kind, "completed", "TTFT p95", "TTFT p99", "TPOT p95", "TPOT p99", "E2E p95", "E2E p99"], rows, left=1)


def _conversations(page: Page, conv: dict | None) -> None:
    """summary.json's conversations (requests grouped by session)."""
    if not conv:
        return
    page.h2(f"Conversations ({conv['conversations']}, {conv['completed']} completed: every turn)")
    rows = [[name, st.get("count"), *(st.get(k) for k in ("mean", "p50", "p95", "p99", "max"))]
            for name, st in (("turns", conv["turns"]), ("duration (ms)", conv["duration_ms"]),
                             ("mean TTFT of its turns (ms)", conv["ttft_mean_ms"]),
                             ("output tokens", conv["output_tokens"]))]
    page.table(["per conversation", "count", "mean", "p50", "p95", "p99", "max"],
               [[r[0], r[1]] + [None if x is None else f"{x:.4g}" for x in r[2:]] for r in rows], left=1)


_REP_COLS = (("pool", "pool"), ("role", "role"), ("submitted", "submitted"), ("completed", "completed"),
             ("rejected", "rejected"), ("busy_fraction", "GPU busy"), ("mean_kv_usage", "mean KV"),
             ("peak_kv_usage", "peak KV"), ("preemptions", "preemptions"), ("prefix_hit_rate", "prefix hits"),
             ("steps", "steps"), ("energy_joules", "energy (J)"), ("cost_usd", "cost ($)"))
_SHARES = {"busy_fraction", "mean_kv_usage", "peak_kv_usage", "prefix_hit_rate", "share"}


def _cell(k, v):
    if k in _SHARES and isinstance(v, (int, float)):
        return f"{v:.1%}"
    return v


def _tables(page: Page, s: dict) -> None:
    reps = s.get("replicas") or {}
    if reps:
        page.h2(f"Replicas ({len(reps)})")
        cols = [(k, h) for k, h in _REP_COLS if any(k in r for r in reps.values())]
        page.table(["replica"] + [h for _, h in cols],
                   [[n] + [_cell(k, r.get(k)) for k, _ in cols] for n, r in sorted(reps.items())], left=3)
    else:
        sch, kv = s.get("scheduler", {}), s.get("kv_cache", {})
        page.h2("Replica")
        page.table(["steps", "GPU busy", "mean batch tokens", "peak running", "peak waiting", "preemptions",
                    "KV blocks", "mean KV", "peak KV", "prefix hits"],
                   [[sch.get("steps"), _cell("busy_fraction", sch.get("busy_fraction")), sch.get("mean_batch_tokens"),
                     sch.get("peak_running"), sch.get("peak_waiting"), sch.get("preemptions"), kv.get("total_blocks"),
                     _cell("mean_kv_usage", kv.get("mean_usage")), _cell("peak_kv_usage", kv.get("peak_usage")),
                     _cell("prefix_hit_rate", kv.get("prefix_hit_rate"))]], left=0)
    pools = s.get("pools") or {}
    if pools:
        page.h2(f"Pools ({len(pools)})")
        keys = sorted({k for p in pools.values() for k, v in p.items() if isinstance(v, (int, float, str, bool))
                       or v is None})
        page.table(["pool"] + keys, [[n] + [_cell(k, p.get(k)) for k in keys] for n, p in sorted(pools.items())])
    plan = s.get("planner")
    if plan:
        _planner_table(page, plan)


def _planner_table(page: Page, plan: dict) -> None:
    """One row per planner tick: what it chose, and (simulation planner) its forecast against what
    then happened (docs/planner.md)."""
    ticks = plan.get("tick_log") or []
    page.h2(f"Planner ({plan.get('kind')}): {len(ticks)} ticks, {plan.get('changes')} changes")
    rows = []
    for t in ticks:
        if plan.get("kind") == "simulate":
            c = t["candidates"][t["chosen"]]
            conf = ", ".join(f"{n}: {v['replicas']}" for n, v in c["config"].items())
            fc, act, err = c.get("attainment"), (t.get("actual") or {}).get("attainment"), t.get("attainment_error")
            rows.append([t["time_s"], t["trigger"], conf, len(t["candidates"]), _cell("share", fc),
                         _cell("share", act), err if err is None else f"{err:+.3f}", "yes" if t["changed"] else ""])
        else:
            conf = ", ".join(f"{n}: {v['replicas']}" for n, v in t["pools"].items())
            rows.append([t["time_s"], "cadence", conf, "", "", "", "", "yes" if t["changed"] else ""])
    page.table(["time (s)", "trigger", "replicas chosen", "candidates", "forecast attainment", "actual attainment",
                "error", "changed"], rows, left=3)
