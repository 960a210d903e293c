"""Builds the step-time and queueing models named by a scenario's ``latency`` section."""
from __future__ import annotations

from ..config.errors import ConfigError
from ..config.fields import Section, check_number
from .base import AlphaModel
from .blackbox import BlackboxModel
from .roofline import RooflineModel

MODELS = ("roofline", "blackbox")


def _coeffs(s: Section, key: str, n: int, default=None):
    v = s.raw(key, default)
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise ConfigError(s.sub(key), v, f"a list of {n} numbers (microseconds)")
    return [check_number(x, f"{s.sub(key)}[{i}]") for i, x in enumerate(v)]


def build_latency(data, model, device, tp: int, path: str = "latency"):
    """Return (step-time model, queueing model, description dict for the manifest)."""
    s = Section(data, path)
    kind = s.str("model", "roofline", choices=MODELS)
    alpha = AlphaModel(*_coeffs(s, "alpha", 3, [0.0, 0.0, 0.0]))
    if kind == "roofline":
        d = RooflineModel.DEFAULTS
        kw = {k: s.num(k, d[k], lo=0, hi=1, lo_open=True) if k.endswith("efficiency") else s.num(k, d[k], lo=0)
              for k in d}
        step = RooflineModel(model, device, tp, **kw)
        desc = dict(model="roofline", **kw)
    else:
        beta = _coeffs(s, "beta", 3)
        step = BlackboxModel(*beta)
        desc = dict(model="blackbox", beta_us=beta)
    s.done()
    desc["alpha_us"] = [alpha.a0 * 1e6, alpha.a1 * 1e6, alpha.a2 * 1e6]
    return step, alpha, desc
