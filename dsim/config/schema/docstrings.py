"""Field docstrings, read from the source only when a schema or reference is generated.

Why not pydantic's ``use_attribute_docstrings``: it re-reads each class's source when the class is
created, which made every ``dsim`` process pay for documentation it never prints (about a third of
the schema's import time); here a module is parsed once, and only by ``dsim schema``."""
from __future__ import annotations

import ast
import inspect
import sys
from functools import lru_cache


@lru_cache(maxsize=None)
def _module_docs(module: str) -> dict:
    """{class name: {field: docstring}} for every class of a module."""
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
    except (OSError, TypeError, KeyError):
        return {}
    out = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        docs, body = {}, node.body
        for a, b in zip(body, body[1:]):
            if (isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name) and isinstance(b, ast.Expr)
                    and isinstance(b.value, ast.Constant) and isinstance(b.value.value, str)):
                docs[a.target.id] = inspect.cleandoc(b.value.value)
        out[node.name] = docs
    return out


def field_docs(cls) -> dict:
    """{field name: docstring} of a model, its base classes' fields included."""
    out: dict = {}
    for klass in reversed(cls.__mro__):
        out.update(_module_docs(klass.__module__).get(klass.__name__, {}))
    return out


def annotate(js: dict, root) -> dict:
    """Put each field's docstring into the JSON Schema as its description (in place; returns js)."""
    from .base import Section
    classes: dict = {}

    def collect(c):
        for sub in c.__subclasses__():
            classes.setdefault(sub.__name__, []).append(sub)
            collect(sub)
    collect(Section)

    def fill(node: dict, cls) -> None:
        docs = field_docs(cls)
        for name, prop in node.get("properties", {}).items():
            field = next((n for n, f in cls.model_fields.items() if (f.alias or n) == name), name)
            if name in docs or field in docs:
                prop.setdefault("description", docs.get(field) or docs.get(name))

    def walk(node) -> None:          # every object schema, in $defs or inline in a union
        if isinstance(node, dict):
            if "properties" in node and "title" in node:
                props = set(node["properties"])
                cands = [c for c in classes.get(node["title"], [])
                         if {f.alias or n for n, f in c.model_fields.items()} == props]
                if cands:
                    fill(node, cands[0])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    fill(js, root)
    walk(js)
    return js


def described_schema(model) -> dict:
    """``model.model_json_schema()`` with every field's docstring as its description, and every
    section model under ``$defs`` (referenced by ``$ref``) once."""
    return hoist(annotate(model.model_json_schema(), model))


def hoist(js: dict) -> dict:
    """Move section models written inline (the members of a Tagged section are generated one by one)
    into ``$defs`` and refer to them, as pydantic does for the others: a smaller schema, one name per
    model."""
    defs = js.setdefault("$defs", {})

    def walk(node, top: bool):
        if isinstance(node, list):
            return [walk(v, False) for v in node]
        if not isinstance(node, dict):
            return node
        node = {k: (v if k == "$defs" else walk(v, False)) for k, v in node.items()}
        title = node.get("title")
        if not top and title and node.get("type") == "object" and "properties" in node:
            name = title
            while name in defs and defs[name] != node:
                name += "_"
            defs[name] = node
            return {"$ref": f"#/$defs/{name}"}
        return node
    for name in list(defs):
        defs[name] = walk(defs[name], True)
    out = walk(js, True)
    out["$defs"] = dict(sorted(defs.items()))
    return out
