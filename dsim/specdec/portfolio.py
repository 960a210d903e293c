"""A drafter portfolio (seed 002 section 6.1): several drafters, each with its own model and
acceptance, chosen per request and escalated mid-decode.

Why: a tiny drafter is cheap but accepts little on hard text; a larger one accepts more but costs
more per draft token.  A portfolio starts each conversation on the drafter its prompt calls for
and moves it one drafter up, at a round boundary, when its smoothed acceptance falls below
``escalate_below`` (the conversation's acceptance estimate then starts afresh).

Choice rules (``choose``):

* ``prompt_tokens``: ``prompt_tokens: [t_1, .., t_{n-1}]`` ascending; a prompt of at most t_1
  tokens gets the first drafter, at most t_2 the second, ..., longer ones the last.
* ``acceptance``: the first drafter (list them smallest first) whose predicted tokens per verify
  step at the prompt's length and ``k`` reaches ``min_tokens_per_step``, else the last.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config.errors import ConfigError
from ..config.fields import Section
from ..config.limits import MAX_SPEC_K
from .acceptance import tokens_per_step


@dataclass(frozen=True)
class Drafter:
    name: str
    model: object                 # ModelSpec
    acceptance: object            # an acceptance model (dsim.specdec.acceptance)
    acceptance_desc: dict


@dataclass(frozen=True)
class Portfolio:
    drafters: tuple
    choose: str
    thresholds: tuple             # prompt_tokens rule
    min_tokens_per_step: float    # acceptance rule
    k: int                        # the k the acceptance rule predicts at
    escalate_below: float | None

    def first(self, prompt_len: int, temperature: float) -> int:
        """Index of the drafter a new conversation starts on."""
        if self.choose == "prompt_tokens":
            for i, t in enumerate(self.thresholds):
                if prompt_len <= t:
                    return i
            return len(self.drafters) - 1
        for i, d in enumerate(self.drafters):
            if tokens_per_step(d.acceptance.probabilities(prompt_len, self.k, temperature)) >= self.min_tokens_per_step:
                return i
        return len(self.drafters) - 1

    def escalate(self, idx: int, acc_est: float) -> bool:
        """Move up one drafter now? (strictly below the threshold, and a larger drafter exists)"""
        return self.escalate_below is not None and idx < len(self.drafters) - 1 and acc_est < self.escalate_below


def load_portfolio(raw, path: str, base_dir, load_model, load_acceptance, target_vocab) -> Portfolio | None:
    """Parse ``speculation.portfolio`` (path-qualified ConfigError on any bad key)."""
    if raw is None:
        return None
    s = Section(raw, path)
    rows = s.raw("drafters")
    if not isinstance(rows, list) or len(rows) < 2:
        raise ConfigError(s.sub("drafters"), rows, "a list of at least two drafters, smallest first")
    out, names = [], set()
    for i, row in enumerate(rows):
        d = Section(row, f"{s.sub('drafters')}[{i}]")
        name = d.str("name", f"drafter{i}")
        if name in names:
            raise ConfigError(d.sub("name"), name, "a name used by one drafter only")
        names.add(name)
        model = load_model(d.raw("drafter"), d.sub("drafter"), base_dir)
        if target_vocab is not None and model.vocab_size != target_vocab:
            raise ConfigError(d.sub("drafter"), model.name,
                              f"a drafter sharing the target's vocabulary ({target_vocab} tokens, not {model.vocab_size})")
        acc, desc = load_acceptance(d.raw("acceptance", None), d.sub("acceptance"), base_dir)
        d.done()
        out.append(Drafter(name, model, acc, desc))
    choose = s.str("choose", "prompt_tokens", choices=("prompt_tokens", "acceptance"))
    thresholds = ()
    min_tps, k = 0.0, 4
    if choose == "prompt_tokens":
        th = s.raw("prompt_tokens", [])
        if (not isinstance(th, list) or len(th) != len(out) - 1
                or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in th)
                or list(th) != sorted(th)):
            raise ConfigError(s.sub("prompt_tokens"), th, f"{len(out) - 1} ascending positive token counts "
                              "(one boundary between each pair of drafters)")
        thresholds = tuple(th)
    else:
        min_tps = s.num("min_tokens_per_step", lo=1, hi=MAX_SPEC_K + 1)
        k = s.int("k", 4, lo=1, hi=MAX_SPEC_K)
    esc = s.num("escalate_below", None, lo=0, hi=1)
    s.done()
    return Portfolio(tuple(out), choose, thresholds, min_tps, k, esc)
