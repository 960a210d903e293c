"""Vega-Lite charts of the reports, built with Altair: CDFs with SLO lines, a zoomable timeline,
metric-vs-setting scatter/line charts with every point's configuration on hover, sim vs real bars.

Every selection is named and every dataset inline (Altair names datasets by a hash of their
content), so the same data gives the same spec.  Altair is imported here only: ``import dsim``
never loads it."""
from __future__ import annotations

import math
import re
import warnings

import numpy as np

from ..metrics.exact import percentiles

W = 400          # width of a panel: two panels fit a row of the page
H = 230


def _alt():
    import altair as alt
    return alt


def finish(chart) -> dict:
    """The chart as a Vega-Lite dict (no $schema URL: the page needs none)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # Altair's note on deduplicated (shared) selections
        d = chart.to_dict()
    d.pop("$schema", None)
    return d


def spans_decades(values) -> bool:
    """Log axis when the positive values span more than a factor of 10."""
    v = [float(x) for x in values if x is not None and isinstance(x, (int, float)) and x == x and x > 0]
    return len(v) >= 2 and max(v) / min(v) > 10


def _clean(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, (np.floating, np.integer)):
        return _clean(v.item())
    return v


def field(name: str) -> str:
    """A column name as a Vega-Lite field (dots and brackets are not paths here)."""
    return re.sub(r"([.\[\]\\])", r"\\\1", name)


def _type(rows, k) -> str:
    for r in rows:
        v = r.get(k)
        if v is not None:
            return "quantitative" if isinstance(v, (int, float)) and not isinstance(v, bool) else "nominal"
    return "nominal"


def tips(rows, keys, fmt=",.4g") -> list:
    """Tooltip entries for ``keys`` (numbers formatted, names as they are)."""
    alt = _alt()
    out = []
    for k in keys:
        t = _type(rows, k)
        out.append(alt.Tooltip(field=field(k), type=t, title=k, **({"format": fmt} if t == "quantitative" else {})))
    return out


def csv_data(rows: list[dict], cols: list[str], numbers=()):
    """Rows as inline CSV text (a third of the size of JSON objects); ``numbers`` parsed as numbers."""
    alt = _alt()
    text = "\n".join([",".join(cols)] + [",".join(_csv(r.get(c)) for c in cols) for r in rows])
    return alt.InlineData(values=text, format=alt.DataFormat(type="csv", parse={c: "number" for c in numbers}))


def _csv(v) -> str:
    if v is None:
        return ""
    if isinstance(v, float):
        return f"{v:.6g}"
    t = str(v)
    return '"' + t.replace('"', '""') + '"' if any(ch in t for ch in ',"\n') else t


def rows_clean(rows):
    return [{k: _clean(v) for k, v in r.items()} for r in rows]


def quantile_rows(samples, metric: str, label: str, n: int = 1000) -> list[dict]:
    """A CDF as at most n+1 points: (value at the percentile, percentile)."""
    v = np.asarray(samples, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return []
    qs = np.linspace(0, 100, min(n, max(2, v.size)) + 1)
    xs = percentiles(v, qs)
    return [{"metric": metric, "series": label, "ms": float(f"{x:.5g}"), "percentile": round(float(q), 3)}
            for x, q in zip(xs, qs)]


def cdf_panel(rows: list[dict], title: str, slo: float | None = None, log: bool | None = None) -> dict | None:
    """One CDF (one line per series); hover a point for its percentile and value; the SLO dashed."""
    alt = _alt()
    if not rows:
        return None
    vals = [r["ms"] for r in rows]
    log = spans_decades(vals + ([slo] if slo else [])) if log is None else log
    xs = alt.Scale(type="log") if log else alt.Scale(zero=False)
    data = csv_data([r for r in rows if not log or r["ms"] > 0], ["series", "ms", "percentile"], ("ms", "percentile"))
    series = len({r["series"] for r in rows}) > 1
    enc = dict(x=alt.X("ms:Q", title="ms" + (" (log)" if log else ""), scale=xs),
               y=alt.Y("percentile:Q", title="percentile of requests", scale=alt.Scale(domain=[0, 100])),
               tooltip=[alt.Tooltip("series:N"), alt.Tooltip("percentile:Q", format=".1f"),
                        alt.Tooltip("ms:Q", format=",.2f")])
    if series:
        enc["color"] = alt.Color("series:N", title=None)
        enc["strokeDash"] = alt.StrokeDash("series:N", title=None)
    line = alt.Chart(data).mark_line(point=alt.OverlayMarkDef(size=40, opacity=0)).encode(**enc)
    layers = [line]
    if slo:
        rule = alt.Chart(alt.Data(values=[{"slo": slo, "label": f"SLO {slo:g} ms"}])).mark_rule(
            color="#d62728", strokeDash=[5, 3]).encode(x="slo:Q", tooltip=[alt.Tooltip("label:N", title="SLO")])
        layers.append(rule)
    return alt.layer(*layers).properties(title=title, width=W, height=H)


def grid(panels: list, columns: int = 2):
    """Panels two to a row."""
    alt = _alt()
    panels = [p for p in panels if p is not None]
    if not panels:
        return None
    rows = [alt.hconcat(*panels[i:i + columns]) for i in range(0, len(panels), columns)]
    return rows[0] if len(rows) == 1 else alt.vconcat(*rows)


def timeline(series_rows: list[dict], arrivals: list[dict], name: str = "zoom") -> object:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")        # the shared zoom: Altair notes the deduplicated selection
        return _timeline(series_rows, arrivals, name)


def _timeline(series_rows: list[dict], arrivals: list[dict], name: str) -> object:
    """Running, waiting, KV used (%) and arrivals/s over simulated time (rows: replica, series,
    time_s, value), one line per replica; one shared zoom on time (scroll or drag in any panel)."""
    alt = _alt()
    zoom = alt.selection_interval(bind="scales", encodings=["x"], name=name)
    data = csv_data(series_rows, ["replica", "series", "time_s", "value"], ("time_s", "value"))
    reps = sorted({r["replica"] for r in series_rows})
    color = alt.Color("replica:N", title="replica", legend=alt.Legend(orient="right") if len(reps) > 1 else None)
    panels = []
    for key, title in (("running", "requests running"), ("waiting", "requests waiting"),
                       ("kv_used_pct", "KV cache used (%)")):
        panels.append(alt.Chart().transform_filter(alt.datum.series == key).mark_line(
            strokeWidth=1, interpolate="step-after").encode(
            x=alt.X("time_s:Q", title="simulated time (s)"), y=alt.Y("value:Q", title=title),
            color=color, tooltip=[alt.Tooltip("replica:N"), alt.Tooltip("time_s:Q", title="time (s)", format=",.3f"),
                                 alt.Tooltip("value:Q", title=title, format=",.4g")]
        ).add_params(zoom).properties(width=2 * W + 60, height=130))
    if arrivals:
        panels.append(alt.Chart(alt.Data(values=rows_clean(arrivals))).mark_area(
            color="#888", interpolate="step-after", opacity=0.7).encode(
            x=alt.X("t0:Q", title="simulated time (s)"), y=alt.Y("per_s:Q", title="arrivals/s"),
            tooltip=[alt.Tooltip("t0:Q", title="from (s)", format=",.3f"), alt.Tooltip("t1:Q", title="to (s)", format=",.3f"),
                     alt.Tooltip("per_s:Q", title="arrivals/s", format=",.3g")]
        ).add_params(zoom).properties(width=2 * W + 60, height=90))
    return alt.vconcat(*panels, data=data).resolve_scale(color="shared", x="shared")


def arrival_bins(arrivals, bins: int = 120) -> list[dict]:
    a = np.asarray(arrivals, dtype=float)
    a = a[np.isfinite(a)]
    if a.size < 2 or a.max() <= a.min():
        return []
    edges = np.linspace(a.min(), a.max(), bins + 1)
    h, e = np.histogram(a, edges)
    w = float(e[1] - e[0])
    return [{"t0": round(float(e[i]), 6), "t1": round(float(e[i + 1]), 6), "per_s": round(float(h[i]) / w, 6)}
            for i in range(len(h))]


def points_panel(rows: list[dict], x: str, y: str, *, tooltip: list[str], title: str, color: str | None = None,
                 slo: float | None = None, line: bool = True, xlabel: str | None = None, ylabel: str | None = None,
                 front: list[dict] | None = None, vline: float | None = None, xnominal: bool = False):
    """Metric ``y`` against setting ``x``: one line per ``color`` value, every point hoverable with
    ``tooltip`` fields; ``mark`` (a row field) picks the point shape: ok, misses the SLO, overloaded."""
    alt = _alt()
    pts = [r for r in rows if isinstance(r.get(y), (int, float)) and r.get(y) is not None]
    if not pts:
        return None
    ys = [r[y] for r in pts] + ([slo] if slo else [])
    ylog = spans_decades(ys) and all(v > 0 for v in ys) and not y.endswith("fraction")
    xlog = not xnominal and spans_decades([r.get(x) for r in pts]) and all(
        isinstance(r.get(x), (int, float)) and r.get(x) > 0 for r in pts)
    data = alt.Data(values=rows_clean(pts))
    xenc = (alt.X(field=field(x), type="nominal", title=xlabel or x, sort=None) if xnominal else
            alt.X(field=field(x), type="quantitative", title=(xlabel or x) + (" (log)" if xlog else ""),
                  scale=alt.Scale(type="log", nice=False) if xlog else alt.Scale(zero=False)))
    yenc = alt.Y(field=field(y), type="quantitative", title=(ylabel or y) + (" (log)" if ylog else ""),
                 scale=alt.Scale(type="log") if ylog else alt.Scale(zero=False))
    tt = tips(pts, tooltip)
    layers = []
    cenc = dict(color=alt.Color(field=field(color), type="nominal", title=color)) if color else {}
    if line:
        layers.append(alt.Chart(data).mark_line(strokeWidth=1.2, opacity=0.7).encode(
            x=xenc, y=yenc, **cenc))
    shape = alt.Shape("mark:N", title="point", scale=alt.Scale(
        domain=["ok", "misses SLO", "overloaded"], range=["circle", "triangle-down", "cross"]))
    layers.append(alt.Chart(data).mark_point(size=70, filled=True, opacity=0.9).encode(
        x=xenc, y=yenc, shape=shape, tooltip=tt, **cenc))
    if front:
        layers.append(alt.Chart(alt.Data(values=rows_clean(front))).mark_line(
            color="black", strokeDash=[6, 3], point=True).encode(
            x=xenc, y=yenc, order=alt.Order(field=field(x), type="quantitative"), tooltip=tt))
    if slo:
        layers.append(alt.Chart(alt.Data(values=[{"slo": slo, "label": f"SLO {slo:g} ms"}])).mark_rule(
            color="#d62728", strokeDash=[5, 3]).encode(y="slo:Q", tooltip=[alt.Tooltip("label:N", title="SLO")]))
    if vline is not None:
        layers.append(alt.Chart(alt.Data(values=[{"v": vline, "label": f"answer {vline:g}"}])).mark_rule(
            color="black", strokeDash=[2, 2]).encode(x="v:Q", tooltip=[alt.Tooltip("label:N", title="answer")]))
    return alt.layer(*layers).properties(title=title, width=W, height=H)


def bars(rows: list[dict], *, x: str, y: str, color: str, column_title: str, title: str, ylabel: str,
         tooltip: list[str], log: bool | None = None, zero_rule: bool = False):
    """Grouped bars: ``y`` per ``x`` (e.g. percentile), one bar per ``color`` (real, sim)."""
    alt = _alt()
    pts = [r for r in rows if isinstance(r.get(y), (int, float))]
    if not pts:
        return None
    log = (spans_decades([r[y] for r in pts]) and all(r[y] > 0 for r in pts)) if log is None else log
    enc = dict(x=alt.X(f"{x}:N", title=column_title, sort=None),
               xOffset=alt.XOffset(f"{color}:N", sort=None),
               y=alt.Y(f"{y}:Q", title=ylabel + (" (log)" if log else ""),
                       scale=alt.Scale(type="log") if log else alt.Undefined),
               color=alt.Color(f"{color}:N", title=None, sort=None),
               tooltip=tips(pts, tooltip))
    layers = [alt.Chart(alt.Data(values=rows_clean(pts))).mark_bar().encode(**enc)]
    if zero_rule:
        layers.append(alt.Chart(alt.Data(values=[{"z": 0}])).mark_rule(color="#444").encode(y="z:Q"))
    return alt.layer(*layers).properties(title=title, width=W, height=H)
