"""Data-parallel attention with expert parallelism for MoE (``engine.data_parallel_size: D`` with
``enable_expert_parallel: true``), after vLLM's ``--data-parallel-size D --enable-expert-parallel``.

vLLM runs D engine cores (DP ranks), each with its own scheduler, KV cache and attention over TP
GPUs, while the routed experts of every MoE layer are spread over all D x TP GPUs (EP).  A MoE
layer needs every rank: tokens are dispatched to the GPUs holding their experts and combined back
(two all-to-alls), so the ranks step in lockstep, and a rank without work runs a dummy batch.

dsim builds each rank as a replica (``<name>.dp<k>``, TP GPUs; a group counts TP x D) whose loop,
instead of timing its own step, joins its group's next step (``DPGroup.join``).  The group step
starts once every rank that was running has joined, and lasts

    max over ranks (host + dense time of its own batch) + expert time + all-to-all time

- dense: the roofline (compute vs HBM, with the same efficiencies and overlap as
  dsim.latency.roofline) of everything but the routed experts, for the rank's own tokens: attention
  and its KV, dense/shared MLPs, router, LM head, TP all-reduces;
- expert: every GPU holds E / (D x TP) whole experts and, under uniform routing, computes 1 / (D x TP)
  of all ranks' routed expert work, reading the weights of the experts that work touches;
- all-to-all: per MoE layer each token's hidden state goes to its k experts and comes back
  (2 x k x hidden x 2 bytes), over the interconnect, plus two latencies; the rank with the most
  tokens sets it.
Only the roofline latency model splits into these parts; other models are refused with DP > 1.
"""
from __future__ import annotations

from simpy.events import NORMAL

from ..latency.roofline import RooflineModel


class DPRoofline:
    """The parts of a DP+EP step on one GPU, from the roofline's constants."""

    def __init__(self, rf: RooflineModel, dp: int, scale: float = 1.0):
        self.rf = rf
        self.scale = scale                          # latency.scale: every part of the step x scale
        model, device, tp = rf.model, rf.device, rf.tp
        m = model
        self.ep = ep = tp * dp
        expert_flops_tok = 2 * m.num_moe_layers * m.experts_per_token * m._mlp(m.expert_intermediate_size)
        self._flops_dense = rf._flops_lin - expert_flops_tok / tp
        self._flops_expert = expert_flops_tok / ep              # per token of any rank, on one GPU
        self._expert_bytes_one = rf._expert_bytes * tp           # one whole expert (all MoE layers)
        self.local_experts = m.num_experts / ep
        self._k = m.experts_per_token
        self._e = m.num_experts
        bpp = m.bytes_per_param
        self._a2a_per_token = 2 * m.num_moe_layers * m.experts_per_token * m.hidden_size * bpp \
            / device.interconnect_bytes_s
        self._a2a_fixed = 2 * m.num_moe_layers * device.interconnect_latency_s

    def _roof(self, flops: float, byts: float) -> float:
        rf = self.rf
        tc, tm = flops * rf._inv_flops, byts * rf._inv_bw
        return (tc + rf._serial * tm if tc > tm else tm + rf._serial * tc) * self.scale

    def dense_time(self, b) -> float:
        """This rank's batch through everything but the routed experts."""
        rf = self.rf
        tokens = b.prefill_tokens + b.decode_tokens
        if tokens == 0:
            return 0.0
        pairs = b.prefill_attn_pairs + b.decode_ctx_sum
        flops = self._flops_dense * tokens + rf._flops_head * b.num_sampled + rf._flops_pair * pairs
        byts = rf._fixed_bytes + rf._kv_tok * (b.decode_ctx_sum + b.prefill_ctx_tokens + tokens)
        t = self._roof(flops, byts)
        if rf._ar_fixed:
            t += (rf._ar_fixed + rf._ar_per_token * tokens) * self.scale
        return t

    def expert_time(self, total_tokens: int) -> float:
        """One GPU's share of every rank's routed expert work, with the weights it touches."""
        if total_tokens == 0:
            return 0.0
        touched = 1.0 - (1.0 - self._k / self._e) ** total_tokens   # per expert, uniform routing (as the roofline)
        return self._roof(self._flops_expert * total_tokens, self._expert_bytes_one * self.local_experts * touched)

    def a2a_time(self, max_rank_tokens: int) -> float:
        return (self._a2a_fixed + self._a2a_per_token * max_rank_tokens) * self.scale if max_rank_tokens else 0.0


class DPRankStep:
    """A rank's own step model: host time plus its dense part (the group adds experts and a2a).
    ``unpipelined``: the full step as if alone, for estimates (EDF's prefill time)."""

    pure = False         # step_time has effects (see dsim.serving.fastforward)

    def __init__(self, host_model, parts: DPRoofline):
        self.host_model = host_model                 # HostStepModel around the roofline, or the roofline
        self.parts = parts
        self._host = getattr(host_model, "host_time", None)

    @property
    def unpipelined(self):
        return self.host_model

    def __getattr__(self, item):
        if item in ("host_model", "parts", "_host"):
            raise AttributeError(item)
        return getattr(self.host_model, item)

    def step_time(self, b) -> float:
        t = self.parts.dense_time(b)
        if self._host is not None and (b.prefill_tokens or b.decode_tokens):
            t += self._host(b) * self.parts.scale
        return t


class DPGroup:
    """The lockstep of one DP group's ranks."""

    def __init__(self, env, parts: DPRoofline):
        self.env = env
        self.parts = parts
        self.joined: list = []           # (own time, tokens) of the ranks in the next step
        self.ev = None
        self.running = False             # a group step is in flight
        self.steps = 0

    def join(self, own_s: float, tokens: int):
        """A rank is ready with its batch: the returned event fires at the group step's end, with
        the step's duration as its value."""
        self.joined.append((own_s, tokens))
        if self.ev is None:
            self.ev = self.env.event()
            if not self.running:              # a rank that wakes mid-step waits for the step's end
                self._schedule_start()
        return self.ev

    def _schedule_start(self) -> None:
        start = self.env.event()
        start._ok, start._value = True, None
        start.callbacks.append(self._start)
        self.env.schedule(start, NORMAL, 0.0)        # after every rank resumed at this instant has joined

    def _start(self, _e) -> None:
        ev, joined = self.ev, self.joined
        self.ev, self.joined = None, []
        self.running = True
        p = self.parts
        total = sum(n for _, n in joined)
        dur = (max(s for s, _ in joined) + p.expert_time(total) + p.a2a_time(max(n for _, n in joined)))
        self.steps += 1
        t = self.env.timeout(dur)
        t.callbacks.append(lambda _t: self._end(ev, dur))

    def _end(self, ev, dur: float) -> None:
        self.running = False
        ev.succeed(dur)                       # the ranks resume after this and join the next step
        if self.ev is not None:               # ranks that woke up during the step are waiting
            self._schedule_start()
