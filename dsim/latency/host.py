"""Engine host overheads: the CPU side of a vLLM step, shared by every latency model.

A latency model says how long the GPU works on a batch; a real engine also spends host time on
every step (scheduling, input preparation, sampling, detokenising and streaming the outputs,
the driver-to-worker round trip) and, without CUDA graphs, leaves the GPU idle between kernel
launches.  These costs depend on the engine generation, not on the GPU, so they live here once:
``engine.vllm_version`` selects a generation preset (dsim.config.generations) and
``latency.host`` overrides single values.

Models whose coefficients were fitted end to end on a real engine (unified5, physics, blackbox,
calibrated_tps) already contain the host costs of the generation they were fitted on; for them
the layer adds only the difference between the simulated generation and that one.
"""
from __future__ import annotations

from dataclasses import replace

from ..config.generations import Generation, HostCosts, by_name
from .base import BatchShape, decode_curve

# kernels of a step with more tokens than this outlast their launch, so the CPU issuing the next
# one hides the gap even without a CUDA graph (vLLM captures up to 512 tokens for the same reason)
LAUNCH_BOUND_TOKENS = 512

# generation each end-to-end fitted model's coefficients were measured on (their host costs are inside)
FITTED_ON = {"unified5": "v1", "physics": "v1", "blackbox": "v1", "calibrated_tps": "v1"}


def resolve_host(gen: Generation, overrides: dict, model_kind: str, enforce_eager: bool,
                 executor: str = "uniproc", engine_use_ray: bool = False, tp: int = 1) -> HostCosts:
    """Host costs a replica pays on top of its latency model: the generation's (with overrides),
    the Ray round trips its executor and ``engine_use_ray`` select (the others zeroed), minus the
    reference generation's costs for models fitted end to end (their runs had no Ray terms)."""
    costs = replace(gen.host, **overrides).with_executor(executor, engine_use_ray, tp)
    if enforce_eager:
        costs = replace(costs, cudagraph_max_tokens=0)
    ref = FITTED_ON.get(model_kind)
    if ref is not None:
        costs = costs.minus(by_name(ref).host)
    if costs.cudagraph_max_tokens >= LAUNCH_BOUND_TOKENS and not costs.cudagraph_decode_only:
        costs = replace(costs, eager_layer_us=0.0, eager_layer_per_seq_us=0.0)   # every step that could show gaps is captured
    return costs


class HostStepModel:
    """A latency model's GPU time plus the engine's host time per step.

    host = step + per_seq x requests + per_prefill x prefilling requests + per_worker x (TP - 1)
    + the Ray round trips resolve_host kept: ray_step + ray_per_seq x requests (workers are Ray
    actors), ray_tp + ray_tp_per_seq x requests + ray_tp_per_worker x (TP - 2) (Ray executor at
    TP > 1), engine_ray + engine_ray_per_seq x requests (engine in a Ray actor)
    (+ (eager_layer + eager_layer_per_seq x requests) x layers when a step of at most
    LAUNCH_BOUND_TOKENS tokens is not replayed from a CUDA graph).  Steps are serial in the engines modelled (no overlap of one step's host
    work with the previous step's kernels).
    """

    def __init__(self, gpu, costs: HostCosts, num_layers: int, tp: int):
        self.gpu = gpu
        self._gpu_step = gpu.step_time
        self.name = getattr(gpu, "name", "model")
        self.costs = costs
        c = costs
        self._fixed = (c.step_us + c.per_worker_us * (tp - 1) + c.ray_step_us + c.ray_tp_us
                       + c.ray_tp_per_worker_us * max(tp - 2, 0) + c.engine_ray_us) * 1e-6
        self._seq = (c.per_seq_us + c.ray_per_seq_us + c.ray_tp_per_seq_us + c.engine_ray_per_seq_us) * 1e-6
        self._pre = c.per_prefill_us * 1e-6
        self._eager = c.eager_layer_us * num_layers * 1e-6
        self._eager_seq = c.eager_layer_per_seq_us * num_layers * 1e-6
        self._graph_max = costs.cudagraph_max_tokens
        self._decode_only = costs.cudagraph_decode_only

    def __getattr__(self, item):          # energy_mj, basis, ... of the wrapped model
        if item in ("gpu", "_gpu_step"):
            raise AttributeError(item)
        return getattr(self.gpu, item)

    def host_time(self, b: BatchShape) -> float:
        t = self._fixed + self._seq * (b.num_prefill + b.decode_tokens) + self._pre * b.num_prefill
        if self._eager or self._eager_seq:
            tokens = b.prefill_tokens + b.decode_tokens
            if tokens <= LAUNCH_BOUND_TOKENS and (tokens > self._graph_max or (self._decode_only and b.prefill_tokens)):
                t += self._eager + self._eager_seq * (b.num_prefill + b.decode_tokens)
        return t

    def step_time(self, b: BatchShape) -> float:
        if not (b.prefill_tokens or b.decode_tokens):
            return self._gpu_step(b)
        if self._eager or self._eager_seq:
            t = self._gpu_step(b) + self.host_time(b)
        else:       # the common case, inlined: this runs once per simulated step
            t = (self._gpu_step(b) + self._fixed + self._seq * (b.num_prefill + b.decode_tokens)
                 + self._pre * b.num_prefill)
        return t if t > 1e-9 else 1e-9

    def decode_curve(self, n: int, running: int):
        """``step_time`` of n decoders as a function of their context sum (dsim.latency.base)."""
        gpu = decode_curve(self.gpu, n, running)
        if not n:
            return gpu
        if self._eager or self._eager_seq:
            host = self.host_time(BatchShape(decode_tokens=n, num_sampled=n, running=running))

            def curve(ctx: int) -> float:
                t = gpu(ctx) + host
                return t if t > 1e-9 else 1e-9
            return curve
        fixed, seq, pre = self._fixed, self._seq * n, self._pre * 0
        plus = getattr(type(self.gpu), "decode_curve_plus", None)
        if plus is not None:                 # one call per step instead of two, the same float operations
            return plus(self.gpu, n, running, fixed, seq, pre)

        def curve(ctx: int) -> float:
            t = gpu(ctx) + fixed + seq + pre
            return t if t > 1e-9 else 1e-9
        return curve
