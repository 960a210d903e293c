"""Small typed readers for scenario mappings; every failure is a path-qualified ConfigError."""
from __future__ import annotations

import difflib
import math
import numbers
from typing import Any, Iterable

from .errors import ConfigError

_MISSING = object()


class Section:
    """A view of one mapping in the scenario that tracks which keys were read.

    ``done()`` raises on any key that was never read, so typos cannot be silently ignored.
    """

    def __init__(self, data: Any, path: str):
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise ConfigError(path, data, "a mapping")
        self.data = data
        self.path = path
        self._seen: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def raw(self, key: str, default: Any = _MISSING) -> Any:
        self._seen.add(key)
        if key not in self.data:
            if default is _MISSING:
                raise ConfigError(self.sub(key), None, "this key to be set", show_value=False) from None
            return default
        return self.data[key]

    def section(self, key: str, default: Any = _MISSING) -> "Section":
        return Section(self.raw(key, {} if default is _MISSING else default), self.sub(key))

    def num(self, key: str, default: Any = _MISSING, *, lo: float | None = None,
            hi: float | None = None, lo_open: bool = False, integer: bool = False) -> Any:
        v = self.raw(key, default)
        if v is None and default is None:
            return None
        return check_number(v, self.sub(key), lo=lo, hi=hi, lo_open=lo_open, integer=integer)

    def int(self, key: str, default: Any = _MISSING, *, lo: int | None = None, hi: int | None = None) -> Any:
        return self.num(key, default, lo=lo, hi=hi, integer=True)

    def bool(self, key: str, default: Any = _MISSING) -> bool:
        v = self.raw(key, default)
        if not isinstance(v, bool):
            raise ConfigError(self.sub(key), v, "true or false")
        return v

    def str(self, key: str, default: Any = _MISSING, *, choices: Iterable[str] | None = None) -> Any:
        v = self.raw(key, default)
        if v is None and default is None:
            return None
        if not isinstance(v, str):
            raise ConfigError(self.sub(key), v, "a string")
        if choices is not None:
            choices = list(choices)
            if v not in choices:
                raise ConfigError(self.sub(key), v, "one of " + ", ".join(choices))
        return v

    def done(self) -> None:
        extra = sorted(set(self.data) - self._seen, key=str)
        if extra:
            k = extra[0]
            raise ConfigError(self.sub(str(k)), None, unknown_key_hint(str(k), self._seen), show_value=False)


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
