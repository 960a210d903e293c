"""Validation of a value against a declared type: one small function per type, compiled on first use.

Why our own walk: every check is one of dsim's functions raising a ConfigError whose path is
relative to the value it checked; the walk prefixes keys and indices as it returns, so the first
problem reaches the user with its whole path and dsim's wording, and nothing is compiled for the
sections a scenario does not use.  A section's plan follows the declaration: model before-checks
(the most derived class's first), each field in order (its before-checks, its type, its
after-checks), then model after-checks (the base class's first).
"""
from __future__ import annotations

import copy
import types
import typing
from typing import Annotated, Any, Literal, Union

import msgspec

from ..errors import ConfigError

_MISSING = object()
_PLANS: dict = {}
_FIELDS: dict = {}


class ValidationError(ConfigError):
    """A ConfigError whose path is relative to the value validated (``translate`` makes it absolute)."""


def under(prefix: str, err: ConfigError, kind: type = ConfigError) -> ConfigError:
    """``err`` with ``prefix`` (a key or ``[i]``) in front of its path."""
    from .base import _join_key
    return kind(_join_key(prefix, err.path), err.value, err.expected, show_value=err.show_value)


# ---- declarations: what a section's class body may hold besides types --------------------------

class Field:
    """A field's default made at each use (``default_factory``), a default that is validated
    (``validate_default``), or the length bounds of a list (inside ``Annotated``)."""

    def __init__(self, default: Any = _MISSING, *, default_factory=None, validate_default: bool = False,
                 min_length: int | None = None, max_length: int | None = None):
        self.default, self.default_factory = default, default_factory
        self.validate_default, self.min_length, self.max_length = validate_default, min_length, max_length


class BeforeValidator:
    """Inside ``Annotated``: ``func`` sees the value first (it may reshape it or refuse it)."""

    def __init__(self, func):
        self.func = func


class Tag:
    """Inside ``Annotated``: the name of one member of a discriminated union."""

    def __init__(self, tag: str):
        self.tag = tag


class Discriminator:
    """Inside ``Annotated[Union[Annotated[X, Tag(t)], ...], Discriminator(pick)]``: ``pick(value)``
    names the member that validates the value."""

    def __init__(self, pick):
        self.pick = pick


class _Decorated:
    def __init__(self, func, kind: str, mode: str, fields: tuple = ()):
        self.func, self.kind, self.mode, self.fields = func, kind, mode, fields


def model_validator(*, mode: str):
    """A check of the whole section: ``before`` (a classmethod, on the mapping as written) or
    ``after`` (a method, on the typed section); it raises ConfigError with a relative path."""
    return lambda func: _Decorated(func, "model", mode)


def field_validator(*fields: str, mode: str = "after"):
    """A check of some fields' values: ``before`` (on the value as written) or ``after`` (on the
    typed value); a classmethod returning the value to keep."""
    return lambda func: _Decorated(func, "field", mode, fields)


class FieldInfo:
    """What the schema generator and ``dsim`` commands read about one field."""

    __slots__ = ("name", "annotation", "default", "default_factory", "validate_default", "alias")

    def __init__(self, name, annotation, default, default_factory, validate_default):
        self.name, self.annotation, self.default = name, annotation, default
        self.default_factory, self.validate_default, self.alias = default_factory, validate_default, None

    def is_required(self) -> bool:
        return self.default is _MISSING and self.default_factory is None


def _flatten(bases: tuple, ns: dict) -> tuple:
    """msgspec structs with fields cannot share a subclass (instance lay-out): the last base stays
    a base, the others' declarations (fields, checks, methods) are copied into the class, in the
    order Python's method resolution would have met them, so fields keep their declared order."""
    kept = bases[-1]
    dropped: list = []
    for b in bases[:-1]:
        for k in b.__mro__:
            if k not in kept.__mro__ and k not in dropped:
                dropped.append(k)
    ann, body, decos = {}, {}, {}
    for k in reversed(dropped):
        own = k.__dict__
        for field, spec in own.get("__dsim_specs__", {}).items():
            ann[field] = own["__annotations__"][field]
            if spec.default is not _MISSING or spec.default_factory is not None:
                body[field] = spec
            else:
                body.pop(field, None)
        for key, value in own.items():
            if not key.startswith("__") and key not in own.get("__dsim_specs__", ()):
                body[key] = value
        decos.update(own.get("__dsim_decos__", {}))
    ann.update(ns.get("__annotations__", {}))
    out = {**body, **ns, "__annotations__": ann, "__dsim_flat__": tuple(dropped)}
    for field in ns.get("__annotations__", {}):
        if field not in ns:
            out.pop(field, None)
    return (kept,), out, decos


def _copier(value):
    return lambda: copy.deepcopy(value)


class SectionMeta(type(msgspec.Struct)):
    """Records each class's own field defaults and checks before msgspec makes the struct."""

    def __new__(mcls, name, bases, ns, **kw):
        specs, decos = {}, {}
        if sum(1 for b in bases if getattr(b, "__struct_fields__", ())) > 1:
            bases, ns, decos = _flatten(bases, ns)
        for key, value in list(ns.items()):
            if isinstance(value, _Decorated):
                decos[key] = value
                ns[key] = value.func
        for field in ns.get("__annotations__", {}):
            value = ns.get(field, _MISSING)
            spec = value if isinstance(value, Field) else Field(value)
            specs[field] = spec
            if value is _MISSING:
                continue
            if spec.default_factory is not None:
                ns[field] = msgspec.field(default_factory=spec.default_factory)
            elif isinstance(spec.default, (list, dict, set)) and spec.default:
                ns[field] = msgspec.field(default_factory=_copier(spec.default))
            else:
                ns[field] = spec.default
        ns["__dsim_specs__"] = specs
        ns["__dsim_decos__"] = decos
        kw.setdefault("kw_only", True)            # msgspec applies it to the class's own fields only
        return super().__new__(mcls, name, bases, ns, **kw)

    def __call__(cls, **values):
        """``Section(key=value, ...)`` in code is validated like a scenario's mapping."""
        return cls.model_validate(values)

    @property
    def model_fields(cls) -> dict:
        """{name: FieldInfo} in declaration order (base classes' fields first)."""
        out = _FIELDS.get(cls)
        if out is None:
            hints = typing.get_type_hints(cls, include_extras=True)
            out = {}
            for name in hints:
                if name not in cls.__struct_fields__:
                    continue
                spec = next(k.__dict__["__dsim_specs__"][name] for k in cls.__mro__
                            if name in k.__dict__.get("__dsim_specs__", ()))
                out[name] = FieldInfo(name, hints[name], spec.default, spec.default_factory, spec.validate_default)
            _FIELDS[cls] = out
        return out

    def __dsim_plan__(cls):
        """The compiled walk of this section (made on first use)."""
        run = _PLANS.get(cls)
        if run is None:
            run = _PLANS[cls] = _compile_section(cls)
        return run


def _compile_section(cls):
    decos: dict = {}
    for klass in reversed(cls.__mro__):
        decos.update(klass.__dict__.get("__dsim_decos__", {}))
    befores = [getattr(cls, n) for n, d in reversed(decos.items()) if d.kind == "model" and d.mode == "before"]
    afters = [getattr(cls, n) for n, d in decos.items() if d.kind == "model" and d.mode == "after"]
    fields = []
    for name, info in cls.model_fields.items():
        fb = [getattr(cls, n) for n, d in reversed(decos.items())
              if d.kind == "field" and d.mode == "before" and name in d.fields]
        fa = [getattr(cls, n) for n, d in decos.items()
              if d.kind == "field" and d.mode == "after" and name in d.fields]
        check = compile_type(info.annotation)
        if fb or fa:
            check = _with_field_checks(check, fb, fa)
        # a default is validated only when declared so (else msgspec fills it in, a fresh copy)
        default = info.default if info.validate_default else _MISSING
        fields.append((name, check, info.is_required(), default))
    force = msgspec.structs.force_setattr
    make = super(SectionMeta, cls).__call__          # the struct itself, without validation

    def run(data):
        for b in befores:
            data = b(data)
        vals, given = {}, []
        for name, check, required, default in fields:
            if name in data:
                v = data[name]
                given.append(name)
            elif required:
                raise ConfigError(name, None, "this key to be set", show_value=False)
            elif default is _MISSING:
                continue
            else:
                v = default
            try:
                vals[name] = check(v)
            except ConfigError as e:
                raise under(name, e) from None
        obj = make(**vals)
        force(obj, "_given", frozenset(given))
        for a in afters:
            r = a(obj)
            if r is not None:
                obj = r
        return obj
    return run


def _with_field_checks(check, before: list, after: list):
    def run(v):
        for f in before:
            v = f(v)
        v = check(v)
        for f in after:
            v = f(v)
        return v
    return run


# ---- types -----------------------------------------------------------------------------------

def _identity(v):
    return v


def _str(v):
    if not isinstance(v, str):
        raise ConfigError("", v, "a string")
    return v


def compile_type(tp: Any):
    """A function that checks a value of type ``tp`` and returns it as typed (a ConfigError with a
    path relative to the value on the first problem)."""
    from .base import Section, _Checked, _Lazy, _TaggedUnion
    origin = typing.get_origin(tp)
    if origin is Annotated:
        base, *meta = typing.get_args(tp)
        fn = None
        for m in meta:
            if isinstance(m, _Checked):
                fn = m.check
            elif isinstance(m, (_TaggedUnion, _Lazy)):
                fn = m.validate
            elif isinstance(m, Discriminator):
                fn = _discriminated(base, m.pick)
            elif isinstance(m, BeforeValidator):
                fn = _before(m.func, fn or compile_type(base))
            elif isinstance(m, Field):
                fn = _lengths(fn or compile_type(base), m.min_length, m.max_length)
            elif hasattr(m, "before"):                          # cluster.NameOrMapping
                fn = _before(m.before, fn or compile_type(base))
        return fn or compile_type(base)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        others = [a for a in args if a is not type(None)]
        if len(others) == 1:
            inner = compile_type(others[0])
            return lambda v: None if v is None else inner(v)
        raise TypeError(f"an undiscriminated union is not declarable: {tp}")
    if origin is Literal:
        values = typing.get_args(tp)
        expected = "one of " + ", ".join(str(x) for x in values)

        def literal(v):
            if v not in values or isinstance(v, bool) != isinstance(values[values.index(v)], bool):
                raise ConfigError("", v, expected)
            return v
        return literal
    if origin is list:
        return _list(compile_type(typing.get_args(tp)[0]))
    if origin is dict:
        k, v = typing.get_args(tp)
        return _dict(compile_type(k), compile_type(v))
    if isinstance(tp, type) and issubclass(tp, Section):
        return _section(tp)
    if tp is Any:
        return _identity
    if tp is str:
        return _str
    if tp is type(None):
        def none(v):
            if v is not None:
                raise ConfigError("", v, "null")
            return v
        return none
    raise TypeError(f"not a declarable type: {tp!r}")


def _section(tp):
    def run(v):
        if isinstance(v, tp):
            return v
        return tp.__dsim_plan__()(v)
    return run


def _before(func, inner):
    return lambda v: inner(func(v))


def _discriminated(union, pick):
    members = {}
    for arg in typing.get_args(union):
        tag = next(m.tag for m in typing.get_args(arg)[1:] if isinstance(m, Tag))
        members[tag] = compile_type(arg)
    return lambda v: members[pick(v)](v)


def _lengths(inner, lo, hi):
    def run(v):
        v = inner(v)
        if lo is not None and len(v) < lo:
            raise ConfigError("", v, f"at least {lo} item(s)")
        if hi is not None and len(v) > hi:
            raise ConfigError("", v, f"at most {hi} item(s)")
        return v
    return run


def _list(item):
    def run(v):
        if not isinstance(v, (list, tuple)):
            raise ConfigError("", v, "a list")
        out = []
        for i, x in enumerate(v):
            try:
                out.append(item(x))
            except ConfigError as e:
                raise under(f"[{i}]", e) from None
        return out
    return run


def _dict(key, value):
    def run(v):
        if not isinstance(v, dict):
            raise ConfigError("", v, "a mapping")
        out = {}
        for k, x in v.items():
            try:
                out[key(k)] = value(x)
            except ConfigError as e:
                raise under(str(k), e) from None
        return out
    return run
