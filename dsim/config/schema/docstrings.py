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

    fill(js, root)
    for d in js.get("$defs", {}).values():
        props = set(d.get("properties", {}))
        cands = [c for c in classes.get(d.get("title"), []) if {f.alias or n for n, f in c.model_fields.items()}
                 == props]
        if cands:
            fill(d, cands[0])
    return js


def described_schema(model) -> dict:
    """``model.model_json_schema()`` with every field's docstring as its description."""
    return annotate(model.model_json_schema(), model)
