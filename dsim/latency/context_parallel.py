"""Context parallelism (``engine.context_parallel_size: C``): one replica's steps split over C ranks.

Each CP rank is a full TP group (the replica has TP x C GPUs, each rank with all of the TP-sharded
weights), and every sequence's KV is sharded evenly over the ranks, so the replica holds C times
the KV of one TP group.  A step runs on the C ranks in lockstep, and the slowest rank sets it:

* **Linear layers.** The step's tokens are shared out: a rank runs ceil(n / C) of the prefill and
  of the decode tokens, and samples ceil(s / C) tokens.
* **Attention.** A prefill chunk's queries are split over the ranks (ring attention, "pass-KV": the
  KV shards travel round the ring so every query block meets every key), so a rank computes
  ceil(pairs / C) of the causal pairs and still reads the whole context once.  A decode query
  attends only the rank's shard of its context on each rank: ceil(context sum / C) per rank.
* **Ring KV exchange (prefill).** Per layer, C - 1 ring steps, each passing a rank's shard of the
  chunk's and its context's KV (ceil((chunk + context) / C) tokens x the layer's KV bytes per TP
  shard): (C - 1) x (a + shard bytes / B).  It runs while the rank computes the layer's
  attention, so only what exceeds that attention is exposed (the overlap of ring attention).
* **Decode combine.** Per layer, the decode queries are gathered on every rank and the partial
  outputs summed: a ring all-gather plus all-reduce of the decode tokens' hidden states (per TP
  shard), 3 (C - 1) a + 3 (C - 1) / C x bytes / B, not overlapped.

B and the step latency a are those of the links between the ranks (``DeviceProfile.collective_link``
for TP x C GPUs: the node's interconnect, or the inter-node link beyond ``gpus_per_node``).  The
attention share of a rank's time is read off the wrapped model (its time minus its time with no
attention work), so this works for any model that costs attention from the causal pairs and
context sums (roofline, vidur, unified5); host costs are added on the whole batch after it
(dsim.latency.host).  Source: the pass-KV ring of Liu, Zaharia and Abbeel, "Ring Attention with
Blockwise Transformers for Near-Infinite Context" (2023), and its use for long-prompt inference in
Yang et al., "Context Parallelism for Scalable Million-Token Inference" (MLSys 2025).
"""
from __future__ import annotations

from .base import BatchShape

MODELS = ("roofline", "vidur", "unified5")      # models that cost attention from pairs and context sums


def _share(x: int, c: int) -> int:
    return -(-x // c)


class ContextParallelStep:
    """The GPU step time of a replica whose steps run over ``cp`` context-parallel ranks."""

    def __init__(self, inner, model, device, tp: int, cp: int):
        if cp < 2:
            raise ValueError(f"context parallelism needs at least 2 ranks, got {cp}")
        self.inner, self.cp = inner, cp
        self.name = getattr(inner, "name", "model")
        self.pure = getattr(inner, "pure", False)
        bw, _, step_s = device.collective_link(tp * cp)
        L = model.num_layers
        self.layers = L
        self._kv_layer = model.kv_bytes_per_token / L / model.kv_shards(tp)     # bytes per token, layer, rank
        self._ring_fixed = (cp - 1) * step_s                                  # one layer's ring, fixed part
        self._ring_per_token = (cp - 1) * self._kv_layer / bw                 # ... per token of a shard
        hidden_bytes = model.hidden_size * 2 / tp                             # a 16-bit hidden state per TP shard
        self._combine_fixed = L * 3 * (cp - 1) * step_s
        self._combine_per_token = L * 3 * (cp - 1) / cp * hidden_bytes / bw

    def __getattr__(self, item):          # energy_mj, gemm, ... of the wrapped model
        if item == "inner":
            raise AttributeError(item)
        return getattr(self.inner, item)

    def rank_batch(self, b: BatchShape) -> BatchShape:
        """The slowest rank's share of the step (see the module docstring)."""
        c = self.cp
        return b._replace(prefill_tokens=_share(b.prefill_tokens, c), prefill_attn_pairs=_share(b.prefill_attn_pairs, c),
                          decode_tokens=_share(b.decode_tokens, c), decode_ctx_sum=_share(b.decode_ctx_sum, c),
                          num_sampled=_share(b.num_sampled, c), prefill_chunk_sq=_share(b.prefill_chunk_sq, c * c),
                          verify_tokens=_share(b.verify_tokens, c), verify_ctx_sum=_share(b.verify_ctx_sum, c))

    def comm_time(self, b: BatchShape, rank_attention_s: float) -> float:
        """Exposed ring exchange (prefill) plus the decode combine, seconds per step."""
        t = 0.0
        if b.prefill_tokens:
            shard = _share(b.prefill_tokens + b.prefill_ctx_tokens, self.cp)
            ring = self._ring_fixed + self._ring_per_token * shard                 # one layer
            hidden = ring - rank_attention_s / self.layers
            if hidden > 0:
                t += self.layers * hidden
        if b.decode_tokens:
            t += self._combine_fixed + self._combine_per_token * b.decode_tokens
        return t

    def step_time(self, b: BatchShape) -> float:
        if not (b.prefill_tokens or b.decode_tokens):
            return self.inner.step_time(b)
        r = self.rank_batch(b)
        t = self.inner.step_time(r)
        attn = 0.0
        if b.prefill_tokens:
            bare = self.inner.step_time(r._replace(prefill_attn_pairs=0, prefill_ctx_tokens=0))
            attn = max(t - bare, 0.0)
        return t + self.comm_time(b, attn)
