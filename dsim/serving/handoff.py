"""Requests leaving a replica other than by completing: the prefill role's hand-off to a decode
replica (prefill/decode disaggregation) and rebalancing's take-back of unstarted requests.
A mixin of ``Instance``."""
from __future__ import annotations

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

