"""Multi-level speculation (seed 002 Appendix A item 3): drafters chained tiny -> mid -> target.

``speculation.levels`` lists drafters below the top drafter (``drafter`` on devices,
``fused_drafter`` or the EAGLE head on the targets), smallest first.  One round, for levels
L_0 .. L_{m-1} under the top drafter T (call it L_m):

* L_0 drafts k tokens (the gamma policy's k), k batch-1 decode steps of its model;
* each next level L_i (i = 1 .. m) verifies what the level below handed up, n_{i-1} tokens, in one
  forward of n_{i-1} + 1 query tokens after the context (the same chunk shape as the target's own
  verification), accepts a leading run a_{i-1} of them by L_{i-1}'s acceptance (each level's
  acceptance is against the next level up) and hands up n_i = a_{i-1} + 1: the accepted tokens and
  its own token at the first rejection (or after the last draft);
* the target verifies the top drafter's n_m tokens with ``speculation.acceptance`` (T against the
  target), as for a one-level round of k = n_m drafts.

Lossless speculative sampling makes L_i's output distributed as L_i's own samples, so the target's
acceptance of the n_m tokens is T's, position by position.  With n_0 = k and P_i(a | n) the
probability that level i accepts exactly a of n drafts (prod_{j<=a} p_j (1 - p_{a+1}), p_{n+1} = 0),
the distribution of what each level hands up is

    P(n_i = a + 1) = sum_n P(n_{i-1} = n) P_{i-1}(a | n)

and the expected tokens per target verify step is

    E[tau] = sum_n P(n_m = n) tau_T(n),   tau_T(n) = 1 + sum_{i=1..n} prod_{j<=i} q_j

(q: the target's acceptance of T's drafts).  ``expected_tokens`` computes it; the runtime samples
each level with its own stream (``specdec.levels``), so adding levels never shifts the target's draws.

Cost: where the round is drafted (the target GPU in fused rounds, the device in distributed ones),
each level's model by the roofline of that GPU or device; fused rounds of one step run each level as
one batch across the step's requests (L_0 one batch per draft position, each higher level one
forward of all the requests' chunks), levels one after the other.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config.errors import ConfigError
from ..latency.base import BatchShape
from ..latency.roofline import RooflineModel
from .acceptance import accepted_run, tokens_per_step


@dataclass(frozen=True)
class Level:
    name: str
    model: object                 # ModelSpec
    acceptance: object            # against the next level up
    acceptance_desc: dict


def accepted_dist(probs) -> list:
    """P(exactly a of len(probs) drafts accepted), a = 0 .. len(probs)."""
    out, run = [], 1.0
    for p in probs:
        out.append(run * (1.0 - p))
        run *= p
    out.append(run)
    return out


class Chain:
    """The levels below the top drafter (``levels[0]`` the smallest)."""

    def __init__(self, levels):
        self.levels = tuple(levels)

    def names(self, top: str) -> list:
        return [lv.name for lv in self.levels] + [top]

    def handed_up(self, ctx: int, k: int, temperature: float) -> list:
        """Distribution of the top drafter's tokens for the target: {n: probability}."""
        dist = {k: 1.0}
        for lv in self.levels:
            nxt: dict = {}
            for n, pn in dist.items():
                for a, pa in enumerate(accepted_dist(lv.acceptance.probabilities(ctx, n, temperature))):
                    nxt[a + 1] = nxt.get(a + 1, 0.0) + pn * pa
            dist = nxt
        return dist

    def expected_tokens(self, target_acceptance, ctx: int, k: int, temperature: float) -> float:
        """E[tau] above: mean tokens one target verify step emits for a round whose L_0 drafts k."""
        return sum(p * tokens_per_step(target_acceptance.probabilities(ctx, n, temperature))
                   for n, p in self.handed_up(ctx, k, temperature).items())

    def draw(self, rng, ctx: int, k: int, temperature: float) -> list:
        """One round's tokens handed up by each level: [n_0 = k, n_1, .., n_m] (n_m: the target's)."""
        out = [k]
        n = k
        for lv in self.levels:
            probs = lv.acceptance.probabilities(ctx, n, temperature)
            n = accepted_run(probs, rng.random(n)) + 1
            out.append(n)
        return out


def device_seconds(models, ctx: int, ns) -> float:
    """One round drafted alone (a device): L_0's k decode steps, then one chunk forward per level
    above it (``models``: the step-time models of L_0 .. L_m on the device; ``ns``: ``Chain.draw``)."""
    t = 0.0
    step0 = models[0].step_time
    for j in range(1, ns[0] + 1):
        t += step0(BatchShape(decode_tokens=1, decode_ctx_sum=ctx + j, num_sampled=1, running=1))
    for model, n in zip(models[1:], ns[:-1]):
        t += model.step_time(chunk_shape([(n + 1, ctx)]))
    return t


def chunk_shape(rows) -> BatchShape:
    """A forward of chunks (c query tokens after p context tokens each), one logit per position."""
    tok = sum(c for c, _ in rows)
    return BatchShape(prefill_tokens=tok, num_prefill=len(rows),
                      prefill_attn_pairs=sum(c * p + c * (c + 1) // 2 for c, p in rows),
                      prefill_ctx_tokens=sum(p for _, p in rows), num_sampled=tok,
                      prefill_chunk_sq=sum(c * c for c, _ in rows), running=len(rows))


def batch_seconds(models, rows) -> float:
    """A step's fused rounds (``rows``: (context, [n_0 .. n_m]) per request): L_0 one batch per draft
    position over the requests still drafting, then each level one forward of all their chunks."""
    t = 0.0
    live = [(c, ns[0]) for c, ns in rows if ns[0]]
    j = 1
    step0 = models[0].step_time
    while live:
        t += step0(BatchShape(decode_tokens=len(live), decode_ctx_sum=sum(c + j for c, _ in live),
                              num_sampled=len(live), running=len(live)))
        j += 1
        live = [x for x in live if x[1] >= j]
    for i, model in enumerate(models[1:]):
        chunks = [(ns[i] + 1, c) for c, ns in rows if ns[0]]
        if chunks:
            t += model.step_time(chunk_shape(chunks))
    return t


def load_levels(rows, path: str, base_dir, load_model, load_acceptance, target_vocab) -> Chain | None:
    """``speculation.levels`` (validated rows, or None) as a Chain, each drafter's vocabulary checked."""
    if rows is None:
        return None
    from ..config.schema.speculation import names
    out = []
    for i, (row, name) in enumerate(zip(rows, names(rows, "level"))):
        where = f"{path}[{i}]"
        model = load_model(row.drafter, f"{where}.drafter", base_dir)
        if target_vocab is not None and model.vocab_size != target_vocab:
            raise ConfigError(f"{where}.drafter", model.name, f"a drafter sharing the target's vocabulary "
                              f"({target_vocab} tokens, not {model.vocab_size})")
        acc, desc = load_acceptance(row.acceptance, f"{where}.acceptance", base_dir)
        out.append(Level(name, model, acc, desc))
    return Chain(out)


class LevelRounds:
    """The runtime's side of a chain (a mixin of ``SpecRuntime``): each round's draw, its drafting
    cost on the target GPU or the device, and the per-level counts for summary.json."""

    def _levels_init(self) -> None:
        chain = self.cfg.levels
        self.level_rng = self.sim.rng.stream("specdec.levels") if chain is not None else None
        self.level_counts = [[0, 0] for _ in chain.levels] if chain is not None else []   # [verified, accepted]
        self.level_drafted = 0           # L_0's drafted tokens
        self.level_rounds = 0

    def _levels_draw(self, st, r, k: int) -> int:
        """Draws the round's chain for L_0's k drafts; returns the top drafter's tokens for the target."""
        if k <= 0:
            st.levels_ns = None
            return k
        ns = self.cfg.levels.draw(self.level_rng, r.num_computed, k, st.temp)     # its request's own
        st.levels_ns = ns
        self.level_rounds += 1
        self.level_drafted += k
        for c, n, up in zip(self.level_counts, ns, ns[1:]):
            c[0] += n
            c[1] += up - 1
        return ns[-1]

    def _level_models(self, key, make, top) -> list:
        m = self._models.get(key)
        if m is None:
            m = self._models[key] = [make(lv.model) for lv in self.cfg.levels.levels] + [top]
        return m

    def _levels_fused_time(self, inst, spec) -> float:
        """The replica's ``draft_cost``: its fused rounds' chains, batched per level."""
        gpu = self._gpu[inst.name]
        models = self._level_models((inst.name, "levels"), lambda m: RooflineModel(m, gpu, 1), inst.draft_model)
        return batch_seconds(models, [(r.num_computed, r.spec.levels_ns) for r, k, _ in spec
                                      if k and r.spec.fused and r.spec.levels_ns is not None])

    def _levels_device_seconds(self, dev, ctx: int, ns) -> float:
        models = self._level_models((dev.group.name, "levels"), dev.prof.roofline, dev.step)
        return device_seconds(models, ctx, ns)

    def levels_summary(self, top: str) -> dict:
        """summary.json ``speculation.levels``: per level, what it verified from the level below and
        accepted (the target's own figures are the section's totals)."""
        chain = self.cfg.levels
        names = chain.names(top)
        out = {"rounds": self.level_rounds, names[0]: {"drafted_tokens": self.level_drafted}}
        for lv_name, (v, a) in zip(names[1:], self.level_counts):
            out[lv_name] = {"verified_tokens": v, "accepted_tokens": a, "acceptance_rate": a / v if v else None,
                            "tokens_handed_up_per_round": (a + self.level_rounds) / self.level_rounds
                            if self.level_rounds else None}
        return out
