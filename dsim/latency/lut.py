"""Latency lookup tables (seed 002 sections 5.2-5.3): load, validate, interpolate, check, export.

A LUT is a CSV whose rows follow dsim/data/lut_schema.json: the latency of one iteration of a phase
(prefill, draft_decode, verify, fused_decode) for ``microbatch`` requests of ``context_len``
tokens.  Lookups interpolate linearly in log(context_len) (bins are log-spaced) and linearly in
microbatch; above the largest bin they extend the last segment linearly (latency keeps growing
with work), below the smallest they hold the first value.

Tail-aware timing: when a row has latency_p95_ms and ``tail: true``, each lookup samples a
lognormal whose mean is latency_ms and whose 95th percentile is latency_p95_ms.  Lognormal
because iteration times are positive and right-skewed (a kernel can be delayed, never sped up
beyond its floor), and two numbers pin it exactly.
"""
from __future__ import annotations

import csv
import io
import json
import math
from importlib import resources
from bisect import bisect_right
from collections import defaultdict
from pathlib import Path

import numpy as np

from ..config.errors import ConfigError, MissingAssetError
from ..config.files import read_text
from .base import BatchShape

SCHEMA_PATH = Path(str(resources.files("dsim").joinpath("data/lut_schema.json")))   # package data
PHASES = ("prefill", "draft_decode", "verify", "fused_decode")
KEY_FIELDS = ("model", "hardware", "tensor_parallel", "pipeline_parallel", "dtype")
Z95 = 1.6448536269514722


def schema() -> dict:
    return json.loads(SCHEMA_PATH.read_text())


def _convert(raw: dict, props: dict) -> dict:
    """CSV strings -> typed values per the schema; empty cells are dropped (absent)."""
    out = {}
    for k, v in raw.items():
        if k is None:
            out["__extra__"] = v
            continue
        v = (v or "").strip()
        if v == "":
            continue
        t = props.get(k, {}).get("type")
        try:
            if t == "integer":
                f = float(v)
                out[k] = int(f) if f.is_integer() else f
            elif t == "number":
                out[k] = float(v)
            else:
                out[k] = v
        except ValueError:
            out[k] = v      # left as text: the schema check reports the wrong type
    return out


_VALID: dict = {}            # (path, text) -> validated rows: a pool's estimator reads its replicas' LUT again
_VALID_MAX = 8


def read_lut(path) -> list[dict]:
    """Rows of a LUT CSV, each validated against the schema; errors name file:line and field.
    The file is read every time (and recorded for the manifest); the validation of a text already
    validated is not repeated."""
    p = Path(path)
    text = read_text(p)
    key = (str(p), text)
    rows = _VALID.get(key)
    if rows is None:
        rows = _validated_rows(p, text)
        if len(_VALID) >= _VALID_MAX:
            _VALID.pop(next(iter(_VALID)))
        _VALID[key] = rows
    return [dict(r) for r in rows]


def _validated_rows(p: Path, text: str) -> list[dict]:
    from jsonschema import Draft202012Validator

    sch = schema()
    val = Draft202012Validator(sch)
    props = sch["properties"]
    reader = csv.DictReader(io.StringIO(text))
    rows = []
    for raw in reader:
        line = reader.line_num
        row = _convert(raw, props)
        if "__extra__" in row:
            raise ConfigError(f"{p}:{line}", None, "as many cells as header columns", show_value=False)
        for k, v in row.items():       # the schema's minimum lets NaN through (NaN < 0 is false), inf too
            if isinstance(v, float) and not math.isfinite(v):
                raise ConfigError(f"{p}:{line}: {k}", raw.get(k), "a finite number")
        errs = sorted(val.iter_errors(row), key=lambda e: list(e.path))
        if errs:
            e = errs[0]
            where = ".".join(str(x) for x in e.path) or "row"
            raise ConfigError(f"{p}:{line}: {where}", e.instance if e.path else None, e.message.split(" is ")[-1]
                              if e.path else e.message, show_value=bool(e.path))
        row["_line"] = line
        rows.append(row)
    if not rows:
        raise ConfigError(str(p), None, "at least one LUT row after the header", show_value=False)
    return rows


class _Curve:
    """One (phase, fanout_k, microbatch): values by context_len."""

    def __init__(self, pts: list[tuple]):
        pts.sort()
        self.ctx = np.array([c for c, *_ in pts], float)
        self.logc = np.log(self.ctx)
        self.vals = np.array([v for _, *v in pts], float)   # columns: latency, p95, energy, kv_delta

    def at(self, c: float) -> np.ndarray:
        x = self.ctx
        if len(x) == 1 or c <= x[0]:
            return self.vals[0]
        if c >= x[-1]:
            d = (self.vals[-1] - self.vals[-2]) / (x[-1] - x[-2])
            return self.vals[-1] + d * (c - x[-1])
        i = bisect_right(self.logc, math.log(c)) - 1
        w = (math.log(c) - self.logc[i]) / (self.logc[i + 1] - self.logc[i])
        return self.vals[i] * (1 - w) + self.vals[i + 1] * w


class LutTable:
    """Interpolating view over the rows of one (model, hardware, TP, PP, dtype) configuration."""

    def __init__(self, rows: list[dict], source: str = ""):
        self.source = source
        groups: dict = defaultdict(lambda: defaultdict(list))
        seen: dict = {}
        for r in rows:
            key = (r["phase"], r["fanout_k"], r["microbatch"], r["context_len"])
            if key in seen:
                raise ConfigError(f"{source}:{r['_line']}", None,
                                  f"one row per (phase, fanout_k, microbatch, context_len); line {seen[key]} "
                                  f"has the same {key}", show_value=False)
            seen[key] = r["_line"]
            p95 = r.get("latency_p95_ms", float("nan"))
            groups[(r["phase"], r["fanout_k"])][r["microbatch"]].append(
                (r["context_len"], r["latency_ms"], p95, r["energy_mj"], r["kv_delta_mb"],
                 r.get("cost_nonatt_ms", float("nan")), r.get("cost_attn_ms", float("nan"))))
        self.curves = {}
        for key, by_mb in groups.items():
            mbs = sorted(by_mb)
            self.curves[key] = (np.array(mbs, float), [_Curve(by_mb[m]) for m in mbs])
        self.phases = sorted({p for p, _ in self.curves})
        self._memo: dict = {}

    def has(self, phase: str, k: int = 1) -> bool:
        return (phase, k) in self.curves

    def has_split(self, phase: str, k: int = 1) -> bool:
        """Do all rows of (phase, k) carry cost_nonatt_ms and cost_attn_ms?"""
        return self.has(phase, k) and all(not np.isnan(c.vals[:, 4:6]).any() for c in self.curves[(phase, k)][1])

    def lookup(self, phase: str, context_len: float, microbatch: float, k: int = 1) -> np.ndarray:
        """[latency_ms, latency_p95_ms, energy_mj, kv_delta_mb, cost_nonatt_ms, cost_attn_ms] (nan if absent)."""
        key = (phase, k, context_len, microbatch)
        v = self._memo.get(key)
        if v is not None:
            return v
        mbs, curves = self.curves[(phase, k)]
        if len(mbs) == 1 or microbatch <= mbs[0]:
            v = curves[0].at(context_len)
        else:
            j = min(max(bisect_right(mbs, microbatch) - 1, 0), len(mbs) - 2)
            a, b = curves[j].at(context_len), curves[j + 1].at(context_len)
            w = (microbatch - mbs[j]) / (mbs[j + 1] - mbs[j])
            v = a * (1 - w) + b * w
        if len(self._memo) < 200_000:
            self._memo[key] = v
        return v


def select_rows(rows: list[dict], select: dict, where: str) -> list[dict]:
    """Rows of the one configuration ``select`` (a subset of KEY_FIELDS) picks."""
    bad = sorted(set(select) - set(KEY_FIELDS))
    if bad:
        raise ConfigError(f"{where}.select.{bad[0]}", select[bad[0]], f"a key among {', '.join(KEY_FIELDS)}")
    keep = [r for r in rows if all(r.get(k) == v for k, v in select.items())]
    combos = sorted({tuple(r[k] for k in KEY_FIELDS) for r in keep}, key=str)
    if len(combos) != 1:
        have = sorted({tuple(r[k] for k in KEY_FIELDS) for r in rows}, key=str)
        raise ConfigError(f"{where}.select", select or None,
                          f"keys among {KEY_FIELDS} that pick exactly one configuration of "
                          f"{[dict(zip(KEY_FIELDS, c)) for c in have]}")
    return keep


def pool_rows(rows: list[dict], select: dict, model: str, hardware: str, tp: int, where: str) -> list[dict]:
    """The rows of the pool's own configuration (model, hardware, TP; ``select`` keys win), for a LUT
    in a ``latency.fallback`` chain: a table without them is a missing asset, not a wrong table."""
    want = {"model": model, "hardware": hardware, "tensor_parallel": tp, **select}
    keep = [r for r in rows if all(r.get(k) == v for k, v in want.items())]
    if not keep:
        have = sorted({(r["model"], r["hardware"], r["tensor_parallel"]) for r in rows}, key=str)
        raise MissingAssetError(f"{where}.path", None,
                                f"rows for {want} (the table has (model, hardware, tensor_parallel) {have})",
                                show_value=False)
    return select_rows(keep, select, where)


def lognormal_params(mean: float, p95: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal with this mean and 95th percentile (sigma 0 if p95 <= mean)."""
    if not p95 > mean > 0:
        return (math.log(mean) if mean > 0 else -math.inf), 0.0
    r = math.log(p95 / mean)
    disc = Z95 * Z95 - 2 * r
    sigma = Z95 - math.sqrt(disc) if disc > 0 else Z95
    return math.log(mean) - sigma * sigma / 2, sigma


class LutModel:
    """Step time from a LUT: prefill rows for the prefill chunks plus decode rows for the decoders
    (and verify rows, at the nearest fanout_k, for speculative verification chunks when the table
    has them; otherwise those are costed as prefill chunks).

    Each row is a whole forward pass, so each includes the fixed cost of one pass (reading the
    weights, launching the kernels).  A mixed step runs one pass, so it is charged the two
    lookups minus that fixed cost once, estimated as the smallest decode row (one request at the
    shortest context).
    """

    pure = False         # step_time has effects (see dsim.serving.fastforward)
    name = "lut"

    def __init__(self, table: LutTable, decode_phase: str = "fused_decode", fanout_k: int = 1,
                 tail: bool = False, rng=None, selective: bool = False, where: str = "latency"):
        for ph, k in (("prefill", 1), (decode_phase, fanout_k)):
            if not table.has(ph, k):
                raise MissingAssetError("latency.path", table.source, f"rows for phase {ph!r} with fanout_k {k}")
            if selective and not table.has_split(ph, k):
                raise ConfigError(f"{where}.selective_batching", True, f"cost_nonatt_ms and cost_attn_ms on every "
                                  f"{ph!r} row of {table.source} (dsim lut build --split-attention writes them)")
        if selective and tail:
            raise ConfigError(f"{where}.tail", True, "false with selective_batching (the split rows have no tails)")
        self.selective = selective
        self.table = table
        self.decode_phase, self.k = decode_phase, fanout_k
        self.tail = tail
        self.rng = rng
        if tail and rng is None:
            raise ValueError("tail-aware LUT timing needs an rng")
        self.energy_mj = 0.0
        self._ln: dict = {}
        mbs, curves = table.curves[(decode_phase, fanout_k)]
        self.pass_ms = float(curves[0].vals[0][0])     # smallest microbatch, shortest context
        self._vks = None
        if selective:
            self._tok, self._nonatt = self._token_curve()
            self._mj_per_ms = float(curves[0].vals[0][2]) / self.pass_ms if self.pass_ms > 0 else 0.0

    # ---- selective batching (seed 002 section 5.2) ---------------------------------------------
    def _token_curve(self):
        """Non-attention ms of one batched pass by its token count: the decode rows (microbatch m is m
        tokens) at their shortest context, then the one-request prefill rows (context_len tokens)."""
        pts = {}
        mbs, curves = self.table.curves[(self.decode_phase, self.k)]
        for m, c in zip(mbs, curves):
            pts[float(m)] = float(c.vals[0][4])
        pmbs, pcurves = self.table.curves[("prefill", 1)]
        top = max(pts)
        for ctx, v in zip(pcurves[0].ctx, pcurves[0].vals):
            if pmbs[0] == 1 and ctx > top:
                pts[float(ctx)] = float(v[4])
        tok = np.array(sorted(pts))
        return tok, np.array([pts[t] for t in tok])

    def nonatt_ms(self, tokens: float) -> float:
        """Linear in tokens between the table's points, the last segment extended above them."""
        x, y = self._tok, self._nonatt
        if len(x) == 1 or tokens <= x[0]:
            return float(y[0]) * (tokens / x[0] if tokens < x[0] else 1.0)
        if tokens >= x[-1]:
            return float(y[-1] + (y[-1] - y[-2]) / (x[-1] - x[-2]) * (tokens - x[-1]))
        return float(np.interp(tokens, x, y))

    def _selective_ms(self, b: BatchShape) -> float:
        """Selective batching: the non-attention work of all the step's tokens in one batched pass,
        plus each request's attention on its own (the one-request row's cost_attn_ms at the mean
        context of its kind: exact when attention is linear in context)."""
        ms = self.nonatt_ms(b.prefill_tokens + b.decode_tokens)
        n_pre, t_pre = b.num_prefill, b.prefill_tokens
        if b.num_verify:
            vk = self._verify_k(b.verify_tokens / b.num_verify - 1)
            if vk is not None and self.table.has_split("verify", vk):
                ms += b.num_verify * float(self.table.lookup("verify", round(b.verify_ctx_sum / b.num_verify), 1, vk)[5])
                n_pre -= b.num_verify
                t_pre -= b.verify_tokens
        if n_pre:
            ms += n_pre * float(self.table.lookup("prefill", round(t_pre / n_pre), 1)[5])
        if b.decode_tokens:
            ms += b.decode_tokens * float(self.table.lookup(self.decode_phase, round(b.decode_ctx_sum / b.decode_tokens),
                                                            1, self.k)[5])
        self.energy_mj += ms * self._mj_per_ms
        return ms

    def _time(self, v: np.ndarray) -> float:
        mean, p95 = float(v[0]), float(v[1])
        if self.tail and p95 == p95 and p95 > mean:
            key = (mean, p95)
            mp = self._ln.get(key)
            if mp is None:
                mp = self._ln[key] = lognormal_params(mean, p95)
            return math.exp(mp[0] + mp[1] * float(self.rng.standard_normal()))
        return mean

    def _verify_k(self, k: float):
        """The table's verify fanout nearest to k (None: no verify rows)."""
        if self._vks is None:
            self._vks = sorted(kk for ph, kk in self.table.curves if ph == "verify")
        if not self._vks:
            return None
        return min(self._vks, key=lambda x: (abs(x - k), x))

    def step_time(self, b: BatchShape) -> float:
        if self.selective:
            return self._selective_ms(b) * 1e-3 if (b.prefill_tokens or b.decode_tokens) else 0.0
        ms = 0.0
        n_pre, t_pre = b.num_prefill, b.prefill_tokens
        if b.num_verify:
            vk = self._verify_k(b.verify_tokens / b.num_verify - 1)
            if vk is not None:         # verification chunks from the verify-phase rows
                v = self.table.lookup("verify", round(b.verify_ctx_sum / b.num_verify), b.num_verify, vk)
                ms += self._time(v)
                self.energy_mj += float(v[2])
                n_pre -= b.num_verify
                t_pre -= b.verify_tokens
        if n_pre:
            v = self.table.lookup("prefill", round(t_pre / n_pre), n_pre)
            d = self._time(v)
            if ms:
                d = max(d - self.pass_ms, 0.0)     # one forward pass, not two
            ms += d
            self.energy_mj += float(v[2])
        if b.decode_tokens:
            v = self.table.lookup(self.decode_phase, round(b.decode_ctx_sum / b.decode_tokens), b.decode_tokens,
                                  self.k)
            d = self._time(v)
            if ms:
                d = max(d - self.pass_ms, 0.0)     # one forward pass, not two
            ms += d
            self.energy_mj += float(v[2])
        return ms * 1e-3


# ---- `dsim lut check` ------------------------------------------------------------------------
def _ident(r: dict) -> tuple:
    return tuple(r[k] for k in KEY_FIELDS) + (r["phase"], r["fanout_k"])


def check_rows(rows: list[dict], previous: list[dict] | None = None, tolerance: float = 0.05,
               name: str = "lut") -> list[str]:
    """Findings: latency falling as context_len or microbatch grows, and drift beyond tolerance."""
    out = []
    for axis, other in (("context_len", "microbatch"), ("microbatch", "context_len")):
        series = defaultdict(list)
        for r in rows:
            series[_ident(r) + (r[other],)].append(r)
        for rs in series.values():
            rs.sort(key=lambda r: r[axis])
            for a, b in zip(rs, rs[1:]):
                if b["latency_ms"] < a["latency_ms"]:
                    out.append(f"{name}:{b['_line']}: non-monotone: latency_ms {b['latency_ms']:g} at {axis} "
                               f"{b[axis]} < {a['latency_ms']:g} at {axis} {a[axis]} (line {a['_line']})")
    if previous is not None:
        old = {_ident(r) + (r["context_len"], r["microbatch"]): r for r in previous}
        for r in rows:
            o = old.get(_ident(r) + (r["context_len"], r["microbatch"]))
            if o is None or o["latency_ms"] == 0:
                continue
            d = (r["latency_ms"] - o["latency_ms"]) / o["latency_ms"]
            if abs(d) > tolerance:
                out.append(f"{name}:{r['_line']}: drift {d:+.1%} vs previous line {o['_line']} "
                           f"({o['latency_ms']:g} -> {r['latency_ms']:g} ms, tolerance {tolerance:.0%})")
    return out


def table_findings(rows: list[dict], name: str = "lut", model: str | None = None) -> list[str]:
    """What makes a readable LUT unusable or suspect for ``dsim run``: rows of a foreign model (another
    than ``model``, or than the file's most common one), rows ``LutTable`` refuses as duplicates, a
    configuration without the prefill and decode rows ``LutModel`` needs, latencies that are all 0."""
    out = []
    counts: dict = defaultdict(list)
    for r in rows:
        counts[r["model"]].append(r["_line"])
    main = model if model is not None else max(counts, key=lambda m: (len(counts[m]), -counts[m][0]))
    for m, lines in counts.items():
        if m != main:
            out.append(f"{name}:{lines[0]}: foreign model: {len(lines)} row(s) of {m!r} in a table of {main!r} "
                       f"(lines {', '.join(map(str, lines[:5]))}{', ...' if len(lines) > 5 else ''})")
    by_cfg: dict = defaultdict(list)
    for r in rows:
        by_cfg[tuple(r[k] for k in KEY_FIELDS)].append(r)
    for cfg, rs in by_cfg.items():
        what = ", ".join(f"{k}={v}" for k, v in zip(KEY_FIELDS, cfg))
        seen: dict = {}
        for r in rs:
            key = (r["phase"], r["fanout_k"], r["microbatch"], r["context_len"])
            if key in seen:
                out.append(f"{name}:{r['_line']}: duplicate of line {seen[key]} (phase, fanout_k, microbatch, "
                           f"context_len = {key}): dsim run refuses the table")
            else:
                seen[key] = r["_line"]
        phases = {r["phase"] for r in rs}
        first = rs[0]["_line"]
        if "prefill" not in phases:
            out.append(f"{name}:{first}: no prefill rows for {what}: dsim run needs them")
        if not phases & {"fused_decode", "draft_decode", "verify"}:
            out.append(f"{name}:{first}: no decode rows (fused_decode, draft_decode or verify) for {what}: "
                       "dsim run needs them")
        if all(r["latency_ms"] == 0 for r in rs):
            out.append(f"{name}:{first}: every latency_ms of {what} is 0 (simulated time would not advance)")
    return out


# ---- `dsim lut build` ------------------------------------------------------------------------
CONTEXTS = (128, 256, 512, 1024, 2048, 4096, 8192)
MICROBATCHES = (1, 2, 4, 8, 16, 32, 64, 128)


def _shape(phase: str, ctx: int, mb: int, k: int) -> BatchShape:
    if phase == "prefill":
        return BatchShape(prefill_tokens=ctx * mb, num_prefill=mb, prefill_attn_pairs=mb * ctx * (ctx + 1) // 2,
                          num_sampled=mb, prefill_chunk_sq=mb * ctx * ctx, running=mb)
    if phase == "verify":
        n = k + 1       # the drafts plus the target's own next token
        return BatchShape(prefill_tokens=n * mb, num_prefill=mb, prefill_attn_pairs=mb * (n * ctx + n * (n + 1) // 2),
                          prefill_ctx_tokens=mb * ctx, num_sampled=mb, prefill_chunk_sq=mb * n * n, running=mb)
    return BatchShape(decode_tokens=mb, decode_ctx_sum=mb * ctx, num_sampled=mb, running=mb)


def export_rows(step_model, model, device, tp: int, contexts=CONTEXTS, microbatches=MICROBATCHES,
                verify_k=(1, 2, 4, 8), dtype: str = "bf16", source: str = "", split: bool = False,
                tail_correlation: str | None = "correlated") -> list[dict]:
    """Tabulate any step-time model into LUT rows (energy at the device's board power).  ``split``:
    also cost_nonatt_ms (the model's time with no attention work: no causal pairs, no context read)
    and cost_attn_ms (the rest), for selective batching.  A model with per-shape kernel noise (the
    vidur model's ``step_sigma``, dsim.latency.kernel_noise) also gets latency_p95_ms: the 95th
    percentile of the lognormal with the row's mean and that std, its operators' deviations combined
    as ``tail_correlation`` says (None: no p95 column)."""
    from .kernel_noise import lognormal_p95
    sigma = getattr(step_model, "step_sigma", None) if tail_correlation is not None else None
    rows = []
    weights_mb = model.weight_bytes / tp / 1e6
    kv_tok_mb = model.kv_bytes_per_token / 1e6
    for phase in PHASES:
        ks = verify_k if phase == "verify" else (1,)
        for k in ks:
            for mb in microbatches:
                for ctx in contexts:
                    ms = step_model.step_time(_shape(phase, ctx, mb, k)) * 1e3
                    new = {"prefill": ctx, "verify": k + 1}.get(phase, 1)
                    rows.append({
                        "phase": phase, "model": model.name, "hardware": device.name, "tensor_parallel": tp,
                        "pipeline_parallel": 1, "context_len": ctx, "microbatch": mb, "fanout_k": k,
                        "dtype": dtype, "latency_ms": round(ms, 6),
                        "peak_mem_mb": round(weights_mb + mb * (ctx + new) * kv_tok_mb / tp, 3),
                        "kv_delta_mb": round(mb * new * kv_tok_mb, 6),
                        "energy_mj": round(device.tdp_w * tp * ms, 3), "source": source})
                    if sigma is not None:
                        sd = sigma(_shape(phase, ctx, mb, k), tail_correlation) * 1e3
                        rows[-1]["latency_p95_ms"] = round(lognormal_p95(round(ms, 6), sd), 6)
                    if split:
                        bare = _shape(phase, ctx, mb, k)._replace(prefill_attn_pairs=0, prefill_ctx_tokens=0,
                                                                   decode_ctx_sum=0)
                        non = step_model.step_time(bare) * 1e3
                        rows[-1]["cost_nonatt_ms"] = round(non, 6)
                        rows[-1]["cost_attn_ms"] = round(max(ms - non, 0.0), 6)
    return rows


def rows_to_csv(rows: list[dict]) -> str:
    cols = [c for c in schema()["properties"] if any(c in r for r in rows)]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    for r in rows:
        w.writerow(r)
    return buf.getvalue()
