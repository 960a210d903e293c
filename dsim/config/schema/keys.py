"""Is ``cluster.pools[-1].replicas`` a key of the scenario?  Answered from the declared models alone.

Why: a sweep over a misspelt key used to build a whole simulation per swept key to find out; the
schema knows every key, so ``--set``, ``--grid`` and plan spaces are checked before anything runs."""
from __future__ import annotations

import re
import types
import typing
from typing import Any

from ..errors import ConfigError
from ..fields import unknown_key_hint

_SEG = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)((?:\[-?\d+\])*)$")
_ANY = "any"             # a value whose inside the schema does not declare (a builder reads it)


def check_key(key: str, flag: str = "--set") -> None:
    """Raise ConfigError (with did-you-mean) when ``key`` names nothing in the scenario schema."""
    from .base import Section
    from .scenario import ScenarioConfig
    here: list = [ScenarioConfig]
    walked = ""
    for part in key.strip().split("."):
        m = _SEG.match(part)
        if not m:
            raise ConfigError(f"{flag} {key}", part, "dotted keys with optional [index]")
        name, idx = m.group(1), re.findall(r"\[(-?\d+)\]", m.group(2))
        nxt, known = [], set()
        for t in here:
            for leaf in _expand(t):
                if leaf is _ANY:
                    return
                if isinstance(leaf, tuple) and leaf[0] == "map":
                    nxt.append(leaf[1])
                elif isinstance(leaf, type) and issubclass(leaf, Section):
                    fields = leaf.model_fields
                    known.update(fields)
                    if name in fields:
                        nxt.append(fields[name].annotation)
        if not nxt:
            where = f"{walked}.{name}" if walked else name
            raise ConfigError(f"{flag} {key}", None, f"a key of the scenario ({where}: "
                              f"{unknown_key_hint(name, known)})", show_value=False)
        for _ in idx:
            items = [leaf[1] for t in nxt for leaf in _expand(t) if isinstance(leaf, tuple) and leaf[0] == "list"]
            if any(leaf is _ANY for t in nxt for leaf in _expand(t)):
                return
            if not items:
                raise ConfigError(f"{flag} {key}", part, f"{name} is not a list: no [index] here")
            nxt = items
        here = nxt
        walked = f"{walked}.{part}" if walked else part


def _expand(t: Any) -> list:
    """What a value of annotation ``t`` may be: section models, ("list", item), ("map", value), _ANY
    (undeclared inside) or nothing (a scalar)."""
    from .base import Section, _Lazy, _TaggedUnion
    origin = typing.get_origin(t)
    if origin is typing.Annotated:
        for meta in getattr(t, "__metadata__", ()):
            if isinstance(meta, _TaggedUnion):
                return list(meta.members.values())
            if isinstance(meta, _Lazy):
                return _expand(meta.tp)
        return _expand(typing.get_args(t)[0])
    if origin in (typing.Union, types.UnionType):
        return [x for a in typing.get_args(t) for x in _expand(a)]
    if origin in (list, tuple, typing.Sequence):
        args = typing.get_args(t)
        return [("list", args[0] if args else Any)]
    if origin is dict:
        args = typing.get_args(t)
        return [("map", args[1] if len(args) == 2 else Any)]
    if t is Any or t is dict:
        return [_ANY]
    if t is list:
        return [("list", Any)]
    if isinstance(t, type) and issubclass(t, Section):
        return [t]
    return []
