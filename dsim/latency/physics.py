"""Physics-normalized step and queueing model (seed 000, final form of Iterations 4-10).

Every feature is a physical time (work / hardware ceiling, seconds) or a dimensionless ratio, so
one coefficient vector can transfer across models, GPUs and TP degrees:

    step_time  = beta . F_step(batch)     (16 features)
    queue_time = alpha . F_queue(arrival) (11 features; 7 scaled by the congestion gate g)

g = s + m - s*m is the probabilistic OR of batch saturation s = running/max_num_seqs and KV
pressure m (both clamped to [0, 1]).  Denominators are clamped to EPS, every feature to
[0, CLAMP], MoE activation uses scheduled tokens with the empty-step guard, and preemption
enters through an EMA updated once per step.

Where the seed's formula text disagrees with the physics it means to describe, this module
follows the physics (docs/latency-models.md lists each case): KV bytes per token are
2 x layers x kv_dim x dtype (the seed has an extra factor 2), an MoE token runs top_k whole
experts (not top_k/num_experts of one), attention widths use num_heads x head_dim (equal to
hidden_size only when head_dim = hidden/heads), and TP divides the work of each shard while the
ceilings stay those of one GPU (the seed divides the ceiling, which would make TP slower).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import NamedTuple

import yaml

from ..config.files import note_read, read_yaml
from ..config.errors import ConfigError
from .base import BatchShape

SPEC_VERSION = "1.0"
EPS = 1e-6
CLAMP = 100.0
from ..config.names import N_ALPHA, N_BETA  # noqa: E402,F401  (one count with the scenario schema)
ALPHA_NAMES = ("batch_saturation", "kv_pressure", "admission_compute", "base_bias", "queue_drain",
               "queue_memory", "prefix_cache_benefit", "memory_admission_gap", "preemption_disruption",
               "cpu_offload_expansion", "queued_regime_bias")
BETA_NAMES = ("prefill_linear", "prefill_attention", "decode_weights", "decode_attention", "kv_read",
              "batch_utilization", "prefill_mix", "moe_activation", "tp_comm", "gqa_ratio",
              "fixed_overhead", "preemption", "cpu_offload_transfer", "cpu_offload_kv_read",
              "chunked_mixed", "bias")
DEFAULT_COEFFS = Path(str(resources.files("dsim.latency").joinpath("coefficients/physics_default.yaml")))


class AlphaInput(NamedTuple):
    running_depth: float
    waiting_depth: float
    kv_usage_ratio: float
    prompt_tokens: float
    prefix_hit_ratio: float
    kv_free_bytes: float
    preemption_ema: float


class BetaInput(NamedTuple):
    prefill_tokens: float
    decode_tokens: float
    scheduled_tokens: float
    num_prefill_reqs: float
    num_decode_reqs: float
    running_depth: float
    sum_prefill_attn_work: float     # sum over prefill chunks of (context incl. chunk) x chunk
    decode_context_tokens: float
    sum_decode_kv_blocks: float
    preemption_ema: float
    transfer_blocks: float
    cpu_resident_read_blocks: float


@dataclass(frozen=True)
class PhysicsConfig:
    """Derived constants of one (model, GPU, TP, vLLM knobs) configuration."""
    tp: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    is_moe: bool
    top_k: int
    num_experts: int
    flops_linear_per_token: float    # whole model incl. LM head, FLOPs
    attn_flops_per_ctx_token: float  # FLOPs per (query, context token) pair, all layers (seed: L x 2h)
    weight_bytes_total: float        # layers' matmul weights with top_k experts (seed's definition)
    weight_bytes_static: float       # layers' weights without routed experts
    weight_bytes_expert: float       # one routed expert over all MoE layers
    kv_bytes_per_token: float        # whole model, all KV heads
    kv_shards: int                   # GPUs the KV heads are split over
    comm_bytes_per_token: float      # ring all-reduce bytes per token per GPU, 2 per layer
    hw_peak_flops: float             # one GPU
    hw_peak_bandwidth: float         # one GPU
    hw_pcie_bandwidth_eff: float
    hw_interconnect_bw: float
    max_num_seqs: int
    max_batched_tokens: int
    chunked_prefill: bool
    cpu_offloading: bool
    block_size: int
    total_kv_blocks_gpu: int
    total_kv_blocks_cpu: int

    @classmethod
    def build(cls, model, *, peak_flops: float, hbm_bytes_s: float, interconnect_bytes_s: float,
              pcie_bytes_s: float, pcie_efficiency: float, tp: int, max_num_seqs: int,
              max_batched_tokens: int, chunked_prefill: bool, block_size: int, total_kv_blocks_gpu: int,
              cpu_offloading: bool = False, total_kv_blocks_cpu: int = 0) -> "PhysicsConfig":
        if max_batched_tokens <= 0:
            raise ValueError("max_num_batched_tokens must be > 0 for the physics model (seed 000, note 2)")
        m = model
        bpp = m.bytes_per_param
        return cls(
            tp=tp, num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads,
            is_moe=m.is_moe, top_k=m.experts_per_token, num_experts=m.num_experts,
            flops_linear_per_token=float(m.flops_per_token),
            attn_flops_per_ctx_token=m.attn_flops_per_pair / 2,
            weight_bytes_total=float(m.layer_weight_bytes(m.experts_per_token if m.is_moe else None)),
            weight_bytes_static=float(m.layer_weight_bytes(0)) if m.is_moe else float(m.layer_weight_bytes()),
            weight_bytes_expert=float(m.expert_bytes),
            kv_bytes_per_token=float(m.kv_bytes_per_token),
            kv_shards=m.kv_shards(tp),
            comm_bytes_per_token=(m.num_layers * 2 * m.hidden_size * bpp * 2 * (tp - 1) / tp) if tp > 1 else 0.0,
            hw_peak_flops=peak_flops, hw_peak_bandwidth=hbm_bytes_s,
            hw_pcie_bandwidth_eff=pcie_bytes_s * pcie_efficiency, hw_interconnect_bw=interconnect_bytes_s,
            max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens, chunked_prefill=chunked_prefill,
            cpu_offloading=cpu_offloading, block_size=block_size, total_kv_blocks_gpu=total_kv_blocks_gpu,
            total_kv_blocks_cpu=total_kv_blocks_cpu if cpu_offloading else 0)

    @property
    def roofline_step_time(self) -> float:
        """A full batch's roofline time on one shard (normalises queue depth into seconds)."""
        return max(self.max_batched_tokens * self.flops_linear_per_token / self.tp / self.hw_peak_flops,
                   self.weight_bytes_total / self.tp / self.hw_peak_bandwidth)

    @property
    def block_bytes(self) -> float:
        """KV bytes of one block on one shard."""
        return self.block_size * self.kv_bytes_per_token / self.kv_shards

    def moe_activation(self, tokens: float) -> float:
        """Expected fraction of experts a step with ``tokens`` tokens touches (0 for an empty step)."""
        if not self.is_moe or tokens <= 0:
            return 0.0
        return 1.0 - (1.0 - self.top_k / self.num_experts) ** max(1.0, tokens)

    def effective_weight_bytes(self, tokens: float) -> float:
        if not self.is_moe:
            return self.weight_bytes_total
        return self.weight_bytes_static + self.weight_bytes_expert * self.num_experts * self.moe_activation(tokens)


def _clamp(x: float) -> float:
    return 0.0 if x < 0.0 else (CLAMP if x > CLAMP else x)


def alpha_features(c: PhysicsConfig, a: AlphaInput) -> list[float]:
    s = min(1.0, a.running_depth / max(EPS, c.max_num_seqs))
    m = min(1.0, max(0.0, a.kv_usage_ratio))
    g = s + m - s * m
    f = [
        a.running_depth / max(EPS, c.max_num_seqs),
        a.kv_usage_ratio,
        a.prompt_tokens * c.flops_linear_per_token / c.tp / c.hw_peak_flops,
        1.0,
        g * math.log1p(a.waiting_depth) * c.roofline_step_time,
        g * m * a.waiting_depth / max(EPS, c.max_num_seqs),
        g * a.prefix_hit_ratio * a.prompt_tokens / max(EPS, c.max_batched_tokens),
        g * a.prompt_tokens * c.kv_bytes_per_token / max(EPS, a.kv_free_bytes),
        g * a.preemption_ema,
        g * (1.0 if c.cpu_offloading else 0.0) * c.total_kv_blocks_cpu / max(EPS, c.total_kv_blocks_gpu),
        g,
    ]
    return [_clamp(x) for x in f]


def beta_features(c: PhysicsConfig, b: BetaInput) -> list[float]:
    peak = c.tp * c.hw_peak_flops          # a shard does 1/tp of the work at one GPU's peak
    cpu = 1.0 if c.cpu_offloading else 0.0
    f = [
        b.prefill_tokens * c.flops_linear_per_token / peak,
        b.sum_prefill_attn_work * c.attn_flops_per_ctx_token / peak,
        (c.effective_weight_bytes(b.scheduled_tokens) / c.tp / c.hw_peak_bandwidth) if b.decode_tokens > 0 else 0.0,
        b.decode_context_tokens * c.attn_flops_per_ctx_token / peak,
        b.sum_decode_kv_blocks * c.block_bytes / c.hw_peak_bandwidth,
        b.scheduled_tokens / max(EPS, c.max_batched_tokens),
        b.prefill_tokens / max(EPS, b.prefill_tokens + b.decode_tokens),
        c.moe_activation(b.scheduled_tokens),
        (c.comm_bytes_per_token * b.scheduled_tokens / c.hw_interconnect_bw) if c.tp > 1 else 0.0,
        c.num_kv_heads / c.num_heads,
        1.0 / max(1.0, b.scheduled_tokens),
        b.preemption_ema,
        cpu * b.transfer_blocks * c.block_bytes / c.hw_pcie_bandwidth_eff,
        cpu * b.cpu_resident_read_blocks * c.block_bytes / c.hw_pcie_bandwidth_eff,
        (1.0 if c.chunked_prefill and b.num_prefill_reqs > 0 and b.num_decode_reqs > 0 else 0.0),
        1.0,
    ]
    return [_clamp(x) for x in f]


# ---- coefficient files (seed 000, Observation G) ----------------------------------------------
@dataclass(frozen=True)
class PhysicsCoefficients:
    alpha: tuple
    beta: tuple
    gamma: float
    trained_on: dict
    source: str


def load_coefficients(path, where: str = "latency.coefficients") -> PhysicsCoefficients:
    p = Path(path)
    try:
        note_read(p)
        doc = read_yaml(p.read_text())
    except OSError as e:
        raise ConfigError(where, str(path), f"a readable coefficient file ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise ConfigError(where, str(path), f"valid YAML ({str(e).splitlines()[0]})") from None
    body = (doc or {}).get("physics_coefficients") if isinstance(doc, dict) else None
    if not isinstance(body, dict):
        raise ConfigError(f"{p}: physics_coefficients", None, "a mapping with spec_version and coefficients")
    ver = str(body.get("spec_version"))
    if ver != SPEC_VERSION:
        raise ConfigError(f"{p}: physics_coefficients.spec_version", body.get("spec_version"),
                          f"{SPEC_VERSION!r} (the feature specification this dsim implements)")
    out = {}
    for key, n in (("alpha_coefficients", N_ALPHA), ("beta_coefficients", N_BETA)):
        v = body.get(key)
        if not isinstance(v, list) or len(v) != n or not all(isinstance(x, (int, float)) and math.isfinite(x)
                                                             for x in v):
            raise ConfigError(f"{p}: physics_coefficients.{key}", v, f"a list of {n} finite numbers")
        out[key] = tuple(float(x) for x in v)
    gamma = body.get("gamma", 0.3)
    if not isinstance(gamma, (int, float)) or not 0 < gamma <= 1:
        raise ConfigError(f"{p}: physics_coefficients.gamma", gamma, "a number in (0, 1]")
    return PhysicsCoefficients(out["alpha_coefficients"], out["beta_coefficients"], float(gamma),
                               dict(body.get("trained_on") or {}), str(p))


class PhysicsModel:
    """Step-time and queueing model in one object: both read the same preemption EMA."""

    pure = False         # step_time has effects (see dsim.serving.fastforward)
    name = "physics"
    needs_state = True
    MIN_STEP = 1e-6

    def __init__(self, cfg: PhysicsConfig, coeffs: PhysicsCoefficients, a2_us: float = 0.0, residual=None):
        self.cfg = cfg
        self.residual = residual      # dsim.latency.residual.PhysicsResidual: step x exp(r(features)), opt-in
        self.coeffs = coeffs
        self.alpha = coeffs.alpha
        self.beta = coeffs.beta
        self.gamma = coeffs.gamma
        self.ema = 0.0
        self.a2 = a2_us * 1e-6
        self._half_block = (cfg.block_size - 1) / 2.0

    def beta_input(self, b: BatchShape) -> BetaInput:
        # sum (p + c) c = sum c p + sum c^2, and prefill_attn_pairs = sum c p + sum c (c + 1) / 2
        work = b.prefill_attn_pairs + (b.prefill_chunk_sq - b.prefill_tokens) / 2
        # blocks held by decoders: context / block_size plus the expected half-filled last block
        blocks = (b.decode_ctx_sum + b.decode_tokens * self._half_block) / self.cfg.block_size
        return BetaInput(b.prefill_tokens, b.decode_tokens, b.prefill_tokens + b.decode_tokens,
                         b.num_prefill, b.decode_tokens, b.running, work, b.decode_ctx_sum, blocks,
                         self.ema, b.kv_load_blocks, 0)

    @property
    def charges_kv_loads(self) -> bool:
        """With CPU offloading configured the step time has its own term for blocks copied in
        (``transfer_blocks``): the replica then does not add the copy time itself."""
        return self.cfg.cpu_offloading

    def step_time(self, b: BatchShape) -> float:
        if b.prefill_tokens + b.decode_tokens == 0:
            return 0.0
        self.ema = self.gamma * (b.num_preempted / max(1, b.running)) + (1 - self.gamma) * self.ema
        f = beta_features(self.cfg, self.beta_input(b))
        t = sum(x * y for x, y in zip(self.beta, f))
        if self.residual is not None:
            t *= math.exp(self.residual(f))
        return t if t > self.MIN_STEP else self.MIN_STEP

    def delay(self, request, state=None) -> float:
        c = self.cfg
        if state is None:
            a = AlphaInput(0, 0, 0.0, request.prompt_len, 0.0, c.total_kv_blocks_gpu * c.block_bytes * c.kv_shards,
                           self.ema)
        else:
            free_blocks = state.kv_total_blocks - state.kv_used_blocks
            a = AlphaInput(state.running, state.waiting, state.kv_used_blocks / max(1, state.kv_total_blocks),
                           request.prompt_len, state.prefix_hit_tokens / max(1, request.prompt_len),
                           free_blocks * c.block_size * c.kv_bytes_per_token, self.ema)
        d = sum(x * y for x, y in zip(self.alpha, alpha_features(c, a)))
        return d if d > 0 else 0.0

    def output_token_overhead(self) -> float:
        return self.a2

    def completion_overhead(self) -> float:
        return 0.0
