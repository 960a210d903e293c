"""Field docstrings, read from the source only when a schema or reference is generated.

Why from the source: a docstring under a field is what a reader of the model sees; reading it at
class creation would make every ``dsim`` process pay for documentation it never prints, so a module
is parsed once, and only by ``dsim schema``."""
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
    """{field name: docstring} of a model, its base classes' fields included (also the bases whose
    declarations were copied into it: walk._flatten)."""
    out: dict = {}

    def add(klass) -> None:
        for flat in reversed(klass.__dict__.get("__dsim_flat__", ())):
            add(flat)
        out.update(_module_docs(klass.__module__).get(klass.__name__, {}))
    for klass in reversed(cls.__mro__):
        add(klass)
    return out
