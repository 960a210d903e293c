"""Pipeline parallelism (``engine.pipeline_parallel_size: P``), after vLLM V0's virtual engines.

vLLM V0 runs a PP deployment as P *virtual engines*, each a scheduler of its own with 1/P of the
KV blocks (``Scheduler.__init__``: ``num_gpu_blocks //= pipeline_parallel_size``), new requests
going to the one with the fewest unfinished requests.  Their batches flow through the same P
stages, each stage holding 1/P of the layers on its TP group, so while one virtual engine's batch
is in stage 2 another's can be in stage 1.  A single virtual engine with work leaves the other
stages idle (the pipeline bubble); P engines with equal batches keep every stage busy.

dsim builds each virtual engine as a replica (``<name>.ve<k>``, ``tensor_parallel_size`` GPUs
each, so a group accounts TP x PP GPUs) whose step model is wrapped by ``PipelineStep``: a step's
GPU time is split evenly over the stages (the latency model's full-model time / P), the engine's
host time is paid once before the first stage, activations cross each stage boundary over the
interconnect (tokens x hidden x 2 bytes / TP per GPU link, plus its latency), and every stage is
a FIFO reserved when the step starts (steps cannot overtake in a FIFO pipeline whose stages take
the same time for a given batch, so reserving at the start is exact).  The step's duration is
when its last stage ends.

vLLM V1 keeps one scheduler and one KV pool and fills the pipeline with up to P batches in flight;
the stage timing is the same, the KV split and the static request-to-engine assignment are V0's.
"""
from __future__ import annotations


class Pipeline:
    """The P stages of one PP group: stage k is reserved until ``free[k]``."""

    __slots__ = ("free", "p2p_fixed_s", "p2p_s_per_token", "hops")

    def __init__(self, stages: int, p2p_fixed_s: float, p2p_s_per_token: float, hops: list | None = None):
        """``hops``: (fixed s, s per token) of each stage boundary, when they differ (a boundary
        between nodes); None: every boundary is (p2p_fixed_s, p2p_s_per_token)."""
        self.free = [0.0] * stages
        self.p2p_fixed_s = p2p_fixed_s
        self.p2p_s_per_token = p2p_s_per_token
        self.hops = hops

    def traverse(self, start: float, stage_s: float, tokens: int) -> float:
        """Reserve every stage in order for a batch ready at ``start``; return when it leaves."""
        free = self.free
        if self.hops is not None:
            t = start
            for k in range(len(free)):
                if k:
                    f, per = self.hops[k - 1]
                    t += f + per * tokens
                if free[k] > t:
                    t = free[k]
                t += stage_s
                free[k] = t
            return t
        hop = self.p2p_fixed_s + self.p2p_s_per_token * tokens
        t = start
        for k in range(len(free)):
            if k:
                t += hop
            if free[k] > t:
                t = free[k]
            t += stage_s
            free[k] = t
        return t


class PipelineStep:
    """A virtual engine's step model: the wrapped model's time, split over the group's stages."""

    pure = False         # step_time has effects (see dsim.serving.fastforward)

    def __init__(self, inner, pipeline: Pipeline, env):
        self.inner = inner
        self.pipeline = pipeline
        self.env = env
        self.stages = len(pipeline.free)
        self._host = getattr(inner, "host_time", None)

    @property
    def unpipelined(self):
        """The wrapped model: for estimates that must not reserve stages (EDF's prefill time)."""
        return self.inner

    def __getattr__(self, item):          # energy_mj, name, ... of the wrapped model
        if item in ("inner", "pipeline", "env", "stages", "_host"):
            raise AttributeError(item)
        return getattr(self.inner, item)

    def step_time(self, b) -> float:
        total = self.inner.step_time(b)
        tokens = b.prefill_tokens + b.decode_tokens
        if not tokens:
            return total
        host = self._host(b) if self._host is not None else 0.0
        now = self.env.now
        end = self.pipeline.traverse(now + host, (total - host) / self.stages, tokens)
        return end - now


def build_pipeline(engine, model, device) -> Pipeline:
    """Stages and the stage-to-stage hop of one PP group (activations of bf16 hidden states).  With
    ``hardware.gpus_per_node`` and ``internode_gb_s``, stages are packed onto nodes in order and a
    boundary between two nodes runs on the per-GPU inter-node link (each TP rank its own NIC)."""
    tp, pp = engine.tensor_parallel_size, engine.pipeline_parallel_size
    per_token = model.hidden_size * 2 / tp / device.interconnect_bytes_s
    hops = None
    g = device.gpus_per_node
    if g is not None and device.internode_bytes_s is not None and tp * pp > g:
        inter = (device.internode_latency_s, model.hidden_size * 2 / tp / device.internode_bytes_s)
        hops = [inter if (k - 1) * tp // g != k * tp // g else (device.interconnect_latency_s, per_token)
                for k in range(1, pp)]
    return Pipeline(pp, device.interconnect_latency_s, per_token, hops)
