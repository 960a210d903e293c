"""A pool's replicas and the gateway's view of each: creation (with PP virtual engines and DP ranks
as groups of replicas), readiness after a cold start, scale-in by draining, live engine knobs."""
from __future__ import annotations

import dataclasses
from functools import partial

from ..config.errors import ConfigError
from ..latency.base import BatchShape, LatencyContext
from ..latency.registry import build_latency
from ..latency.roofline import RooflineModel
from ..serving.dataparallel import DPGroup, DPRankStep, DPRoofline
from ..serving.instance import Instance
from ..serving.offload import build_tier
from ..serving.swap import build_swap
from ..serving.pipeline import PipelineStep, build_pipeline
from .views import LiveView

STARTING, READY, DRAINING, RETIRED = "starting", "ready", "draining", "retired"
# seed 001, "GPU Utilization Model": a decode token weighs 0.3 of a prefill token's compute load
DECODE_WEIGHT = 0.3


class Replica:
    """One replica and the gateway's view of it (live fields; see StaleView for delayed ones)."""

    def __init__(self, fleet, pool, index: int, inst: Instance, t_created: float):
        self.fleet = fleet
        self.pool = pool
        self.index = index
        self.name = inst.name
        self.inst = inst
        self.state = STARTING
        self.t_created = t_created
        self.t_ready = None
        self.t_retired = None
        self.outstanding = 0         # gateway count: routed here, not yet finished/handed off
        self.pending_tokens = 0.0    # gateway's booked work
        self.incoming = 0            # KV transfers on their way here
        self.view = LiveView(self)

    # read-only load view ------------------------------------------------------------------
    @property
    def waiting(self) -> int:
        return len(self.inst.waiting) + self.inst.in_alpha + len(self.inst.swapped)

    @property
    def running(self) -> int:
        return len(self.inst.running)

    @property
    def queue_depth(self) -> int:
        i = self.inst
        return len(i.waiting) + i.in_alpha + len(i.running) + len(i.swapped)

    @property
    def kv_usage(self) -> float:
        kv = self.inst.kv
        return (kv.total - kv.free_count) / kv.total

    @property
    def capacity(self) -> float:
        return self.pool.capacity

    @property
    def spec_counts(self):
        """(verified rounds, accepted drafts) of a speculative replica so far, else None (routers
        read its tokens per verify step)."""
        rt = self.fleet.speculation
        t = rt.targets.get(self.name) if rt is not None else None
        return None if t is None else (t.rounds, t.accepted)

    def cached_prefix(self, r) -> int:
        return self.inst.load_view(r).prefix_hit_tokens

    @property
    def decode_step_s(self) -> float:
        return self.pool.decode_step_s

    def predict_ttft(self, r) -> float:
        """Seconds to r's first token if it joined now: prompt tokens ahead / prefill rate."""
        ahead = r.prompt_len
        for q in self.inst.waiting:
            ahead += q.num_tokens - q.kv_ready
        for q in self.inst.running.values():
            if q.prefilling:
                ahead += q.num_tokens - q.num_computed
        for q in self.inst.swapped:          # swapped out (engine.preemption_mode: swap): they go first
            ahead += q.num_tokens - q.num_computed
        return ahead / self.pool.prefill_rate

    @property
    def idle(self) -> bool:
        return self.inst.idle and self.incoming == 0


class Pool:
    """Runtime of one pool: its spec, replicas and (lazily) a latency estimator for routers."""

    def __init__(self, fleet, spec, cluster):
        self.fleet = fleet
        self.spec = spec
        self.name = spec.name
        self.role = spec.role
        self.cluster = cluster
        self.engine = spec.engine
        self.kv_blocks = spec.engine.kv_blocks(spec.model, spec.device, f"{spec.path}.engine" if spec.path else "engine")
        self.replicas: list = []      # every replica ever created, in creation order
        self.ready: list = []
        self._est = None
        self._capacity = None
        self._decode_rate = None
        self._prefill_rate = None
        self.latency_desc = None
        self.peak_ready = 0

    def _estimator(self):
        if self._est is None:
            # no rng: an estimate reads the mean step time, not one draw of latency.tail's noise
            ctx = LatencyContext(self.spec.model, self.spec.device, self.engine, self.kv_blocks,
                                 None, self.fleet.base_dir)
            self._est = build_latency(self.spec.latency, ctx, self._lat_path())[0]
        return self._est

    def _lat_path(self) -> str:
        return f"{self.spec.path}.latency" if self.spec.path else "latency"

    @property
    def capacity(self) -> float:
        """Decode tokens/s of one replica at batch min(64, max_num_seqs), context 1024
        (or the pool's ``router_weight``)."""
        if self._capacity is None:
            if self.spec.router_weight is not None:
                self._capacity = float(self.spec.router_weight)
            else:
                self._capacity = self.decode_rate
        return self._capacity

    @property
    def decode_rate(self) -> float:
        """Decode tokens/s of one replica at batch min(64, max_num_seqs), context 1024."""
        if self._decode_rate is None:
            b = min(64, self.engine.max_num_seqs)
            t = self._estimator().step_time(BatchShape(decode_tokens=b, decode_ctx_sum=b * 1024,
                                                       num_sampled=b, running=b))
            self._decode_rate = b / t
        return self._decode_rate

    @property
    def decode_step_s(self) -> float:
        """Seconds of one decode step of a replica at batch min(64, max_num_seqs), context 1024."""
        return min(64, self.engine.max_num_seqs) / self.decode_rate

    def work_s(self, prefill_tokens: float, decode_tokens: float) -> float:
        """Seed 001's compute load of these tokens, in replica-seconds: the prefill tokens over
        ``prefill_rate`` plus 0.3 x the decode tokens over ``decode_rate`` (see
        dsim.metrics.measures.gpu_utilization)."""
        return prefill_tokens / self.prefill_rate + DECODE_WEIGHT * decode_tokens / self.decode_rate

    @property
    def gpu_block_fraction(self) -> float:
        """Share of one GPU's memory that one KV block in use takes (its KV heads are sharded over
        TP, its layers over PP), with the engine's kv_cache_dtype."""
        m = self.spec.model.with_kv_cache_dtype(self.engine.kv_cache_dtype)
        shards = (self.engine.tensor_parallel_size * self.engine.pipeline_parallel_size
                  * self.engine.context_parallel_size)
        return m.kv_bytes_per_token / shards * self.engine.block_size / self.spec.device.memory_bytes

    @property
    def prefill_rate(self) -> float:
        """Prompt tokens/s of one replica running full-budget prefill steps."""
        if self._prefill_rate is None:
            n = self.engine.max_num_batched_tokens
            t = self._estimator().step_time(BatchShape(prefill_tokens=n, num_prefill=1,
                                                       prefill_attn_pairs=n * (n + 1) // 2, num_sampled=1,
                                                       prefill_chunk_sq=n * n, running=1))
            self._prefill_rate = n / t
        return self._prefill_rate

    def cold_start_s(self) -> float:
        """Weights per GPU / the device's weight load rate, plus the pool's fixed start-up time."""
        s = self.spec
        return s.model.weight_bytes / s.engine.tensor_parallel_size / s.device.weight_load_bytes_s + s.cold_start_s

    def add_replica(self, delay: float = 0.0) -> Replica:
        """A new replica; with pipeline parallelism P a group of P virtual engines sharing one
        pipeline (dsim.serving.pipeline), the first of which is returned."""
        pp, dp = self.engine.pipeline_parallel_size, self.engine.data_parallel_size
        if pp == 1 and dp == 1:
            return self._add_one(delay, None, None)
        n = pp * dp
        g = len(self.replicas) // n
        base = f"{self.name}-{g}" if self.fleet.spec.declared else f"replica{g}"
        if pp > 1:
            pipe = build_pipeline(self.engine, self.spec.model, self.spec.device)
            return [self._add_one(delay, pipe, f"{base}.ve{k}") for k in range(pp)][0]
        group: list = []                 # the ranks' DPGroup, made with the first rank's roofline
        return [self._add_one(delay, None, f"{base}.dp{k}", group) for k in range(dp)][0]

    def _add_one(self, delay: float, pipe, lane: str | None, dp_group: list | None = None) -> Replica:
        f = self.fleet
        sim = f.sim
        i = len(self.replicas)
        name = lane or (f"{self.name}-{i}" if f.spec.declared else "replica0")
        blocks = self.kv_blocks // self.engine.pipeline_parallel_size     # V0: each virtual engine 1/PP
        #  (DP ranks each have their own GPUs: every rank gets the per-GPU count)
        ctx = LatencyContext(self.spec.model, self.spec.device, self.engine, blocks,
                             sim.rng.stream(f"latency.{name}"), f.base_dir)
        step, queueing, desc = build_latency(self.spec.latency, ctx, self._lat_path())
        if pipe is not None:
            step = PipelineStep(step, pipe, sim.env)
        if dp_group is not None:
            rf = getattr(step, "gpu", step)
            if not isinstance(rf, RooflineModel):
                raise ConfigError(self._lat_path() + ".model", desc.get("model"),
                                  "roofline with data_parallel_size > 1 (it splits into dense, expert and "
                                  "all-to-all parts)")
            if not dp_group:
                dp_group.append(DPGroup(sim.env, DPRoofline(rf, self.engine.data_parallel_size,
                                                            getattr(step, "scale", 1.0))))
            step = DPRankStep(step, dp_group[0].parts)
        self.latency_desc = desc
        holder: list = []
        inst = Instance(sim, self.engine, step, queueing, blocks, name=name,
                        check_invariants=f.check, role=self.role,
                        on_done=lambda r: f._on_done(holder[0], r),
                        on_handoff=lambda r: f._on_handoff(holder[0], r),
                        cpu_tier=build_tier(sim.env, self.engine.kv_offload, self.spec.model, self.spec.device,
                                            self.engine),
                        keep_steps=f.keep_steps,
                        swap_space=build_swap(self.spec.model, self.spec.device, self.engine))
        # a completion only books and records (no hooks, not draining): stretches may end it early
        inst.quiet_done = lambda: not f.done_hooks and holder[0].state != DRAINING
        inst.alone = lambda: f.extra_actors == f.fabric_actors and not f.order_watchers
        inst.arrival_reads = f.arrival_reads
        inst.entries_unread = f.entries_unread

        if self.role == "decode":
            inst.decode_past = f.decode_past
        inst.watts = self.spec.device.tdp_w * self.spec.gpus_per_replica     # as fleet.replica_power
        inst.kv_block_bytes = (self.spec.model.with_kv_cache_dtype(self.engine.kv_cache_dtype).kv_bytes_per_token
                               * self.engine.block_size)
        if f.tracer_factory is not None:
            inst.tracer = f.tracer_factory(inst)
        if f.check:
            inst.on_check = f.check_event_queue
        if dp_group is not None:
            inst.dp_group = dp_group[0]
        rep = Replica(f, self, i, inst, sim.now)
        holder.append(rep)
        inst.on_done = partial(f._on_done, rep)     # the lambda's call, without its frame (once per request)
        for hook in f.replica_hooks:
            hook(rep)
        self.replicas.append(rep)
        if delay <= 0:
            self._ready(rep)
        else:
            ev = sim.env.timeout(delay)
            ev.callbacks.append(lambda _e: self._ready(rep))
        return rep

    def _ready(self, rep: Replica) -> None:
        if rep.state != STARTING:        # scaled in while starting
            return
        rep.state = READY
        rep.t_ready = self.fleet.sim.now
        self.ready.append(rep)
        self.peak_ready = max(self.peak_ready, len(self.ready))
        self.fleet._version += 1

    @property
    def starting(self) -> list:
        return [r for r in self.replicas if r.state == STARTING]

    def remove_replica(self) -> Replica | None:
        """Scale in by one: cancel a starting replica if any, else drain the ready replica with
        the least outstanding work (the newest on ties).  Never goes below min_replicas."""
        start = self.starting
        if start:
            rep = start[-1]
            rep.state = RETIRED
            rep.t_retired = self.fleet.sim.now
            return rep
        if len(self.ready) <= self.spec.min_replicas:
            return None
        rep = min(reversed(self.ready), key=lambda r: r.outstanding)
        self.ready.remove(rep)
        rep.state = DRAINING
        self.fleet._version += 1
        self.fleet._maybe_retire(rep)
        return rep

    def set_engine(self, **knobs) -> None:
        self.engine = dataclasses.replace(self.engine, **knobs)
        for rep in self.replicas:
            if rep.state != RETIRED:
                rep.inst.set_engine(self.engine)
