"""The building blocks every declared scenario section uses.

Why msgspec and our own walk (not pydantic): a section is a frozen ``msgspec.Struct`` (cheap to
create: about a hundred classes cost a few ms, where pydantic's import, class creation and
validator compilation cost a 100-request run a third of its time), and every value is checked by
dsim's own functions, which raise :class:`~dsim.config.errors.ConfigError` with a path relative to
the value: the walk here (:func:`compile_type`) prefixes the keys and indices, so every message a
user sees (``engine.max_num_seqs: got 0, expected a number >= 1``, unknown keys with did-you-mean)
comes from one place.  The JSON Schema is generated from the same declarations (jsonschema.py).

Rules for a section model (subclass :class:`Section`):
- every field has a type from this module (or a nested Section / list / mapping of them), a
  default, and a one-line docstring below it (``dsim schema`` puts it into the JSON Schema and the
  reference as the field's description: dsim.config.schema.docstrings);
- a field whose default depends on other fields is ``Optional`` with default None, and its
  docstring says what None resolves to; the builder that owns the concern resolves it;
- cross-field rules raise ``ConfigError(field, value, expected)`` with a path *relative to the
  model* from a ``@model_validator(mode="after")``; :func:`parse` makes it absolute.
"""
from __future__ import annotations

import numbers
from typing import Annotated, Any

import msgspec

from ..errors import ConfigError
from ..fields import check_number, unknown_key_hint
from .walk import (BeforeValidator, Discriminator, Field, SectionMeta, Tag, ValidationError, compile_type,
                   field_validator, model_validator, under)

__all__ = ["Section", "parse", "translate", "merged", "checked", "Int", "Float", "Bool", "Str", "Choice",
           "Raw", "Tagged", "Lazy", "is_number", "check_str", "one_of", "BeforeValidator", "Discriminator",
           "Field", "Tag", "ValidationError", "field_validator", "model_validator", "TypeAdapter"]


class Section(msgspec.Struct, metaclass=SectionMeta, frozen=True, kw_only=True, dict=True):
    """One mapping of the scenario: unknown keys are errors (with did-you-mean), None means {}."""

    @model_validator(mode="before")
    @classmethod
    def _known_keys_only(cls, data: Any) -> Any:
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise ConfigError("", data, "a mapping")
        known = cls.keys()
        for key in data:
            if key not in known:
                raise ConfigError(str(key), None, unknown_key_hint(str(key), known), show_value=False)
        return data

    @classmethod
    def keys(cls) -> list[str]:
        """The YAML keys this section accepts."""
        return list(cls.model_fields)

    @classmethod
    def model_validate(cls, data: Any) -> Any:
        """``data`` as this section; the first problem is a ValidationError (a ConfigError) with a
        path relative to ``data``."""
        if isinstance(data, cls):
            return data
        try:
            return cls.__dsim_plan__()(data)
        except ValidationError:
            raise
        except ConfigError as e:
            raise ValidationError(e.path, e.value, e.expected, show_value=e.show_value) from None

    def __reduce__(self):
        """Pickled and copied as its fields and given keys (no second validation)."""
        return _restore, (type(self), {k: getattr(self, k) for k in self.__struct_fields__}, self.model_fields_set)

    @property
    def model_fields_set(self) -> frozenset:
        return self.__dict__.get("_given", frozenset())

    def given(self, key: str) -> bool:
        """Was ``key`` written in the scenario (as opposed to taking its default)?"""
        return key in self.model_fields_set

    def to_dict(self) -> dict:
        """The keys as written (unset ones left out): what a builder hands on to old-style code."""
        return self.model_dump(exclude_unset=True)

    def model_dump(self, *, by_alias: bool = False, exclude_unset: bool = False) -> dict:
        """The fields as plain Python values (sections as dicts); ``exclude_unset``: only the keys
        written, at every level."""
        given = self.model_fields_set
        return {k: _dump(getattr(self, k), exclude_unset) for k in type(self).model_fields
                if not exclude_unset or k in given}


def _restore(cls, values: dict, given: frozenset) -> Any:
    obj = super(type(cls), cls).__call__(**values)
    msgspec.structs.force_setattr(obj, "_given", given)
    return obj


def _dump(v: Any, exclude_unset: bool) -> Any:
    if isinstance(v, Section):
        return v.model_dump(exclude_unset=exclude_unset)
    if isinstance(v, list):
        return [_dump(x, exclude_unset) for x in v]
    if isinstance(v, tuple):
        return tuple(_dump(x, exclude_unset) for x in v)
    if isinstance(v, dict):
        return {k: _dump(x, exclude_unset) for k, x in v.items()}
    return v


class TypeAdapter:
    """Validation of a value of any declared type (a Tagged union, a list, ...) outside a section."""

    def __init__(self, tp: Any):
        self.tp = tp
        self._check = None

    def validate_python(self, v: Any) -> Any:
        if self._check is None:
            self._check = compile_type(self.tp)
        try:
            return self._check(v)
        except ValidationError:
            raise
        except ConfigError as e:
            raise ValidationError(e.path, e.value, e.expected, show_value=e.show_value) from None


def parse(model: type[Section], data: Any, path: str) -> Any:
    """Validate ``data`` (the mapping at ``path``) into ``model``; the first problem is a ConfigError."""
    try:
        return model.model_validate(data if data is not None else {})
    except ConfigError as e:
        raise translate(e, data, path) from None


def translate(err: ConfigError, data: Any, path: str) -> ConfigError:
    """A ConfigError with a path relative to ``data`` (the value at ``path``), made absolute."""
    return under(path, err, ConfigError)


# ---- field types: dsim's own checks, with the JSON Schema an editor needs ------------------------

def _schema_bounds(js: dict, lo, hi, lo_open) -> dict:
    if lo is not None:
        js["exclusiveMinimum" if lo_open else "minimum"] = lo
    if hi is not None:
        js["maximum"] = hi
    return js


class _Checked:
    """A field type checked by one of dsim's functions (``check``), shown to editors as ``js``."""

    __slots__ = ("check", "js")

    def __init__(self, check, js: dict):
        self.check, self.js = check, js


def checked(py_type, check, js: dict):
    """``py_type`` validated by ``check`` (a ConfigError with a relative path on a bad value), shown as ``js``."""
    return Annotated[py_type, _Checked(check, js)]


_TYPES: dict = {}


def _memo(key, make):
    """One Annotated type per distinct declaration (Int(1) on fifty fields is one object)."""
    tp = _TYPES.get(key)
    if tp is None:
        tp = _TYPES[key] = make()
    return tp


def Int(lo: int | None = None, hi: int | None = None):
    """An integer in [lo, hi]; 5.0 reads as 5, booleans and strings are refused."""
    def make():
        def check(v):
            return check_number(v, "", lo=lo, hi=hi, integer=True)
        return checked(int, check, _schema_bounds({"type": "integer"}, lo, hi, False))
    return _memo(("int", lo, hi), make)


def Float(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False):
    """A finite number in [lo, hi] (or (lo, hi] with ``lo_open``); integers are accepted."""
    def make():
        def check(v):
            return check_number(v, "", lo=lo, hi=hi, lo_open=lo_open)
        return checked(float, check, _schema_bounds({"type": "number"}, lo, hi, lo_open))
    return _memo(("float", lo, hi, lo_open), make)


def _bool(v):
    if type(v).__module__ == "numpy" and type(v).__name__ in ("bool_", "bool"):
        v = bool(v)                           # np.True_ (a pandas row's flag)
    if not isinstance(v, bool):
        raise ConfigError("", v, "true or false")
    return v


Bool = checked(bool, _bool, {"type": "boolean"})


def check_str(v):
    if not isinstance(v, str):
        raise ConfigError("", v, "a string")
    return v


Str = checked(str, check_str, {"type": "string"})


def one_of(*options: str):
    """The check of a ``Choice``: one string of ``options`` (the message lists them)."""
    def check(v):
        if not isinstance(v, str):
            raise ConfigError("", v, "a string")
        if v not in options:
            raise ConfigError("", v, "one of " + ", ".join(options))
        return v
    return check


def Choice(*options: str):
    """One string of a fixed set (the message lists them)."""
    opts = tuple(options)
    return _memo(("choice",) + opts, lambda: checked(str, one_of(*opts), {"type": "string", "enum": list(opts)}))


def _any(v):
    return v


def Raw(description_schema: dict | None = None):
    """A value a builder reads itself (a file path or inline data whose shape depends on content)."""
    return checked(Any, _any, description_schema or {})


def is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


class _TaggedUnion:
    """Validation of a ``Tagged`` value: the member named by the tag validates it (each member's
    walk is compiled the first time that member is met, so a run compiles the few it uses)."""

    def __init__(self, key: str, members: dict, default: str | None):
        self.key, self.members, self.default = key, dict(members), default
        self.names = tuple(members)

    def validate(self, v: Any) -> Any:
        if isinstance(v, Section) and type(v) in self.members.values():
            return v
        if v is None:
            v = {}
        if not isinstance(v, dict):
            raise ConfigError("", v, "a mapping")
        tag = v.get(self.key, self.default)
        if tag is not None and not isinstance(tag, str):
            raise ConfigError(self.key, tag, "one of " + ", ".join(self.names))
        if tag is None:
            raise ConfigError(self.key, None, "this key to be set (one of " + ", ".join(self.names) + ")",
                              show_value=False)
        if tag not in self.members:
            raise ConfigError(self.key, tag, "one of " + ", ".join(self.names))
        if self.key not in v:                   # the default tag: the member sees it as written
            v = {**v, self.key: tag}
        return self.members[tag].model_validate(v)


def Tagged(key: str, members: dict, default: str | None = None):
    """One of several section models chosen by the value of ``key`` (``type: poisson``, ``model: lut``).

    Each member declares ``key`` as a ``Literal`` field (with ``default`` as its default where the
    key may be left out), so the JSON Schema shows the choice and the member's own keys."""
    return Annotated[Any, _TaggedUnion(key, members, default)]


class _Lazy:
    """Validation by ``tp``'s own walk, compiled the first time a value is met (a scenario
    without a cluster never compiles the cluster's models); the JSON Schema is ``tp``'s."""

    def __init__(self, tp: Any):
        self._tp = tp
        self._check = None

    @property
    def tp(self) -> Any:
        """The type; a "module:name" string is imported on first use (a section's models are then
        not even created for a scenario without that section)."""
        if isinstance(self._tp, str):
            import importlib
            module, _, name = self._tp.partition(":")
            self._tp = getattr(importlib.import_module(module), name)
        return self._tp

    def validate(self, v: Any) -> Any:
        if self._check is None:
            self._check = compile_type(self.tp)
        return self._check(v)


def Lazy(tp: Any):
    """A section field whose type is compiled on first use (see _Lazy); ``tp`` may be a
    "module:name" string, imported on first use."""
    return Annotated[Any, _Lazy(tp)]


def merged(shared: Any, own: Any) -> Any:
    """A pool's section on top of the scenario's shared one: keys the pool writes win.

    Both are typed sections of one model (or None); the result is validated again as a whole, so
    cross-field rules see the combination the replica will run with."""
    if own is None:
        return shared
    if shared is None:
        return own
    if isinstance(own, Section):
        return type(own).model_validate({**shared.to_dict(), **own.to_dict()})
    return {**shared, **own}                 # sections still declared as Raw (a mapping)


def _join_key(path: str, key: str) -> str:
    if not key:
        return path
    if not path:
        return key
    return f"{path}{key}" if key.startswith("[") else f"{path}.{key}"
