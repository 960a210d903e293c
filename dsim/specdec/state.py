"""Per-conversation and per-target speculation state, the part of the runtime the replica reads.

Why its own module: the serving loop reads ``SpecState`` (k, ready, fused) on every step; the
runtime (dsim.specdec.runtime) writes it. Keeping the state apart keeps the runtime's module to the
rounds' logic.
"""
from __future__ import annotations

import math


ACC_PRIOR = 0.7     # a conversation's acceptance estimate before its first round


class SpecState:
    """Per-conversation round state; the replica reads ``k``, ``ready`` and ``fused``."""

    __slots__ = ("rt", "device", "k", "ready", "fused", "policy", "in_flight", "t_ready", "t_last", "rounds",
                 "drafted", "verified", "accepted", "tvt_max", "net_s", "acc_est", "last_k", "last_a",
                 "tpot_est", "fused_rounds", "dist_rounds", "rollbacks", "drafted_now", "speculative", "done_ev",
                 "tree", "first_at_server", "drafter", "escalations", "draft_model", "deadline", "fused_until",
                 "acc_carry", "rb_carry", "levels_ns", "temp", "acc", "acc_at", "kmemo")

    def __init__(self, rt, device, policy, speculative: bool):
        self.rt = rt
        self.device = device
        self.policy = policy
        self.speculative = speculative
        self.k = 0
        self.ready = False
        self.fused = False
        self.in_flight = False
        self.t_ready = self.t_last = 0.0
        self.rounds = self.drafted = self.verified = self.accepted = 0
        self.fused_rounds = self.dist_rounds = self.rollbacks = 0
        self.drafted_now = 0
        self.tvt_max = 0.0
        self.net_s = 0.0
        self.acc_est = ACC_PRIOR
        self.last_k = self.last_a = 0
        self.tpot_est = 0.0
        self.done_ev = None
        self.tree = None                 # this round's DraftTree (dsim.specdec.tree), None = a chain
        self.first_at_server = None      # the first token's server time (token times are shifted to the device)
        self.drafter = -1                # index in the portfolio (dsim.specdec.portfolio), -1 = none
        self.escalations = 0
        self.fused_until = -1.0          # hybrid mode's fused hysteresis: fused rounds until then
        self.acc_carry = 0.0             # acceptance_draws: expectation: the expected drafts not yet accepted
        self.rb_carry = 0.0              # ... and the expected rollbacks not yet charged
        self.draft_model = None          # this round's fused drafter when not the replica's own
        self.deadline = 0.0              # when this round's verification is due (verify_order: edf)
        self.levels_ns = None            # multi-level chains: this round's tokens per level (dsim.specdec.levels)
        self.temp = rt.cfg.temperature   # the temperature its acceptance is read at (its request's own, if any)
        self.acc = None                  # its conditioned acceptance model (dsim.specdec.conditioning), None = none
        self.acc_at = None               # (replica, drafter) that acc was looked up for
        self.kmemo = None                # its policy's gamma table at its temperature (context -> k; False = none),
                                         # looked up at its first one-pass round (dsim.specdec.fusedstep)

    @property
    def drafter_name(self) -> str:
        """The portfolio drafter this conversation is on ("" without a portfolio)."""
        return self.rt.cfg.portfolio.drafters[self.drafter].name if self.drafter >= 0 else ""

    def accept(self, r, k: int):
        return self.rt.accept(self, r, k)

    def accept_all(self, rows) -> float:
        """A step's verifications at once: sets ``row[2]`` (accepted drafts) of every (r, k, _) row
        and returns the extra step seconds (rollback penalties)."""
        return self.rt.accept_rows(rows)

    def round_done(self, r, inst, k: int, a: int, last: bool) -> None:
        self.rt.round_done(self, r, inst, k, a, last)


class TargetState:
    """Per-target replica speculation state: its policy, its fused drafter's warm/cold status, the
    verify queue and a controller's override."""

    __slots__ = ("policy", "warm_until", "loading", "cold_starts", "load_s", "ready_n", "override", "verified",
                 "accepted", "rounds", "drafter")

    def __init__(self, policy, warm: bool, load_s: float):
        self.policy = policy
        self.warm_until = math.inf if warm else -math.inf
        self.loading = None
        self.cold_starts = 0
        self.load_s = load_s
        self.ready_n = 0                 # conversations whose drafts wait at this target (verify queue)
        self.verified = 0                # drafts verified here so far (controllers read acceptance per window)
        self.accepted = 0
        self.rounds = 0                  # verified rounds (a router reads tokens per verify step)
        self.drafter = None              # a SetDrafter action's portfolio index for this pool, None = none
        self.override = None             # (mode or None, k or None) set by a SetSpeculation action
