"""The ``engine``: section of a scenario (declared schema; see dsim.config.schema.base for the rules).

vLLM's engine arguments that change scheduling and memory, under vLLM's names.  Several defaults
depend on the engine generation (``vllm_version``) and on tensor parallelism; they are None here and
resolved by dsim.config.engine.load_engine.  Rules that tie keys together (executor vs TP, age_weight
vs scheduling_policy, the token budget without chunked prefill, ...) are checked there too, on the
combination a replica runs with: a cluster pool's engine keys over the scenario's shared ones
(schema.base.merged), neither of which need be valid alone.
"""
from __future__ import annotations

from ..errors import ConfigError
from ..generations import generation_for
from ..limits import MAX_BLOCKS, MAX_SEQS, MAX_TOKENS
from ..model import KV_CACHE_DTYPES
from ..names import EXECUTORS, OFFLOAD_POLICIES, PREEMPTION_MODES, SCHEDULING_POLICIES
from .base import Bool, Choice, Float, Int, Section, checked


def _version(v):
    """A release string; a number (YAML reads 0.15 as one) stands for its text.  It must name a
    generation dsim knows (>= the oldest preset)."""
    if isinstance(v, bool) or not isinstance(v, (str, int, float)):
        raise ConfigError("", v, 'a vLLM version string such as "0.6.3"')
    v = str(v)
    generation_for(v, "")
    return v


VllmVersion = checked(str, _version, {"type": ["string", "number"]})


class OffloadSection(Section):
    """A CPU tier for the prefix cache (vLLM's native CPU KV offloading; dsim.serving.offload)."""
    cpu_gb: Float(0, 1e6, lo_open=True)
    """Host memory for KV blocks, GB (1e9 bytes), per replica."""
    policy: Choice(*OFFLOAD_POLICIES) = "write_through"
    """write_through: every full block is copied to the host as it is computed; on_evict: when the GPU evicts it."""
    overlap: Bool = True
    """Loads from the host run while other requests compute (vLLM); false: the step waits for them."""


class MoeSection(Section):
    """MoE kernel settings (seed 004 VLLMMoEConfig); no effect on a dense model."""
    fused_kernel: Bool = True
    """The routed experts of a layer run as one grouped kernel (vLLM's fused MoE); false: one GEMM kernel per
    expert the step touches, each with its own launch floor and smaller weight stream (roofline)."""


class EngineSection(Section):
    """vLLM engine arguments of one replica (vLLM's defaults for the chosen generation)."""
    vllm_version: VllmVersion | None = None
    """vLLM release the replica runs (host costs, V0/V1 defaults), e.g. "0.6.3" (None: the newest generation)."""
    tensor_parallel_size: Int(1) = 1
    """TP degree: weights, FLOPs and KV heads split over this many GPUs (2 all-reduces per layer)."""
    pipeline_parallel_size: Int(1, 1024) = 1
    """PP degree: layers split over this many stages of TP GPUs each."""
    context_parallel_size: Int(1, 1024) = 1
    """CP degree: every step's tokens and every sequence's KV split over this many ranks of TP GPUs each, with a
    ring KV exchange in prefill attention (docs/parallelism.md; roofline, vidur and unified5 only)."""
    data_parallel_size: Int(1, 1024) = 1
    """DP attention ranks for a MoE model with enable_expert_parallel (experts over TP x DP GPUs)."""
    max_num_seqs: Int(1, MAX_SEQS) = 256
    """Most requests running at once."""
    max_num_batched_tokens: Int(1, MAX_TOKENS) | None = None
    """Token budget of one step (None: 2048 with chunked prefill, else max(max_model_len, 2048))."""
    enable_chunked_prefill: Bool | None = None
    """Split long prompts over steps (V1 scheduler); false: V0 policy, whole prompts in prefill-only
    steps (None: true, false for a V0 vllm_version)."""
    enable_prefix_caching: Bool = True
    """Reuse KV blocks of a shared prompt prefix (block hashes, LRU eviction)."""
    block_size: Int(1, MAX_TOKENS) = 16
    """Tokens per KV block."""
    gpu_memory_utilization: Float(0, 1, lo_open=True) = 0.9
    """Share of device memory vLLM may use, in (0, 1]."""
    max_model_len: Int(1) = 8192
    """Longest prompt + output a request may have, tokens (longer ones are rejected)."""
    num_gpu_blocks: Int(1, MAX_BLOCKS) | None = None
    """KV capacity in blocks, instead of the memory estimate (None: estimated)."""
    num_gpu_blocks_override: Int(1, MAX_BLOCKS) | None = None
    """vLLM's name for num_gpu_blocks (--num-gpu-blocks-override); not both."""
    long_prefill_token_threshold: Int(0, MAX_TOKENS) = 0
    """Most prompt tokens of one request in a step (0: no cap)."""
    max_num_partial_prefills: Int(1, MAX_SEQS) = 1
    """vLLM's concurrent partial prefills: each prefill's chunk is at most the token budget / the prefills
    (up to this many) a step could schedule, and a long prompt waits while max_long_partial_prefills run (1: off)."""
    max_long_partial_prefills: Int(1, MAX_SEQS) = 1
    """Most long prompts (above long_prefill_token_threshold, else 4 % of max_model_len) partly prefilled at once."""
    non_torch_memory_gb: Float(0) = 0.9
    """Memory outside PyTorch's allocator per GPU (CUDA context, NCCL/cuBLAS workspaces, CUDA graphs), GiB."""
    all_reduce_algorithm: Choice("ring", "tree") | None = None
    """NCCL_ALGO of the TP all-reduce, costed by the latency-bandwidth model (roofline, vidur's roofline
    comm; docs/parallelism.md): ring or tree (None: the profile's per-collective latency + the ring's bytes)."""
    moe: MoeSection = MoeSection()
    """MoE kernel settings."""
    enable_expert_parallel: Bool = False
    """MoE experts split over the TP group (and DP ranks) instead of tensor-sliced."""
    enforce_eager: Bool | None = None
    """No CUDA graphs: every step pays kernel launch gaps (None: true for a generation without CUDA graphs)."""
    scheduling_policy: Choice(*SCHEDULING_POLICIES) = "fcfs"
    """Waiting-queue order: fcfs, priority (vLLM's), edf (least slack first) or age_weighted."""
    age_weight: Float(0, 1e6) = 1.0
    """age_weighted only: priority units a request gains per second waited."""
    preemption_mode: Choice(*PREEMPTION_MODES) = "recompute"
    """What a request preempted for KV blocks loses: recompute (its KV is dropped and its prompt and
    outputs are prefilled again, vLLM V1) or swap (vLLM V0's --preemption-mode swap: its KV goes to
    CPU memory over PCIe and comes back before new requests are admitted; recompute if swap_space is full)."""
    swap_space: Float(0, 1e6) = 4.0
    """vLLM V0's --swap-space: CPU memory for swapped-out KV blocks, GiB per GPU (used with preemption_mode: swap)."""
    kv_offload: OffloadSection | None = None
    """CPU tier of the prefix cache (None: none); needs enable_prefix_caching."""
    kv_cache_dtype: Choice(*KV_CACHE_DTYPES) = "auto"
    """vLLM's --kv-cache-dtype: auto (the model dtype), bfloat16 or fp8 (1 byte per KV element)."""
    executor: Choice(*EXECUTORS) | None = None
    """Worker executor: ray, mp or uniproc (None: uniproc at TP 1, the generation's executor above)."""
    engine_use_ray: Bool | None = None
    """V0's --engine-use-ray: the engine runs in a Ray actor (None: the generation's default; vLLM < 0.6 only)."""
    async_scheduling: Bool | None = None
    """vLLM's --async-scheduling: plan step n+1 while step n runs (None: on from vLLM 0.13 at TP > 1
    without pipeline parallelism, off otherwise)."""


EngineField = EngineSection | None
