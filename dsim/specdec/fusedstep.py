"""A fast target's verified rounds in one pass per step (docs/performance.md, "Round three: fused
speculative rounds as data").

Why its own module: ``SpeculativeSteps._verified`` (the replica's bookkeeping after a
verification) and ``SpecRuntime.fused_round``/``_tally`` (the round's counts, its gamma, the next
round) cost a handful of calls per request per target step; on a ``fast_target`` this does the
same updates, row by row and in the same order, in one loop.  Rows it may not take (a policy that
wants feedback or has no ``k_for``, the target's policy rather than the conversation's own, a
conversation that is not fused, a device outside fused mode) and a conversation's last round go
the general way in their turn, with everything the loop held back (KV blocks to free, the target's
counters, the gamma timeline) applied first.
"""
from __future__ import annotations

# the ITL sample (0.0, a) of a round's a accepted drafts (their tokens come out with the target's),
# one tuple per a shared by every row that accepts a; a larger a builds its own
ACCEPTED_SAMPLES = tuple((0.0, a) for a in range(17))


class FusedSteps:
    """Mixin of ``SpecRuntime``: ``fused_step``, the verified rows of one step on a fast target."""

    # False: every row goes through fused_round/round_done, as before this module (the tests compare)
    one_pass = True

    def fused_step(self, inst, spec, t_end: float, emit_t: float, tgt) -> None:
        """``_verified`` + ``fused_round`` for every row of ``spec`` ([(request, k, accepted)])."""
        bs = inst.bs
        kb = inst.kv_block_bytes
        wpt = inst._step_wpt
        itl_append = inst.itl_extra.append
        kv = inst.kv
        by_context = self.by_context
        now = self.env.now
        deadline = now + self.round_budget_s
        dev_general = self.cfg.mode != "fused"       # a conversation with a device then goes the general way
        waker = inst.wake if inst._wake is not None else None
        drop = 0                         # rejected drafts' KV blocks, not yet returned to the pool
        n = nk = na = nd = 0             # fast rounds held back: count, verified, accepted, drafted
        # a row's times are mostly the same float object as the row before's (both set to the same step's
        # end): what is computed from them is taken from the row before when the object is the same
        t_tok = t_rdy = t_rnd = gap = tvt = rs3 = None
        acc_s = ACCEPTED_SAMPLES
        n_acc = len(acc_s)
        for r, k, a in spec:
            old = r.num_computed
            new = old + a + 1
            held = -(-(old + k + 1) // bs)
            hb = held * kb
            if hb > r.kv_peak_bytes:
                r.kv_peak_bytes = hb
            r.energy_j += (k + 1) * wpt
            drop += held - -(-new // bs)
            r.num_computed = new
            t = r.t_last_token
            if t is not t_tok:
                t_tok = t
                gap = (t_end - t, 1)
            itl_append(gap)
            if a:
                itl_append(acc_s[a] if a < n_acc else (0.0, a))
            r.t_last_token = t_end
            n_out = r.n_out = r.n_out + a + 1
            st = r.spec
            last = n_out >= r.max_tokens
            km = st.kmemo
            if km is None and not last:
                km = self._gamma_table(st)
            if last or km is None or not st.fused or (dev_general and st.device is not None):
                # the general way: first what the rows before it held back
                if drop:
                    kv.free(drop, ())
                    drop = 0
                if n:
                    self._held_counts(tgt, now, n, nk, na, nd)
                    n = nk = na = nd = 0
                if last:
                    del inst.spec_dec[r.rid]
                    self.round_done(st, r, inst, k, a, True)
                    inst._complete(r, new, emit_t)
                else:
                    self.round_done(st, r, inst, k, a)
                continue
            # _tally, the target's and the second's counts held back to the end
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
            st.fused_rounds += 1
            t = st.t_ready
            if t is not t_rdy:
                t_rdy = t
                tvt = now - t
            if tvt > st.tvt_max:
                st.tvt_max = tvt
            t = st.t_last
            if t is not t_rnd:
                t_rnd = t
                rs3 = (now - t) * 1e3    # the round's seconds, in ms
            st.t_last = now
            if k:
                st.acc_est = 0.8 * st.acc_est + 0.2 * (a / k)
            tpot_ms = rs3 / (a + 1)
            est = st.tpot_est
            st.tpot_est = tpot_ms if est == 0 else 0.8 * est + 0.2 * tpot_ms
            st.last_k = dn
            st.last_a = a
            # the next round: its gamma from the policy's table (k_for on a miss, which fills it)
            if km is False:
                g = st.policy.k_for(new, st.temp)
            else:
                g = km.get(new)
                if g is None:
                    g = st.policy.k_for(new, st.temp)
            st.drafted_now = st.k = g
            st.t_ready = now
            st.deadline = deadline
            if waker is not None:
                waker()
        if drop:
            kv.free(drop, ())
        if n:
            self._held_counts(tgt, now, n, nk, na, nd)

    @staticmethod
    def _gamma_table(st):
        """The conversation's gamma table (context -> k, filled by its policy's ``k_for``; False: its
        policy has none, ask ``k_for``), kept in ``SpecState.kmemo``: its policy and temperature are
        fixed for its life.  None, not kept: its rounds go the general way (a target's policy, one
        without ``k_for`` or that wants each round's feedback; ``fused_round`` sends the last two the
        general way too, the general way gives what it would for the first)."""
        pol = st.policy
        if pol is None or pol.k_for is None or pol.wants_feedback:
            return None
        t = pol.k_memo(st.temp) if hasattr(pol, "k_memo") else None
        st.kmemo = t = False if t is None else t
        return t

    def _held_counts(self, tgt, now: float, n: int, nk: int, na: int, nd: int) -> None:
        """The counts ``_tally`` adds per round, for ``n`` rounds at once (integer sums)."""
        tgt.verified += nk
        tgt.accepted += na
        tgt.rounds += n
        w = self.by_second.get(int(now))
        if w is None:
            w = self.by_second[int(now)] = [0, 0, 0, 0]
        w[0] += n
        w[1] += nd
        w[2] += nk
        w[3] += na
