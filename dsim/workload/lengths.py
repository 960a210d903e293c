"""Token-length distributions (prompt and output), sampled in one vectorised call."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from ..config.errors import ConfigError
from ..config.files import note_read


def sample_lengths(spec, path: str, n: int, rng: np.random.Generator, base_dir: Path | None) -> np.ndarray:
    """Integers >= 1.  ``spec`` is an integer (a constant length) or a typed distribution of
    dsim.config.schema.workload (validated at load); ``path`` names it in a file's errors."""
    if isinstance(spec, int):
        return np.full(n, spec, dtype=np.int64)
    dist, lo, hi = spec.dist, spec.min, spec.max
    if dist == "constant":
        out = np.full(n, spec.value, dtype=np.float64)
    elif dist == "uniform":
        a, b = spec.bounds
        out = rng.integers(a, b + 1, n).astype(np.float64)
    elif dist == "normal":
        out = np.rint(rng.normal(spec.mean, spec.std, n))
    elif dist == "lognormal":
        mean, std = spec.mean, spec.std
        sigma2 = math.log(1.0 + (std / mean) ** 2)
        mu = math.log(mean) - sigma2 / 2
        out = np.rint(rng.lognormal(mu, math.sqrt(sigma2), n))
    else:
        values = _read_empirical(spec, path, base_dir)
        out = values[rng.integers(0, len(values), n)].astype(np.float64)
    out = np.maximum(out, lo)
    if hi is not None:
        out = np.minimum(out, hi)
    return out.astype(np.int64)


def _read_empirical(spec, path: str, base_dir: Path | None) -> np.ndarray:
    """One positive integer per line, or a named column of a CSV with a header."""
    raw, column = spec.path, spec.column
    p = Path(raw)
    if base_dir is not None and not p.is_absolute():
        p = base_dir / p
    if not p.is_file():
        raise ConfigError(f"{path}.path", raw, "an existing file of lengths")
    vals = []
    note_read(p)
    with p.open() as f:
        col = None
        for lineno, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            if column is not None and col is None:
                names = [c.strip() for c in line.split(",")]
                if column not in names:
                    raise ConfigError(f"{path}.column", column, f"a column of {p} (has {', '.join(names)})")
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
        raise ConfigError(f"{path}.path", raw, "a file with at least one length")
    return np.asarray(vals, dtype=np.int64)
