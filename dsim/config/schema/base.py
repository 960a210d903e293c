"""The building blocks every declared scenario section uses.

Why pydantic: it turns one class per concern into a validator, typed defaults-filled objects and a
JSON Schema for editors, from the same declaration.  What it does not give us is dsim's error
form (``engine.max_num_seqs: got 0, expected a number >= 1``, unknown keys with did-you-mean, YAML
1.1 quirks, numpy scalars); the field types below and :func:`parse` provide that, so every message
a user sees still comes from :class:`~dsim.config.errors.ConfigError`.

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
from typing import Annotated, Any, Iterable

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from ..errors import ConfigError
from ..fields import check_number, unknown_key_hint


class Section(BaseModel):
    """One mapping of the scenario: unknown keys are errors (with did-you-mean), None means {}."""

    # defer_build: a model's validator is compiled when first used (most sections' models are only
    # reached through ScenarioConfig's), not when the class is created
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), populate_by_name=True,
                              defer_build=True, arbitrary_types_allowed=True)

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
        """The YAML keys this section accepts (aliases where a field has one)."""
        return [f.alias or name for name, f in cls.model_fields.items()]

    def given(self, key: str) -> bool:
        """Was ``key`` written in the scenario (as opposed to taking its default)?"""
        return key in self.model_fields_set

    def to_dict(self) -> dict:
        """The keys as written (unset ones left out): what a builder hands on to old-style code."""
        return self.model_dump(by_alias=True, exclude_unset=True)


def parse(model: type[Section], data: Any, path: str) -> Any:
    """Validate ``data`` (the mapping at ``path``) into ``model``; the first problem is a ConfigError."""
    try:
        return model.model_validate(data if data is not None else {})
    except ValidationError as e:
        raise translate(e, data, path) from None


def translate(err: ValidationError, data: Any, path: str) -> ConfigError:
    """The first of pydantic's errors, in dsim's form, with a path that follows the user's keys."""
    first = err.errors(include_url=False)[0]
    loc, node = _walk(first["loc"], data, first["type"] == "missing")
    where = _join(path, loc)
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, ConfigError):
        return ConfigError(_join_key(where, cause.path), cause.value, cause.expected,
                           show_value=cause.show_value)
    if isinstance(cause, ValidationError):            # a nested parse() inside a validator
        return translate(cause, node, where)
    kind, ctx, given = first["type"], first.get("ctx") or {}, first.get("input")
    if kind == "missing":
        return ConfigError(where, None, "this key to be set", show_value=False)
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        tag = ctx.get("discriminator", "type").strip("'")
        if kind == "union_tag_not_found":
            return ConfigError(_join_key(where, tag), None, "this key to be set", show_value=False)
        return ConfigError(_join_key(where, tag), ctx.get("tag"), "one of " + str(ctx.get("expected_tags", ""))
                           .replace("'", ""))
    expected = _EXPECTED.get(kind)
    if expected is None:
        expected = first["msg"][0].lower() + first["msg"][1:]
    elif callable(expected):
        expected = expected(ctx)
    return ConfigError(where, given, expected)


_EXPECTED = {
    "dict_type": "a mapping", "model_type": "a mapping", "model_attributes_type": "a mapping",
    "list_type": "a list", "tuple_type": "a list", "string_type": "a string", "bool_type": "true or false",
    "int_type": "an integer", "float_type": "a number", "int_from_float": "an integer",
    "literal_error": lambda c: "one of " + str(c.get("expected", "")).replace("'", "").replace(" or ", ", "),
    "too_short": lambda c: f"at least {c.get('min_length')} item(s)",
    "too_long": lambda c: f"at most {c.get('max_length')} item(s)",
}


def _walk(loc: tuple, data: Any, missing: bool) -> tuple[list, Any]:
    """Keep the parts of pydantic's location that are the user's keys and indices (drop union tags)."""
    out, node = [], data
    for i, part in enumerate(loc):
        last = i == len(loc) - 1
        if isinstance(node, dict) and part in node:
            out.append(str(part))          # a mapping's key, even a number (`devices: {1: ...}`) is `.1`
            node = node[part]
        elif isinstance(node, (list, tuple)) and isinstance(part, int) and -len(node) <= part < len(node):
            out.append(part)
            node = node[part]
        elif last and missing:
            out.append(part)
            node = None
        # else: a union member's tag or a validator's name, not part of the user's file
    return out, node


def _join(path: str, loc: Iterable) -> str:
    for part in loc:
        path = f"{path}[{part}]" if isinstance(part, int) else _join_key(path, str(part))
    return path


def _join_key(path: str, key: str) -> str:
    if not key:
        return path
    if not path:
        return key
    return f"{path}{key}" if key.startswith("[") else f"{path}.{key}"


# ---- field types: dsim's own checks, with the JSON Schema an editor needs ------------------------

def _schema_bounds(js: dict, lo, hi, lo_open) -> dict:
    if lo is not None:
        js["exclusiveMinimum" if lo_open else "minimum"] = lo
    if hi is not None:
        js["maximum"] = hi
    return js


class _Checked:
    """A field type checked by one of dsim's functions: pydantic calls ``check`` directly (a plain
    validator core schema), and editors get ``js``.

    Why not ``Annotated[int, PlainValidator(check), WithJsonSchema(js)]``: pydantic applies such
    metadata through its generic annotation machinery on every field, a few hundred microseconds a
    field when a section's validator is first compiled.  The core schema is made anew for each use:
    pydantic writes into it (its metadata), so one shared dict would grow with every model."""

    __slots__ = ("check", "js")

    def __init__(self, check, js: dict):
        self.check, self.js = check, js

    def __get_pydantic_core_schema__(self, _source, _handler):
        from pydantic_core import core_schema
        return core_schema.no_info_plain_validator_function(self.check)

    def __get_pydantic_json_schema__(self, _schema, _handler):
        return dict(self.js)


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
    """Validation of a ``Tagged`` value: the member named by the tag validates it with its own
    validator, compiled the first time that member is met.

    Why not pydantic's discriminated union: it compiles every member (and their members) when the
    enclosing model is built, and a scenario's sections have about a hundred models; a run needs the
    few it uses, and ``dsim schema`` alone needs them all (``__get_pydantic_json_schema__``)."""

    def __init__(self, key: str, members: dict, default: str | None):
        self.key, self.members, self.default = key, dict(members), default
        self.names = tuple(members)

    def validate(self, v: Any) -> Any:
        if isinstance(v, BaseModel) and type(v) in self.members.values():
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

    def __get_pydantic_core_schema__(self, _source, _handler):
        from pydantic_core import core_schema
        return core_schema.no_info_plain_validator_function(self.validate)

    def __get_pydantic_json_schema__(self, _schema, handler):
        from pydantic import TypeAdapter
        unique = dict.fromkeys(self.members.values())        # several tags may share one model
        # anyOf, not oneOf: the tag tells members apart, and a section may be null ({}), which
        # every member accepts
        return {"anyOf": [handler(TypeAdapter(m).core_schema) for m in unique]}


def Tagged(key: str, members: dict, default: str | None = None):
    """One of several section models chosen by the value of ``key`` (``type: poisson``, ``model: lut``).

    Each member declares ``key`` as a ``Literal`` field (with ``default`` as its default where the
    key may be left out), so the JSON Schema shows the choice and the member's own keys."""
    return Annotated[Any, _TaggedUnion(key, members, default)]


class _Lazy:
    """Validation by ``tp``'s own validator, compiled the first time a value is met (a scenario
    without a cluster never compiles the cluster's models); the JSON Schema is ``tp``'s."""

    def __init__(self, tp: Any):
        self._tp = tp
        self._adapter = None

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
        if self._adapter is None:
            from pydantic import TypeAdapter
            self._adapter = TypeAdapter(self.tp)
        return self._adapter.validate_python(v)

    def __get_pydantic_core_schema__(self, _source, _handler):
        from pydantic_core import core_schema
        return core_schema.no_info_plain_validator_function(self.validate)

    def __get_pydantic_json_schema__(self, _schema, handler):
        from pydantic import TypeAdapter
        tagged = [m for m in getattr(self.tp, "__metadata__", ()) if isinstance(m, _TaggedUnion)]
        if tagged:                          # a Tagged section: its members' schemas
            return tagged[0].__get_pydantic_json_schema__(None, handler)
        return handler(TypeAdapter(self.tp).core_schema)


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
    if isinstance(own, BaseModel):
        return type(own).model_validate({**shared.to_dict(), **own.to_dict()})
    return {**shared, **own}                 # sections still declared as Raw (a mapping)
