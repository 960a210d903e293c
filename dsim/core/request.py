"""A request and its lifecycle timestamps (seed 000 journey events; seed 004 BC-7/BC-8)."""
from __future__ import annotations

# Lifecycle states, in order.  REJECTED is terminal for requests that can never fit.
# ROUTED (seed 004 BC-7: a replica was chosen, the request is on its way into that replica's queue)
# came last and keeps the other values.
PENDING, QUEUED, RUNNING, PREEMPTED, COMPLETED, REJECTED, HANDOFF, ROUTED = range(8)
STATE_NAMES = ("pending", "queued", "running", "preempted", "completed", "rejected", "kv_transfer", "routed")


class Request:
    """One inference request.  Plain slots object: the scheduler touches these on the hot path.

    ``segments`` describes the prompt's content for prefix caching: a tuple of (segment id,
    length) pairs; two requests share a KV block iff their segment sequences agree up to the
    end of that block.  ``None`` means the prompt is unique to this request.
    """

    __slots__ = (
        "rid", "arrival", "prompt_len", "max_tokens", "segments", "prefix_group", "label",
        "state", "t_routed", "t_queued", "t_scheduled", "t_first_token", "t_completion", "t_last_token",
        "preempt_times", "resume_times", "cached_tokens", "num_computed", "n_out",
        "d0", "c0", "hashes", "plain_blocks", "block_hashes", "prefilling", "itl_gap",
        "session", "tenant", "replica", "prefill_replica", "kv_ready", "reject_reason", "t_handoff", "t_kv_ready",
        "spec", "priority", "sched_key", "slo_class", "ttft_slo_ms", "tpot_slo_ms", "draft_id",
        "energy_j", "e0", "kv_peak_bytes", "t_enqueued", "t_decode_scheduled", "decode_deferred",
        "sampling",
    )

    def __init__(self, rid: int, arrival: float, prompt_len: int, max_tokens: int,
                 segments=None, prefix_group: int = -1, label: str = ""):
        self.rid = rid
        self.arrival = arrival
        self.prompt_len = prompt_len
        self.max_tokens = max_tokens
        self.segments = segments
        self.prefix_group = prefix_group
        self.label = label
        self.state = PENDING
        self.t_routed = self.t_queued = self.t_scheduled = self.t_first_token = self.t_completion = None
        self.t_last_token = None
        self.preempt_times: tuple = ()    # immutable and shared while empty: no list per request
        self.resume_times: tuple = ()     # (time, "PREFILL" | "DECODE") it was scheduled again after each
        self.cached_tokens = 0       # prefix-cache hit tokens at first scheduling
        self.num_computed = 0        # tokens whose KV is computed (explicit while prefilling)
        self.n_out = 0               # output tokens emitted
        self.d0 = 0                  # lazy decode: instance decode-step counter at rebase
        self.c0 = 0                  # lazy decode: num_computed at rebase
        self.hashes: list | tuple = ()   # hashed (cache-registered or hit) blocks held, in order; () = none
        self.plain_blocks = 0        # unhashed blocks held (explicit while prefilling)
        self.block_hashes = None     # hashes of full blocks of the token sequence (lazy)
        self.prefilling = False
        self.itl_gap = False         # next emitted token's ITL is not the step duration
        self.session = -1            # conversation id (affinity); -1 = none
        self.tenant = ""             # request class for fairness reports (workload type: mix)
        self.draft_id = ""           # speculation: the draft device that opens it (trace column); "" = bound by cohort
        self.sampling = None         # speculation: (temperature or None, top_p or None, domain) the acceptance is
        #                              read at (a tenant's keys or trace columns); None = the scenario's
        self.replica = None          # replica that finished (or holds) the request
        self.prefill_replica = None  # P/D: the replica that ran the prefill
        self.kv_ready = 0            # P/D: prompt tokens whose KV arrived from a prefill replica
        self.reject_reason = ""
        self.t_handoff = None        # P/D: prefill done, KV transfer starts
        self.t_kv_ready = None       # P/D: KV transfer done, request reaches the decode replica
        self.spec = None             # speculative decoding round state (dsim.specdec), None = plain
        self.priority = 0            # engine.scheduling_policy priority: lower is served first (vLLM)
        self.sched_key = None        # the replica's scheduling-policy key, set when it queues (not FCFS)
        self.slo_class = ""          # slo.classes name ("" = none)
        self.ttft_slo_ms = None      # this request's targets: its own, else its class's, else slo.*
        self.tpot_slo_ms = None
        # metrics (docs/cluster.md, "Metrics"): joules of the steps' energy attributed to this request
        # (each step's energy split equally over the tokens it computed), the most KV bytes it held at
        # once and, P/D, its first admission on the decode replica and whether a step of that replica
        # started after it queued there without admitting it.  Set when first needed: ``e0`` (the
        # replica's decode energy counter when it last became a lazy decoder) and ``t_enqueued``
        # (when it last joined a waiting queue)
        self.energy_j = 0.0
        self.kv_peak_bytes = 0
        self.t_decode_scheduled = None
        self.decode_deferred = False

    @property
    def num_tokens(self) -> int:
        """Tokens known to the engine: prompt plus outputs so far (vLLM ``Request.num_tokens``)."""
        return self.prompt_len + self.n_out

    def __repr__(self) -> str:
        return f"Request({self.rid}, t={self.arrival:.4f}, in={self.prompt_len}, out={self.max_tokens})"
