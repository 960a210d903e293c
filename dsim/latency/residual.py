"""An opt-in learned correction on top of the physics step time (seed 000 Iteration 6, Refinement 6,
the "v2 path"): step = physics x exp(r(features)), r a sum of regression trees over the 16 physics
step features, fitted by ``dsim fit --model physics --residual OUT.json`` on log(real / physics).

The trees are stored as plain arrays in JSON (not a pickle: a file anyone may share, readable by any
dsim without scikit-learn at run time, byte-stable), and evaluated here as scikit-learn's regression
trees evaluate them: features as float32, ``x[feature] <= threshold`` goes left.  A tree ensemble is
piecewise constant, so outside the training range it keeps the edge leaves' correction instead of
extrapolating.
"""
from __future__ import annotations

import json
import math
from array import array
from dataclasses import dataclass


from ..config.errors import ConfigError

RESIDUAL_VERSION = "1.0"
TARGET = "log(real / physics) of the step time"


@dataclass(frozen=True)
class Tree:
    feature: tuple
    threshold: tuple
    left: tuple            # -1 at a leaf
    right: tuple
    value: tuple


@dataclass(frozen=True)
class PhysicsResidual:
    """r(x) = init + learning_rate x sum of the trees' leaves."""
    init: float
    learning_rate: float
    trees: tuple
    n_features: int
    beta: tuple | None     # the physics coefficients it was fitted on top of
    source: str = ""

    def __post_init__(self):
        object.__setattr__(self, "_flat", [(t.feature, t.threshold, t.left, t.right, t.value) for t in self.trees])
        object.__setattr__(self, "_sum", _compiled(self.trees) or self._walk)

    def __call__(self, features) -> float:
        # the trees split float32 values (array('f') rounds as numpy's float32 does, in a tenth of the time)
        return self.init + self.learning_rate * self._sum(array("f", features).tolist())

    def _walk(self, x) -> float:
        """The trees' leaf sum by walking the node arrays (trees too deep to compile)."""
        s = 0.0
        for feat, thr, left, right, value in self._flat:
            node = 0
            while left[node] != -1:
                node = left[node] if x[feat[node]] <= thr[node] else right[node]
            s += value[node]
        return s

    def to_dict(self) -> dict:
        return {"spec_version": RESIDUAL_VERSION, "target": TARGET, "init": self.init,
                "learning_rate": self.learning_rate, "n_features": self.n_features,
                "beta_coefficients": None if self.beta is None else list(self.beta),
                "trees": [{"feature": list(t.feature), "threshold": list(t.threshold), "left": list(t.left),
                           "right": list(t.right), "value": list(t.value)} for t in self.trees]}


COMPILE_DEPTH = 32        # deeper trees are walked (the compiled form nests one conditional per level)


def _depth(t: Tree) -> int:
    """Levels below the root (iterative: a file's tree may be a long chain)."""
    depth = [0] * len(t.left)                 # children come after their parent (checked on load)
    for i, l in enumerate(t.left):
        if l != -1:
            depth[l] = depth[t.right[i]] = depth[i] + 1
    return max(depth)


def _expr(t: Tree, i: int = 0) -> str:
    if t.left[i] == -1:
        return repr(t.value[i])
    return f"({_expr(t, t.left[i])} if x[{t.feature[i]}] <= {t.threshold[i]!r} else {_expr(t, t.right[i])})"


def _compiled(trees):
    """The leaf sum as one Python function of nested conditionals, the trees added in order (the same
    float sum as the walk, ~4x faster: the residual runs once per simulated step).  Only validated ints
    and finite floats (``repr``) enter the source.  None if a tree is deeper than COMPILE_DEPTH."""
    if any(_depth(t) > COMPILE_DEPTH for t in trees):
        return None
    src = "def leaf_sum(x):\n    s = 0.0\n" + "".join(f"    s += {_expr(t)}\n" for t in trees) + "    return s\n"
    ns: dict = {}
    exec(compile(src, "<dsim physics residual>", "exec"), ns)     # noqa: S102 (numbers only, see above)
    return ns["leaf_sum"]


def _tree(d, where: str, n_features: int) -> Tree:
    try:
        cols = [tuple(d[k]) for k in ("feature", "threshold", "left", "right", "value")]
    except (KeyError, TypeError):
        raise ConfigError(where, None, "a tree {feature, threshold, left, right, value}", show_value=False) from None
    n = len(cols[0])
    if n == 0 or any(len(c) != n for c in cols):
        raise ConfigError(where, None, "five non-empty node arrays of one length", show_value=False)
    feat, thr, left, right, val = cols
    for i in range(n):
        leaf = left[i] == -1
        ok = (isinstance(left[i], int) and isinstance(right[i], int)
              and all(isinstance(v, (int, float)) and math.isfinite(v) for v in (thr[i], val[i])))
        if ok and not leaf:    # children after their parent: every walk ends
            ok = (i < left[i] < n and i < right[i] < n and isinstance(feat[i], int) and 0 <= feat[i] < n_features)
        if not ok:
            raise ConfigError(f"{where}[node {i}]", None, "a leaf (left -1) or a split on a feature index "
                              f"< {n_features} with children after it", show_value=False)
    return Tree(tuple(feat), tuple(float(v) for v in thr), tuple(left), tuple(right), tuple(float(v) for v in val))


def load_residual(path, where: str = "latency.residual", n_features: int = 16) -> PhysicsResidual:
    """A residual file written by ``dsim fit --residual``; every problem a ConfigError under ``where``."""
    from ..config.files import read_text
    text = read_text(path, where)
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(where, str(path), f"a JSON residual file ({e.msg})") from None
    body = doc.get("physics_residual") if isinstance(doc, dict) else None
    if not isinstance(body, dict):
        raise ConfigError(where, str(path), "a JSON object with physics_residual (written by dsim fit --residual)")
    if str(body.get("spec_version")) != RESIDUAL_VERSION:
        raise ConfigError(f"{where}: physics_residual.spec_version", body.get("spec_version"), repr(RESIDUAL_VERSION))
    if body.get("n_features") != n_features:
        raise ConfigError(f"{where}: physics_residual.n_features", body.get("n_features"),
                          f"{n_features} (the physics step features)")
    for k in ("init", "learning_rate"):
        v = body.get(k)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ConfigError(f"{where}: physics_residual.{k}", v, "a finite number")
    trees = body.get("trees")
    if not isinstance(trees, list):
        raise ConfigError(f"{where}: physics_residual.trees", None, "a list of trees", show_value=False)
    beta = body.get("beta_coefficients")
    return PhysicsResidual(float(body["init"]), float(body["learning_rate"]),
                           tuple(_tree(t, f"{where}: physics_residual.trees[{i}]", n_features)
                                 for i, t in enumerate(trees)),
                           n_features, None if beta is None else tuple(float(b) for b in beta), str(path))
