"""Acceptance conditioned per request (seed 002 sections 1 and 5.4): its sampling temperature and
top_p, its domain label, and the pool verifying it.

Why: acceptance depends on the drafter/verifier pair *and* on what is asked and how it is sampled.
Published figures show it: EAGLE-3 on Llama-3.1-8B emits 6.74 tokens per verify step on HumanEval
but 6.13 on MT-bench at T=0, and 5.82 / 4.24 at T=1 (EAGLE-3 paper, Table 1); a Llama-3.2-1B
drafter accepts its first draft on 84 % of HumanEval steps but 62 % of writing steps
(vllm-project/speculators issue 1135).  One scenario-wide curve averages a code tenant and a chat
tenant into a rate neither of them sees.

- temperature: the request's own (a tenant's key or a trace column), else speculation.temperature;
  the curves interpolate between the temperatures they were measured at (dsim.specdec.acceptance).
- domain / pool: ``speculation.acceptance_rules``, first match wins, else speculation.acceptance.
- top_p (no published acceptance-by-top_p figures exist to fit): nucleus sampling keeps the
  smallest set of tokens holding top_p of the mass, so as top_p falls the sampled token tends to
  the argmax and speculative sampling's acceptance to its greedy value; at top_p = 1 the curve at
  the temperature applies unchanged.  The rule is the linear blend of those two ends, per draft
  position:  a(T, top_p) = a(0) + top_p x (a(T) - a(0)).  It moves nothing at T = 0 (or on a
  curve measured at one temperature only) and is a modelling assumption, stated as such in
  docs/specdec.md.
"""
from __future__ import annotations

from functools import lru_cache


class TopP:
    """An acceptance model read under nucleus sampling: ``a(0) + top_p (a(T) - a(0))`` per position."""

    def __init__(self, base, top_p: float):
        self.base = base
        self.top_p = float(top_p)
        self.probabilities = lru_cache(maxsize=4096)(self._probabilities)

    def _probabilities(self, context_len: int = 0, k: int = 1, temperature: float | None = None) -> tuple:
        hot = self.base.probabilities(context_len, k, temperature)
        if not temperature:
            return hot
        greedy = self.base.probabilities(context_len, k, 0.0)
        p = self.top_p
        return tuple(g + p * (h - g) for g, h in zip(greedy, hot))


class Conditioning:
    """The acceptance model and temperature of each conversation, from its request's sampling
    parameters and domain and the pool it is verified on."""

    def __init__(self, cfg, pool_of: dict):
        self.cfg = cfg
        self.rules = cfg.rules                  # [(domain or None, pool or None, model)]
        self.pool_of = pool_of                  # replica name -> pool name
        self.by_pool = any(p is not None for _, p, _ in self.rules)
        self._memo: dict = {}

    @staticmethod
    def wanted(cfg, reqs) -> bool:
        """Is any conditioning configured (else the runtime keeps its unconditioned fast paths)?"""
        return bool(cfg.rules) or cfg.top_p != 1.0 or any(r.sampling is not None for r in reqs)

    def temperature(self, r) -> float:
        s = r.sampling
        return self.cfg.temperature if s is None or s[0] is None else s[0]

    def model(self, r, base, replica: str | None = None):
        """The model for request r verified on ``replica`` (None: not yet routed, pool rules skipped);
        ``base``: the model without rules (the scenario's, or the portfolio drafter's)."""
        s = r.sampling
        domain = s[2] if s is not None else ""
        top_p = self.cfg.top_p if s is None or s[1] is None else s[1]
        pool = self.pool_of.get(replica) if self.by_pool and replica is not None else None
        key = (domain, pool, top_p, id(base))
        m = self._memo.get(key)
        if m is None:
            m = base
            for d, p, acc in self.rules:
                if (d is None or d == domain) and (p is None or p == pool):
                    m = acc
                    break
            if top_p != 1.0:
                m = TopP(m, top_p)
            self._memo[key] = m
        return m
