"""The replica's speculative-decoding steps: drafting on the replica (fused drafters) and the
bookkeeping after a verification.  A mixin of ``Instance``: the drafts and the verify chunks are
costed inside its step; see dsim.serving.instance for how eager decoders enter a step."""
from __future__ import annotations

from ..latency.base import BatchShape, decode_curve


class SpeculativeSteps:
    _draft_curves = None                 # (draft model, n -> its decode curve): _draft_curve

    # ---- speculative decoders -----------------------------------------------------------------
    def _draft_time(self, spec) -> float:
        """Drafters on this replica draft k tokens one step at a time, batched across requests:
        draft step j runs every fused request with k >= j."""
        if self.draft_cost is not None:  # multi-level chains (dsim.specdec.levels)
            return self.draft_cost(self, spec)
        if self.mixed_drafts:
            return self._mixed_draft_time(spec)
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
        t = 0.0
        if not n:
            return t
        while not cn[top]:
            top -= 1
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

