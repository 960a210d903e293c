"""Builds the step-time and queueing models named by a scenario's ``latency`` section.

The section arrives typed and validated (dsim.config.schema.latency: one model per kind); each
builder here turns its kind's keys into (step-time model, queueing model, description for the
manifest), resolving the defaults that depend on the replica and reading the files it names.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config.errors import ConfigError, MissingAssetError
from ..config.limits import MAX_FILE_BYTES
from ..config.generations import HostCosts, by_name
from .base import AlphaModel, LatencyContext
from .blackbox import BlackboxModel
from .credibility import credibility_warnings
from .scaled import ScaledStepModel
from .calibrated_tps import CalibratedTPSModel
from .host import FITTED_ON, HostStepModel, resolve_host
from .roofline import RooflineModel


def _path(v: str | None, where: str, ctx: LatencyContext) -> Path | None:
    """The file a latency key names, relative to the scenario's folder; it must exist."""
    if v is None:
        return None
    p = Path(v).expanduser()
    if not p.is_absolute() and ctx.base_dir is not None:
        p = Path(ctx.base_dir) / p
    if not p.is_file():     # a missing asset: in a latency.fallback chain the next tier is tried
        raise MissingAssetError(where, v, f"an existing regular file (looked for {p})")
    if p.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError(where, v, f"a file under {MAX_FILE_BYTES >> 30} GiB")
    return p


def _gpu_alpha(lat, ctx) -> AlphaModel:
    """GPU-only models: the API-server costs default to the engine generation's."""
    return AlphaModel(*(lat.alpha if lat.alpha is not None else ctx.engine.generation.alpha_us))


def _roofline(lat, ctx, path):
    kw = {k: getattr(lat, k) for k in RooflineModel.DEFAULTS}
    e = ctx.engine
    step = RooflineModel(ctx.model, ctx.device, e.tensor_parallel_size, all_reduce=e.all_reduce_algorithm,
                         moe_fused=e.moe_fused_kernel, **kw)
    desc = dict(kw)
    if e.all_reduce_algorithm:
        desc["all_reduce"] = e.all_reduce_algorithm
    if not e.moe_fused_kernel and ctx.model.is_moe:
        desc["moe_fused_kernel"] = False
    return step, _gpu_alpha(lat, ctx), desc


def _blackbox(lat, ctx, path):
    return BlackboxModel(*lat.beta), AlphaModel(*lat.alpha), {"beta_us": lat.beta}


def _unified5(lat, ctx, path):
    from .unified5 import Unified5Model
    beta, alpha = list(Unified5Model.BETA), list(Unified5Model.ALPHA_US)
    cpath = _path(lat.coefficients, f"{path}.coefficients", ctx)
    if cpath is not None:       # a file written by ``dsim fit --model unified5``; inline keys still win
        from .unified5 import load_unified5_coeffs
        beta, alpha = load_unified5_coeffs(cpath, f"{path}.coefficients")
    beta = lat.beta if lat.beta is not None else beta
    a = lat.alpha if lat.alpha is not None else alpha
    e = ctx.engine
    step = Unified5Model(ctx.model, ctx.device, e.tensor_parallel_size, beta, e.enable_expert_parallel)
    # seed 003 alpha: a0 before queueing, a1 after the last token (E2E only), a2 per output token
    return step, AlphaModel(a[0], 0.0, a[2], post_us=a[1]), {"beta": beta, "expert_parallel": step.ep > 1}


def _physics(lat, ctx, path):
    from .physics import DEFAULT_COEFFS, PhysicsConfig, PhysicsModel, load_coefficients
    p = _path(lat.coefficients, f"{path}.coefficients", ctx)
    coeffs = load_coefficients(p or DEFAULT_COEFFS, f"{path}.coefficients")
    if lat.beta is not None or lat.alpha is not None:   # inline keys win (dsim calibrate)
        from dataclasses import replace
        coeffs = replace(coeffs, beta=tuple(lat.beta if lat.beta is not None else coeffs.beta),
                         alpha=tuple(lat.alpha if lat.alpha is not None else coeffs.alpha))
    e, d = ctx.engine, ctx.device
    # the CPU tier's size when the replica has one (engine.kv_offload), else what the scenario says
    tier = e.kv_offload.capacity_blocks(ctx.model, e) if getattr(e, "kv_offload", None) is not None else 0
    cpu_blocks = lat.cpu_offload_blocks if lat.cpu_offload_blocks is not None else tier
    cfg = PhysicsConfig.build(
        ctx.model, peak_flops=d.peak_flops, hbm_bytes_s=d.hbm_bytes_s, interconnect_bytes_s=d.interconnect_bytes_s,
        pcie_bytes_s=d.pcie_bytes_s, pcie_efficiency=d.pcie_efficiency, tp=e.tensor_parallel_size,
        max_num_seqs=e.max_num_seqs, max_batched_tokens=e.max_num_batched_tokens,
        chunked_prefill=e.enable_chunked_prefill, block_size=e.block_size, total_kv_blocks_gpu=ctx.kv_blocks,
        cpu_offloading=cpu_blocks > 0, total_kv_blocks_cpu=cpu_blocks)
    rpath = _path(lat.residual, f"{path}.residual", ctx)
    residual = None
    if rpath is not None:
        from .residual import load_residual
        residual = load_residual(rpath, f"{path}.residual")
    m = PhysicsModel(cfg, coeffs, residual=residual)
    trained = coeffs.trained_on
    desc = {"coefficients": coeffs.source, "trained_on": trained, "gamma": coeffs.gamma}
    if residual is not None:
        desc["residual"] = str(rpath)
        if residual.beta is not None and any(not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)
                                             for a, b in zip(residual.beta, coeffs.beta)):
            desc["warning"] = ("the residual was fitted on top of other physics coefficients than these: it "
                               "corrects a step time this model does not give")
    hw = trained.get("hardware")
    if hw and hw != d.name:
        desc["warning"] = "; ".join([f"coefficients were fitted on {hw}, this replica runs on {d.name}"]
                                    + ([desc["warning"]] if desc.get("warning") else []))
    return m, m, desc


def _lut(lat, ctx, path, chained=False):
    from .lut import LutModel, LutTable, pool_rows, read_lut, select_rows
    p = _path(lat.path, f"{path}.path", ctx)
    sel = lat.select.to_dict()
    if chained:     # in a fallback chain the table must hold the pool's own model, GPU and TP
        rows = pool_rows(read_lut(p), sel, ctx.model.name, ctx.device.name, ctx.engine.tensor_parallel_size, path)
    else:
        rows = select_rows(read_lut(p), sel, path)
    own = lat.tail is True or (lat.tail is not False and lat.tail.own)      # the rows' latency_p95_ms
    step = LutModel(LutTable(rows, str(p)), lat.decode_phase, lat.fanout_k, own and ctx.rng is not None, ctx.rng,
                    lat.selective_batching, path)
    desc = {"path": str(p), "select": sel, "tail": own, "decode_phase": lat.decode_phase, "fanout_k": lat.fanout_k}
    if lat.selective_batching:
        desc["selective_batching"] = True
    return step, _gpu_alpha(lat, ctx), desc


def _vidur(lat, ctx, path):
    from .vidur import VidurModel
    kw = {k: getattr(lat, k) for k in VidurModel.DEFAULTS}
    e = ctx.engine
    step = VidurModel(ctx.model, ctx.device, e.tensor_parallel_size, max_tokens=e.max_num_batched_tokens,
                      tp_comm=lat.tp_comm, all_reduce=e.all_reduce_algorithm, network_device=lat.network_device, **kw)
    desc = dict(kw, profile=step.profile, tp_comm=step.comm)
    if lat.network_device is not None:
        desc.update(network_device=lat.network_device, network_profile=step.network_profile)
    return step, _gpu_alpha(lat, ctx), desc


def _calibrated_tps(lat, ctx, path):
    kw = {k: getattr(lat, k) for k in CalibratedTPSModel.DEFAULTS}
    return CalibratedTPSModel(ctx.engine.tensor_parallel_size, **kw), AlphaModel(*lat.alpha), kw


MODELS = {"roofline": _roofline, "blackbox": _blackbox, "unified5": _unified5, "physics": _physics,
          "lut": _lut, "vidur": _vidur, "calibrated_tps": _calibrated_tps}


def _host_overrides(lat) -> dict:
    """latency.host: the values written, as HostCosts holds them."""
    out = {}
    for k in HostCosts.__dataclass_fields__:
        v = getattr(lat.host, k)
        if v is not None:
            out[k] = v if k in ("cudagraph_decode_only", "cudagraph_max_tokens") else float(v)
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


def _with_tail(lat, step, ctx: LatencyContext, path: str, desc: dict):
    """latency.tail (dsim.latency.tails): a mean-1 lognormal factor on each step's GPU time, with the
    spread given or (``true``) the model's own; a LUT's own tails are drawn by the LUT model itself.
    Without an rng (an estimate read off the model, e.g. dsim plan) the mean is used."""
    t = lat.tail
    if t is False:
        return step
    kind = lat.model
    own = t is True or t.own
    if own and kind not in ("lut", "vidur"):
        raise ConfigError(f"{path}.tail", True if t is True else t.to_dict(),
                          f"{{cv: X}} or {{p95_over_mean: Y}} with latency.model {kind} (only lut and vidur have tails "
                          "of their own)")
    if own and kind == "lut":
        return step
    from .tails import TailStepModel, cv_of_sigma, sigma_of_cv, sigma_of_p95
    if own:
        corr = "correlated" if t is True else t.correlation
        desc["tail"] = {"source": "vidur operator profiles (per-shape std)", "correlation": corr}
        if ctx.rng is None:
            return step
        sigma_of = step.step_sigma
        return TailStepModel(step, ctx.rng, cv_of=lambda b, mean: sigma_of(b, corr) / mean)
    s = sigma_of_cv(t.cv) if t.cv is not None else sigma_of_p95(t.p95_over_mean)
    desc["tail"] = {"cv": t.cv if t.cv is not None else round(cv_of_sigma(s), 6),
                    "p95_over_mean": t.p95_over_mean if t.p95_over_mean is not None else
                    round(math.exp(s * 1.6448536269514722 - s * s / 2), 6)}
    return step if ctx.rng is None else TailStepModel(step, ctx.rng, sigma=s)


# unified5's built-in coefficients come from traces of vLLM on H100 (docs/latency-models.md)
UNIFIED5_DEFAULT_HARDWARE = "H100-SXM"


def build_latency(lat, ctx: LatencyContext, path: str = "latency"):
    """Return (step-time model, queueing model, description dict for the manifest).

    ``lat`` is the typed latency section (dsim.config.schema.latency; ``parse_latency`` turns a
    mapping into one), None for all defaults; ``path`` is where it sits in the scenario (for the
    errors of the files it names).  The model gives GPU time; the engine generation's host costs
    are added on top (one layer for every model, dsim.latency.host), with ``latency.host``
    overriding single values.

    With ``latency.fallback`` the section is the first tier of a chain (seed 002 section 5.7:
    real-time predictors, then tables, then the heuristic): a tier whose data does not cover this
    replica (MissingAssetError) passes it to the next, and ``desc["provider"]`` says which tier
    was used and why the ones before it were skipped."""
    from ..config.schema.latency import LatencyCommon, parse_latency
    if lat is None:
        lat = parse_latency(None, path)
    elif not isinstance(lat, LatencyCommon):
        raise TypeError(f"build_latency takes a typed latency section (parse_latency(mapping)), not {lat!r}")
    if not lat.fallback:
        return _build_tier(lat, ctx, path)
    # the engine's host overrides and the what-if scale belong to the replica, not to one model:
    # a tier that does not write them takes the head section's
    inherit = {k: (lat.host.to_dict() if k == "host" else getattr(lat, k)) for k in ("host", "scale") if lat.given(k)}
    if lat.tail is not False and lat.tail is not True and not lat.tail.own:    # a given spread: any tier's
        inherit["tail"] = lat.tail.to_dict()
    tiers = [(lat, path)] + [(parse_latency({**inherit, **t.to_dict()}, f"{path}.fallback[{i}]") if inherit else t,
                              f"{path}.fallback[{i}]") for i, t in enumerate(lat.fallback)]
    chain = [t.model for t, _ in tiers]
    skipped = []
    for i, (tier, where) in enumerate(tiers):
        try:
            step, queueing, desc = _build_tier(tier, ctx, where, chained=True)
        except MissingAssetError as e:
            skipped.append({"model": tier.model, "reason": str(e)})
            continue
        desc["provider"] = {"chain": chain, "tier": i, "used": tier.model, "skipped": skipped}
        if skipped:
            desc["fallback_warning"] = (f"latency {chain[0]} has no data for this replica "
                                        f"({skipped[0]['reason']}): fell back to {tier.model} (tier {i + 1} "
                                        f"of {' -> '.join(chain)})")
        return step, queueing, desc
    raise ConfigError(path + ".fallback", None, "a tier with data for this replica; every one was skipped: "
                      + "; ".join(f"{s['model']}: {s['reason']}" for s in skipped), show_value=False)


def _build_tier(lat, ctx: LatencyContext, path: str, chained: bool = False):
    """build_latency for one latency section (one tier of a chain)."""
    kind = lat.model
    fitted_on = lat.fitted_on        # written by dsim calibrate: the GPU the fit is valid for
    held_out = lat.held_out_errors   # written by dsim calibrate: its errors on runs it did not fit
    step, queueing, desc = (_lut(lat, ctx, path, chained) if kind == "lut" else MODELS[kind](lat, ctx, path))
    desc = dict(model=kind, **desc)
    cp = ctx.engine.context_parallel_size
    if cp > 1:
        from .context_parallel import MODELS as CP_MODELS, ContextParallelStep
        if kind not in CP_MODELS:
            raise ConfigError(path[:path.index("latency")] + "engine.context_parallel_size", cp, f"1 with latency.model {kind} (context parallelism "
                              f"splits attention from the rest: {', '.join(CP_MODELS)})")
        step = ContextParallelStep(step, ctx.model, ctx.device, ctx.engine.tensor_parallel_size, cp)
        desc["context_parallel"] = cp
    step = _with_tail(lat, step, ctx, path, desc)       # on the whole GPU step, before the host costs
    if ctx.engine.all_reduce_algorithm and kind not in ("roofline", "vidur") and ctx.engine.tensor_parallel_size > 1:
        desc["warning"] = (f"engine.all_reduce_algorithm is read by the roofline and vidur models only; {kind} keeps "
                           "its own tensor-parallel cost")
    if not ctx.engine.moe_fused_kernel and ctx.model.is_moe and kind != "roofline":
        desc["warning"] = "; ".join(([desc["warning"]] if desc.get("warning") else [])
                                    + [f"engine.moe.fused_kernel is read by the roofline only; {kind} keeps its MoE cost"])
    if fitted_on is not None:
        desc["calibrated"] = True
    if held_out:
        desc["held_out_errors"] = held_out
    if kind == "unified5" and not lat.given("beta") and not lat.given("coefficients"):
        fitted_on = fitted_on or UNIFIED5_DEFAULT_HARDWARE
    if fitted_on is not None:
        desc["fitted_on"] = fitted_on
        if fitted_on != ctx.device.name and "warning" not in desc:
            desc["warning"] = (f"{kind} coefficients were fitted on {fitted_on}, this replica runs on "
                               f"{ctx.device.name}: expect larger errors (calibrate on this GPU)")
    shipped = {"unified5": not lat.given("beta") and not lat.given("coefficients"),
               "physics": not lat.given("coefficients")}.get(kind, True)
    warn = credibility_warnings(kind, getattr(step, "beta", None), shipped)
    if warn:
        desc["warning"] = "; ".join(([desc["warning"]] if desc.get("warning") else []) + warn)
    step, queueing = _with_host(kind, step, queueing, ctx, _host_overrides(lat), desc)
    if lat.scale != 1.0:
        step = ScaledStepModel(step, lat.scale)
        desc["scale"] = lat.scale
    if isinstance(queueing, AlphaModel):
        desc["alpha_us"] = list(queueing.us[:3])
        if queueing.post:
            desc["post_us"] = queueing.us[3]
    return step, queueing, desc
