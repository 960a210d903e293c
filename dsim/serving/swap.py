"""Swap preemption (``engine.preemption_mode: swap``), after vLLM V0's scheduler.

vLLM V0 (vllm/core/scheduler.py, ``PreemptionMode.SWAP``) could preempt a request by copying its
KV blocks to a CPU swap area (``--swap-space`` GiB per GPU, default 4) instead of dropping them:
the GPU blocks are freed, the request waits in a *swapped* queue, and once blocks allow it is
copied back and continues where it stopped (no prefill is recomputed).  What dsim follows:

* the victim is the one recompute preemption would take (the last running request); its blocks
  (``ceil(num_computed / block_size)``) go out if the swap area has room for them, else it is
  preempted by recompute (vLLM V0 stops the engine with "Aborted due to the lack of CPU swap
  space"; a simulator would rather degrade);
* swapped requests come back FIFO (vLLM's ``swapped`` deque; under a keyed policy by key) after
  the running requests are scheduled, only in a step that preempted nobody (V0's rule), each while
  the step's token budget, ``max_num_seqs`` and the free blocks (above V0's 1 % watermark with
  chunked prefill off, while anything runs) allow; a swapped-in request takes its step in the same
  iteration (a decoder decodes one token, a chunked prefill continues its next chunk);
* while any request is swapped out no waiting request is admitted: V0 skips new prefills when the
  swapped queue is not empty (``_schedule_default``); with chunked prefill V0 would still admit
  behind a swapped request that did not fit, dsim keeps the swapped one first there too, as a
  recompute-preempted request at the head of the waiting queue is;
* the copies are part of the step: V0's worker runs ``swap_in`` / ``swap_out`` on the model's
  stream before the forward pass, so a step is longer by (blocks out + blocks in) x the PCIe time
  of a block (``offload.pcie_block_s``, the CPU tier's copy cost; like ``kv_offload.overlap:
  false``);
* a request's GPU blocks are freed as a recompute preemption frees them (full blocks stay cached
  for others with prefix caching); on the way back every block is copied into a new one;
* a speculative request is preempted by recompute (its rounds restart from a prefill).
"""
from __future__ import annotations

from ..config.engine import GIB
from ..core.request import PREEMPTED, RUNNING
from .offload import block_bytes_per_gpu, pcie_block_s


class SwapSpace:
    """The CPU swap area of one replica: capacity and use in blocks, copy time, counters."""

    __slots__ = ("capacity", "used", "block_bytes", "block_s", "outs", "ins", "out_blocks", "in_blocks",
                 "fallbacks", "copy_s")

    def __init__(self, capacity_blocks: int, block_bytes: float, block_s: float):
        self.capacity = capacity_blocks
        self.used = 0
        self.block_bytes = block_bytes   # per GPU (each GPU of the TP group swaps its shard)
        self.block_s = block_s           # PCIe time of one block
        self.outs = self.ins = 0         # requests swapped out / in
        self.out_blocks = self.in_blocks = 0
        self.fallbacks = 0               # preemptions that found the swap area full: recomputed
        self.copy_s = 0.0                # step time spent copying

    def summary(self) -> dict:
        per_block = self.block_bytes
        return {"swap_outs": self.outs, "swap_ins": self.ins, "swap_out_blocks": self.out_blocks,
                "swap_in_blocks": self.in_blocks,
                "swapped_bytes": int(round((self.out_blocks + self.in_blocks) * per_block)),
                "swap_fallbacks": self.fallbacks, "swap_copy_s": self.copy_s,
                "swap_capacity_blocks": self.capacity}


def build_swap(model, device, engine) -> SwapSpace | None:
    """vLLM's CPU block count: ``swap_space`` GiB over one GPU's block (its KV-head shard)."""
    if engine.preemption_mode != "swap":
        return None
    per_gpu = block_bytes_per_gpu(model, engine)
    return SwapSpace(int(engine.swap_space * GIB // per_gpu), per_gpu, pcie_block_s(model, device, engine))


class SwapPreemption:
    """The replica's side (a mixin of ``Instance``): ``_swap_out`` from ``_preempt``, ``_swap_in``
    from ``_schedule``.  A swapped request keeps ``num_computed`` and holds no GPU block."""

    def _swap_out(self, r, comp: int) -> bool:
        """Copy r's KV to the swap area and free its GPU blocks; False (nothing done) if full."""
        sw = self.swap
        n = -(-comp // self.bs)
        if n > sw.capacity - sw.used:
            sw.fallbacks += 1
            return False
        self._release(r, comp, self.cache_on)
        r.num_computed = comp
        r.itl_gap = r.n_out > 0
        r.state = PREEMPTED
        sw.used += n
        sw.outs += 1
        sw.out_blocks += n
        self._swap_wait += n * sw.block_s
        self.swapped.append(r)
        return True

    def _swap_in(self, budget: int, prefills: list, gap_dec: list, now: float, v0: bool) -> tuple:
        """Bring swapped requests back while they fit; returns (budget left, decoders added)."""
        sw, kv, bs = self.swap, self.kv, self.bs
        swapped, running = self.swapped, self.running
        max_seqs = self.engine.max_num_seqs
        thr = self.engine.long_prefill_token_threshold
        watermark = int(0.01 * kv.total) if v0 and running else 0
        n_dec = 0
        while swapped and budget > 0 and len(running) < max_seqs:
            r = swapped[0]
            comp = r.num_computed
            decoder = r.n_out > 0 and comp == r.num_tokens - 1
            if decoder:
                need = 1
            else:
                need = r.num_tokens - comp
                if 0 < thr < need:
                    need = thr
                if need > budget:
                    need = budget
            blocks = -(-(comp + need) // bs)
            if blocks > kv.free_count - watermark:
                break
            swapped.popleft()
            kv.allocate(blocks)
            n = -(-comp // bs)
            sw.used -= n
            sw.ins += 1
            sw.in_blocks += n
            self._swap_wait += n * sw.block_s
            r.resume_times += ((now, "DECODE" if decoder else "PREFILL"),)
            r.state = RUNNING
            running[r.rid] = r
            budget -= need
            if decoder:                  # decodes this step: its context grows by one at the step end
                self._lazy_add(r)
                n_dec += 1
                if r.itl_gap:
                    self.n_gap += 1
                    gap_dec.append(r)
            else:
                r.prefilling = True
                r.plain_blocks = blocks
                self.n_prefilling += 1
                prefills.append((r, need))
        return budget, n_dec

    def check_swap(self) -> None:
        """Swap-area conservation: its blocks are those of the swapped requests, within capacity."""
        from ..core.invariant import check
        sw = self.swap
        held = sum(-(-r.num_computed // self.bs) for r in self.swapped)
        check(sw.used == held and 0 <= sw.used <= sw.capacity, (sw.used, held, sw.capacity))
        check(sw.out_blocks - sw.in_blocks == sw.used, (sw.out_blocks, sw.in_blocks, sw.used))
