"""The PNG plots of a ``dsim run`` folder, drawn from its files alone.

``dsim run`` writes summary.json, manifest.json, requests.csv and timeline.csv, then calls
``draw_run_plots`` on its (temporary) folder; ``dsim plot DIR`` calls the same function on a finished
report (one written with ``--no-plots``, or whose plots were deleted), so both give the same files,
byte for byte.  Only plots/network.png needs the run's network object (link bins are in no file):
``dsim run`` draws it, ``dsim plot`` cannot."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from ..config.errors import ConfigError
from ..metrics import plots
from .run import read_classes, read_latencies, read_timeline

NEEDS = ("summary.json", "manifest.json", "requests.csv", "timeline.csv")
PLOTS = ("latency_cdf.png", "timeline.png")
TAILS = "tails.png"             # drawn when requests.csv has two tenants or SLO classes or more


def _series(rows: list[dict]) -> dict:
    """replica -> series -> (times, values) from timeline.csv rows, replicas in file order."""
    out: dict = {}
    for r in rows:
        t, v = out.setdefault(r["replica"], {}).setdefault(r["series"], ([], []))
        t.append(r["time_s"])
        v.append(r["value"])
    return {rep: {k: (np.asarray(t), np.asarray(v)) for k, (t, v) in s.items()} for rep, s in out.items()}


def _step_sum(a, b):
    """Two step functions (times, values) added on the union of their times (each holds its last
    value; 0 before its first point): queue depth from the separately decimated running and waiting."""
    t = np.union1d(a[0], b[0])

    def at(s):
        i = np.searchsorted(s[0], t, side="right") - 1
        return np.where(i >= 0, s[1][np.clip(i, 0, None)] if len(s[1]) else 0.0, 0.0)
    return t, at(a) + at(b)


def manifest_title(man: dict) -> str:
    """The plots' title (scenario, --set overrides, model on hardware or the pools) from manifest.json."""
    pools = [(p.get("replicas", 1), p.get("model", ""), p.get("hardware", "")) for p in (man.get("pools") or {}).values()]
    return plots.fleet_title(man.get("scenario", ""), man.get("overrides", ()), (man.get("model") or {}).get("name", ""),
                             man.get("hardware", ""), pools)


def draw_run_plots(folder, out_dir) -> list[Path]:
    """Draw latency_cdf.png and timeline.png of the run report ``folder`` into ``out_dir``, and
    tails.png (p95/p99 per tenant or SLO class) when it has two classes or more."""
    d, out = Path(folder), Path(out_dir)
    missing = [f for f in NEEDS if not (d / f).is_file()]
    if missing:
        raise ConfigError(str(folder), None, f"a dsim run report ({', '.join(missing)} missing)", show_value=False)
    try:
        man = json.loads((d / "manifest.json").read_text())
        summary = json.loads((d / "summary.json").read_text())
        lat = read_latencies(d / "requests.csv")
        series = _series(read_timeline(d / "timeline.csv"))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(str(folder), None, f"a dsim run report whose files can be read ({e})", show_value=False) from None
    if not isinstance(man, dict) or not isinstance(summary, dict):
        raise ConfigError(str(folder), None, "a dsim run report (manifest.json and summary.json are objects)",
                          show_value=False)
    title = manifest_title(man)
    slo = (man.get("resolved_scenario") or {}).get("slo") or {}
    slos = {k: slo[k] for k in ("ttft_ms", "tpot_ms") if slo.get(k) is not None}
    out.mkdir(parents=True, exist_ok=True)
    arrivals = lat.pop("_arrivals")
    lat["e2e_ms"] = lat.pop("e2el_ms")
    plots.latency_cdfs(lat, out / "latency_cdf.png", title, slos)
    empty = (np.zeros(0), np.zeros(0))
    if len(series) <= 1:
        s = next(iter(series.values()), {})
        plots.timeline({"waiting": s.get("waiting", empty), "running": s.get("running", empty),
                        "kv_pct": s.get("kv_used_pct", empty)}, out / "timeline.png", title=title, arrivals=arrivals)
    else:
        reps = [(name, {"depth": _step_sum(s.get("running", empty), s.get("waiting", empty)),
                        "kv_pct": s.get("kv_used_pct", empty)}) for name, s in series.items()]
        plots.fleet_timeline(reps, out / "timeline.png", title=title, arrivals=arrivals,
                             scale_events=summary.get("scale_events", ()))
    drawn = [out / f for f in PLOTS]
    classes = read_classes(d / "requests.csv")
    if classes is not None:
        plots.class_tails(classes[1], out / TAILS, classes[0], title)
        drawn.append(out / TAILS)
    return drawn


def plot_folder(folder, out=None) -> list[Path]:
    """``dsim plot DIR [--out OUT]``: redraw into DIR/plots (files replaced one by one, atomically,
    and listed in the report's file list) or into a new folder OUT."""
    from ..metrics.writers import MARKER, AtomicOutput, write_atomic
    d = Path(folder)
    if not d.is_dir() or not all((d / f).is_file() for f in NEEDS[:3]):
        raise ConfigError(str(folder), None, "a dsim run report (summary.json, manifest.json and requests.csv)",
                          show_value=False)
    if out is not None:
        with AtomicOutput(Path(out)) as ao:
            drawn = draw_run_plots(d, ao.tmp)
        return [Path(out) / f.name for f in drawn]
    try:
        with tempfile.TemporaryDirectory(dir=d, prefix=".plots-") as tmp:
            drawn = draw_run_plots(d, tmp)
            (d / "plots").mkdir(exist_ok=True)
            for f in drawn:
                os.replace(f, d / "plots" / f.name)
        m = d / MARKER
        if m.is_file():
            names = [ln for ln in m.read_text().splitlines() if ln]
            new = [f"plots/{f.name}" for f in drawn if f"plots/{f.name}" not in names]
            if new:
                write_atomic(m, "".join(f"{n}\n" for n in sorted(names + new)))
    except OSError as e:
        raise ConfigError(str(folder), None, f"a folder that can be written ({e.strerror})", show_value=False) from None
    return [d / "plots" / f.name for f in drawn]
