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

    def index(self, name: str) -> int:
        """The index of the drafter called ``name`` (ValueError naming the drafters)."""
        for i, d in enumerate(self.drafters):
            if d.name == name:
                return i
        raise ValueError(f"drafter: expected one of {', '.join(d.name for d in self.drafters)}, got {name!r}")

    def escalate(self, idx: int, acc_est: float) -> bool:
        """Move up one drafter now? (strictly below the threshold, and a larger drafter exists)"""
        return self.escalate_below is not None and idx < len(self.drafters) - 1 and acc_est < self.escalate_below


def load_portfolio(cfg, path: str, base_dir, load_model, load_acceptance, target_vocab) -> Portfolio | None:
    """Build ``speculation.portfolio`` from its validated section (dsim.config.schema.speculation:
    PromptTokensPortfolio | AcceptancePortfolio, or None): loads each drafter's model and acceptance
    and checks its vocabulary against the target's (path-qualified ConfigError)."""
    if cfg is None:
        return None
    from ..config.schema.speculation import names
    out = []
    for i, (d, name) in enumerate(zip(cfg.drafters, names(cfg.drafters, "drafter"))):
        where = f"{path}.drafters[{i}]"
        model = load_model(d.drafter, f"{where}.drafter", base_dir)
        if target_vocab is not None and model.vocab_size != target_vocab:
            raise ConfigError(f"{where}.drafter", model.name,
                              f"a drafter sharing the target's vocabulary ({target_vocab} tokens, not {model.vocab_size})")
        acc, desc = load_acceptance(d.acceptance, f"{where}.acceptance", base_dir)
        out.append(Drafter(name, model, acc, desc))
    if cfg.choose == "prompt_tokens":
        return Portfolio(tuple(out), cfg.choose, tuple(cfg.prompt_tokens), 0.0, 4, cfg.escalate_below)
    return Portfolio(tuple(out), cfg.choose, (), cfg.min_tokens_per_step, cfg.k, cfg.escalate_below)
