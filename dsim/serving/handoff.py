"""Requests leaving a replica other than by completing: the prefill role's hand-off to a decode
replica (prefill/decode disaggregation) and rebalancing's take-back of unstarted requests.
A mixin of ``Instance``."""
from __future__ import annotations

from ..core.invariant import check
from ..core.request import HANDOFF


class Handoff:
    # ---- prefill/decode disaggregation ----------------------------------------------------------
    def _handoff(self, r, emit_t: float) -> None:
        """Prefill role: the first token is out; the KV stays held until the transfer ends."""
        del self.running[r.rid]
        r.t_last_token = r.t_handoff = emit_t
        r.state = HANDOFF
        self.transferring[r.rid] = r
        self.on_handoff(r)

    def release_handoff(self, r) -> None:
        """The KV of a handed-off request has been copied out: free its blocks here."""
        del self.transferring[r.rid]
        self._release(r, r.num_computed, self.cache_on and r.segments is not None)
        self.handed_off += 1
        if self._wake is not None and not self._wake.triggered and self.waiting:
            self._wake.succeed()

    def migrate_out(self, n: int, on_out) -> int:
        """Mark up to ``n`` decoding requests (the last admitted first, as vLLM picks preemption
        victims) to leave at the end of the step in flight, holding their KV until
        ``release_handoff``; ``on_out(r)`` is then called to move the KV.  Returns how many."""
        picks = [r for r in reversed(self.running.values())
                 if not r.prefilling and r.spec is None and r.rid not in self._leaving][:n]
        for r in picks:
            self._leaving[r.rid] = on_out
        return len(picks)

    def _migrate_leaving(self, now: float) -> None:
        for rid, on_out in list(self._leaving.items()):
            del self._leaving[rid]
            r = self.running.get(rid)
            if r is None or r.prefilling or r.spec is not None:
                continue                        # finished or preempted in the meantime
            del self.running[rid]
            comp = self._lazy_remove(r)
            if r.itl_gap:
                self.n_gap -= 1
            else:
                r.t_last_token = now
            r.itl_gap = True                    # the next token comes after the move
            r.state = HANDOFF
            self.transferring[rid] = r
            on_out(r)
            check(r.num_computed == comp)

    def take_unstarted(self):
        """Remove and return the newest waiting request that was never scheduled (or None)."""
        w = self.waiting
        for i in range(len(w) - 1, -1, -1):
            r = w[i]
            if r.t_scheduled is None and not r.kv_ready and r.rid not in self.offload_held:
                del w[i]
                self.moved_out += 1
                return r
        return None

