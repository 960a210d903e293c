"""Builds the step-time and queueing models named by a scenario's ``latency`` section.

Each builder reads its own keys from the section (unknown keys are errors) and returns
(step-time model, queueing model, description for the manifest).
"""
from __future__ import annotations

from pathlib import Path

from ..config.errors import ConfigError
from ..config.limits import MAX_FILE_BYTES
from ..config.fields import Section, check_number
from ..config.generations import HostCosts, by_name
from .base import AlphaModel, LatencyContext
from .blackbox import BlackboxModel
from .credibility import BAND_COLUMNS, credibility_warnings
from .scaled import ScaledStepModel
from .calibrated_tps import CalibratedTPSModel
from .host import FITTED_ON, HostStepModel, resolve_host
from .roofline import RooflineModel


def _coeffs(s: Section, key: str, n: int, default=None, unit: str = "microseconds"):
    """A list of n coefficients, each >= 0: a negative one makes steps or delays take negative time."""
    v = s.raw(key, default)
    if not isinstance(v, (list, tuple)) or len(v) != n:
        raise ConfigError(s.sub(key), v, f"a list of {n} numbers ({unit})")
    return [check_number(x, f"{s.sub(key)}[{i}]", lo=0) for i, x in enumerate(v)]


def _alpha(s: Section, default=(0.0, 0.0, 0.0)) -> AlphaModel:
    return AlphaModel(*_coeffs(s, "alpha", 3, list(default)))


def _path(s: Section, key: str, ctx: LatencyContext, default=None) -> Path | None:
    v = s.str(key, default)
    if v is None:
        return None
    p = Path(v).expanduser()
    if not p.is_absolute() and ctx.base_dir is not None:
        p = Path(ctx.base_dir) / p
    if not p.is_file():
        raise ConfigError(s.sub(key), v, f"an existing regular file (looked for {p})")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError(s.sub(key), v, f"a file under {MAX_FILE_BYTES >> 30} GiB")
    return p


def _efficiencies(s: Section, defaults: dict) -> dict:
    return {k: s.num(k, d, lo=0, hi=1, lo_open=k.endswith("efficiency")) for k, d in defaults.items()}


def _gpu_alpha(s: Section, ctx) -> AlphaModel:
    """GPU-only models: the API-server costs default to the engine generation's."""
    return _alpha(s, ctx.engine.generation.alpha_us)


def _roofline(s, ctx):
    kw = _efficiencies(s, RooflineModel.DEFAULTS)
    return RooflineModel(ctx.model, ctx.device, ctx.engine.tensor_parallel_size, **kw), _gpu_alpha(s, ctx), kw


def _blackbox(s, ctx):
    beta = _coeffs(s, "beta", 3)
    return BlackboxModel(*beta), _alpha(s), {"beta_us": beta}


def _unified5(s, ctx):
    from .unified5 import Unified5Model
    beta0, alpha0 = list(Unified5Model.BETA), list(Unified5Model.ALPHA_US)
    cpath = _path(s, "coefficients", ctx)
    if cpath is not None:       # a file written by ``dsim fit --model unified5``; inline keys still win
        from .unified5 import load_unified5_coeffs
        beta0, alpha0 = load_unified5_coeffs(cpath, s.sub("coefficients"))
    beta = _coeffs(s, "beta", 5, beta0, "b1-b3 dimensionless, b4-b5 microseconds")
    a = _coeffs(s, "alpha", 3, alpha0)
    e = ctx.engine
    step = Unified5Model(ctx.model, ctx.device, e.tensor_parallel_size, beta, e.enable_expert_parallel)
    # seed 003 alpha: a0 before queueing, a1 after the last token (E2E only), a2 per output token
    return step, AlphaModel(a[0], 0.0, a[2], post_us=a[1]), {"beta": beta, "expert_parallel": step.ep > 1}


def _physics(s, ctx):
    from .physics import DEFAULT_COEFFS, PhysicsConfig, PhysicsModel, load_coefficients
    p = _path(s, "coefficients", ctx)
    coeffs = load_coefficients(p or DEFAULT_COEFFS, s.sub("coefficients"))
    if s.raw("beta", None) is not None or s.raw("alpha", None) is not None:   # inline keys win (dsim calibrate)
        from dataclasses import replace
        coeffs = replace(coeffs, beta=tuple(_coeffs(s, "beta", len(coeffs.beta), list(coeffs.beta), "see BETA_NAMES")),
                         alpha=tuple(_coeffs(s, "alpha", len(coeffs.alpha), list(coeffs.alpha), "see ALPHA_NAMES")))
    e, d = ctx.engine, ctx.device
    # the CPU tier's size when the replica has one (engine.kv_offload), else what the scenario says
    tier = e.kv_offload.capacity_blocks(ctx.model, e) if getattr(e, "kv_offload", None) is not None else 0
    cpu_blocks = s.int("cpu_offload_blocks", tier, lo=0)
    cfg = PhysicsConfig.build(
        ctx.model, peak_flops=d.peak_flops, hbm_bytes_s=d.hbm_bytes_s, interconnect_bytes_s=d.interconnect_bytes_s,
        pcie_bytes_s=d.pcie_bytes_s, pcie_efficiency=d.pcie_efficiency, tp=e.tensor_parallel_size,
        max_num_seqs=e.max_num_seqs, max_batched_tokens=e.max_num_batched_tokens,
        chunked_prefill=e.enable_chunked_prefill, block_size=e.block_size, total_kv_blocks_gpu=ctx.kv_blocks,
        cpu_offloading=cpu_blocks > 0, total_kv_blocks_cpu=cpu_blocks)
    m = PhysicsModel(cfg, coeffs)
    trained = coeffs.trained_on
    desc = {"coefficients": coeffs.source, "trained_on": trained, "gamma": coeffs.gamma}
    hw = trained.get("hardware")
    if hw and hw != d.name:
        desc["warning"] = f"coefficients were fitted on {hw}, this replica runs on {d.name}"
    return m, m, desc


def _lut(s, ctx):
    from .lut import LutModel, LutTable, read_lut, select_rows
    p = _path(s, "path", ctx)
    if p is None:
        raise ConfigError(s.sub("path"), None, "the LUT CSV to read (latency.path)", show_value=False)
    sel = s.raw("select", {})
    if not isinstance(sel, dict):
        raise ConfigError(s.sub("select"), sel, "a mapping of LUT columns to values")
    rows = select_rows(read_lut(p), sel, s.path)
    tail = s.bool("tail", False)
    phase = s.str("decode_phase", "fused_decode", choices=("fused_decode", "draft_decode", "verify"))
    k = s.int("fanout_k", 1, lo=1)
    step = LutModel(LutTable(rows, str(p)), phase, k, tail, ctx.rng)
    return step, _gpu_alpha(s, ctx), {"path": str(p), "select": sel, "tail": tail, "decode_phase": phase, "fanout_k": k}


def _vidur(s, ctx):
    from .vidur import VidurModel
    kw = _efficiencies(s, VidurModel.DEFAULTS)
    comm = s.str("tp_comm", "profile", choices=("profile", "roofline"))
    e = ctx.engine
    step = VidurModel(ctx.model, ctx.device, e.tensor_parallel_size, max_tokens=e.max_num_batched_tokens,
                      tp_comm=comm, **kw)
    return step, _gpu_alpha(s, ctx), dict(kw, profile=step.profile, tp_comm=step.comm)


def _calibrated_tps(s, ctx):
    d = CalibratedTPSModel.DEFAULTS
    kw = {k: (s.bool(k, v) if isinstance(v, bool) else s.num(k, v, lo=0, lo_open=k.startswith("base")))
          for k, v in d.items()}
    return CalibratedTPSModel(ctx.engine.tensor_parallel_size, **kw), _alpha(s), kw


MODELS = {"roofline": _roofline, "blackbox": _blackbox, "unified5": _unified5, "physics": _physics,
          "lut": _lut, "vidur": _vidur, "calibrated_tps": _calibrated_tps}


def _host_overrides(s: Section) -> dict:
    h = s.section("host", {})
    out = {}
    for k in HostCosts.__dataclass_fields__:
        if k == "cudagraph_decode_only":
            v = h.raw(k, None)
            if v is not None:
                out[k] = h.bool(k)
        elif k == "cudagraph_max_tokens":
            v = h.int(k, None, lo=0)
            if v is not None:
                out[k] = v
        else:
            v = h.num(k, None, lo=0)
            if v is not None:
                out[k] = float(v)
    h.done()
    return out


def _with_host(kind, step, queueing, ctx, overrides, desc):
    """Add the engine generation's host costs (dsim.latency.host) to a built model."""
    e = ctx.engine
    gen = e.generation
    costs = resolve_host(gen, overrides, kind, e.enforce_eager, e.executor, e.engine_use_ray, e.tensor_parallel_size)
    ref = FITTED_ON.get(kind)
    if ref is not None and isinstance(queueing, AlphaModel):
        d = [a - b for a, b in zip(gen.alpha_us, by_name(ref).alpha_us)]
        if any(d):
            a0, a1, a2, post = queueing.us
            queueing = AlphaModel(max(0.0, a0 + d[0]), max(0.0, a1 + d[1]), max(0.0, a2 + d[2]), post)
    desc["engine_generation"] = gen.name
    desc["host_us"] = {k: getattr(costs, k) for k in HostCosts.__dataclass_fields__}
    if ref is not None:
        desc["host_us"]["relative_to"] = ref
    if not costs.is_zero:
        step = HostStepModel(step, costs, ctx.model.num_layers, e.tensor_parallel_size)
    return step, queueing


# unified5's built-in coefficients come from traces of vLLM on H100 (docs/latency-models.md)
UNIFIED5_DEFAULT_HARDWARE = "H100-SXM"


def _held_out_errors(s: Section) -> dict | None:
    """latency.held_out_errors: error column (dsim.metrics.band.BAND_COLUMNS) -> signed relative errors."""
    raw = s.raw("held_out_errors", None)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ConfigError(s.sub("held_out_errors"), raw, "a mapping of error column -> list of numbers")
    out = {}
    for k, v in raw.items():
        p = f"{s.sub('held_out_errors')}.{k}"
        if k not in BAND_COLUMNS:
            raise ConfigError(p, k, "one of " + ", ".join(BAND_COLUMNS))
        if not isinstance(v, list):
            raise ConfigError(p, v, "a list of relative errors")
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (-1 < x < float("inf")):
                raise ConfigError(f"{p}[{i}]", x, "a finite relative error > -1")
        out[k] = [float(x) for x in v]
    return out


def build_latency(data, ctx: LatencyContext, path: str = "latency"):
    """Return (step-time model, queueing model, description dict for the manifest).

    The model gives GPU time; the engine generation's host costs are added on top (one layer for
    every model, dsim.latency.host), with ``latency.host`` overriding single values."""
    s = Section(data, path)
    kind = s.str("model", "roofline", choices=MODELS)
    overrides = _host_overrides(s)
    fitted_on = s.str("fitted_on", None)        # written by dsim calibrate: the GPU the fit is valid for
    held_out = _held_out_errors(s)              # written by dsim calibrate: its errors on runs it did not fit
    scale = s.num("scale", 1.0, lo=0, lo_open=True)     # every step x scale (error-band ends, what-ifs)
    step, queueing, desc = MODELS[kind](s, ctx)
    s.done()
    desc = dict(model=kind, **desc)
    if fitted_on is not None:
        desc["calibrated"] = True
    if held_out:
        desc["held_out_errors"] = held_out
    if kind == "unified5" and "beta" not in s.data and "coefficients" not in s.data:
        fitted_on = fitted_on or UNIFIED5_DEFAULT_HARDWARE
    if fitted_on is not None:
        desc["fitted_on"] = fitted_on
        if fitted_on != ctx.device.name and "warning" not in desc:
            desc["warning"] = (f"{kind} coefficients were fitted on {fitted_on}, this replica runs on "
                               f"{ctx.device.name}: expect larger errors (calibrate on this GPU)")
    shipped = {"unified5": "beta" not in s.data and "coefficients" not in s.data,
               "physics": "coefficients" not in s.data}.get(kind, True)
    warn = credibility_warnings(kind, getattr(step, "beta", None), shipped)
    if warn:
        desc["warning"] = "; ".join(([desc["warning"]] if desc.get("warning") else []) + warn)
    step, queueing = _with_host(kind, step, queueing, ctx, overrides, desc)
    if scale != 1.0:
        step = ScaledStepModel(step, scale)
        desc["scale"] = scale
    if isinstance(queueing, AlphaModel):
        desc["alpha_us"] = list(queueing.us[:3])
        if queueing.post:
            desc["post_us"] = queueing.us[3]
    return step, queueing, desc
