"""``dsim sweep``: a grid (or random sample) of scenario overrides, each point a normal run,
collected into one tidy table (one row per point and seed) that survives interruption."""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ..config.errors import ConfigError
from ..config.limits import MAX_POINTS
from .backends import run_calls
from .evaluate import evaluate, resolve
from .points import as_overrides, grid_points, parse_grid, parse_ranges, random_points
from .store import PointStore, table_csv, write_atomic


@dataclass
class SweepSpec:
    scenario: str | dict
    grid: list = field(default_factory=list)          # [(key, [values])]
    ranges: list = field(default_factory=list)        # [(key, lo, hi, integer)]
    random: int = 0
    seeds: int = 1
    overrides: list = field(default_factory=list)     # --set, applied before every point
    name: str = ""                                     # the base scenario's name (after --set)

    def points(self, base_seed: int) -> list[tuple]:
        pts = random_points(self.ranges, self.random, base_seed, self.grid) if self.random else grid_points(self.grid)
        return pts

    def keys(self) -> list[str]:
        return [k for k, *_ in self.ranges] * bool(self.random) + [k for k, _ in self.grid]

    def record(self) -> dict:
        return {"scenario": self.scenario if isinstance(self.scenario, str) else "<mapping>", "name": self.name,
                "grid": {k: v for k, v in self.grid}, "range": {k: [lo, hi] for k, lo, hi, _ in self.ranges},
                "random": self.random, "seeds": self.seeds, "set": list(self.overrides)}


def _tasks(spec: SweepSpec):
    """(point, seed, key, overrides) for every row, in table order; bad points carry their error."""
    base = resolve(spec.scenario, spec.overrides)          # the base scenario itself must be valid
    spec.name = base.name
    seeds = [None] if spec.seeds == 1 else [base.seed + i for i in range(spec.seeds)]
    out = []
    for pt in spec.points(base.seed):
        ovs = list(spec.overrides) + as_overrides(pt)
        for sd in seeds:
            try:
                scn = resolve(spec.scenario, ovs, sd)
                key, err, seed = scn.digest[:16], None, scn.seed
            except ConfigError as e:
                blob = json.dumps([ovs, sd], sort_keys=True, default=str)
                key, err, seed = "bad-" + hashlib.sha256(blob.encode()).hexdigest()[:12], str(e), sd
            out.append((pt, seed, key, ovs, err))
    return out


def _check_size(grid, random: int, seeds: int) -> None:
    """Refuse a sweep of more than MAX_POINTS runs before its points are built (a 3,000 x 3,000
    grid allocated nine million points before anything ran)."""
    n = max(1, random) * seeds
    for _, vals in grid:
        n *= max(1, len(vals))
    if n > MAX_POINTS:
        flag = "--random" if random else "--grid"
        raise ConfigError(flag, None, f"at most {MAX_POINTS:,} runs (points x seeds) in one sweep: this one has "
                          f"{n:,}; split it or use --random N", show_value=False)


def _check_keys(firsts) -> None:
    """A key the scenario schema does not have fails the sweep before any point runs (each point would
    have failed alone, into a table of errors); a bad value stays a per-point failure."""
    from ..config.schema.keys import check_key
    for key, _ in firsts:
        check_key(key, "--grid")


def sweep(scenario, grid=(), *, overrides=(), random: int = 0, ranges=(), seeds: int = 1, jobs: int = 1,
          backend: str = "joblib", address: str | None = None, out=None, progress: bool = False,
          plot: str | None = None, x: str | None = None, hue: str | None = None, extra=None) -> "SweepTable":
    """Run every point of a grid (``["workload.rate=10,20", ...]`` or [(key, values)]) or ``random``
    points drawn from ``ranges`` (``["workload.rate=5:40"]``), ``seeds`` seeds each; return one row
    per point and seed: the override keys, ``seed``, ``status`` and every summary metric.

    With ``out``, each finished point is stored in ``out/points/`` and the table written to
    ``out/results.csv`` (and ``results.parquet`` when pyarrow is installed); re-running into the
    same folder computes only the missing points.  ``backend``: joblib, dask or ray.
    ``extra(summary) -> dict``: more columns per row (a module-level function, so workers can load
    it); stored rows are reused as they are, so use a fresh ``out`` when ``extra`` changes."""
    from ..config.fields import check_number
    from ..config.limits import MAX_JOBS, MAX_SEEDS
    if isinstance(grid, (str, bytes)) or not hasattr(grid, "__iter__"):
        raise ConfigError("grid", grid, "a list of 'KEY=V1,V2' strings or (key, [values]) pairs")
    jobs = check_number(jobs, "--jobs", lo=1, hi=MAX_JOBS, integer=True)
    seeds = check_number(seeds, "--seeds", lo=1, hi=MAX_SEEDS, integer=True)
    random = check_number(random, "--random", lo=0, integer=True)
    grid = parse_grid(grid) if grid and isinstance(next(iter(grid)), str) else list(grid)
    ranges = parse_ranges(ranges) if ranges and isinstance(next(iter(ranges)), str) else list(ranges)
    if isinstance(random, bool) or not isinstance(random, int) or random < 0:
        raise ConfigError("--random", random, "a number of points >= 1 (0: no random points)")
    if random and not ranges:
        raise ConfigError("--random", random, "--range KEY=LO:HI to draw from", show_value=False)
    if ranges and not random:
        raise ConfigError("--range", None, "--random N (how many points to draw)", show_value=False)
    if seeds < 1:
        raise ConfigError("--seeds", seeds, "an integer >= 1")
    _check_size(grid, random, seeds)
    _check_keys([(k, vals[0]) for k, vals in grid if vals] + [(r[0], r[1]) for r in ranges])
    spec = SweepSpec(scenario if isinstance(scenario, dict) else str(scenario), grid, ranges, random, seeds,
                     list(overrides))
    if isinstance(spec.scenario, dict) and out is not None:
        spec.scenario = dict(spec.scenario)
    tasks = _tasks(spec)
    store = PointStore(out) if out is not None else None
    if store is None:
        return _sweep(spec, tasks, None, grid, random, jobs, backend, address, progress, plot, x, hue, extra)
    store.lock()
    try:
        return _sweep(spec, tasks, store, grid, random, jobs, backend, address, progress, plot, x, hue, extra)
    except ConfigError:
        store.discard_if_new()
        raise
    finally:
        store.unlock()


def _sweep(spec, tasks, store, grid, random, jobs, backend, address, progress, plot, x, hue, extra):
    if store is not None:
        write_atomic(store.dir / "sweep.yaml", yaml.safe_dump(spec.record(), sort_keys=False))
    rows: dict = {}
    todo = []
    queued: set = set()
    reused = 0
    for pt, seed, key, ovs, err in tasks:
        have = store.get(key) if store is not None else None
        if have is not None:
            rows[key] = have["row"]
            reused += 1
        elif err is not None:
            rows[key] = {"status": "error", "error": err}
        elif key not in queued:
            queued.add(key)
            todo.append((key, ovs, seed))
    bar = _bar(len(todo), progress)
    results = run_calls(evaluate, [(spec.scenario, ovs, seed, False, extra) for _, ovs, seed in todo], jobs, backend,
                        address)
    for (key, ovs, seed), row in zip(todo, results):
        rows[key] = row
        if store is not None:
            store.put(key, {"overrides": ovs, "seed": seed, "row": row})
        bar.update(1)
    bar.close()
    lead = spec.keys() + ["seed", "status", "error"]
    table = []
    for pt, seed, key, ovs, err in tasks:
        table.append({**dict(pt), "seed": seed, **rows[key]})
    table = SweepTable(table)
    table.stats = {"points": len(tasks), "computed": len(todo), "reused": reused}
    if store is not None:
        write_atomic(store.dir / "results.csv", table_csv(table, lead))
        _parquet(table, lead, store.dir / "results.parquet")
        from .plots import sweep_plot
        keys = [k for k, _ in grid]
        if plot or (1 <= len(keys) <= 2 and not random):
            sweep_plot(table, store.dir / "plots" / "sweep.png", metric=plot, x=x or (keys[0] if keys else None),
                       hue=hue or (keys[1] if len(keys) == 2 else None), title=_title(spec))
        from ..report import write as write_html        # reads results.csv and sweep.yaml, as `dsim report` does
        write_html(store.dir, "sweep")
    return table


class SweepTable(list):
    """The rows of a sweep; ``stats``: points, computed now, reused from the output folder."""
    stats: dict = {}


def _title(spec: SweepSpec) -> str:
    """'dsim sweep quickstart (workload.num_requests=200, cluster.replicas=8)': the base scenario as run."""
    from ..metrics.plots import run_title
    name = spec.name or (Path(spec.scenario).stem if isinstance(spec.scenario, str) else "")
    return f"dsim sweep {run_title(name, spec.overrides)}".strip()


def _parquet(rows, lead, path: Path) -> None:
    import importlib.util
    if importlib.util.find_spec("pandas") is None or importlib.util.find_spec("pyarrow") is None:
        return                                  # Parquet needs pandas with pyarrow: CSV only
    import pandas as pd
    cols = list(lead) + sorted({k for r in rows for k in r if not k.startswith("_")} - set(lead))
    df = pd.DataFrame([{c: r.get(c) for c in cols} for r in rows], columns=cols)
    for c in cols:                          # mixed-type columns (grid values) as text
        if df[c].map(type).nunique() > 1:
            df[c] = df[c].astype(str)
    tmp = path.with_name(path.name + ".tmp")
    df.to_parquet(tmp, index=False)
    tmp.replace(path)


class _NoBar:
    def update(self, n):
        pass

    def close(self):
        pass


def _bar(total: int, enabled: bool):
    if not enabled or total == 0 or not sys.stderr.isatty():
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, unit="point", file=sys.stderr, dynamic_ncols=True)
