"""Pareto sets: the rows no other row beats on every objective."""
from __future__ import annotations

import math


def pareto_front(rows, objectives) -> list[int]:
    """Indices of the non-dominated rows.  ``objectives``: [(column, "max" | "min"), ...].
    Row a dominates b when it is at least as good on every objective and better on one; rows
    with a missing or NaN objective are never on the front.  O(n^2), fine for thousands."""
    vals = []
    for r in rows:
        v = []
        for col, sense in objectives:
            x = r.get(col)
            if x is None or not isinstance(x, (int, float)) or isinstance(x, bool) or math.isnan(x):
                v = None
                break
            v.append(x if sense == "max" else -x)
        vals.append(v)
    front = []
    for i, a in enumerate(vals):
        if a is None:
            continue
        dominated = False
        for j, b in enumerate(vals):
            if j == i or b is None:
                continue
            if all(y >= x for x, y in zip(a, b)) and any(y > x for x, y in zip(a, b)):
                dominated = True
                break
        if not dominated:
            front.append(i)
    return front
