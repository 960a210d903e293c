"""The replica's speculative-decoding steps: drafting on the replica (fused drafters) and the
bookkeeping after a verification.  A mixin of ``Instance``: the drafts and the verify chunks are
costed inside its step; see dsim.serving.instance for how eager decoders enter a step."""
from __future__ import annotations

from ..latency.base import BatchShape, decode_curve


class SpeculativeSteps:
    _draft_curves = None                 # (draft model, n -> its decode curve): _draft_curve
    _spec_sums = None                    # the verify walk's shape terms and draft seconds of this step's rows
    one_walk = True                      # False: every step walks _schedule's general loop (the tests compare)

    # ---- speculative decoders -----------------------------------------------------------------
    def _draft_time(self, spec) -> float:
        """Drafters on this replica draft k tokens one step at a time, batched across requests:
        draft step j runs every fused request with k >= j."""
        if self.draft_cost is not None:  # multi-level chains (dsim.specdec.levels)
            return self.draft_cost(self, spec)
        if self.mixed_drafts:
            return self._mixed_draft_time(spec)
        sums = self._spec_sums
        if sums is not None and spec is self._spec_sched:
            return sums[7]               # the verify walk counted this step's rows (_verify_walk)
        top = max([k for _, k, _ in spec], default=0)
        if top <= 0:
            return 0.0
        n = ctx = 0
        cn = [0] * (top + 1)             # k -> fused requests drafting k
        cc = [0] * (top + 1)             # k -> the sum of their contexts
        for r, k, _ in spec:
            if k > 0 and r.spec.fused:
                c = r.num_computed
                n += 1
                ctx += c
                cn[k] += 1
                cc[k] += c
        if not n:
            return 0.0
        while not cn[top]:
            top -= 1
        return self._draft_steps(cn, cc, n, ctx, top)

    def _draft_steps(self, cn, cc, n: int, ctx: int, top: int) -> float:
        """The draft steps of ``n`` fused requests (context sum ``ctx``), ``cn[k]``/``cc[k]`` of them
        (their context sum) drafting k, ``top`` the largest k: step j costed by the drafter's decode
        curve for the requests with k >= j, summed in step order."""
        t = 0.0
        curve = self._draft_curve()
        f = None
        for j in range(1, top + 1):      # draft step j: the requests with k >= j
            if f is None:
                f = curve(n)
            t += f(ctx + n * j)
            m = cn[j]                    # requests with k = j are done after draft step j
            if m:
                n -= m
                ctx -= cc[j]
                f = None
        return t

    def _verify_walk(self, order: list, budget: int, now: float, spec: list):
        """``_schedule``'s walk of ``order`` when every request in it is a speculative decoder and the
        drafts are chains costed by this replica's drafter: the same rows, k and preemptions as the
        general loop, with the rows' blocks taken from the pool in one ``allocate`` (before a
        preemption and at the end), and the rows' shape terms and draft seconds summed on the way
        into ``_spec_sums`` for ``_loop`` (docs/performance.md, "Round three, second pass").
        Returns (budget left, whether a request was preempted)."""
        kv = self.kv
        bs = self.bs
        free = kv.free_count             # the pool's free blocks less those the rows took (taken at a flush)
        preempted = False
        s_tok = s_sq = s_pairs = v_n = v_ctx = s_dec = s_dctx = 0
        xn = xctx = top = 0              # verify rows not drafted here (not fused), their contexts; the largest k
        cn = [0]                         # k -> fused rows drafting k
        cc = [0]                         # k -> the sum of their contexts
        for r in order:                  # (a preemption pops from the end: the loop then stops sooner)
            if budget <= 0:
                break                    # (the general loop takes nothing more)
            sp = r.spec
            if not sp.ready:
                continue                 # drafts not here yet: holds its KV, takes no tokens
            comp = r.num_computed
            k = sp.k                     # min(sp.k, max_tokens - n_out - 1, budget - 1)
            m = r.max_tokens - r.n_out - 1
            if m < k:
                k = m
            if budget <= k:
                k = budget - 1
            c = k + 1
            blocks = -(-(comp + c) // bs) - -(-comp // bs)
            if blocks > free:
                if free < kv.free_count:     # the pool as the general loop leaves it, then its preemptions
                    kv.allocate(kv.free_count - free)
                victim_self = False
                while blocks > kv.free_count:
                    victim = order.pop()
                    self._preempt(victim, now)
                    preempted = True
                    if victim is r:
                        victim_self = True
                        break
                free = kv.free_count     # (nothing taken is pending now)
                if victim_self:
                    break
            free -= blocks
            budget -= c
            spec.append([r, k, 0])
            if k:                        # k + 1 query tokens after the context, like a prefill chunk
                s_tok += c
                s_sq += c * c
                s_pairs += c * comp + c * (c + 1) // 2
                v_n += 1
                v_ctx += comp
                if k > 0 and sp.fused:
                    if k > top:
                        cn += [0] * (k - top)
                        cc += [0] * (k - top)
                        top = k
                    cn[k] += 1
                    cc[k] += comp
                else:
                    xn += 1
                    xctx += comp
            else:                        # k = 0: a plain decode token
                s_dec += 1
                s_dctx += comp + 1
        if free < kv.free_count:
            kv.allocate(kv.free_count - free)
        nf = v_n - xn                    # fused rows drafting, and their context sum
        draft_s = self._draft_steps(cn, cc, nf, v_ctx - xctx, top) if nf and self.draft_model is not None else 0.0
        self._spec_sums = (s_tok, s_sq, s_pairs, v_n, v_ctx, s_dec, s_dctx, draft_s)
        return budget, preempted

    def _draft_curve(self):
        """n -> the drafter's step time of n decoders as a function of their context sum
        (dsim.latency.base.decode_curve: its step_time float for float), memoised per n."""
        dm = self.draft_model
        dc = self._draft_curves
        if dc is None or dc[0] is not dm:
            memo: dict = {}

            def curve(n):
                f = memo.get(n)
                if f is None:
                    f = memo[n] = decode_curve(dm, n, n)
                return f
            dc = self._draft_curves = (dm, curve)
        return dc[1]

    def _mixed_draft_time(self, spec) -> float:
        """Trees and several drafters: each drafter model runs its requests as one batch per draft
        step (step j: the tokens each request expands at level j, 1 for a chain, a tree's widths
        for a tree: dsim.specdec.tree); different drafters run one after the other."""
        groups: dict = {}
        for r, k, _ in spec:
            if k and r.spec.fused:
                tree = r.spec.tree
                model = r.spec.draft_model or self.draft_model
                groups.setdefault(id(model), (model, []))[1].append(
                    (tree.draft_steps(k) if tree is not None else [1] * k, r.num_computed))
        t = 0.0
        for model, rows in groups.values():
            j = 1
            while rows:
                tok = sum(steps[j - 1] for steps, _ in rows)
                ctx = sum(steps[j - 1] * (c + j) for steps, c in rows)
                t += model.step_time(BatchShape(decode_tokens=tok, decode_ctx_sum=ctx, num_sampled=tok,
                                                running=len(rows)))
                j += 1
                rows = [row for row in rows if len(row[0]) >= j]
        return t

    def _verified(self, spec, t_end: float, emit_t: float) -> None:
        """Emit accepted + 1 tokens per verified request, free the rejected positions' KV; each
        request is given the energy of its k + 1 verified tokens (the step's ``_step_wpt`` joules a
        token)."""
        bs = self.bs
        kb = self.kv_block_bytes
        wpt = self._step_wpt
        itl = self.itl_extra
        rt = spec[0][0].spec.rt
        fast = rt.fast_target(self)      # a target whose fused rounds take the short way
        if fast is not None and rt.one_pass:
            rt.fused_step(self, spec, t_end, emit_t, fast)       # the same, one pass (dsim.specdec.fusedstep)
            return
        if fast is None:
            tgt = rt.dist_target(self)
            if tgt is not None:
                rt.dist_step(self, spec, t_end, emit_t, tgt)     # the same, one pass (dsim.specdec.diststep)
                return
        for r, k, a in spec:
            old = r.num_computed
            new = old + a + 1
            held = -(-(old + k + 1) // bs)
            if held * kb > r.kv_peak_bytes:
                r.kv_peak_bytes = held * kb
            r.energy_j += (k + 1) * wpt
            drop = held - -(-new // bs)
            if drop:
                self.kv.free(drop, ())
            r.num_computed = new
            itl.append((t_end - r.t_last_token, 1))
            if a:
                itl.append((0.0, a))
            r.t_last_token = t_end
            r.n_out += a + 1
            last = r.n_out >= r.max_tokens
            if last:
                del self.spec_dec[r.rid]
            sp = r.spec
            if last:
                rt.round_done(sp, r, self, k, a, True)
                self._complete(r, new, emit_t)
            elif fast is not None:
                rt.fused_round(sp, r, self, k, a, fast)
            else:
                rt.round_done(sp, r, self, k, a, False)

