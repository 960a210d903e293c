"""Decoding requests in lazy form (a mixin of ``Instance``): every one advances a token per step,
so its context is ``c0 + (D - d0)`` for the replica's decode-step counter D, and the sum of
contexts, the count crossing a KV-block boundary and the step each one finishes at are kept as
aggregates updated in O(1), and so is their energy: the replica's ``ecum`` (energy per token summed
over the steps that advanced them) minus its value when a request joined.  These helpers move a
request into and out of that form."""
from __future__ import annotations


class LazyDecoders:
    def _lazy_add(self, r) -> None:
        """r has just computed up to r.num_computed and emitted; it decodes from step D on."""
        if r.spec is not None:
            self.spec_dec[r.rid] = r
            r.t_last_token = self.env.now
            r.spec.round_done(r, self, -1, 0, False)
            return
        r.d0 = d0 = self.D
        r.c0 = c0 = r.num_computed
        r.e0 = self.ecum
        self.n_dec += 1
        self.lazy_sum += c0 - d0
        self.boundary[(d0 - c0) % self.bs] += 1
        fin = d0 - c0 + r.prompt_len + r.max_tokens - 1
        b = self.finish.get(fin)
        if b is None:
            self.finish[fin] = {r.rid: r}
        else:
            b[r.rid] = r

    def _lazy_detach(self, r) -> int:
        """Drop r from the lazy aggregates (not the finish table); returns its num_computed."""
        self.n_dec -= 1
        self.lazy_sum -= r.c0 - r.d0
        self.boundary[(r.d0 - r.c0) % self.bs] -= 1
        r.energy_j += self.ecum - r.e0
        return r.c0 + self.D - r.d0

    def _lazy_remove(self, r) -> int:
        """Take r out of the lazy set before it finishes; returns its materialised num_computed."""
        comp = self._lazy_detach(r)
        fin = r.d0 - r.c0 + r.prompt_len + r.max_tokens - 1
        b = self.finish[fin]
        del b[r.rid]
        if not b:
            del self.finish[fin]
        r.num_computed = comp
        r.n_out = comp - r.prompt_len + 1
        return comp
