"""Regression baselines (``dsim baseline``) and ``dsim compare``: which headline metrics of a run moved
beyond the run-to-run spread across seeds, so a change of the code or of a scenario can be judged
against the noise of the workload draw rather than against an arbitrary threshold."""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from ..config.errors import ConfigError
from .evaluate import summary_row

KIND = "dsim-baseline"
FORMAT = 1
# summary_row columns that restate the scenario's inputs or the validation table (SLO bounds, the
# offered rate, prices, the error band): not results, so they never "move" with the code
INPUTS = frozenset(("request_rate", "max_concurrency", "goodput_slo_ttft_ms", "goodput_slo_tpot_ms",
                    "efficiency_gpus", "efficiency_usd_per_hour", "band_validated", "band_tpot_p50_lo",
                    "band_tpot_p50_hi"))
SPREAD_SIGMAS = 3.0          # a seed-to-seed std this many times over (or the min-max range) is "within"
FLOAT_FLOOR = 1e-9           # relative: printing and summation noise is never a move


def headline(summary: dict) -> dict:
    """The numeric headline metrics of a summary.json: summary_row without the inputs."""
    return headline_row(summary_row(summary))


def _stats(values: list) -> dict:
    mean = statistics.fmean(values)
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return {"mean": mean, "std": std, "min": min(values), "max": max(values), "values": values}


def make_baseline(scenario, seeds: int, overrides=(), jobs: int = 1, command: str = "",
                  source: str | None = None) -> dict:
    """Run ``scenario`` with ``seeds`` seeds (its own seed, +1, ...: the rows of ``dsim sweep
    --seeds``) and return the baseline: per headline metric the mean, std, min, max and the values."""
    from .._version import __version__
    from .evaluate import resolve
    from .sweep import sweep
    if isinstance(seeds, bool) or not isinstance(seeds, int) or seeds < 2:
        raise ConfigError("--seeds", seeds, "an integer >= 2 (a spread needs two runs)")
    base = resolve(scenario, list(overrides))
    rows = sweep(scenario, overrides=list(overrides), seeds=seeds, jobs=jobs)
    bad = [r for r in rows if r.get("status") != "ok"]
    if bad:
        raise ConfigError(str(source or scenario), None, f"a scenario that runs (seed {bad[0]['seed']}: "
                          f"{bad[0].get('error')})", show_value=False)
    per_seed = [headline_row(r) for r in rows]
    names = sorted(set.intersection(*(set(r) for r in per_seed)))
    return {"kind": KIND, "format": FORMAT, "dsim_version": __version__, "command": command,
            "scenario": {"name": base.name, "source": source or str(scenario), "overrides": list(overrides),
                         "scenario_sha256": base.digest},
            "seeds": [r["seed"] for r in rows],
            "metrics": {k: _stats([r[k] for r in per_seed]) for k in names}}


def headline_row(row: dict) -> dict:
    """A summary_row (or a sweep row: plus status and seed) reduced to the headline metrics; a
    boolean (stability_overloaded) counts as 0/1 so a flip is a change."""
    out = {}
    for k, v in row.items():
        if k in INPUTS or k in ("status", "error", "seed") or isinstance(v, str) or v is None:
            continue
        v = float(v)
        if math.isfinite(v):
            out[k] = v
    return out


def check_out(out) -> Path:
    """A baseline's --out, refused before any simulation when it names a folder."""
    p = Path(out)
    if p.is_dir():
        raise ConfigError("--out", str(out), "a baseline file path (this is a folder)")
    return p


def write_baseline(doc: dict, out) -> Path:
    from ..metrics.writers import write_atomic
    p = check_out(out)
    try:
        write_atomic(p, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    except OSError as e:
        raise ConfigError("--out", str(out), f"a writable file path ({e.strerror})") from None
    return p


def load_side(path) -> dict:
    """One side of a comparison: a run's output folder, its summary.json, or a baseline file, as
    {"label", "kind": run|baseline, "name", "metrics": {name: {"mean", "std", "min", "max"}}}."""
    from ..config.files import parse_json, read_text
    p = Path(path)
    expected = "a dsim run folder (summary.json), a summary.json or a baseline file of dsim baseline"
    if p.is_dir():
        if not (p / "summary.json").is_file():
            raise ConfigError(str(path), None, f"{expected} (this folder has no summary.json)", show_value=False)
        p = p / "summary.json"
    elif not p.is_file():
        raise ConfigError(str(path), None, f"{expected} (not found)", show_value=False)
    doc = parse_json(read_text(p, str(p), 64 * 1024**2, "a summary or baseline"), str(p))
    if isinstance(doc, dict) and doc.get("kind") == KIND:
        return _baseline_side(doc, str(path))
    if not (isinstance(doc, dict) and isinstance(doc.get("metrics"), dict)
            and isinstance(doc.get("latency_ms"), dict) and isinstance(doc["latency_ms"].get("queue"), dict)):
        raise ConfigError(str(p), None, expected, show_value=False)
    try:
        values = headline(doc)
    except (TypeError, ValueError, AttributeError, KeyError):
        raise ConfigError(str(p), None, f"{expected} (its numbers do not parse)", show_value=False) from None
    return {"label": str(path), "kind": "run", "name": doc.get("scenario"), "seed": doc.get("seed"),
            "metrics": {k: {"mean": v, "std": 0.0, "min": v, "max": v} for k, v in values.items()}}


def _baseline_side(doc: dict, label: str) -> dict:
    if doc.get("format") != FORMAT or not isinstance(doc.get("metrics"), dict):
        raise ConfigError(label, doc.get("format"), f"a baseline of format {FORMAT} with a metrics object")
    metrics = {}
    for k, st in doc["metrics"].items():
        try:
            metrics[k] = {f: float(st[f]) for f in ("mean", "std", "min", "max")}
        except (TypeError, KeyError, ValueError):
            raise ConfigError(f"{label}: metrics.{k}", None, "mean, std, min and max numbers",
                              show_value=False) from None
    scn = doc.get("scenario") if isinstance(doc.get("scenario"), dict) else {}
    return {"label": label, "kind": "baseline", "name": scn.get("name"), "seeds": doc.get("seeds"),
            "metrics": metrics}


def _limit(st: dict) -> float:
    """The seed spread of one metric: its min-max range or SPREAD_SIGMAS standard deviations."""
    return max(st["max"] - st["min"], SPREAD_SIGMAS * st["std"])


def compare(a: dict, b: dict, tolerance: float | None = None) -> dict:
    """Compare the means of two sides (load_side).  A metric moved when |B - A| exceeds the larger of
    the baselines' seed spreads, ``tolerance`` x |A|, and a float-noise floor; with two plain runs
    there is no spread and ``tolerance`` is required."""
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise ConfigError("--tolerance", tolerance, "a relative threshold >= 0 (0.05 = 5 %)")
    if a["kind"] == b["kind"] == "run" and tolerance is None:
        raise ConfigError("--tolerance", None, "a relative threshold (e.g. 0.05) when neither side is a baseline "
                          "(two runs have no seed spread)", show_value=False)
    tol = tolerance or 0.0
    rows, moved = [], []
    for k in sorted(set(a["metrics"]) | set(b["metrics"])):
        sa, sb = a["metrics"].get(k), b["metrics"].get(k)
        if sa is None or sb is None:
            rows.append({"metric": k, "a": sa and sa["mean"], "b": sb and sb["mean"], "change": None,
                         "relative": None, "limit": None, "moved": False})
            continue
        va, vb = sa["mean"], sb["mean"]
        spread = max(_limit(sa), _limit(sb))
        limit = max(spread, tol * abs(va), FLOAT_FLOOR * max(1.0, abs(va)))
        change = vb - va
        row = {"metric": k, "a": va, "b": vb, "change": change,
               "relative": change / abs(va) if va else None, "limit": limit, "moved": abs(change) > limit}
        rows.append(row)
        if row["moved"]:
            moved.append(k)
    rule = ("seed spread (max of the min-max range and 3 std)" if "baseline" in (a["kind"], b["kind"]) else
            "tolerance")
    return {"a": _identity(a), "b": _identity(b), "tolerance": tolerance, "rule": rule, "metrics": rows,
            "moved": moved}


def _identity(side: dict) -> dict:
    return {k: side.get(k) for k in ("label", "kind", "name", "seed", "seeds") if side.get(k) is not None}


def _num(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4g}" if abs(v) < 1e5 else f"{v:,.0f}"


def table(res: dict, only_moved: bool = False) -> str:
    """The comparison as an aligned text table and a verdict line."""
    head = ("metric", "A", "B", "change", "%", "limit", "")
    lines = []
    for r in res["metrics"]:
        if only_moved and not r["moved"]:
            continue
        pct = "-" if r["relative"] is None else f"{r['relative'] * 100:+.1f}"
        chg = "-" if r["change"] is None else ("0" if r["change"] == 0 else f"{r['change']:+.4g}")
        lim = "-" if r["limit"] is None else f"±{r['limit']:.3g}"
        verdict = "MOVED" if r["moved"] else ("(one side only)" if r["change"] is None else "")
        lines.append((r["metric"], _num(r["a"]), _num(r["b"]), chg, pct, lim, verdict))
    widths = [max(len(x[i]) for x in [head] + lines) for i in range(len(head))]

    def fmt(row):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
    out = [f"A: {_describe(res['a'])}", f"B: {_describe(res['b'])}"] + [fmt(head).rstrip()] * bool(lines)
    out += [fmt(x).rstrip() for x in lines]
    n = sum(1 for r in res["metrics"] if r["change"] is not None)
    by = "the seed spread" if res["rule"] != "tolerance" else f"the tolerance ({res['tolerance']:g})"
    out.append(f"{len(res['moved'])} of {n} metrics moved beyond {by}" +
               (": " + ", ".join(res["moved"]) if res["moved"] else ""))
    return "\n".join(out)


def _describe(ident: dict) -> str:
    what = (f"baseline over seeds {ident.get('seeds')}" if ident["kind"] == "baseline" else
            f"run (seed {ident.get('seed')})")
    return f"{ident['label']} - {ident.get('name')} {what}"
