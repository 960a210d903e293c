"""Sweep specifications: ``KEY=V1,V2`` grids, ``KEY=LO:HI`` random ranges, and the points they span.

A point is a tuple of (key, value) overrides, applied to the scenario like ``dsim run --set``;
values are parsed as YAML, so ``8`` is an int, ``true`` a bool and ``[1,2]`` a list.
"""
from __future__ import annotations

import itertools
import json

import numpy as np

from ..config.errors import ConfigError
from ..config.files import load_value
from ..config.limits import MAX_POINTS


def split_top(text: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets, so ``[1,2],[3,4]`` is two values."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == sep and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur))
    return out


def _value(text: str):
    return load_value(text)


def parse_grid(specs, flag: str = "--grid") -> list[tuple[str, list]]:
    """``["engine.max_num_seqs=64,128", "cluster.router=jsq,random"]`` -> [(key, values), ...]."""
    out, seen = [], set()
    for spec in specs or ():
        key, eq, vals = str(spec).partition("=")
        key = key.strip()
        if not eq or not key or not vals.strip():
            raise ConfigError(f"{flag} {spec}", None, "KEY=V1,V2,... e.g. workload.rate=10,20,40", show_value=False)
        if key in seen:
            raise ConfigError(f"{flag} {spec}", None, f"each key once ({key} is repeated)", show_value=False)
        seen.add(key)
        parts = split_top(vals)
        if len(parts) > MAX_POINTS:
            raise ConfigError(f"{flag} {key}", None, f"at most {MAX_POINTS:,} values (it has {len(parts):,})",
                              show_value=False)
        values = [_value(v.strip()) for v in parts]
        if any(v == "" for v in values):
            raise ConfigError(f"{flag} {spec}", None, "no empty values", show_value=False)
        out.append((key, values))
    return out


def parse_ranges(specs, flag: str = "--range") -> list[tuple[str, float, float, bool]]:
    """``["workload.rate=5:40", "engine.max_num_seqs=32:256"]`` -> [(key, lo, hi, integer), ...]."""
    out = []
    for spec in specs or ():
        key, eq, rng = str(spec).partition("=")
        lo_s, colon, hi_s = rng.partition(":")
        lo, hi = _value(lo_s), _value(hi_s)
        ok = eq and colon and key.strip() and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in (lo, hi))
        if not ok or lo >= hi:
            raise ConfigError(f"{flag} {spec}", None, "KEY=LO:HI with numbers LO < HI, e.g. workload.rate=5:40",
                              show_value=False)
        out.append((key.strip(), lo, hi, isinstance(lo, int) and isinstance(hi, int)))
    return out


def grid_points(grid) -> list[tuple]:
    """The cartesian product, the first key varying slowest (a point is ((key, value), ...))."""
    if not grid:
        return [()]
    keys = [k for k, _ in grid]
    return [tuple(zip(keys, combo)) for combo in itertools.product(*(v for _, v in grid))]


def random_points(ranges, n: int, seed: int, grid=()) -> list[tuple]:
    """``n`` points drawn uniformly in the ranges (integers inclusive), crossed with any grid;
    the same seed draws the same points."""
    g = np.random.default_rng([seed, 0x5EE9])
    draws = []
    for _ in range(n):
        pt = []
        for key, lo, hi, integer in ranges:
            v = int(g.integers(lo, hi + 1)) if integer else float(round(g.uniform(lo, hi), 6))
            pt.append((key, v))
        draws.append(tuple(pt))
    return [d + p for d in draws for p in grid_points(grid)]


def as_overrides(point) -> list[str]:
    """A point as ``--set`` strings; non-strings are written as JSON, which YAML reads back unchanged."""
    return [f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in point]
