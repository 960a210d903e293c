"""The checks every input shares (numbers with bounds, unknown keys with did-you-mean); the scenario's
sections are declared in dsim.config.schema, which uses them, and so do CLI flags and Python API
arguments."""
from __future__ import annotations

import difflib
import math
import numbers
from typing import Any

from .errors import ConfigError


def unknown_key_hint(key: str, known) -> str:
    """"unknown key; did you mean 'workload'? (known keys here: ...)" for a key nobody reads."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return f"unknown key{hint} (known keys here: {', '.join(known) or '(none)'})"


def check_number(v: Any, path: str, *, lo=None, hi=None, lo_open=False, integer=False):
    if not isinstance(v, (int, float)) and isinstance(v, numbers.Real) and not hasattr(v, "__len__"):
        v = int(v) if isinstance(v, numbers.Integral) else float(v)    # numpy scalars (np.int64(5))
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(path, v, "an integer" if integer else "a number")
    if integer:
        if isinstance(v, float):
            if not v.is_integer():
                raise ConfigError(path, v, "an integer")
            v = int(v)
    elif not math.isfinite(v):
        raise ConfigError(path, v, "a finite number")
    if lo is not None and (v < lo or (lo_open and v == lo)):
        raise ConfigError(path, v, f"a number {'>' if lo_open else '>='} {lo}")
    if hi is not None and v > hi:
        raise ConfigError(path, v, f"a number <= {hi}")
    return v
