"""The latency-model interfaces: step time (beta side) and queueing/token overheads (alpha side)."""
from __future__ import annotations

from typing import NamedTuple, Protocol


class BatchShape(NamedTuple):
    """Immutable summary of one scheduler iteration; all a step-time model may look at.

    prefill_attn_pairs is the exact count of (query, key) pairs attended by the prefill chunks:
    a chunk of c tokens after p cached/computed tokens attends c*p + c*(c+1)/2 pairs (causal).
    """
    prefill_tokens: int = 0        # tokens computed for requests still in prefill this step
    num_prefill: int = 0           # requests with a prefill chunk this step
    prefill_attn_pairs: int = 0
    prefill_ctx_tokens: int = 0    # KV tokens read by prefill chunks (context before each chunk)
    decode_tokens: int = 0         # one per decoding request
    decode_ctx_sum: int = 0        # sum of context lengths attended by the decode tokens
    num_sampled: int = 0           # requests that sample a token at the end of this step
    prefill_chunk_sq: int = 0      # sum of squared chunk lengths (physics: context x chunk work)
    running: int = 0               # requests holding KV after scheduling (running depth)
    num_preempted: int = 0         # requests preempted while scheduling this step
    # speculative verification chunks (k + 1 tokens after a context) are counted in the prefill
    # fields above; these say how much of them is verification (for verify-phase LUT rows)
    num_verify: int = 0
    verify_tokens: int = 0
    verify_ctx_sum: int = 0        # sum of the contexts the verify chunks follow
    kv_load_blocks: int = 0        # KV blocks this step waits to copy in from the CPU tier (overlap false)

    @property
    def total_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens

    @property
    def num_requests(self) -> int:
        return self.num_prefill + self.decode_tokens


class LoadView(NamedTuple):
    """Read-only replica state a queueing (alpha) model may condition on at arrival."""
    running: int
    waiting: int
    kv_used_blocks: int
    kv_total_blocks: int
    prefix_hit_tokens: int = 0     # prompt tokens the prefix cache would serve right now


class LatencyContext(NamedTuple):
    """What a latency model may be built from: the replica's static description."""
    model: object                  # ModelSpec
    device: object                 # DeviceProfile
    engine: object                 # EngineConfig
    kv_blocks: int
    rng: object = None             # numpy Generator for models that sample (tail-aware LUT)
    base_dir: object = None        # folder that relative file paths in the scenario resolve from


class StepTimeModel(Protocol):
    name: str
    # optional ``pure = True``: step_time keeps no state and draws nothing at random, so a replica
    # may replay quiet decode steps in one go (dsim.serving.fastforward); absent means False

    def step_time(self, batch: BatchShape) -> float:
        """Seconds one scheduler iteration with this batch takes on the replica."""

    # optional ``decode_curve(n, running) -> f``: f(context sum) is step_time of a decode-only batch
    # of n requests, bit for bit (see ``decode_curve`` below); quiet stretches call f once per step


def decode_curve(model, n: int, running: int):
    """f(ctx) = ``model.step_time`` of a batch of n decoders whose contexts sum to ctx.

    A model's own ``decode_curve`` (looked up on its class, so a wrapper that forwards unknown
    attributes to the model it wraps cannot hand out the wrapped model's curve without its own
    costs) hoists what does not depend on ctx and keeps step_time's float operations in order."""
    own = getattr(type(model), "decode_curve", None)
    if own is not None:
        return own(model, n, running)
    step_time = model.step_time
    return lambda ctx: step_time(BatchShape(0, 0, 0, 0, n, ctx, n, 0, running, 0, 0, 0, 0, 0))


class QueueingModel(Protocol):
    def delay(self, request, instance_state=None) -> float:
        """Seconds from arrival at the server to entering the scheduler's waiting queue."""

    def output_token_overhead(self) -> float:
        """Seconds from a token's step end to it being observed by the client."""

    def completion_overhead(self) -> float:
        """Seconds added to a request's end-to-end latency after its last token (not to TTFT)."""


class AlphaModel:
    """alpha = [a0, a1, a2] in microseconds: queue entry a0 + a1 x prompt tokens; a2 per token.

    ``post_us`` is a fixed per-request overhead after the last token (unified5's alpha1).
    """
    needs_state = False

    def __init__(self, a0_us: float = 0.0, a1_us: float = 0.0, a2_us: float = 0.0, post_us: float = 0.0):
        self.a0 = a0_us * 1e-6
        self.a1 = a1_us * 1e-6
        self.a2 = a2_us * 1e-6
        self.post = post_us * 1e-6
        self.us = (a0_us, a1_us, a2_us, post_us)      # as given, for the manifest

    def delay(self, request, instance_state=None) -> float:
        return self.a0 + self.a1 * request.prompt_len

    def output_token_overhead(self) -> float:
        return self.a2

    def completion_overhead(self) -> float:
        return self.post
