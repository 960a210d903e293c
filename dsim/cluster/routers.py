"""Routers: pick a replica (or a cluster) for a request from read-only load views.

A view exposes ``queue_depth`` (waiting + running + accepted but not yet queued, as the replica
last reported it), ``waiting``, ``running``, ``kv_usage`` (fraction of KV blocks in use),
``outstanding`` (requests this gateway sent and has not seen finish: always fresh),
``pending_tokens`` (the gateway's estimate of the work it sent and has not seen finish),
``capacity`` (relative speed, tokens/s), ``cached_prefix(request)`` (prompt tokens the
replica's prefix cache holds) and ``spec_counts`` (a speculative replica's verified rounds and
accepted drafts so far, else None).  With ``staleness_s > 0`` the replica-reported fields are
snapshots refreshed every ``staleness_s`` seconds, as a gateway scraping metrics sees them.

Each router draws from its own RNG stream, so changing one router never shifts another's draws.
Ties are broken at random (JSQ, least-KV, ...) so equal replicas share load evenly.
"""
from __future__ import annotations

import math

from ..config.errors import ConfigError


class Router:
    """Base class: ``choose(request, candidates) -> candidate``.  Subclasses set ``name``."""
    counts_only = False      # True: reads only queue counts of its candidates (queue_depth, outstanding)

    name = ""

    def __init__(self, rng):
        self.rng = rng

    def choose(self, request, candidates):
        """Return one of ``candidates`` (read-only views; see the module docstring)."""
        raise NotImplementedError

    def routed_work(self, request) -> float:
        """The work (tokens) the gateway books for a routed request: prompt + output length."""
        return request.prompt_len + request.max_tokens

    def _argmin(self, candidates, key):
        return self._pick_min(candidates, map(key, candidates))

    def _pick_min(self, candidates, keys):
        """The candidate of the smallest key (``keys`` in the candidates' order); ties at random."""
        best = None
        ties = []
        for c, k in zip(candidates, keys):
            if best is None or k < best:
                best, ties = k, [c]
            elif k == best:
                ties.append(c)
        if len(ties) == 1:
            return ties[0]
        return ties[int(self.rng.integers(len(ties)))]


class RandomRouter(Router):
    name = "random"
    counts_only = True

    def choose(self, request, candidates):
        return candidates[int(self.rng.integers(len(candidates)))]


class RoundRobin(Router):
    name = "round_robin"
    counts_only = True

    def __init__(self, rng):
        super().__init__(rng)
        self.i = -1

    def choose(self, request, candidates):
        self.i = (self.i + 1) % len(candidates)
        return candidates[self.i]


class LeastOutstanding(Router):
    """Fewest requests in flight as counted by the gateway itself (never stale)."""
    name = "least_outstanding"
    counts_only = True

    def choose(self, request, candidates):
        return self._argmin(candidates, lambda c: c.outstanding)


class JSQ(Router):
    """Join the shortest queue: smallest replica-reported queue depth."""
    name = "jsq"
    counts_only = True

    def choose(self, request, candidates):
        return self._pick_min(candidates, [c.queue_depth for c in candidates])


class JIQ(Router):
    """Join the idle queue: a random idle replica if any, otherwise a random one."""
    name = "jiq"
    counts_only = True

    def choose(self, request, candidates):
        idle = [c for c in candidates if c.queue_depth == 0]
        pool = idle or candidates
        return pool[int(self.rng.integers(len(pool)))]


class PowerOfTwo(Router):
    """Sample two distinct replicas uniformly, keep the shorter queue."""
    name = "power_of_two"

    def choose(self, request, candidates):
        n = len(candidates)
        if n == 1:
            return candidates[0]
        i, j = self.rng.choice(n, 2, replace=False)
        a, b = candidates[int(i)], candidates[int(j)]
        return b if b.queue_depth < a.queue_depth else a


class WeightedPowerOfTwo(Router):
    """Sample two distinct replicas with probability proportional to capacity; keep the one with
    the smaller queue per unit of capacity (fast replicas are both sampled and kept more often)."""
    name = "weighted_power_of_two"

    def choose(self, request, candidates):
        n = len(candidates)
        if n == 1:
            return candidates[0]
        w = [c.capacity for c in candidates]
        tot = sum(w)
        i, j = self.rng.choice(n, 2, replace=False, p=[x / tot for x in w])
        a, b = candidates[int(i)], candidates[int(j)]
        return b if (b.queue_depth + 1) / b.capacity < (a.queue_depth + 1) / a.capacity else a


class LeastKV(Router):
    """Lowest KV-cache usage; queue depth breaks ties."""
    name = "least_kv"

    def choose(self, request, candidates):
        return self._argmin(candidates, lambda c: (c.kv_usage, c.queue_depth))


class PrefixAffinity(Router):
    """Longest cached prefix wins; queue depth breaks ties.  ``max_queue_gap`` (optional): ignore
    the cache when the best-cached replica's queue exceeds the shortest by more than this."""
    name = "prefix_affinity"

    def __init__(self, rng, max_queue_gap=None):
        super().__init__(rng)
        self.gap = max_queue_gap

    def choose(self, request, candidates):
        best = self._argmin(candidates, lambda c: (-c.cached_prefix(request), c.queue_depth))
        if self.gap is not None:
            shortest = min(c.queue_depth for c in candidates)
            if best.queue_depth - shortest > self.gap:
                return self._argmin(candidates, lambda c: c.queue_depth)
        return best


class SemiClairvoyant(Router):
    """Least pending work per unit of capacity, where the work of a request is its prompt plus an
    estimate of its output length (``estimate: exact`` knows it; ``lognormal`` multiplies the
    truth by a lognormal error of ``sigma``; ``mean`` uses ``mean_output_tokens`` for all)."""
    name = "semi_clairvoyant"

    def __init__(self, rng, estimate="lognormal", sigma=0.5, mean_output_tokens=256):
        super().__init__(rng)
        self.estimate = estimate
        self.sigma = sigma
        self.mean = mean_output_tokens

    def work(self, request) -> float:
        if self.estimate == "exact":
            out = request.max_tokens
        elif self.estimate == "mean":
            out = self.mean
        else:
            out = request.max_tokens * math.exp(self.sigma * float(self.rng.standard_normal()))
        return request.prompt_len + out

    def choose(self, request, candidates):
        w = self.work(request)
        self._last = (request.rid, w)
        return self._argmin(candidates, lambda c: (c.pending_tokens + w) / c.capacity)

    def routed_work(self, request) -> float:
        last = getattr(self, "_last", None)
        if last is not None and last[0] == request.rid:
            return last[1]
        return super().routed_work(request)


class Slack(Router):
    """Deadline-aware (seed 002 section 6.1: routers that read queue slack).  A request's slack on a
    replica is its TTFT target (its own, its class's, else ``slo.ttft_ms``) minus the TTFT the
    replica predicts for it now (prompt tokens ahead of it / the pool's prefill rate).  Among the
    replicas that would leave at least ``MARGIN`` of the target as slack, the slowest (least
    capacity) wins, then the least predicted TTFT: on a mixed fleet a request with a loose target
    goes to a slow GPU that still meets it and leaves the fast ones to tight targets; on equal
    replicas it is the least predicted TTFT.  When no replica would meet the target, or the request
    has none, the least predicted TTFT."""
    name = "slack"
    MARGIN = 0.25                 # share of the target kept as slack against the prediction's error

    def choose(self, request, candidates):
        pred = [c.predict_ttft(request) for c in candidates]
        target = request.ttft_slo_ms
        if target is not None:
            bound = (1.0 - self.MARGIN) * target / 1e3
            fit = [(c.capacity, p, c) for p, c in zip(pred, candidates) if p <= bound]
            if fit:
                return self._pick_min([c for _, _, c in fit], [(cap, p) for cap, p, _ in fit])
        return self._pick_min(candidates, pred)


class SpecAware(Router):
    """Acceptance-aware (seed 002 section 6.1: routers that read acceptance).  A verify step of a
    speculative replica emits tau tokens per sequence (its accepted drafts + the target's own), so
    a request of N output tokens decodes there in about N / tau steps.  Each replica's tau is read
    from the speculation telemetry it reports (verified rounds and accepted drafts), over each
    stretch of at least ``WINDOW`` new rounds, smoothed by half (recent rounds weigh most).  The
    request goes to the replica of the least expected time to its last token: its predicted TTFT
    (prompt tokens ahead / prefill rate, as ``slack`` reads it) plus N / tau decode steps of the
    pool's step time (N: the request's max_tokens, which a client sends).  A replica without
    ``WINDOW`` rounds yet is given the mean tau of the others (1 when none has any); ties at random."""
    name = "spec_aware"
    WINDOW = 32                   # rounds a tau estimate is measured over

    def __init__(self, rng):
        super().__init__(rng)
        self.est: dict = {}       # replica name -> [rounds, accepted at the last estimate, tau]

    def tau(self, c):
        counts = c.spec_counts
        if counts is None:
            return None
        rounds, acc = counts
        e = self.est.get(c.name)
        if e is None:
            e = self.est[c.name] = [0, 0, None]
        if rounds - e[0] >= self.WINDOW:
            t = 1.0 + (acc - e[1]) / (rounds - e[0])
            e[2] = t if e[2] is None else 0.5 * e[2] + 0.5 * t
            e[0], e[1] = rounds, acc
        return e[2]

    def choose(self, request, candidates):
        taus = [self.tau(c) for c in candidates]
        known = [t for t in taus if t is not None]
        prior = sum(known) / len(known) if known else 1.0
        n = request.max_tokens
        return self._pick_min(candidates, [c.predict_ttft(request) + n * (c.queue_depth + 1)
                                           / (c.capacity * (prior if t is None else t))
                                           for c, t in zip(candidates, taus)])


ROUTERS = {cls.name: cls for cls in (RandomRouter, RoundRobin, LeastOutstanding, JSQ, JIQ, PowerOfTwo,
                                     WeightedPowerOfTwo, LeastKV, PrefixAffinity, SemiClairvoyant, Slack,
                                     SpecAware)}


def build_router(spec, rng):
    """The router of a typed spec (``schema.cluster.RouterField``: ``router: jsq`` or ``router:
    {policy: prefix_affinity, max_queue_gap: 8, staleness_s: 0.5}``).  Returns (router, staleness_s)."""
    kind = spec.policy
    if kind == "prefix_affinity":
        r = PrefixAffinity(rng, spec.max_queue_gap)
    elif kind == "semi_clairvoyant":
        r = SemiClairvoyant(rng, spec.estimate, spec.sigma, spec.mean_output_tokens)
    else:
        r = ROUTERS[kind](rng)
    return r, spec.staleness_s


def check_router_name(name: str, path: str) -> None:
    if name not in ROUTERS:
        raise ConfigError(path, name, "one of " + ", ".join(sorted(ROUTERS)))
