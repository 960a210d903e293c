"""Verify cohorts and shape divergence (seed 002 section 3.2 and Appendix A item 5): which ready
rounds a target step verifies together, and what mixing context lengths in one step costs.

Cost model (``speculation.verify_attention``):

* ``exact`` (the default): each verify row's attention is costed at its own context and chunk,
  as a variable-length (paged) attention kernel runs it;
* ``padded``: verify rows run as static-shape batches, every row padded to its batch's longest
  context P and longest chunk C (k + 1 query tokens): a row of chunk c after p context tokens is
  charged C P + C (C + 1) / 2 query-key pairs and P context tokens of KV reads instead of
  c p + c (c + 1) / 2 and p.  The linear layers still see the real tokens.  Under ``fcfs`` and
  ``edf`` a step's verify rows are one batch.  The padding, summed over the run, is the
  shape-divergence cost summary.json reports (``speculation.verify_cohorts``).

Grouping (``speculation.verify_order: context_cohort``): a round's cohort is the power-of-two bin
of its context (``num_computed.bit_length()``, the bins of ``acceptance_by_context``), so contexts
in one cohort differ by less than 2x.  A step's verify rows form one batch per cohort, each padded
to its own longest context and chunk only.  Under token-budget pressure the step serves the cohort
of the round that has waited longest (earliest ``t_ready``) first, then the others in the
scheduler's order.  Each extra batch is assumed to cost nothing beyond its attention (no launch
overhead is charged), which is the favourable case for grouping.
"""
from __future__ import annotations


def cohort(r) -> int:
    """A ready round's cohort: the power-of-two bin of its context."""
    return r.num_computed.bit_length()


def cohort_first(order) -> list:
    """``order`` with the ready rounds of the longest-waiting ready round's cohort first (stable)."""
    head = None
    for r in order:
        sp = r.spec
        if sp is not None and sp.ready and not r.prefilling and (head is None or sp.t_ready < head.spec.t_ready):
            head = r
    if head is None:
        return order
    c = cohort(head)
    return sorted(order, key=lambda r: not (r.spec is not None and r.spec.ready and not r.prefilling
                                            and cohort(r) == c))


def padding(rows, grouped: bool) -> tuple:
    """(extra query-key pairs, extra context tokens) of padding a step's verify rows ([r, k, _] with
    k > 0) to their batch's longest context and chunk: one batch, or one per cohort (``grouped``)."""
    batches: dict = {}
    for row in rows:
        k = row[1]
        if k:
            r = row[0]
            batches.setdefault(cohort(r) if grouped else 0, []).append((r.num_computed, k + 1))
    pairs = ctx = 0
    for b in batches.values():
        big_p = max(p for p, _ in b)
        big_c = max(c for _, c in b)
        full = big_c * big_p + big_c * (big_c + 1) // 2
        for p, c in b:
            pairs += full - (c * p + c * (c + 1) // 2)
            ctx += big_p - p
    return pairs, ctx


class CohortSteps:
    """The runtime's side (a mixin of ``SpecRuntime``): installs the hooks on each replica and counts
    the verify attention's exact and padded pairs for summary.json."""

    def _cohorts_init(self) -> None:
        self.attn_exact = 0              # query-key pairs the verify rows need
        self.attn_padding = 0            # ... and the padding added to them (verify_attention: padded)
        self.cohort_steps = 0            # steps that verified rounds
        self.cohort_mixed = 0            # ... with rounds of more than one cohort (one batch each when grouped)

    def _cohorts_setup(self, inst) -> None:
        if self.cfg.verify_order == "context_cohort":
            inst.verify_cohort = cohort_first
        if self.cfg.verify_attention == "padded" or self.cfg.verify_order == "context_cohort":
            inst.verify_padding = self._padding

    def _padding(self, rows) -> tuple:
        """The replica's ``verify_padding``: counts the step's divergence, returns the padding to
        charge (none under ``exact``)."""
        seen = set()
        exact = 0
        for row in rows:
            k = row[1]
            if k:
                p, c = row[0].num_computed, k + 1
                exact += c * p + c * (c + 1) // 2
                seen.add(row[0].num_computed.bit_length())
        if not seen:
            return 0, 0
        pairs, ctx = padding(rows, self.cfg.verify_order == "context_cohort")
        self.attn_exact += exact
        self.attn_padding += pairs
        self.cohort_steps += 1
        self.cohort_mixed += len(seen) > 1
        return (pairs, ctx) if self.cfg.verify_attention == "padded" else (0, 0)

    def cohorts_summary(self) -> dict:
        return {"verify_order": self.cfg.verify_order, "verify_attention": self.cfg.verify_attention,
                "steps": self.cohort_steps, "steps_with_several_cohorts": self.cohort_mixed,
                "exact_attention_pairs": self.attn_exact, "padding_attention_pairs": self.attn_padding,
                "padding_share": self.attn_padding / (self.attn_exact + self.attn_padding)
                if self.attn_exact else None}
