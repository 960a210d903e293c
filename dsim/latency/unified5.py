"""Unified additive step time (seed 003): one HBM term for weights and KV, so the two are not
charged twice for the same memory bus.

    step_us = b1*T_pf_compute + b2*T_dc_compute + b3*(T_weight + T_pf_kv + T_dc_kv) + b4*L + b5*B

The T_* basis functions are first-principles times in microseconds on one GPU of the TP group:
FLOPs / peak FLOP/s and bytes / peak HBM bytes/s.  Prefill FLOPs are the linear layers (QKV, O,
gated or plain MLP, active experts only) plus causal attention over each chunk's context; decode
FLOPs the same for one token per request over its whole context.  T_weight reads the attention
weights and, for MoE, n_eff = min(E, max(k, B*k)) experts per layer.  With expert parallelism
(engine.enable_expert_parallel) each GPU holds E/EP whole experts instead of a 1/TP slice of all
of them and every routed token crosses an all-to-all (seed 003 part 3a).

The LM head and the embedding are not in the basis: the seed's coefficients were fitted without
them, and b1..b3 absorb them.
"""
from __future__ import annotations

import math
from pathlib import Path


from ..config.files import note_read, read_yaml
from ..config.errors import ConfigError
from .base import BatchShape

SPEC_VERSION = "1.0"         # coefficient files written by ``dsim fit --model unified5``


class Unified5Model:

    pure = True          # step_time keeps no state: quiet decode steps may be replayed in one go
    name = "unified5"
    # Seed 003, "Fitted coefficients (BLIS-in-the-loop, 21 ground truth experiments)", H100 SXM.
    BETA = (0.393, 0.093, 0.910, 68.3, 12.9)
    ALPHA_US = (19615.0, 1850.0, 1.71)

    def __init__(self, model, device, tp: int = 1, beta=BETA, expert_parallel: bool = False):
        if len(beta) != 5:
            raise ValueError("unified5 needs 5 beta coefficients")
        self.beta = tuple(float(b) for b in beta)
        m = model
        self.model, self.tp = m, tp
        self.L = m.num_layers
        us = 1e6
        self._us_per_flop = us / (device.peak_flops * tp)
        self._us_per_byte = us / device.hbm_bytes_s
        self._flops_tok = m.flops_per_token_linear * self._us_per_flop
        self._flops_pair = m.attn_flops_per_pair * self._us_per_flop
        self._kv_tok_us = m.kv_bytes_per_token / m.kv_shards(tp) * self._us_per_byte
        bpp = m.bytes_per_param
        self.ep = tp if (expert_parallel and m.is_moe) else 1
        if m.is_moe:
            one_expert = m.expert_bytes
            static = m.layer_weight_bytes(0)
            if self.ep > 1:
                # attention and dense parts stay TP-sharded; experts are whole on their owner GPU
                self._static_us = static / tp * self._us_per_byte
                self._expert_us = one_expert * self._us_per_byte
                self._experts = m.num_experts / self.ep
                self._a2a_us_per_tok = (m.num_moe_layers * m.experts_per_token * m.hidden_size * 4 * bpp
                                        / device.interconnect_bytes_s * us)
            else:
                self._static_us = static / tp * self._us_per_byte
                self._expert_us = one_expert / tp * self._us_per_byte
                self._experts = m.num_experts
                self._a2a_us_per_tok = 0.0
            self._k = m.experts_per_token
        else:
            self._static_us = m.layer_weight_bytes() / tp * self._us_per_byte
            self._expert_us = 0.0
            self._a2a_us_per_tok = 0.0

    def weight_us(self, batch_requests: int) -> float:
        if not self._expert_us:
            return self._static_us
        k = self._k
        n_eff = min(self._experts, max(k, batch_requests * k))
        return self._static_us + self._expert_us * n_eff

    def basis(self, b: BatchShape) -> tuple[float, float, float, float, float]:
        """(T_pf_compute, T_dc_compute, T_all_memory, L, B), times in microseconds."""
        B = b.num_prefill + b.decode_tokens
        t_pf = self._flops_tok * b.prefill_tokens + self._flops_pair * b.prefill_attn_pairs
        t_dc = self._flops_tok * b.decode_tokens + self._flops_pair * b.decode_ctx_sum
        kv_tokens = (b.prefill_ctx_tokens + 2 * b.prefill_tokens) + (b.decode_ctx_sum + b.decode_tokens)
        mem = self.weight_us(B) + self._kv_tok_us * kv_tokens
        return t_pf, t_dc, mem, float(self.L), float(B)

    def step_time(self, b: BatchShape) -> float:
        if b.prefill_tokens + b.decode_tokens == 0:
            return 0.0
        f = self.basis(b)
        be = self.beta
        t = be[0] * f[0] + be[1] * f[1] + be[2] * f[2] + be[3] * f[3] + be[4] * f[4]
        if self._a2a_us_per_tok:
            t += self._a2a_us_per_tok * b.total_tokens
        return t * 1e-6


def load_unified5_coeffs(path: Path, where: str) -> tuple[list, list]:
    """(beta, alpha) from a unified5_coefficients file."""
    try:
        note_read(path)
        doc = read_yaml(Path(path).read_text())
    except OSError as e:
        raise ConfigError(where, str(path), f"a readable coefficient file ({e.strerror})") from None
    body = (doc or {}).get("unified5_coefficients") if isinstance(doc, dict) else None
    if not isinstance(body, dict) or str(body.get("spec_version")) != SPEC_VERSION:
        raise ConfigError(f"{path}: unified5_coefficients.spec_version", (body or {}).get("spec_version"),
                          f"{SPEC_VERSION!r} in a unified5_coefficients mapping")
    beta, alpha = body.get("beta"), body.get("alpha")
    for k, v, n in (("beta", beta, 5), ("alpha", alpha, 3)):
        if not isinstance(v, list) or len(v) != n or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x < math.inf for x in v):
            raise ConfigError(f"{path}: unified5_coefficients.{k}", v, f"a list of {n} finite numbers >= 0")
    return [float(x) for x in beta], [float(x) for x in alpha]
