"""Roofline step time: compute and memory time per iteration, partly overlapped.

GPU time = max(compute, memory) + (1 - overlap) x min(compute, memory): with overlap 1 the
slower of the two hides the other entirely (the textbook roofline); real kernels overlap weight
streaming and math only in part, which gives prefill a floor of weight reading under its compute.
Host costs (scheduling, sampling, launch gaps) are not here: dsim.latency.host adds them.

Compute counts linear-layer FLOPs for every scheduled token, the LM head only for tokens that
are sampled (vLLM computes logits for the last position of each request), and exact causal
attention work (prefill: context x chunk pairs; decode: one query over its whole context).
Memory counts the weights read once per step (for MoE only the experts the batch touches, in
expectation under uniform routing), KV reads of every attended context and KV writes of the
new tokens.  TP divides FLOPs, weights and KV heads and adds two ring all-reduces per layer.
"""
from __future__ import annotations

from ..config.hardware import DeviceProfile
from ..config.model import ModelSpec
from .base import BatchShape


class RooflineModel:

    pure = True          # step_time keeps no state: quiet decode steps may be replayed in one go
    name = "roofline"
    # Fitted on the H100 inference-perf runs by experiments/fit_roofline.py (docs/engine-overheads.md).
    DEFAULTS = {"compute_efficiency": 0.8, "memory_efficiency": 0.84, "overlap": 0.98}

    def __init__(self, model: ModelSpec, device: DeviceProfile, tp: int = 1, step_overhead_us: float = 0.0,
                 **params: float):
        """``step_overhead_us`` is a fixed cost per step for devices without a vLLM host layer
        (draft devices); replicas get theirs from dsim.latency.host."""
        unknown = set(params) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"unknown roofline parameters: {sorted(unknown)}")
        p = {**self.DEFAULTS, **params}
        compute_efficiency, memory_efficiency = p["compute_efficiency"], p["memory_efficiency"]
        self._serial = 1.0 - p["overlap"]
        self.model, self.device, self.tp = model, device, tp
        m = model
        self._flops_lin = m.flops_per_token_linear / tp
        self._flops_head = m.flops_lm_head / tp
        self._flops_pair = m.attn_flops_per_pair / tp
        self._kv_tok = m.kv_bytes_per_token / m.kv_shards(tp)
        self._inv_flops = 1.0 / (device.peak_flops_for(m.compute_dtype, m.compute_dtype_share) * compute_efficiency)
        self._inv_bw = 1.0 / (device.hbm_bytes_s * memory_efficiency)
        bpp = m.bytes_per_param
        if m.is_moe:
            self._expert_bytes = m.expert_bytes / tp      # one routed expert, all MoE layers (quantized width)
            emb = m.embedding_params * bpp * (0 if m.tie_word_embeddings else 1)
            self._fixed_bytes = (m.weight_bytes - emb) / tp - self._expert_bytes * m.num_experts
        else:
            emb = m.embedding_params * bpp * (0 if m.tie_word_embeddings else 1)
            self._fixed_bytes = (m.weight_bytes - emb) / tp   # embedding is a gather, not a stream
            self._expert_bytes = 0.0
        self._overhead = step_overhead_us * 1e-6
        if tp > 1:
            ring = 2.0 * (tp - 1) / tp
            self._ar_per_token = 2 * m.num_layers * ring * m.hidden_size * bpp / device.interconnect_bytes_s
            self._ar_fixed = 2 * m.num_layers * device.interconnect_latency_s
        else:
            self._ar_per_token = self._ar_fixed = 0.0
        self._moe_cache: dict[int, float] = {}

    def _weight_bytes(self, tokens: int) -> float:
        if not self._expert_bytes:
            return self._fixed_bytes
        w = self._moe_cache.get(tokens)
        if w is None:
            m = self.model
            e, k = m.num_experts, m.experts_per_token
            touched = e * (1.0 - (1.0 - k / e) ** tokens)   # expected distinct experts per layer
            w = self._fixed_bytes + self._expert_bytes * touched
            if len(self._moe_cache) < 65536:
                self._moe_cache[tokens] = w
        return w

    def step_time(self, b: BatchShape) -> float:
        tokens = b.prefill_tokens + b.decode_tokens
        if tokens == 0:
            return 0.0
        pairs = b.prefill_attn_pairs + b.decode_ctx_sum
        flops = self._flops_lin * tokens + self._flops_head * b.num_sampled + self._flops_pair * pairs
        kv = self._kv_tok * (b.decode_ctx_sum + b.prefill_ctx_tokens + tokens)
        byts = self._weight_bytes(tokens) + kv
        tc = flops * self._inv_flops
        tm = byts * self._inv_bw
        t = (tc + self._serial * tm if tc > tm else tm + self._serial * tc) + self._overhead
        if self._ar_fixed:
            t += self._ar_fixed + self._ar_per_token * tokens
        return t

    def decode_curve(self, n: int, running: int):
        """``step_time`` of n decoders as a function of their context sum (dsim.latency.base)."""
        if n == 0:
            return lambda ctx: 0.0
        flops_n = self._flops_lin * n + self._flops_head * n
        pair, kv_tok, w = self._flops_pair, self._kv_tok, self._weight_bytes(n)
        inv_flops, inv_bw, serial, over = self._inv_flops, self._inv_bw, self._serial, self._overhead
        ar = self._ar_fixed + self._ar_per_token * n if self._ar_fixed else 0.0

        def curve(ctx: int) -> float:
            tc = (flops_n + pair * ctx) * inv_flops
            tm = (w + kv_tok * (ctx + n)) * inv_bw
            t = (tc + serial * tm if tc > tm else tm + serial * tc) + over
            if ar:
                t += ar
            return t
        return curve
