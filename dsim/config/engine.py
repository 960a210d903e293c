"""vLLM engine knobs (the subset that changes scheduling and memory), with vLLM's defaults.

The scenario's ``engine:`` keys are declared in dsim.config.schema.engine (EngineSection);
:func:`load_engine` resolves the defaults that depend on the generation and TP and checks the rules
between keys on the combination a replica runs with."""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ConfigError
from .hardware import DeviceProfile
from .model import ModelSpec

GIB = 1024 ** 3




@dataclass(frozen=True)
class OffloadConfig:
    cpu_gb: float
    policy: str = "write_through"
    overlap: bool = True             # loads run while other requests compute (vLLM); False: the step waits

    def capacity_blocks(self, model, engine) -> int:
        """Host blocks: ``cpu_gb`` over the TP group's block (each GPU holds its KV-head shard)."""
        return int(self.cpu_gb * 1e9 // (model.kv_bytes_per_token * engine.block_size))


def load_offload(cfg) -> "OffloadConfig | None":
    """``engine.kv_offload`` (an OffloadSection, validated by the schema) as the runtime config."""
    if cfg is None:
        return None
    return OffloadConfig(cpu_gb=cfg.cpu_gb, policy=cfg.policy, overlap=cfg.overlap)




@dataclass(frozen=True)
class EngineConfig:
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1          # layers split over PP stages (dsim.serving.pipeline)
    data_parallel_size: int = 1              # DP attention ranks with EP experts (dsim.serving.dataparallel)
    context_parallel_size: int = 1           # CP ranks of TP GPUs each (dsim.latency.context_parallel)
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    block_size: int = 16
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 8192
    num_gpu_blocks: int | None = None        # explicit KV capacity (skips the memory estimate)
    long_prefill_token_threshold: int = 0    # 0 = off (vLLM default)
    # vLLM's concurrent partial prefills (dsim.serving.scheduling, "partial prefills"); 1 = off
    max_num_partial_prefills: int = 1
    max_long_partial_prefills: int = 1
    long_partial_threshold: int = 0          # prompt tokens above which a prefill counts as long
    non_torch_memory_gb: float = 0.9         # CUDA context, NCCL/cuBLAS workspaces, CUDA graphs
    enable_expert_parallel: bool = False     # MoE experts split over the TP group (latency models)
    all_reduce_algorithm: str | None = None  # ring | tree: the TP all-reduce's cost (dsim.latency.collectives)
    moe_fused_kernel: bool = True            # engine.moe.fused_kernel: routed experts in one grouped kernel
    vllm_version: str | None = None          # engine generation preset (host costs, defaults); None = newest
    enforce_eager: bool = False              # no CUDA graphs: every step pays kernel launch gaps
    scheduling_policy: str = "fcfs"          # fcfs | priority (vLLM --scheduling-policy) | edf | age_weighted
    age_weight: float = 1.0                  # age_weighted: priority units gained per second waited
    kv_offload: OffloadConfig | None = None  # CPU tier of the prefix cache (dsim.serving.offload)
    # what a preempted request loses: recompute (vLLM V1) | swap (vLLM V0 --preemption-mode swap: its
    # KV goes to swap_space GiB of CPU memory per GPU and comes back; dsim.serving.swap)
    preemption_mode: str = "recompute"
    swap_space: float = 4.0
    # vLLM --kv-cache-dtype: auto (the model dtype) | bfloat16 | fp8 | fp8_e4m3 | fp8_e5m2; fp8 stores
    # 1 byte per KV element: half the KV memory per token (about twice the blocks) and KV traffic
    kv_cache_dtype: str = "auto"
    executor: str = "uniproc"                # ray | mp | uniproc (default: the generation's, uniproc at TP 1)
    engine_use_ray: bool = False             # V0 --engine-use-ray: the engine runs in a Ray actor
    # vLLM --async-scheduling: the scheduler plans step n+1 while step n runs, so a request that
    # arrives during step n first runs in step n+2 (one step more to its first token).  Default
    # (unset): on from vLLM 0.13 (ASYNC_SCHEDULING_SINCE) when the workers run in their own processes
    # (TP > 1 with pipeline_parallel_size 1); vLLM of that time turned it off with one in-process worker
    async_scheduling: bool = False

    @property
    def generation(self):
        """The engine-generation preset (dsim.latency.host) this replica simulates."""
        from .generations import generation_for
        return generation_for(self.vllm_version)

    def kv_blocks(self, model: ModelSpec, device: DeviceProfile, path: str = "engine") -> int:
        """Blocks of ``block_size`` tokens that fit per replica (vLLM's profile-then-fill rule).

        free = memory x gpu_memory_utilization - weights/(TP x PP) - peak activations - non-torch
        memory, per GPU; KV per token per GPU = kv_bytes_per_token / (TP x PP) (KV heads are sharded
        over TP, layers over PP).  With PP every GPU holds its layers' part of every block, so the
        count is the per-GPU one (vLLM V0 then divides it among its PP virtual engines).
        """
        if self.num_gpu_blocks is not None:
            return self.num_gpu_blocks
        tp = self.tensor_parallel_size
        shards = tp * self.pipeline_parallel_size
        budget = device.memory_bytes * self.gpu_memory_utilization
        model = model.with_kv_cache_dtype(self.kv_cache_dtype, f"{path}.kv_cache_dtype")
        weights = model.weight_bytes / shards
        if self.data_parallel_size > 1 and model.is_moe:      # EP: the routed experts over TP x DP GPUs
            experts = model.expert_bytes * model.num_experts
            weights -= experts / shards * (1 - 1 / self.data_parallel_size)
        layer_act = self.max_num_batched_tokens * (4 * model.hidden_size + 2 * model.intermediate_size / tp) * 2
        if self.generation.profile_activation == "forward":
            # early engines' profile held every layer's activations of the max_num_batched_tokens
            # forward pass at its peak (docs/engine-overheads.md, "KV capacity")
            layer_act *= model.num_layers / self.pipeline_parallel_size
        act = layer_act + self.max_num_seqs * model.vocab_size * 4
        free = budget - weights - act - self.non_torch_memory_gb * GIB
        per_block = model.kv_bytes_per_token / shards * self.block_size
        if self.context_parallel_size > 1:       # every sequence's KV sharded over the CP ranks
            per_block /= self.context_parallel_size
        blocks = int(free // per_block)
        if blocks <= 0:
            raise ConfigError(f"{path}.gpu_memory_utilization", self.gpu_memory_utilization,
                              f"enough memory for the KV cache: {model.name} needs {weights / 1e9:.1f} GB of weights "
                              f"per GPU on {device.name} ({device.memory_bytes / 1e9:.0f} GB); raise "
                              "tensor_parallel_size or pipeline_parallel_size, or pick a larger device")
        return blocks


# first vLLM release that turned --async-scheduling on by default (vllm-project/vllm #27614, late 2025)
ASYNC_SCHEDULING_SINCE = (0, 13, 0)


def _async_default(version, gen, tp: int, pp: int) -> bool:
    """vLLM's default: on since ASYNC_SCHEDULING_SINCE for a V1 engine whose workers run in other
    processes (TP > 1, no pipeline parallelism); off with one in-process worker (UniProcExecutor)."""
    from .generations import parse_version
    if gen.scheduler != "v1" or tp <= 1 or pp > 1:
        return False
    return version is None or parse_version(version) >= ASYNC_SCHEDULING_SINCE


def _given(value, default):
    return default if value is None else value


def load_engine(cfg=None, path: str = "engine") -> EngineConfig:
    """The engine a replica runs: ``cfg`` (an EngineSection, or a mapping parsed into one) with the
    defaults that depend on the generation and TP resolved, and the rules between keys checked on
    this combination (a pool's keys over the shared ones; neither part need pass them alone)."""
    from .generations import generation_for
    from .schema.base import parse
    from .schema.engine import EngineSection
    if not isinstance(cfg, EngineSection):
        cfg = parse(EngineSection, cfg, path)
    version = cfg.vllm_version
    gen = generation_for(version, f"{path}.vllm_version")
    # V0 engines default to whole-prompt prefill steps and a token budget of max(max_model_len, 2048)
    chunked = _given(cfg.enable_chunked_prefill, gen.scheduler != "v0")
    tp, max_len = cfg.tensor_parallel_size, cfg.max_model_len
    blocks, override = cfg.num_gpu_blocks, cfg.num_gpu_blocks_override      # vLLM's --num-gpu-blocks-override
    if blocks is not None and override is not None:
        raise ConfigError(f"{path}.num_gpu_blocks_override", override, "only one of num_gpu_blocks and "
                          "num_gpu_blocks_override (vLLM's name for the same setting)")
    if cfg.given("age_weight") and cfg.scheduling_policy != "age_weighted":
        raise ConfigError(f"{path}.age_weight", cfg.age_weight,
                          "only with scheduling_policy: age_weighted (the other policies do not age)")
    e = EngineConfig(
        tensor_parallel_size=tp,
        pipeline_parallel_size=cfg.pipeline_parallel_size,
        data_parallel_size=cfg.data_parallel_size,
        context_parallel_size=cfg.context_parallel_size,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=_given(cfg.max_num_batched_tokens, 2048 if chunked else max(max_len, 2048)),
        enable_chunked_prefill=chunked,
        enable_prefix_caching=cfg.enable_prefix_caching,
        block_size=cfg.block_size,
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        max_model_len=max_len,
        num_gpu_blocks=blocks if override is None else override,
        long_prefill_token_threshold=cfg.long_prefill_token_threshold,
        max_num_partial_prefills=cfg.max_num_partial_prefills,
        max_long_partial_prefills=cfg.max_long_partial_prefills,
        # vLLM's SchedulerConfig: with concurrent partial prefills an unset threshold is 4 % of max_model_len
        long_partial_threshold=(cfg.long_prefill_token_threshold or int(max_len * 0.04))
        if cfg.max_num_partial_prefills > 1 else 0,
        non_torch_memory_gb=cfg.non_torch_memory_gb,
        enable_expert_parallel=cfg.enable_expert_parallel,
        all_reduce_algorithm=cfg.all_reduce_algorithm,
        moe_fused_kernel=cfg.moe.fused_kernel,
        vllm_version=version,
        enforce_eager=_given(cfg.enforce_eager, not gen.cuda_graphs),
        scheduling_policy=cfg.scheduling_policy,
        age_weight=cfg.age_weight,
        kv_offload=load_offload(cfg.kv_offload),
        preemption_mode=cfg.preemption_mode,
        swap_space=cfg.swap_space,
        kv_cache_dtype=cfg.kv_cache_dtype,
        executor=_given(cfg.executor, gen.executor if tp > 1 else "uniproc"),
        engine_use_ray=_given(cfg.engine_use_ray, bool(gen.engine_use_ray)),
        async_scheduling=_given(cfg.async_scheduling,
                                _async_default(version, gen, tp, cfg.pipeline_parallel_size)),
    )
    if e.executor == "uniproc" and tp > 1:
        raise ConfigError(f"{path}.executor", e.executor, "ray or mp when tensor_parallel_size > 1 (an "
                          "in-process worker drives one GPU)")
    if e.engine_use_ray and gen.engine_use_ray is None:
        raise ConfigError(f"{path}.engine_use_ray", True, f"false with vLLM {version or 'of the newest generation'} "
                          "(--engine-use-ray exists only before vLLM 0.6)")
    if e.kv_offload is not None and not e.enable_prefix_caching:
        raise ConfigError(f"{path}.kv_offload", "kv_offload", "enable_prefix_caching: true (the CPU tier holds "
                          "prefix-cache blocks)", show_value=False)
    if e.preemption_mode == "swap" and e.kv_offload is not None:
        raise ConfigError(f"{path}.preemption_mode", "swap", "recompute with kv_offload (swap preemption is vLLM "
                          "V0's, the CPU tier V1's connector: no vLLM runs both over one PCIe link)")
    if e.max_num_partial_prefills > 1 and not e.enable_chunked_prefill:
        raise ConfigError(f"{path}.max_num_partial_prefills", e.max_num_partial_prefills,
                          "1 when enable_chunked_prefill is false (partial prefills are chunks)")
    unit = e.block_size if e.enable_prefix_caching else 1       # a chunk is whole blocks with the prefix cache
    if e.max_num_partial_prefills > 1 and e.max_num_batched_tokens // e.max_num_partial_prefills < unit:
        raise ConfigError(f"{path}.max_num_partial_prefills", e.max_num_partial_prefills,
                          f"at most max_num_batched_tokens // {unit} = {e.max_num_batched_tokens // unit} (each of the "
                          "concurrent prefills gets budget // N tokens a step" + (", rounded down to whole blocks"
                          if unit > 1 else "") + "; a smaller share would schedule no prefill)")
    if e.max_long_partial_prefills > e.max_num_partial_prefills:
        raise ConfigError(f"{path}.max_long_partial_prefills", e.max_long_partial_prefills,
                          f"at most max_num_partial_prefills ({e.max_num_partial_prefills}), as vLLM requires")
    if not e.enable_chunked_prefill and e.max_num_batched_tokens < e.max_model_len:
        raise ConfigError(f"{path}.max_num_batched_tokens", e.max_num_batched_tokens,
                          f">= max_model_len ({e.max_model_len}) when enable_chunked_prefill is false "
                          "(vLLM refuses this combination)")
    return e
