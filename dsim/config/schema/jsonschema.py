"""The JSON Schema (draft 2020-12) of a declared section, generated from the same declarations the
walk validates with (dsim.config.schema.walk).

Why our own generator: the checks are dsim's functions, so only the declarations know what an
editor should be told (each field type carries its schema: ``checked(..., js)``).  The layout is the
one scenarios/scenario.schema.json has had since the schema was declared (every section under
``$defs``, a field's title from its name, ``anyOf`` for null and for a tag's members, ``oneOf`` for a
choice made by the value's kind), so editors and the reference see the same document.
"""
from __future__ import annotations

import inspect
import types
import typing
from typing import Annotated, Any, Literal, Union

from .walk import BeforeValidator, Discriminator, Field, Tag

_NULL = {"type": "null"}


class _Gen:
    def __init__(self):
        self.defs: dict = {}

    def section(self, cls) -> dict:
        """The object schema of ``cls`` (its fields' descriptions from their docstrings)."""
        from .docstrings import field_docs
        docs = field_docs(cls)
        props, required = {}, []
        for name, info in cls.model_fields.items():
            js, titled = self.of(info.annotation)
            js = dict(js)
            if titled:
                js["title"] = name.replace("_", " ").title()
            if info.is_required():
                required.append(name)
            elif info.default_factory is None:
                js["default"] = _jsonable(info.default)
            if docs.get(name):
                js.setdefault("description", docs[name])
            props[name] = js
        out = {"additionalProperties": False}
        if cls.__dict__.get("__doc__"):
            out["description"] = inspect.cleandoc(cls.__doc__)
        out["properties"] = props
        if required:
            out["required"] = required
        out.update({"title": cls.__name__, "type": "object"})
        return out

    def ref(self, cls) -> dict:
        name = cls.__name__
        if name not in self.defs:
            self.defs[name] = None                       # a recursive reference stops here
            self.defs[name] = self.section(cls)
        return {"$ref": f"#/$defs/{name}"}

    def of(self, tp: Any) -> tuple[dict, bool]:
        """(schema, whether a field of this type gets a title: not when it is a section's $ref)."""
        from .base import Section, _Checked, _Lazy, _TaggedUnion
        origin = typing.get_origin(tp)
        if origin is Annotated:
            base, *meta = typing.get_args(tp)
            js, titled = None, True
            for m in meta:
                if isinstance(m, _Checked):
                    js, titled = dict(m.js), True
                elif isinstance(m, _TaggedUnion):
                    js, titled = self.tagged(m), True
                elif isinstance(m, _Lazy):
                    inner = [x for x in getattr(m.tp, "__metadata__", ()) if isinstance(x, _TaggedUnion)]
                    js, titled = (self.tagged(inner[0]), True) if inner else (self.of(m.tp)[0], True)
                elif isinstance(m, Discriminator):
                    js, titled = {"oneOf": [self.of(a)[0] for a in typing.get_args(base)]}, True
                elif isinstance(m, Field):
                    if js is None:
                        js, titled = self.of(base)
                    js = dict(js)
                    if m.min_length is not None:
                        js["minItems"] = m.min_length
                    if m.max_length is not None:
                        js["maxItems"] = m.max_length
                elif isinstance(m, (BeforeValidator, Tag)):
                    if js is None:
                        js, titled = self.of(base)
                elif hasattr(m, "json_schema"):                  # cluster.NameOrMapping
                    if js is None:
                        js, titled = self.of(base)
                    js = m.json_schema(js)
            return (js, titled) if js is not None else self.of(base)
        if origin in (Union, types.UnionType):
            args = typing.get_args(tp)
            others = [a for a in args if a is not type(None)]
            inner = [self.of(a) for a in others]
            parts = [j for j, _ in inner] + ([_NULL] if len(others) < len(args) else [])
            return _flat_any_of(parts), all(t for _, t in inner)
        if origin is Literal:
            values = list(typing.get_args(tp))
            js = {"const": values[0]} if len(values) == 1 else {"enum": values}
            kinds = {type(v) for v in values}
            if kinds == {str}:
                js["type"] = "string"
            return js, True
        if origin is list:
            return {"items": self.of(typing.get_args(tp)[0])[0], "type": "array"}, True
        if origin is dict:
            k, v = typing.get_args(tp)
            keys = dict(self.of(k)[0])
            values = dict(self.of(v)[0])
            values.pop("title", None)
            js = {"additionalProperties": values, "type": "object"}
            if keys.get("type") == "string" and len(keys) > 1:
                js["propertyNames"] = keys
            return js, True
        if isinstance(tp, type) and issubclass(tp, Section):
            return self.ref(tp), False
        if tp is Any:
            return {}, True
        if tp is str:
            return {"type": "string"}, True
        if tp is type(None):
            return dict(_NULL), True
        raise TypeError(f"no JSON Schema for {tp!r}")

    def tagged(self, t) -> dict:
        unique = dict.fromkeys(t.members.values())           # several tags may share one model
        # anyOf, not oneOf: the tag tells members apart, and a section may be null ({}), which
        # every member accepts
        return {"anyOf": [self.ref(m) for m in unique]}


def _flat_any_of(parts: list) -> dict:
    if len(parts) == 1:
        return parts[0]
    out = []
    for p in parts:
        out.extend(p["anyOf"] if list(p) == ["anyOf"] else [p])
    return {"anyOf": out}


def _jsonable(v: Any) -> Any:
    from .base import Section
    if isinstance(v, Section):
        return {k: _jsonable(x) for k, x in v.model_dump().items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def model_json_schema(cls) -> dict:
    """``cls``'s schema with every section it reaches under ``$defs``."""
    gen = _Gen()
    js = gen.section(cls)
    if gen.defs:
        js["$defs"] = dict(sorted(gen.defs.items()))
    return js


def described_schema(model) -> dict:
    """The JSON Schema of ``model`` with every field's docstring as its description, and every
    section model under ``$defs`` (referenced by ``$ref``) once."""
    return model_json_schema(model)
