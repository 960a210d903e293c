"""The ``latency``: section of a scenario (declared schema; see dsim.config.schema.base for the rules).

One model per latency kind, chosen by ``latency.model`` (roofline when left out); every kind also
takes the keys of :class:`LatencyCommon` (host-cost overrides and what ``dsim calibrate`` writes).
The builders are in dsim.latency.registry: they read coefficient files and LUTs (relative to the
scenario's folder) and resolve the defaults that depend on the replica (None below).
"""
from __future__ import annotations

import math
from typing import Annotated, Any, Literal, Union

from ..errors import ConfigError
from ..fields import check_number
from ..names import BAND_COLUMNS, N_ALPHA, N_BETA
from .base import (BeforeValidator, Bool, Choice, Discriminator, Float, Int, Section, Str, Tag, Tagged, TypeAdapter,
                   ValidationError, checked, model_validator, translate)


def Coefficients(n: int, unit: str = "microseconds"):
    """A list of exactly n numbers, each >= 0 (a negative one makes steps or delays take negative time)."""
    def check(v):
        if not isinstance(v, (list, tuple)) or len(v) != n:
            raise ConfigError("", v, f"a list of {n} numbers ({unit})")
        return [check_number(x, f"[{i}]", lo=0) for i, x in enumerate(v)]
    js = {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": n, "maxItems": n}
    return checked(list, check, js)


def _held_out(v):
    if not isinstance(v, dict):
        raise ConfigError("", v, "a mapping of error column -> list of numbers")
    out = {}
    for k, errs in v.items():
        if k not in BAND_COLUMNS:
            raise ConfigError(str(k), k, "one of " + ", ".join(BAND_COLUMNS))
        if not isinstance(errs, list):
            raise ConfigError(str(k), errs, "a list of relative errors")
        for i, x in enumerate(errs):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not (-1 < x < math.inf):
                raise ConfigError(f"{k}[{i}]", x, "a finite relative error > -1")
        out[k] = [float(x) for x in errs]
    return out


# error column of dsim.metrics.band -> signed relative errors (sim - real) / real
HeldOutErrors = checked(dict, _held_out, {
    "type": "object", "propertyNames": {"enum": list(BAND_COLUMNS)},
    "additionalProperties": {"type": "array", "items": {"type": "number", "exclusiveMinimum": -1}}})

Efficiency = Float(0, 1, lo_open=True)


def _fallback(v):
    """``latency.fallback``: each entry a latency section, or a model name for its defaults; a tier
    has no chain of its own (the chain is the one list)."""
    if not isinstance(v, list):
        raise ConfigError("", v, "a list of latency models (names or mappings)")
    out = []
    for i, x in enumerate(v):
        raw = {"model": x} if isinstance(x, str) else x
        if not isinstance(raw, (dict, LatencyCommon)):
            raise ConfigError(f"[{i}]", x, "a latency model name or a latency mapping")
        tier = parse_latency(raw, f"[{i}]")
        if tier.fallback:
            raise ConfigError(f"[{i}].fallback", None, "no chain inside a fallback tier (list every tier in the "
                              "one latency.fallback)", show_value=False)
        out.append(tier)
    return out


FallbackChain = checked(list, _fallback, {"type": "array", "items": {"anyOf": [
    {"type": "string", "enum": ["roofline", "blackbox", "unified5", "physics", "lut", "vidur", "calibrated_tps"]},
    {"type": "object"}]}})


class HostOverrides(Section):
    """Single values of the engine generation's host costs (dsim.latency.host; docs/engine-overheads.md);
    None keeps the value of the generation ``engine.vllm_version`` selects."""
    step_us: Float(0) | None = None
    """Fixed host time per step, microseconds."""
    per_seq_us: Float(0) | None = None
    """Host time per request in the step, microseconds."""
    per_prefill_us: Float(0) | None = None
    """Host time per request with a prefill chunk in the step, microseconds."""
    per_worker_us: Float(0) | None = None
    """Host time per extra tensor-parallel worker, x (TP - 1), microseconds."""
    eager_layer_us: Float(0) | None = None
    """Launch gap per decoder layer on steps of at most 512 tokens not captured in a CUDA graph, microseconds."""
    cudagraph_max_tokens: Int(0) | None = None
    """Largest step (tokens) replayed from a CUDA graph (0: no graphs)."""
    cudagraph_decode_only: Bool | None = None
    """CUDA graphs capture decode-only steps only (a step with a prefill chunk pays the launch gaps)."""
    eager_layer_per_seq_us: Float(0) | None = None
    """Launch gap per decoder layer and request, on the same eager steps, microseconds."""
    ray_step_us: Float(0) | None = None
    """Driver <-> one Ray worker round trip per step (engine.executor: ray), microseconds."""
    ray_per_seq_us: Float(0) | None = None
    """... per request in the step, microseconds."""
    ray_tp_us: Float(0) | None = None
    """Ray executor with TP > 1, beyond one worker's round trip, per step, microseconds."""
    ray_tp_per_seq_us: Float(0) | None = None
    """... per request in the step, microseconds."""
    ray_tp_per_worker_us: Float(0) | None = None
    """... per worker beyond the second, x (TP - 2), microseconds."""
    engine_ray_us: Float(0) | None = None
    """API server <-> engine actor round trip per step (engine.engine_use_ray), microseconds."""
    engine_ray_per_seq_us: Float(0) | None = None
    """... per request in the step, microseconds."""


class StepTail(Section):
    """Per-step timing noise (dsim.latency.tails): each step's GPU time x a lognormal factor of mean 1.
    Neither cv nor p95_over_mean: the model's own tails (lut: the rows' latency_p95_ms; vidur: its operator
    profiles' per-shape noise)."""
    cv: Float(0, lo_open=True) | None = None
    """Coefficient of variation of the factor, the same for every step (None: p95_over_mean, else the model's own)."""
    p95_over_mean: Float(1, lo_open=True) | None = None
    """95th percentile of the factor, the same for every step, > 1 and below exp(z95^2 / 2) = 3.87 (None: cv, else
    the model's own)."""
    correlation: Choice("correlated", "independent") = "correlated"
    """vidur's own tails: how the profiled operators' run-to-run deviations combine in a step, correlated (sum of
    their std: the upper bound) or independent (root of the summed variances: the lower bound)."""

    @model_validator(mode="after")
    def _one_spread(self):
        if self.cv is not None and self.p95_over_mean is not None:
            raise ConfigError("p95_over_mean", self.p95_over_mean, "absent with cv (one spread)")
        if self.p95_over_mean is not None and math.log(self.p95_over_mean) >= 1.6448536269514722 ** 2 / 2:
            raise ConfigError("p95_over_mean", self.p95_over_mean, "below 3.87 (a mean-1 lognormal's p95 cannot exceed "
                              "exp(z95^2 / 2))")
        return self

    @property
    def own(self) -> bool:
        """The model's own tails (no spread given)?"""
        return self.cv is None and self.p95_over_mean is None


def _tail_check(v):
    if isinstance(v, (bool, dict, StepTail)) or v is None:
        return v
    raise ConfigError("", v, "true, false or a mapping {cv: X} / {p95_over_mean: Y}")


TailField = Annotated[Union[Annotated[Bool, Tag("<bool>")], Annotated[StepTail, Tag("<mapping>")]],
                      Discriminator(lambda v: "<bool>" if isinstance(v, bool) else "<mapping>"),
                      BeforeValidator(_tail_check)]


class LatencyCommon(Section):
    """The keys every latency model takes."""
    model: Str = "roofline"
    """The step-time model (each member below fixes it)."""
    host: HostOverrides = HostOverrides()
    """Overrides of the engine generation's host costs, added on top of every model's GPU time."""
    fitted_on: Str | None = None
    """The GPU these coefficients were fitted on (written by dsim calibrate; another GPU gets a warning)."""
    held_out_errors: HeldOutErrors | None = None
    """Error column -> the calibration's signed relative errors on runs it was not fitted on (written by
    dsim calibrate; a run's error band is built from them)."""
    scale: Float(0, lo_open=True) = 1.0
    """Every step time x this factor (error-band ends, what-ifs)."""
    tail: TailField = False
    """Per-step timing noise: false (off), true (the model's own tails: lut's latency_p95_ms rows, vidur's
    operator-profile noise), or {cv: X} / {p95_over_mean: Y} for any model (dsim.latency.tails)."""
    fallback: FallbackChain = []
    """Latency models tried in order when this one has no data for a pool (no VIDUR profile for its GPU,
    model or TP; no LUT file or rows for its model, GPU and TP): names or mappings, e.g. [lut, roofline].
    The tier used is reported per pool (summary.json pools.<name>.latency_tier) with a warning ([]: none)."""


class RooflineLatency(LatencyCommon):
    """First-principles step time from the HF config and the GPU datasheet, GEMM efficiency curves per GPU."""
    model: Literal["roofline"] = "roofline"
    """roofline (the default)."""
    compute_efficiency: Efficiency = 1.0
    """Multiplier of the achieved FLOP/s of the GEMM efficiency curves, in (0, 1]."""
    memory_efficiency: Efficiency = 1.0
    """Multiplier of the achieved HBM bandwidth, in (0, 1]."""
    overlap: Float(0, 1) = 1.0
    """How far compute and memory time overlap: 1 max(compute, memory), 0 their sum."""
    alpha: Coefficients(3) | None = None
    """API-server costs [a0 queue entry, a1 per prompt token, a2 per output token], microseconds (None: the
    engine generation's)."""


class BlackboxLatency(LatencyCommon):
    """BLIS-style linear step time: b0 + b1 x prefill tokens + b2 x decode tokens."""
    model: Literal["blackbox"]
    """blackbox."""
    beta: Coefficients(3)
    """[b0 per step, b1 per prefill token, b2 per decode token], microseconds."""
    alpha: Coefficients(3) = [0.0, 0.0, 0.0]
    """[a0 queue entry, a1 per prompt token, a2 per output token], microseconds."""


class Unified5Latency(LatencyCommon):
    """Five-coefficient physical model (seed 003), fitted on H100 traces of vLLM."""
    model: Literal["unified5"]
    """unified5."""
    coefficients: Str | None = None
    """A unified5_coefficients YAML written by ``dsim fit --model unified5`` (relative to the scenario's
    folder); inline beta/alpha win over it (None: the built-in H100 fit)."""
    beta: Coefficients(5, "b1-b3 dimensionless, b4-b5 microseconds") | None = None
    """[b1 compute, b2 attention, b3 HBM multipliers, b4 per layer, b5 per request us] (None: from
    coefficients, else the built-in fit)."""
    alpha: Coefficients(3) | None = None
    """[a0 before queueing, a1 after the last token (E2E only), a2 per output token], microseconds (None:
    from coefficients, else the built-in fit)."""


class PhysicsLatency(LatencyCommon):
    """Physics-informed model: 16 step-time and 11 queueing coefficients over vLLM's knobs."""
    model: Literal["physics"]
    """physics."""
    coefficients: Str | None = None
    """A physics_coefficients YAML (relative to the scenario's folder) (None: dsim's shipped H100 fit)."""
    beta: Coefficients(N_BETA, "see BETA_NAMES") | None = None
    """The 16 step-time coefficients, dsim.latency.physics.BETA_NAMES order (None: the file's). Giving
    beta or alpha inline (dsim calibrate does) replaces the file's."""
    alpha: Coefficients(N_ALPHA, "see ALPHA_NAMES") | None = None
    """The 11 queueing coefficients, dsim.latency.physics.ALPHA_NAMES order (None: the file's)."""
    residual: Str | None = None
    """Opt-in learned correction: a residual JSON written by ``dsim fit --model physics --residual`` (relative
    to the scenario's folder); each step time x exp(its trees' value on the 16 step features) (None: off)."""
    cpu_offload_blocks: Int(0) | None = None
    """KV blocks of the CPU offload tier the model costs (None: engine.kv_offload's size, else 0)."""


class LutSelect(Section):
    """Which configuration of a LUT holding several to read (the LUT's key columns)."""
    model: Str | None = None
    """The LUT's model column."""
    hardware: Str | None = None
    """The LUT's hardware column."""
    tensor_parallel: Int(1) | None = None
    """The LUT's tensor_parallel column."""
    pipeline_parallel: Int(1) | None = None
    """The LUT's pipeline_parallel column."""
    dtype: Str | None = None
    """The LUT's dtype column."""


class LutLatency(LatencyCommon):
    """Step time looked up (and interpolated) in a measured table (dsim/data/lut_schema.json)."""
    model: Literal["lut"]
    """lut."""
    path: Str
    """The LUT CSV (relative to the scenario's folder)."""
    select: LutSelect = LutSelect()
    """Key columns that pick exactly one configuration of the table (needed when it holds several)."""
    decode_phase: Choice("fused_decode", "draft_decode", "verify") = "fused_decode"
    """Which phase's rows cost the decode tokens."""
    fanout_k: Int(1) = 1
    """Fan-out of the decode rows read (tree drafts)."""
    selective_batching: Bool = False
    """Cost a step as Orca's selective batching from the rows' cost_nonatt_ms / cost_attn_ms: the non-attention
    work of all its tokens in one batched pass plus each request's attention (false: whole-pass rows)."""
    alpha: Coefficients(3) | None = None
    """API-server costs [a0, a1, a2], microseconds (None: the engine generation's)."""


class VidurLatency(LatencyCommon):
    """Vidur's operator profiles (A100 / H100 / A40, profiled dense models), attention from the roofline."""
    model: Literal["vidur"]
    """vidur."""
    attn_compute_efficiency: Efficiency = 0.8
    """Achieved fraction of peak FLOP/s in attention, in (0, 1]."""
    attn_memory_efficiency: Efficiency = 0.8
    """Achieved fraction of peak HBM bandwidth in attention, in (0, 1]."""
    tp_comm: Choice("profile", "roofline") = "profile"
    """Tensor-parallel all-reduce: the profiled NCCL times, or a vLLM-like ring on the roofline."""
    network_device: Str | None = None
    """VIDUR's network profile for the all-reduce, a folder of its network/ data (h100_dgx, h100_pairwise_nvlink,
    a100_dgx, a100_pairwise_nvlink, ...) (None: the GPU's DGX profile)."""
    alpha: Coefficients(3) | None = None
    """API-server costs [a0, a1, a2], microseconds (None: the engine generation's)."""


class CalibratedTpsLatency(LatencyCommon):
    """Seed 001's throughput model: prefill and decode tokens/s per GPU plus penalties."""
    model: Literal["calibrated_tps"]
    """calibrated_tps."""
    base_prefill_tps: Float(0, lo_open=True) = 3000.0
    """Prefill tokens/s of one GPU."""
    base_decode_tps: Float(0, lo_open=True) = 200.0
    """Decode tokens/s of one GPU."""
    comm_overhead_ms: Float(0) = 5.0
    """Tensor-parallel cost x log2(GPUs) per prefill step (a tenth per decode step), ms."""
    speculative: Bool = False
    """Speculative decoding speeds up decode by speculation_factor."""
    speculation_factor: Float(0) = 0.6
    """Decode time x this factor when speculative."""
    draft_compute_overhead: Float(0) = 0.2
    """Draft work added to the utilisation that drives the saturation penalty, when speculative (fraction)."""
    alpha: Coefficients(3) = [0.0, 0.0, 0.0]
    """[a0 queue entry, a1 per prompt token, a2 per output token], microseconds."""


KINDS = {"roofline": RooflineLatency, "blackbox": BlackboxLatency, "unified5": Unified5Latency,
         "physics": PhysicsLatency, "lut": LutLatency, "vidur": VidurLatency,
         "calibrated_tps": CalibratedTpsLatency}

LatencyField = Tagged("model", KINDS, "roofline")


_ADAPTER = TypeAdapter(LatencyField)


def parse_latency(raw: Any, path: str = "latency") -> LatencyCommon:
    """A latency mapping built in code (dsim calibrate, dsim fit, dsim lut build, a pool's own section)
    as its typed model; None is the default (roofline).  Errors are ConfigErrors under ``path``."""
    if isinstance(raw, LatencyCommon):
        return raw
    try:
        return _ADAPTER.validate_python(raw)
    except ValidationError as e:
        raise translate(e, raw, path) from None
