"""A step's verified rounds on a target whose rounds are drafted by devices (or chosen per round in
hybrid mode), in one pass (docs/performance.md, "Round three, second pass: distributed rounds").

Why its own module: per verified round, ``SpeculativeSteps._verified`` called ``round_done``,
which called ``_tally`` and then ``_next_round``; here one loop does the replica's bookkeeping,
``round_done`` and ``_tally`` row by row in the same order, and calls ``_next_round`` as
``round_done`` does.  The target's counters and the per-second timeline (integer sums that
nothing reads before the step is over) are added once per step; the rejected drafts' KV is freed
per row, as before, since the next round's telemetry reads the free blocks.  A conversation's last
round goes the general way, after what was held back is applied.
"""
from __future__ import annotations


class DistSteps:
    """Mixin of ``SpecRuntime``: ``dist_step``, the verified rows of one step of a target that is
    not a ``fast_target``."""

    # False: every row goes through round_done, as before this module (the tests compare)
    dist_pass = True

    def dist_target(self, inst):
        """This target's TargetState when its verified rounds can take ``dist_step``: chains (a
        round's depth is its k), one drafter, no drafter memory on the devices, no log to write or
        replay and no decision hook (which could read the counters held back); else None."""
        if (self.dist_pass and self._chain_one and self.log is None and self.decision_hook is None
                and not self.devmem):
            return self.targets[inst.name]
        return None

    def dist_step(self, inst, spec, t_end: float, emit_t: float, tgt) -> None:
        """``_verified`` + ``round_done`` for every row of ``spec`` ([(request, k, accepted)])."""
        bs = inst.bs
        kb = inst.kv_block_bytes
        wpt = inst._step_wpt
        itl_append = inst.itl_extra.append
        kv = inst.kv
        spec_dec = inst.spec_dec
        by_context = self.by_context
        now = self.env._now
        slo = self.slo_tpot_ms
        next_round = self._next_round
        n = nk = na = nd = 0             # rounds held back: count, verified, accepted, drafted
        for r, k, a in spec:
            old = r.num_computed
            new = old + a + 1
            held = -(-(old + k + 1) // bs)
            hb = held * kb
            if hb > r.kv_peak_bytes:
                r.kv_peak_bytes = hb
            r.energy_j += (k + 1) * wpt
            drop = held - -(-new // bs)
            if drop:
                kv.free(drop, ())
            r.num_computed = new
            itl_append((t_end - r.t_last_token, 1))
            if a:
                itl_append((0.0, a))
            r.t_last_token = t_end
            n_out = r.n_out = r.n_out + a + 1
            st = r.spec
            if n_out >= r.max_tokens:    # the conversation's last round: the general way
                del spec_dec[r.rid]
                if n:
                    self._held_counts(tgt, now, n, nk, na, nd)
                    n = nk = na = nd = 0
                self.round_done(st, r, inst, k, a, True)
                inst._complete(r, new, emit_t)
                continue
            # round_done and _tally, the target's and the second's counts held back to the end
            st.ready = False
            tgt.ready_n -= 1
            n += 1
            nk += k
            na += a
            dn = st.drafted_now
            nd += dn
            st.rounds += 1
            st.verified += k
            st.accepted += a
            st.drafted += dn
            b = old.bit_length()         # the context the drafts were verified at, binned
            c = by_context.get(b)
            if c is None:
                c = by_context[b] = [0, 0, 0]
            c[0] += 1
            c[1] += k
            c[2] += a
            if st.fused:
                st.fused_rounds += 1
            else:
                st.dist_rounds += 1
            tvt = now - st.t_ready
            if tvt > st.tvt_max:
                st.tvt_max = tvt
            round_s = now - st.t_last
            st.t_last = now
            if k:
                st.acc_est = 0.8 * st.acc_est + 0.2 * (a / k)
            tpot_ms = round_s * 1e3 / (a + 1)
            est = st.tpot_est
            st.tpot_est = tpot_ms if est == 0 else 0.8 * est + 0.2 * tpot_ms
            st.last_k = dn
            st.last_a = a
            pol = st.policy or tgt.policy
            if getattr(pol, "wants_feedback", True):
                pol.on_round(dn, a, round_s, self._rtt_ms(st), tpot_ms, not slo or tpot_ms <= slo)
            next_round(st, r, inst)
        if n:
            self._held_counts(tgt, now, n, nk, na, nd)
