"""Roofline step time: linear layers GEMM by GEMM on measured efficiency curves, attention and KV
traffic on the textbook roofline, TP all-reduces.

Linear layers (qkv, output, gate/up, down per layer, the MoE router, shared and routed experts,
the LM head for the sampled tokens) are timed one GEMM at a time, each
max(FLOPs / (peak x e_c), bytes / (bw x e_m)) + a launch floor, with the achieved efficiencies of
dsim.latency.efficiency: fitted on vidur's measured kernels per GPU, functions of the token count
and the TP-sharded weight shape (small GEMMs and small batches run well below peak).  GPUs
without a profile borrow one by architecture (``self.gemm.borrowed`` / ``.reason`` say which).
A MoE layer's routed experts are one grouped GEMM: the experts a step touches (expected distinct
experts under uniform routing) each see tokens x k / touched tokens, and only their weights are
read.

Attention (exact causal work: prefill context x chunk pairs, decode one query over its context)
and the KV reads of every attended context plus writes of the new tokens keep one efficiency each
(ATTN_COMPUTE, ATTN_MEMORY), combined as max(compute, memory) + (1 - overlap) x min.  Host costs
(scheduling, sampling, launch gaps) are not here: dsim.latency.host adds them.

Parameters (``latency.*``): ``compute_efficiency`` and ``memory_efficiency`` are multipliers
(default 1.0) on the fitted curves and on the attention efficiencies; ``overlap`` is the share of
the shorter of compute and memory hidden under the longer, per GEMM and for attention (default
1.0: the curves were fitted as max(compute, memory)).  ``curve=False`` (draft devices, formula
tests) restores one flat efficiency for everything: then the two efficiencies are absolute.
"""
from __future__ import annotations

from ..config.hardware import DeviceProfile
from ..config.model import ModelSpec
from .base import BatchShape
from .collectives import all_reduce_terms
from .efficiency import GemmCurve, curve_for

ATTN_COMPUTE, ATTN_MEMORY = 0.8, 0.84    # attention / KV efficiencies (the former flat defaults)
ACT_BYTES = 2.0                          # activations are 16-bit whatever the weight format
_CACHE_MAX = 65536
# (curve, GEMM inventory, MoE shape, multipliers) -> the (linear, head) memo dicts every model of that
# key shares: a plan or sweep builds a new model per run, and each refilled the same entries (a
# cache miss costs ~40 us: ~6 % of a 70B plan's simulation time).  The key holds every input of
# linear_time and head_time, so a shared entry is the value this model would compute (only for
# RooflineModel itself: a subclass may time its GEMMs from other state).
_SHARED: dict = {}
_SHARED_MAX = 16


class RooflineModel:

    pure = True          # step_time keeps no state: quiet decode steps may be replayed in one go
    name = "roofline"
    DEFAULTS = {"compute_efficiency": 1.0, "memory_efficiency": 1.0, "overlap": 1.0}

    def __init__(self, model: ModelSpec, device: DeviceProfile, tp: int = 1, step_overhead_us: float = 0.0,
                 curve: bool | GemmCurve = True, all_reduce: str | None = None, moe_fused: bool = True,
                 **params: float):
        """``step_overhead_us`` is a fixed cost per step for devices without a vLLM host layer
        (draft devices); replicas get theirs from dsim.latency.host.  ``curve``: True (the
        device's fitted or borrowed GEMM curve), a GemmCurve, or False (flat efficiencies).
        ``all_reduce``: the TP all-reduce's algorithm (dsim.latency.collectives; None: the
        profile's per-collective latency plus the ring's bytes).  ``moe_fused``: the routed experts
        run as one grouped kernel (vLLM's fused MoE); False: one GEMM kernel per touched expert."""
        unknown = set(params) - set(self.DEFAULTS)
        if unknown:
            raise TypeError(f"unknown roofline parameters: {sorted(unknown)}")
        if not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tensor parallel size must be a positive integer, got {tp!r}")
        p = {**self.DEFAULTS, **params}
        mc, mm = p["compute_efficiency"], p["memory_efficiency"]
        if not (mc > 0 and mm > 0 and 0.0 <= p["overlap"] <= 1.0):
            raise ValueError(f"roofline efficiencies must be > 0 and overlap in [0, 1]: {p}")
        self._serial = 1.0 - p["overlap"]
        self.model, self.device, self.tp = model, device, tp
        self.gemm = curve_for(device) if curve is True else (curve or None)
        m = model
        flat = self.gemm is None
        self._mc, self._mm = mc, mm
        self._flops_lin = m.flops_per_token_linear / tp
        self._flops_head = m.flops_lm_head / tp
        self._flops_pair = m.attn_flops_per_pair / tp
        self._kv_tok = m.kv_bytes_per_token / m.kv_shards(tp)
        # flat efficiencies: everything in flat mode, attention and KV with the curve (and DP's expert model)
        # flat: the mix of quantized and BF16 linear FLOPs; with the curve only attention uses this (BF16)
        peak = device.peak_flops_for(m.compute_dtype, m.compute_dtype_share) if flat else device.peak_flops
        self._inv_flops = 1.0 / (peak * mc * (1.0 if flat else ATTN_COMPUTE))
        self._inv_bw = 1.0 / (device.hbm_bytes_s * mm * (1.0 if flat else ATTN_MEMORY))
        bpp = m.bytes_per_param
        emb = m.embedding_params * bpp * (0 if m.tie_word_embeddings else 1)
        if m.is_moe:
            self._expert_bytes = m.expert_bytes / tp      # one routed expert, all MoE layers (quantized width)
            self._fixed_bytes = (m.weight_bytes - emb) / tp - self._expert_bytes * m.num_experts
        else:
            self._fixed_bytes = (m.weight_bytes - emb) / tp   # embedding is a gather, not a stream
            self._expert_bytes = 0.0
        self._overhead = step_overhead_us * 1e-6
        self.all_reduce = all_reduce
        self.moe_fused = moe_fused
        if tp > 1:
            fixed, coef, bw = all_reduce_terms(device, tp, all_reduce)
            self._ar_per_token = 2 * m.num_layers * coef * m.hidden_size * bpp / bw
            self._ar_fixed = 2 * m.num_layers * fixed
        else:
            self._ar_per_token = self._ar_fixed = 0.0
        self._moe_cache: dict[int, float] = {}
        self._lin_cache: dict[int, float] = {}
        self._head_cache: dict[int, float] = {}
        if not flat:
            self._dense_gemms, self._moe_layers, self._head_shape = self._gemm_list()
        if not flat and type(self) is RooflineModel:       # a subclass may time GEMMs otherwise
            moe = (m.num_experts, m.experts_per_token, m.hidden_size) if self._moe_layers else None
            key = (self.gemm, tuple(self._dense_gemms), self._moe_layers, moe, self._head_shape, mc, mm,
                   self._serial, moe_fused)
            caches = _SHARED.get(key)
            if caches is None:
                if len(_SHARED) >= _SHARED_MAX:
                    del _SHARED[next(iter(_SHARED))]
                caches = _SHARED[key] = ({}, {})
            self._lin_cache, self._head_cache = caches

    # ---- GEMM inventory (per TP shard) -----------------------------------------------------
    def _gemm_list(self):
        """([(count, n, k, bytes per weight, compute slowdown)] of the dense GEMMs per step, MoE layers
        (L, n_up, k_down, bytes, slowdown), LM head (n, k, bytes, slowdown)).  Bytes per weight and the
        compute slowdown (BF16 peak / the peak of the GEMM's input dtype) follow the checkpoint's
        quantization per part: attention, MLP / experts, LM head (dsim.config.quant)."""
        m, tp, h = self.model, self.tp, self.model.hidden_size
        q, dev = m.quant, self.device

        def slow(share):
            return dev.peak_flops / dev.peak_flops_for(m.compute_dtype, share) if q else 1.0
        att = (m.attn_bytes_per_param, slow(q.attn_share if q else 0.0))
        mlp = (m.mlp_bytes_per_param, slow(q.mlp_share if q else 0.0))
        out = []
        if m.is_mla:   # MLA projections (low-rank q/kv, output) as one GEMM of the same weight
            out.append((m.num_layers, m.attn_params_per_layer / h / tp, h, *att))
        else:
            out.append((m.num_layers, (m.q_dim + 2 * m.kv_dim) / tp, h, *att))      # qkv
            out.append((m.num_layers, h, m.q_dim / tp, *att))                       # output
        up = 2 if m.gated_mlp else 1
        dense_layers = m.num_layers - m.num_moe_layers
        if dense_layers and m.intermediate_size:
            out.append((dense_layers, up * m.intermediate_size / tp, h, *mlp))
            out.append((dense_layers, h, m.intermediate_size / tp, *mlp))
        moe = None
        if m.is_moe:
            L = m.num_moe_layers
            out.append((L, m.num_experts, h, *mlp))                                 # router (replicated)
            if m.num_shared_experts and m.shared_expert_intermediate_size:
                out.append((L, up * m.shared_expert_intermediate_size / tp, h, *mlp))
                out.append((L, h, m.shared_expert_intermediate_size / tp, *mlp))
            moe = (L, up * m.expert_intermediate_size / tp, m.expert_intermediate_size / tp, *mlp)
        head = (m.lm_head_bytes_per_param, slow(1.0 if q and q.lm_head else 0.0))
        return out, moe, (m.vocab_size / tp, h, *head)

    def _gemm_time(self, tokens: float, n: float, k: float, bpp: float, slow: float, count: float = 1.0) -> float:
        tc, tm = self.gemm.terms(tokens, n, k, bpp, ACT_BYTES, count)
        tc, tm = tc * slow / self._mc, tm / self._mm
        return (tc + self._serial * tm if tc > tm else tm + self._serial * tc) + self.gemm.t0_us * 1e-6

    def gemm_terms(self, tokens, sampled):
        """Per GEMM kind, at unit multipliers and for arrays of token / sampled counts: (compute s,
        memory s) as arrays (len(tokens), kinds) summed over layers, and the launch floors (s) per
        step.  Each kind's time is max(compute / compute_efficiency, memory / memory_efficiency)
        (overlap 1); dsim.calibrate fits the two multipliers on these."""
        import numpy as np
        if self.gemm is None:
            raise ValueError("gemm_terms needs the GEMM efficiency curve (curve=True)")
        tokens, sampled = np.asarray(tokens, float), np.asarray(sampled, float)
        g = self.gemm
        cols_c, cols_m, floor = [], [], np.zeros_like(tokens)
        t0 = g.t0_us * 1e-6

        def add(count, m, n, k, bpp, slow, group=1.0):
            tc, tm = g.terms(m, n, k, bpp, ACT_BYTES, group)
            cols_c.append(count * tc * slow)
            cols_m.append(count * tm)
            return count * t0
        for count, n, k, bpp, slow in self._dense_gemms:
            floor = floor + add(count, tokens, n, k, bpp, slow)
        if self._moe_layers:
            L, n_up, k_down, bpp, slow = self._moe_layers
            e, k_top = self.model.num_experts, self.model.experts_per_token
            touched = e * (1.0 - (1.0 - k_top / e) ** tokens)
            per = tokens * k_top / touched
            h = self.model.hidden_size
            if self.moe_fused:
                floor = floor + add(L, per, n_up, h, bpp, slow, touched) + add(L, per, h, k_down, bpp, slow, touched)
            else:           # one kernel per touched expert: its own stream and launch floor
                floor = floor + add(L * touched, per, n_up, h, bpp, slow) + add(L * touched, per, h, k_down, bpp, slow)
        on = sampled > 0
        hn, hk, hbpp, hslow = self._head_shape
        tc, tm = g.terms(np.where(on, sampled, 1.0), hn, hk, hbpp, ACT_BYTES)
        tc = tc * hslow
        cols_c.append(np.where(on, tc, 0.0))
        cols_m.append(np.where(on, tm, 0.0))
        floor = floor + np.where(on, t0, 0.0)
        return np.stack(cols_c, axis=-1), np.stack(cols_m, axis=-1), floor

    def touched_experts(self, tokens: int) -> float:
        """Expected distinct routed experts per MoE layer for ``tokens`` tokens (uniform routing)."""
        e, k = self.model.num_experts, self.model.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** tokens)

    def linear_time(self, tokens: int) -> float:
        """Seconds of every transformer-layer GEMM for ``tokens`` scheduled tokens (memoised)."""
        t = self._lin_cache.get(tokens)
        if t is None:
            t = 0.0
            for count, n, k, bpp, slow in self._dense_gemms:
                t += count * self._gemm_time(tokens, n, k, bpp, slow)
            if self._moe_layers:
                L, n_up, k_down, bpp, slow = self._moe_layers
                touched = self.touched_experts(tokens)
                per = tokens * self.model.experts_per_token / touched       # tokens each touched expert sees
                h = self.model.hidden_size
                if self.moe_fused:      # one grouped kernel over the touched experts (vLLM's fused MoE)
                    t += L * (self._gemm_time(per, n_up, h, bpp, slow, touched)
                              + self._gemm_time(per, h, k_down, bpp, slow, touched))
                else:                   # a kernel per touched expert: smaller streams, a launch floor each
                    t += L * touched * (self._gemm_time(per, n_up, h, bpp, slow)
                                        + self._gemm_time(per, h, k_down, bpp, slow))
            if len(self._lin_cache) < _CACHE_MAX:
                self._lin_cache[tokens] = t
        return t

    def head_time(self, sampled: int) -> float:
        """Seconds of the LM head for ``sampled`` tokens (memoised)."""
        t = self._head_cache.get(sampled)
        if t is None:
            t = self._gemm_time(sampled, *self._head_shape) if sampled else 0.0
            if len(self._head_cache) < _CACHE_MAX:
                self._head_cache[sampled] = t
        return t

    # ---- flat mode -------------------------------------------------------------------------
    def _weight_bytes(self, tokens: int) -> float:
        if not self._expert_bytes:
            return self._fixed_bytes
        w = self._moe_cache.get(tokens)
        if w is None:
            w = self._fixed_bytes + self._expert_bytes * self.touched_experts(tokens)
            if len(self._moe_cache) < _CACHE_MAX:
                self._moe_cache[tokens] = w
        return w

    def _flat_step(self, b: BatchShape, tokens: int) -> float:
        pairs = b.prefill_attn_pairs + b.decode_ctx_sum
        flops = self._flops_lin * tokens + self._flops_head * b.num_sampled + self._flops_pair * pairs
        kv = self._kv_tok * (b.decode_ctx_sum + b.prefill_ctx_tokens + tokens)
        tc = flops * self._inv_flops
        tm = (self._weight_bytes(tokens) + kv) * self._inv_bw
        t = (tc + self._serial * tm if tc > tm else tm + self._serial * tc) + self._overhead
        if self._ar_fixed:
            t += self._ar_fixed + self._ar_per_token * tokens
        return t

    # ---- step time -------------------------------------------------------------------------
    def step_time(self, b: BatchShape) -> float:
        tokens = b.prefill_tokens + b.decode_tokens
        if tokens == 0:
            return 0.0
        if self.gemm is None:
            return self._flat_step(b, tokens)
        lin = self._lin_cache.get(tokens)
        if lin is None:
            lin = self.linear_time(tokens)
        head = self._head_cache.get(b.num_sampled)
        if head is None:
            head = self.head_time(b.num_sampled)
        tc = self._flops_pair * (b.prefill_attn_pairs + b.decode_ctx_sum) * self._inv_flops
        tm = self._kv_tok * (b.decode_ctx_sum + b.prefill_ctx_tokens + tokens) * self._inv_bw
        t = (lin + head) + (tc + self._serial * tm if tc > tm else tm + self._serial * tc) + self._overhead
        if self._ar_fixed:
            t += self._ar_fixed + self._ar_per_token * tokens
        return t

    def decode_curve_plus(self, n: int, running: int, fixed: float, seq: float, pre: float):
        """``decode_curve(n, running)`` with the host layer's sum after it (dsim.latency.host):
        ``max(curve(ctx) + fixed + seq + pre, 1e-9)`` in one function, the same float operations."""
        if self.gemm is None or type(self).decode_curve is not RooflineModel.decode_curve:
            gpu = self.decode_curve(n, running)

            def plus_flat(ctx: int) -> float:
                t = gpu(ctx) + fixed + seq + pre
                return t if t > 1e-9 else 1e-9
            return plus_flat
        pair, kv_tok = self._flops_pair, self._kv_tok
        inv_flops, inv_bw, serial, over = self._inv_flops, self._inv_bw, self._serial, self._overhead
        ar = self._ar_fixed + self._ar_per_token * n if self._ar_fixed else 0.0
        base = self.linear_time(n) + self.head_time(n)

        def plus(ctx: int) -> float:
            tc = pair * ctx * inv_flops
            tm = kv_tok * (ctx + n) * inv_bw
            t = base + (tc + serial * tm if tc > tm else tm + serial * tc) + over
            if ar:
                t += ar
            t = t + fixed + seq + pre
            return t if t > 1e-9 else 1e-9
        return plus

    def decode_curve(self, n: int, running: int):
        """``step_time`` of n decoders as a function of their context sum (dsim.latency.base)."""
        if n == 0:
            return lambda ctx: 0.0
        pair, kv_tok = self._flops_pair, self._kv_tok
        inv_flops, inv_bw, serial, over = self._inv_flops, self._inv_bw, self._serial, self._overhead
        ar = self._ar_fixed + self._ar_per_token * n if self._ar_fixed else 0.0
        if self.gemm is None:
            flops_n = self._flops_lin * n + self._flops_head * n
            w = self._weight_bytes(n)

            def flat_curve(ctx: int) -> float:
                tc = (flops_n + pair * ctx) * inv_flops
                tm = (w + kv_tok * (ctx + n)) * inv_bw
                t = (tc + serial * tm if tc > tm else tm + serial * tc) + over
                if ar:
                    t += ar
                return t
            return flat_curve
        base = self.linear_time(n) + self.head_time(n)

        def curve(ctx: int) -> float:
            tc = pair * ctx * inv_flops
            tm = kv_tok * (ctx + n) * inv_bw
            t = base + (tc + serial * tm if tc > tm else tm + serial * tc) + over
            if ar:
                t += ar
            return t
        return curve
