"""What routers see: read-only views of replicas and clusters, live or stale, and the slot that
holds a router with its views (refreshing stale snapshots on a SimPy tick)."""
from __future__ import annotations

from .routers import build_router


class LiveView:
    """What a router may read of a replica: load fields, gateway counters, prefix lookup."""

    __slots__ = ("_r",)

    def __init__(self, rep):
        self._r = rep

    name = property(lambda self: self._r.name)
    pool = property(lambda self: self._r.pool.name)
    waiting = property(lambda self: self._r.waiting)
    running = property(lambda self: self._r.running)
    queue_depth = property(lambda self: self._r.queue_depth)
    kv_usage = property(lambda self: self._r.kv_usage)
    outstanding = property(lambda self: self._r.outstanding)
    pending_tokens = property(lambda self: self._r.pending_tokens)
    capacity = property(lambda self: self._r.capacity)
    spec_counts = property(lambda self: self._r.spec_counts)
    decode_step_s = property(lambda self: self._r.decode_step_s)

    def cached_prefix(self, r) -> int:
        return self._r.cached_prefix(r)

    def predict_ttft(self, r) -> float:
        return self._r.predict_ttft(r)


class StaleView:
    """A router's delayed view of a replica or cluster: load fields are snapshots taken every
    ``staleness_s``; the gateway's own counters stay live."""

    def __init__(self, target):
        self.target = target
        self.refresh()

    def refresh(self) -> None:
        t = self.target
        self.waiting, self.running, self.queue_depth, self.kv_usage = \
            t.waiting, t.running, t.queue_depth, t.kv_usage
        self.spec_counts = t.spec_counts

    def __getattr__(self, name):          # outstanding, pending_tokens, capacity, cached_prefix...
        return getattr(self.target, name)


class ClusterView:
    """A cluster as one candidate of the global router: sums (and mean KV usage) of its replicas."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.name = cluster.name

    def _reps(self):
        return self.cluster.ready_replicas()

    waiting = property(lambda self: sum(r.waiting for r in self._reps()))
    running = property(lambda self: sum(r.running for r in self._reps()))
    queue_depth = property(lambda self: sum(r.queue_depth for r in self._reps()))
    outstanding = property(lambda self: sum(r.outstanding for r in self._reps()))
    pending_tokens = property(lambda self: sum(r.pending_tokens for r in self._reps()))
    capacity = property(lambda self: sum(r.capacity for r in self._reps()))

    @property
    def spec_counts(self):
        c = [x for x in (r.spec_counts for r in self._reps()) if x is not None]
        return (sum(x[0] for x in c), sum(x[1] for x in c)) if c else None

    @property
    def kv_usage(self) -> float:
        reps = self._reps()
        return sum(r.kv_usage for r in reps) / len(reps) if reps else 1.0

    def cached_prefix(self, r) -> int:
        return max((x.cached_prefix(r) for x in self.cluster.entry_candidates()), default=0)

    def predict_ttft(self, r) -> float:
        return min(x.predict_ttft(r) for x in self.cluster.entry_candidates())

    @property
    def decode_step_s(self) -> float:
        return min((x.decode_step_s for x in self._reps()), default=1.0)


class RouterSlot:
    """A router with its (possibly stale) views of a changing candidate list."""

    def __init__(self, fleet, spec, stream: str):
        self.router, self.staleness = build_router(spec, fleet.sim.rng.stream(stream))
        self.policy = self.router.name
        self.views: dict = {}
        if self.staleness > 0:
            fleet.sim.process(self._refresh_loop(fleet))

    def view(self, target):
        live = getattr(target, "view", target)
        if self.staleness <= 0:
            return live
        v = self.views.get(target)
        if v is None:
            v = self.views[target] = StaleView(live)
        return v

    def choose(self, r, targets):
        """The router picks among read-only views; returns the matching target."""
        if self.staleness <= 0:          # live views: the targets' own (one call per arrival, not per target)
            if len(targets) == 1:
                return targets[0]
            views = [getattr(t, "view", t) for t in targets]
        else:
            views = [self.view(t) for t in targets]
        pick = self.router.choose(r, views)
        for t, v in zip(targets, views):
            if v is pick:
                return t
        raise RuntimeError(f"router {self.policy} returned a view that was not a candidate")

    def _refresh_loop(self, fleet):
        env = fleet.sim.env
        while not fleet.done:
            yield env.timeout(self.staleness)
            for v in self.views.values():
                v.refresh()
