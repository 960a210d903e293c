"""Speculative-decoding acceptance models: how many of k drafted tokens a verification accepts.

A model answers ``probabilities(context_len, k, temperature) -> (a_0 .. a_{k-1})``, the conditional
acceptance of draft position i given positions 0..i-1 were accepted (standard left-to-right
verification: the first rejection ends the run).  A verify step then emits the accepted tokens plus
one token from the target, so the mean tokens per verify step is

    tau = 1 + sum_i prod_{j <= i} a_j          (EAGLE's "acceptance length")

Two models here: ``GeometricAcceptance`` (one rate for every position) and ``CurveAcceptance``
(YAML curves per method / dataset / temperature with points over context length and k,
interpolated; see acceptance/README.md).  Lookups are memoised on their exact (binned) inputs:
seed 002 Appendix B shows a gamma policy crippled by un-memoised acceptance lookups.
"""
from __future__ import annotations

import bisect
import csv
import math
from functools import lru_cache
from pathlib import Path

import numpy as np
import yaml

from ..config.files import note_read, read_yaml
from ..config.errors import ConfigError

SPEC_VERSION = "1.0"


def tokens_per_step(probs) -> float:
    """Expected tokens emitted by one verify step (accepted drafts + the target's own token)."""
    tau, run = 1.0, 1.0
    for a in probs:
        run *= a
        tau += run
    return tau


def sample_accepted(rng, probs) -> int:
    """Accepted draft tokens of one verify step: positions accepted left to right until a rejection."""
    return accepted_run(probs, rng.random(len(probs)))


def expected_accepted(st, probs) -> int:
    """``acceptance_draws: expectation``: the expected accepted drafts of a chain (the sum over
    positions of the chance that every draft up to it is accepted) added to the conversation's
    carry, of which the whole part is accepted now; no random draw."""
    e, run = 0.0, 1.0
    for p in probs:
        run *= p
        e += run
    st.acc_carry += e
    a = min(int(st.acc_carry + 1e-9), len(probs))      # 1e-9: a sum that should be whole may fall short
    st.acc_carry -= a
    return a


def accepted_run(probs, u, start: int = 0) -> int:
    """Leading positions j with ``u[start + j] < probs[j]``: the accepted drafts given uniforms
    already drawn (a step draws all its rows' uniforms at once)."""
    n = 0
    for a in probs:
        if u[start + n] >= a:
            break
        n += 1
    return n


def conditional_from_cumulative(cum) -> list:
    """Per-position shares of steps whose i-th draft token was accepted -> conditional rates."""
    out, prev = [], 1.0
    for c in cum:
        if not 0 <= c <= prev + 1e-12:
            raise ValueError(f"cumulative acceptance must be non-increasing in [0, 1]: {list(cum)}")
        out.append(c / prev if prev > 0 else 0.0)
        prev = c
    return out


def geometric_rate_for_tau(tau: float, k: int) -> float:
    """The constant rate a with 1 + a + a^2 + ... + a^k = tau (tau in [1, k + 1))."""
    from scipy.optimize import brentq
    if not 1.0 <= tau < k + 1:
        raise ValueError(f"tokens per verify step {tau} is not reachable with k={k} (needs 1 <= tau < k + 1)")
    if tau == 1.0:
        return 0.0
    return float(brentq(lambda a: tokens_per_step([a] * k) - tau, 1e-12, 1 - 1e-12, xtol=1e-14))


class GeometricAcceptance:
    """Every position accepted with the same conditional probability ``rate``."""

    def __init__(self, rate: float):
        if not 0 <= rate <= 1:
            raise ValueError("rate must be in [0, 1]")
        self.rate = float(rate)
        self.probabilities = lru_cache(maxsize=256)(self._probabilities)

    def _probabilities(self, context_len: int = 0, k: int = 1, temperature: float | None = None) -> tuple:
        return (self.rate,) * int(k)


class CurveAcceptance:
    """One named curve: points (context_len, k) -> conditional rates, per temperature.

    Lookup: nearest temperature at or below (curves at T=0 and T=1 interpolate linearly between),
    linear interpolation in log(context_len) between points, clamped at the ends; a k beyond the
    point's own k repeats its last conditional rate, a smaller k truncates."""

    def __init__(self, spec: dict, where: str = "curve"):
        self.name = str(spec.get("name", where))
        self.meta = {k: v for k, v in spec.items() if k != "points"}
        pts = spec.get("points")
        if not isinstance(pts, list) or not pts:
            raise ConfigError(f"{where}.points", pts, "a non-empty list of {temperature, context_len, conditional}")
        by_t: dict = {}
        for i, p in enumerate(pts):
            w = f"{where}.points[{i}]"
            cond = p.get("conditional") if isinstance(p, dict) else None
            if not isinstance(cond, list) or not cond or not all(isinstance(x, (int, float)) and 0 <= x <= 1
                                                                 for x in cond):
                raise ConfigError(f"{w}.conditional", cond, "a list of probabilities in [0, 1], one per draft position")
            t = float(p.get("temperature", 0.0))
            ctx = float(p.get("context_len", 0))
            if ctx < 0:
                raise ConfigError(f"{w}.context_len", ctx, "a length >= 0")
            by_t.setdefault(t, []).append((ctx, [float(x) for x in cond]))
        self.temps = sorted(by_t)
        self.points = {t: sorted(v, key=lambda x: x[0]) for t, v in by_t.items()}
        self._xs = {t: [math.log1p(c) for c, _ in v] for t, v in self.points.items()}   # computed once, not per lookup
        self.probabilities = lru_cache(maxsize=4096)(self._probabilities)

    @staticmethod
    def _extend(cond, k):
        return list(cond[:k]) + [cond[-1]] * max(0, k - len(cond))

    def _at_temp(self, t: float, ctx: float, k: int) -> np.ndarray:
        pts = self.points[t]
        xs = self._xs[t]
        x = math.log1p(ctx)
        i = bisect.bisect_right(xs, x)
        if i == 0:
            return np.array(self._extend(pts[0][1], k))
        if i == len(pts):
            return np.array(self._extend(pts[-1][1], k))
        f = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
        return (1 - f) * np.array(self._extend(pts[i - 1][1], k)) + f * np.array(self._extend(pts[i][1], k))

    def _probabilities(self, context_len: int = 0, k: int = 1, temperature: float | None = None) -> tuple:
        k = int(k)
        t = self.temps[0] if temperature is None else float(temperature)
        ts = self.temps
        if t <= ts[0]:
            v = self._at_temp(ts[0], context_len, k)
        elif t >= ts[-1]:
            v = self._at_temp(ts[-1], context_len, k)
        else:
            j = bisect.bisect_right(ts, t)
            f = (t - ts[j - 1]) / (ts[j] - ts[j - 1])
            v = (1 - f) * self._at_temp(ts[j - 1], context_len, k) + f * self._at_temp(ts[j], context_len, k)
        return tuple(float(x) for x in v)

    def tokens_per_step(self, context_len=0, k=None, temperature=None) -> float:
        k = k or self.meta.get("k") or len(self.points[self.temps[0]][0][1])
        return tokens_per_step(self.probabilities(context_len, k, temperature))


def load_curves(path) -> dict:
    """name -> CurveAcceptance from an ``acceptance_curves`` YAML file (path-qualified errors)."""
    p = Path(path)
    try:
        note_read(p)
        doc = read_yaml(p.read_text())
    except OSError as e:
        raise ConfigError(str(p), None, f"a readable acceptance curve file ({e.strerror})", show_value=False) from None
    except yaml.YAMLError as e:
        raise ConfigError(str(p), None, f"valid YAML ({str(e).splitlines()[0]})", show_value=False) from None
    body = (doc or {}).get("acceptance_curves") if isinstance(doc, dict) else None
    if not isinstance(body, dict) or str(body.get("spec_version")) != SPEC_VERSION:
        raise ConfigError(f"{p}: acceptance_curves.spec_version", (body or {}).get("spec_version"),
                          f"{SPEC_VERSION!r} in an acceptance_curves mapping")
    curves = body.get("curves")
    if not isinstance(curves, list) or not curves:
        raise ConfigError(f"{p}: acceptance_curves.curves", curves, "a non-empty list of curves")
    out = {}
    for i, c in enumerate(curves):
        w = f"{p}: acceptance_curves.curves[{i}]"
        if not isinstance(c, dict) or not c.get("name"):
            raise ConfigError(f"{w}.name", None, "a curve name", show_value=False)
        if c["name"] in out:
            raise ConfigError(f"{w}.name", c["name"], "a name not used by another curve")
        out[c["name"]] = CurveAcceptance(c, w)
    return out


# ---- building the shipped curves from published figures ------------------------------------------------
# Draft length assumed where a source gives only the acceptance length (tokens per verify step).
# EAGLE-3's and EAGLE's trees verify up to depth 8 / 6 in their papers' default settings; the chain
# methods of Spec-Bench are given the same k = 5 that the leaderboard's SpS baseline uses.
ASSUMED_K = {"EAGLE-3": 8, "EAGLE": 6, "Hydra": 5, "Medusa": 5, "SpS (draft model)": 5, "REST": 5, "PLD": 5,
             "Lookahead": 5}


def _slug(*parts) -> str:
    s = "-".join(str(p) for p in parts if p not in (None, ""))
    return "".join(ch if ch.isalnum() or ch in "-." else "-" for ch in s.lower()).replace("--", "-").strip("-")


def curves_from_published(csv_path) -> list:
    """One curve per (method, drafter, target, dataset, temperature) of the published CSV: the
    per-position rates when given (cumulative shares -> conditional), else the geometric rate that
    reproduces the published tokens per verify step with ``ASSUMED_K``."""
    groups: dict = {}
    note_read(csv_path)
    with open(csv_path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["method"], row["drafter"], row["target"], row["dataset"], row["temperature"])
            groups.setdefault(key, []).append(row)
    curves = []
    for (method, drafter, target, dataset, temp), rows in groups.items():
        pos = sorted((int(r["position"]), float(r["value"])) for r in rows
                     if r["metric"] == "per_position_acceptance_rate")
        tau = next((float(r["value"]) for r in rows if r["metric"] == "tokens_per_verify_step"), None)
        if tau is None:       # mean accepted drafts per iteration + the target's own token
            tau = next((float(r["value"]) + 1 for r in rows if r["metric"] == "mean_accepted_tokens_per_iteration"),
                       None)
        k_given = next((int(r["spec_tokens"]) for r in rows if r["spec_tokens"]), None)
        src = rows[0]["source"]
        t = float(temp) if temp not in ("", None) else 0.0
        c = {"name": _slug(method, target, dataset, f"t{temp}" if temp else ""), "method": method, "drafter": drafter,
             "target": target, "dataset": dataset, "temperature": t, "source": src}
        if pos:
            cond = conditional_from_cumulative([v for _, v in pos])
            c.update({"k": len(cond), "derived_from": "per_position_acceptance_rate",
                      "tokens_per_verify_step": tokens_per_step(cond)})
            if tau is not None:
                c["published_tokens_per_verify_step"] = tau
                if k_given and k_given != len(cond):
                    c["note"] = f"source gives {len(cond)} of k={k_given} positions"
        elif tau is not None:
            k = k_given or ASSUMED_K.get(method)
            if k is None:
                continue
            a = geometric_rate_for_tau(tau, k)
            cond = [a] * k
            c.update({"k": k, "derived_from": f"tokens_per_verify_step {tau} (geometric, k={k}"
                                              + ("" if k_given else " assumed") + ")",
                      "tokens_per_verify_step": tau})
        else:
            continue          # aggregate-only rows (token acceptance rate) make no curve
        c["points"] = [{"temperature": t, "context_len": 0, "conditional": [round(x, 6) for x in cond]}]
        curves.append(c)
    return curves + merged_temperatures(curves)


def merged_temperatures(curves) -> list:
    """One curve per (method, drafter, target, dataset) measured at several temperatures, holding
    every temperature's points (named like them without the ``-t<T>`` suffix), so a request's own
    temperature interpolates between the measured ones (dsim.specdec.conditioning)."""
    groups: dict = {}
    for c in curves:
        groups.setdefault((c["method"], c["drafter"], c["target"], c["dataset"]), []).append(c)
    out = []
    for (method, drafter, target, dataset), cs in groups.items():
        cs = sorted(cs, key=lambda c: c["temperature"])
        if len({c["temperature"] for c in cs}) < 2 or len({c["k"] for c in cs}) != 1:
            continue
        out.append({"name": _slug(method, target, dataset), "method": method, "drafter": drafter, "target": target,
                    "dataset": dataset, "temperature": cs[0]["temperature"], "source": cs[0]["source"],
                    "k": cs[0]["k"], "derived_from": "the curves " + ", ".join(c["name"] for c in cs),
                    "tokens_per_verify_step": cs[0]["tokens_per_verify_step"],
                    "tokens_per_verify_step_by_temperature": {c["temperature"]: c["tokens_per_verify_step"] for c in cs},
                    "points": [dict(p, conditional=list(p["conditional"])) for c in cs for p in c["points"]]})
    return out
