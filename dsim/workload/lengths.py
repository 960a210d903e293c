"""Token-length distributions (prompt and output), sampled in one vectorised call."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..config.errors import ConfigError
from ..config.fields import Section
from ..config.limits import MAX_TOKENS

DISTS = ("constant", "uniform", "normal", "lognormal", "empirical")


def sample_lengths(data, path: str, n: int, rng: np.random.Generator, base_dir: Path | None,
                   default_min: int = 1) -> np.ndarray:
    """Integers >= 1.  ``data`` may be a bare integer (constant) or a {dist: ...} mapping."""
    if isinstance(data, int) and not isinstance(data, bool):
        if not default_min <= data <= MAX_TOKENS:
            raise ConfigError(path, data, f"an integer in [{default_min}, {MAX_TOKENS:.0e}]")
        return np.full(n, data, dtype=np.int64)
    s = Section(data, path)
    dist = s.str("dist", choices=DISTS)
    lo = s.int("min", default_min, lo=default_min, hi=MAX_TOKENS)
    hi = s.int("max", None, lo=lo, hi=MAX_TOKENS)
    if dist == "constant":
        v = s.int("value", lo=default_min, hi=MAX_TOKENS)
        out = np.full(n, v, dtype=np.float64)
    elif dist == "uniform":
        a = s.int("low", lo, hi=MAX_TOKENS)
        b = s.int("high", hi, lo=a, hi=MAX_TOKENS) if hi is not None else s.int("high", lo=a, hi=MAX_TOKENS)
        out = rng.integers(a, b + 1, n).astype(np.float64)
    elif dist == "normal":
        mean = s.num("mean", lo=0, hi=MAX_TOKENS)
        std = s.num("std", lo=0, hi=MAX_TOKENS)
        out = np.rint(rng.normal(mean, std, n))
    elif dist == "lognormal":
        mean = s.num("mean", lo=1e-3, hi=MAX_TOKENS)
        std = s.num("std", lo=0, lo_open=True, hi=MAX_TOKENS)
        sigma2 = math.log(1.0 + (std / mean) ** 2)
        mu = math.log(mean) - sigma2 / 2
        out = np.rint(rng.lognormal(mu, math.sqrt(sigma2), n))
    else:
        values = _read_empirical(s, base_dir)
        out = values[rng.integers(0, len(values), n)].astype(np.float64)
    s.done()
    out = np.maximum(out, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return out.astype(np.int64)


def _read_empirical(s: Section, base_dir: Path | None) -> np.ndarray:
    """One positive integer per line, or a named column of a CSV with a header."""
    raw = s.str("path")
    column = s.str("column", None)
    p = Path(raw)
    if base_dir is not None and not p.is_absolute():
        p = base_dir / p
    if not p.is_file():
        raise ConfigError(s.sub("path"), raw, "an existing file of lengths")
    vals = []
    with p.open() as f:
        col = None
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if column is not None and col is None:
                names = [c.strip() for c in line.split(",")]
                if column not in names:
                    raise ConfigError(s.sub("column"), column, f"a column of {p} (has {', '.join(names)})")
                col = names.index(column)
                continue
            field = line.split(",")[col] if col is not None else line
            try:
                v = int(float(field))
            except ValueError:
                raise ConfigError(f"{p}:{lineno}", field, "an integer length") from None
            if v < 1:
                raise ConfigError(f"{p}:{lineno}", v, "a length >= 1")
            vals.append(v)
    if not vals:
        raise ConfigError(s.sub("path"), raw, "a file with at least one length")
    return np.asarray(vals, dtype=np.int64)
