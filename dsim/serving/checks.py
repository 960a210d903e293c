"""The replica's invariants (seed 004 BC-5, BC-12, BC-13; request and pool conservation), run
after every step with ``--check-invariants``.  A mixin of ``Instance``."""
from __future__ import annotations

from ..core.invariant import check


class ReplicaChecks:
    # ---- invariants ---------------------------------------------------------------------------
    def held_blocks(self) -> int:
        """Blocks in use by running requests (shared cached blocks counted once)."""
        plain = 0
        shared = set()
        for r in self.offload_held.values():
            shared.update(r.hashes)
        for r in self.transferring.values():
            plain += -(-r.num_computed // self.bs) - len(r.hashes)
            shared.update(r.hashes)
        for r in self.running.values():
            comp = r.num_computed if (r.prefilling or r.spec is not None) else r.c0 + self.D - r.d0
            if r.prefilling:
                plain += r.plain_blocks
                check(-(-comp // self.bs) <= len(r.hashes) + r.plain_blocks)
            else:
                plain += -(-comp // self.bs) - len(r.hashes)
            shared.update(r.hashes)
        return plain + len(shared)

    def check_invariants(self) -> None:
        """BC-5 clock, BC-12 batch limit, BC-13 KV conservation, request conservation."""
        now = self.env.now
        check(now >= self._last_now, f"clock went back: {now} < {self._last_now}")
        self._last_now = now
        check(len(self.running) <= self.engine.max_num_seqs)
        self.kv.check(self.held_blocks())
        if self.tier is not None:
            self.tier.check()
        if self.swap is not None:
            self.check_swap()
        check(min(self.kv.cached.values(), default=0) >= 0)
        check(self.n_dec + self.n_prefilling + len(self.spec_dec) == len(self.running))
        check(self.n_dec >= 0 and self.n_prefilling >= 0 and self.n_gap >= 0)
        if self.on_check is not None:
            self.on_check()
        # pool isolation: a decode replica never produces a first token, a prefill replica
        # never a second one
        if self.role == "prefill":
            for r in self.running.values():
                check(r.n_out == 0, f"{self.name}: prefill replica decodes request {r.rid}")
        elif self.role == "decode":
            for r in self.running.values():
                check(r.prefill_replica is not None and r.prefill_replica != self.name,
                      f"{self.name}: decode replica runs the prefill of request {r.rid}")
