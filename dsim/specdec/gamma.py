"""Speculation-length (gamma) policies: ``choose(telemetry) -> (mode, k)`` before a round and
``observe(...)`` after it.  Pure decision rules over the telemetry they are handed (seed 002 sections
5.5, 6.1, 6.4.1 and Appendix B); the verification loop that calls them is a separate piece.

mode is "distributed" (drafts on the device), or "fused" (the target drafts for itself);
every policy keeps k in [k_min, k_max].
"""
from __future__ import annotations

import math
from collections import deque
from typing import NamedTuple

import numpy as np

DISTRIBUTED, FUSED = "distributed", "fused"


class Telemetry(NamedTuple):
    """What a policy may see when it chooses the next round's k."""
    context_len: int = 0
    last_gamma: int = 0            # drafts sent last round (0: first round)
    last_accepted: int = 0         # of them accepted
    acceptance_est: float = 0.0    # smoothed per-token acceptance of this conversation
    verify_queue: int = 0          # requests waiting at the verifier
    kv_utilization: float = 0.0    # verifier KV in use, [0, 1]
    rtt_ms: float = 0.0
    tpot_ms: float = 0.0
    slo_tpot_ms: float = 0.0
    temperature: float = 0.0


class _Clamp:
    def __init__(self, k_min: int = 1, k_max: int = 8):
        if not 1 <= k_min <= k_max:
            raise ValueError("need 1 <= k_min <= k_max")
        self.k_min, self.k_max = int(k_min), int(k_max)

    def clamp(self, k) -> int:
        return int(min(self.k_max, max(self.k_min, k)))

    def observe(self, *_a, **_k) -> None:
        return None

    def on_round(self, k: int, accepted: int, round_s: float, rtt_ms: float, tpot_ms: float,
                 slo_hit: bool) -> None:
        """Feedback after a verified round (k drafts, ``accepted`` of them, ``round_s`` long)."""
        return None

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        # the runtime skips building on_round's arguments (an RTT lookup per round) for policies
        # that ignore them
        cls.wants_feedback = cls.on_round is not _Clamp.on_round
        # a subclass that decides k in its own choose() and says nothing of k_for must not inherit
        # its parent's k_for: the fused fast path would ask that instead and skip its choose()
        if "choose" in cls.__dict__ and "k_for" not in cls.__dict__:
            cls.k_for = None
        # likewise a subclass with its own k_for and no table of its own: its parent's table (read
        # before asking k_for) would hold the parent's choices, not its own
        if "k_for" in cls.__dict__ and "k_memo" not in cls.__dict__:
            cls.k_memo = _Clamp.k_memo

    wants_feedback = False
    # policies whose k is a function of (context, temperature) alone say so with ``k_for``: the
    # runtime's fused fast path asks it without building a Telemetry each round
    k_for = None

    def k_memo(self, temperature: float):
        """The dict (context -> k) that ``k_for`` fills at ``temperature``, for readers that look a
        choice up before asking (dsim.specdec.fusedstep); None: no such table, ask ``k_for``."""
        return None


class StaticGamma(_Clamp):
    def __init__(self, k: int = 4, mode: str = DISTRIBUTED):
        super().__init__(k, k)
        self.mode = mode

    def choose(self, t: Telemetry):
        return self.mode, self.k_min

    def k_for(self, context_len: int, temperature: float) -> int:
        return self.k_min


class AcceptanceBackoff(_Clamp):
    """AIMD on the last round: every draft accepted -> k + 1; fewer than half accepted -> k halved
    (floor k_min); otherwise unchanged.  First round: ``k0``."""

    def __init__(self, k0: int = 4, k_min: int = 1, k_max: int = 8):
        super().__init__(k_min, k_max)
        self.k0 = self.clamp(k0)

    def choose(self, t: Telemetry):
        if t.last_gamma <= 0:
            return DISTRIBUTED, self.k0
        if t.last_accepted >= t.last_gamma:
            return DISTRIBUTED, self.clamp(t.last_gamma + 1)
        if 2 * t.last_accepted < t.last_gamma:
            return DISTRIBUTED, self.clamp(t.last_gamma // 2)
        return DISTRIBUTED, self.clamp(t.last_gamma)


class SpecPP(_Clamp):
    """SpecDec++-style stopping: draft while the predicted probability that some draft so far is
    rejected, 1 - prod_{j<i} a_j, stays at or below ``threshold``.

    The rule keeps the last length that passed (seed 002 Appendix B: assigning the candidate before
    the test made gamma one too long)."""

    MEMO_MAX = 1 << 16

    def __init__(self, acceptance, threshold: float = 0.7, k_min: int = 1, k_max: int = 8, memo=None):
        """``memo``: a dict (temperature -> context -> k) shared by the policies of one configuration
        (one per conversation): the choice is a function of (context, temperature) alone, asked
        every round."""
        super().__init__(k_min, k_max)
        if not 0 < threshold < 1:
            raise ValueError("threshold must be in (0, 1)")
        self.acc, self.threshold = acceptance, threshold
        self._memo = memo if memo is not None else {}

    def choose(self, t: Telemetry):
        return DISTRIBUTED, self.k_for(t.context_len, t.temperature)

    def k_for(self, context_len: int, temperature: float) -> int:
        by_ctx = self._memo.get(temperature)
        if by_ctx is None:
            by_ctx = self._memo[temperature] = {}
        k = by_ctx.get(context_len)
        if k is None:
            k = self._choose(context_len, temperature)
            if len(by_ctx) < self.MEMO_MAX:
                by_ctx[context_len] = k
        return k

    def k_memo(self, temperature: float):
        by_ctx = self._memo.get(temperature)
        if by_ctx is None:
            by_ctx = self._memo[temperature] = {}
        return by_ctx

    def _choose(self, context_len, temperature) -> int:
        probs = self.acc.probabilities(context_len, self.k_max, temperature)
        keep = 1.0
        selected = self.k_min
        for idx in range(1, self.k_max + 1):
            keep *= probs[idx - 1]
            if 1.0 - keep > self.threshold:
                selected = max(self.k_min, idx - 1)
                break
            selected = idx
        return selected


class LatencyHead(_Clamp):
    """Seed 002 6.4.1: gamma_hat = w . x + b (or a one-hidden-layer SiLU MLP, or that layer in the
    design's residual block y = x + V SiLU(W x + c), gamma_hat = w . y + b) over a 3-sample history
    of (tpot_ms, rtt_ms, gamma, slo_hit); clamped to [1, k_max], exponentially smoothed; a smoothed
    value <= ``fused_below`` means fused mode.  Features: [queue_util, queue_trend, tpot_avg,
    tpot_delta, rtt_avg, rtt_delta, acceptance_est, slo_tpot, last_gamma]."""
    FEATURES = ("queue_util", "queue_trend", "tpot_avg_ms", "tpot_delta_ms", "rtt_avg_ms", "rtt_delta_ms",
                "acceptance_est", "slo_tpot_ms", "last_gamma")      # features()'s order (and oracle.csv's)
    N_FEATURES = len(FEATURES)

    def __init__(self, weights, bias: float = 0.0, hidden=None, k_max: int = 8, smoothing: float = 1.0,
                 fused_below: float = 1.5, default_k: int = 4, history: int = 3, queue_capacity: int = 64,
                 fused_k: int = 1, residual=None):
        super().__init__(1, k_max)
        self.fused_k = self.clamp(fused_k)    # drafts per fused round (a trained head's most common fused label)
        self.w = np.asarray(weights, float)
        self.b = float(bias)
        self.hidden = None
        if hidden is not None:           # [W (units, features), c (units)]; a reversed pair was an IndexError
            shape = f"hidden must be [weights (units, {self.N_FEATURES}), biases (units)]"
            if not isinstance(hidden, (list, tuple)) or len(hidden) != 2:
                raise ValueError(shape)
            self.hidden = (np.asarray(hidden[0], float), np.asarray(hidden[1], float))
            W, c = self.hidden
            if W.ndim != 2 or W.shape[1] != self.N_FEATURES or c.shape != (W.shape[0],):
                raise ValueError(shape)
        self.residual = None
        if residual is not None:         # V (features, units): the block adds V SiLU(W x + c) to x
            self.residual = np.asarray(residual, float)
            if self.hidden is None or self.residual.shape != (self.N_FEATURES, self.hidden[0].shape[0]):
                raise ValueError(f"residual must be [{self.N_FEATURES} rows of one weight per hidden unit] "
                                 "beside a hidden layer")
        want = self.hidden[0].shape[0] if self.hidden is not None and self.residual is None else self.N_FEATURES
        if self.w.shape != (want,):
            raise ValueError(f"weights must have {want} entries")
        self.alpha = float(smoothing)
        self.fused_below = float(fused_below)
        self.default_k = self.clamp(default_k)
        self.hist: deque = deque(maxlen=history)
        self.queue_capacity = queue_capacity
        self.prev = None
        self.last_queue = None
        self.last_x = None               # the features of the last decision (None before the history fills)

    def observe(self, tpot_ms: float, rtt_ms: float, gamma: int, slo_hit: bool = True) -> None:
        self.hist.append((float(tpot_ms), float(rtt_ms), int(gamma), bool(slo_hit)))

    def on_round(self, k, accepted, round_s, rtt_ms, tpot_ms, slo_hit) -> None:
        self.observe(tpot_ms, rtt_ms, max(1, k), slo_hit)

    def features(self, t: Telemetry) -> np.ndarray:
        tp = [h[0] for h in self.hist]
        rt = [h[1] for h in self.hist]
        q = t.verify_queue / self.queue_capacity
        trend = 0.0 if self.last_queue is None else q - self.last_queue
        self.last_queue = q
        return np.array([q, trend, np.mean(tp), tp[-1] - tp[0], np.mean(rt), rt[-1] - rt[0],
                         t.acceptance_est, t.slo_tpot_ms, self.hist[-1][2]])

    def raw(self, x: np.ndarray) -> float:
        if self.hidden is not None:
            W, c = self.hidden
            z = W @ x + c
            h = z / (1.0 + np.exp(-z))             # SiLU
            x = h if self.residual is None else x + self.residual @ h
        return float(self.w @ x + self.b)

    def choose(self, t: Telemetry):
        if len(self.hist) < 2:
            return DISTRIBUTED, self.default_k
        self.last_x = x = self.features(t)
        g = min(float(self.k_max), max(1.0, self.raw(x)))
        g = g if self.prev is None else self.alpha * g + (1 - self.alpha) * self.prev
        self.prev = g
        if g <= self.fused_below:
            return FUSED, self.fused_k
        return DISTRIBUTED, self.clamp(round(g))


class Backpressure(_Clamp):
    """Shrink k by one when the verify queue exceeds ``queue_high`` or KV use exceeds ``kv_high``;
    grow it by one when the queue is below ``queue_low`` and acceptance is at least ``confident``."""

    def __init__(self, k0: int = 4, k_min: int = 1, k_max: int = 8, queue_high: int = 16, queue_low: int = 4,
                 kv_high: float = 0.9, confident: float = 0.6):
        super().__init__(k_min, k_max)
        self.k = self.clamp(k0)
        self.qh, self.ql, self.kvh, self.conf = queue_high, queue_low, kv_high, confident

    def choose(self, t: Telemetry):
        if t.verify_queue > self.qh or t.kv_utilization > self.kvh:
            self.k = self.clamp(self.k - 1)
        elif t.verify_queue < self.ql and t.acceptance_est >= self.conf:
            self.k = self.clamp(self.k + 1)
        return DISTRIBUTED, self.k


class PIDGamma(_Clamp):
    """k = round(k0 + Kp e + Ki sum e + Kd (e - e_prev)), e = target_queue - verify_queue (a longer
    queue than wanted drives k down); the integral is frozen while k is saturated (anti-windup)."""

    def __init__(self, k0: int = 4, k_min: int = 1, k_max: int = 8, target_queue: float = 8.0,
                 kp: float = 0.25, ki: float = 0.02, kd: float = 0.0):
        super().__init__(k_min, k_max)
        self.k0, self.target = k0, target_queue
        self.kp, self.ki, self.kd = kp, ki, kd
        self.integral, self.prev_e = 0.0, None

    def choose(self, t: Telemetry):
        e = self.target - t.verify_queue
        d = 0.0 if self.prev_e is None else e - self.prev_e
        self.prev_e = e
        u = self.k0 + self.kp * e + self.ki * (self.integral + e) + self.kd * d
        k = self.clamp(round(u))
        if k == round(u):                          # not saturated: integrate
            self.integral += e
        return DISTRIBUTED, k


class BanditGamma(_Clamp):
    """UCB1 over arms k_min..k_max; reward = tokens emitted per second of the round (observe)."""

    def __init__(self, k_min: int = 1, k_max: int = 8, c: float = 1.0):
        super().__init__(k_min, k_max)
        self.arms = list(range(self.k_min, self.k_max + 1))
        self.n = {k: 0 for k in self.arms}
        self.mean = {k: 0.0 for k in self.arms}
        self.c = c
        self.t = 0

    def choose(self, t: Telemetry):
        for k in self.arms:
            if self.n[k] == 0:
                return DISTRIBUTED, k
        scale = max(self.mean.values()) or 1.0
        best = max(self.arms, key=lambda k: (self.mean[k] / scale
                                             + self.c * math.sqrt(2 * math.log(self.t) / self.n[k]), -k))
        return DISTRIBUTED, best

    def on_round(self, k, accepted, round_s, rtt_ms, tpot_ms, slo_hit) -> None:
        if k >= self.k_min:
            self.observe(k, (accepted + 1) / max(round_s, 1e-9))

    def observe(self, k: int, reward: float) -> None:
        self.t += 1
        self.n[k] += 1
        self.mean[k] += (reward - self.mean[k]) / self.n[k]
