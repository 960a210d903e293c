"""The fleet: clusters of replica pools behind routers, admission, P/D handoff and scaling.

Request path: gateway (global router over clusters when there are several) -> cluster router
(affinity first when ``affinity: session``) -> admission -> replica.  In a disaggregated cluster
the entry router only sees prefill replicas; when a prefill replica has produced the first token
the decode router picks a decode replica (sticky per session with affinity), the prompt's KV
bytes move over the transfer path, and the decode replica continues.  Conservation: every
arrived request is at all times in exactly one place (a replica's queues, a KV transfer) or
finished (completed or rejected); ``check_conservation`` verifies it.
"""
from __future__ import annotations

from ..config.errors import ConfigError
from ..core.request import COMPLETED, REJECTED, ROUTED
from ..latency.base import AlphaModel
from .admission import Always, build_admission
from .pool import DRAINING, READY, RETIRED, Pool, Replica  # noqa: F401 (Replica: for readers of this module)
from .transfer import build_transfer
from .views import ClusterView, RouterSlot
from ..core.invariant import check
from ..metrics.ledger import RequestLedger

# BC-14 (seed 004): the event queue holds O(requests in flight x events per request).  A request in
# flight has at most a few events pending (its arrival-delay timeout, a KV or draft message, a draft
# job's timeout); every actor (replica loop, draft device, controller, the network's timer and
# outage processes) at most two; the arrival process and run-level timers a fixed handful.
EVENTS_PER_REQUEST = 4
EVENTS_PER_ACTOR = 2
EVENTS_FIXED = 64


class Cluster:
    def __init__(self, fleet, spec, index: int, network=None):
        self.fleet = fleet
        self.spec = spec
        self.name = spec.name
        self.pools = [Pool(fleet, p, self) for p in spec.pools]
        path = spec.path or "cluster"
        self.router = RouterSlot(fleet, spec.router, f"router.{spec.name}")
        self.affinity = spec.affinity
        self.sessions: dict = {}        # session -> replica (entry); for decode: dec_sessions
        self.dec_sessions: dict = {}
        self.disagg = spec.disaggregation is not None
        self.decode_router = None
        self.transfer = None
        self.migration = None           # KV path of live migrations (built on first use)
        if self.disagg:
            d, where = spec.disaggregation, f"{path}.disaggregation"
            self.decode_router = RouterSlot(fleet, d.decode_router, f"router.{spec.name}.decode")
            if network is not None:
                if d.kv_transfer is not None:
                    raise ConfigError(f"{where}.kv_transfer", d.kv_transfer.to_dict(),
                                      "no kv_transfer when the scenario has a network: section (the KV moves over it)")
                self.transfer = NetworkTransfer(network, self)
            else:
                self.transfer = build_transfer(d.kv_transfer, fleet.sim.env)
            models = {p.spec.model.name for p in self.pools}
            if len(models) > 1:
                raise ConfigError(f"{path}.pools", sorted(models),
                                  "one model for the prefill and decode pools of a cluster (the KV moves between them)")
        self._cache = (-1, None, None)

    def _lists(self):
        v = self.fleet._version
        if self._cache[0] != v:
            entry = [r for p in self.pools if p.role != "decode" for r in p.ready]
            dec = [r for p in self.pools if p.role == "decode" for r in p.ready]
            self._cache = (v, entry, dec)
        return self._cache

    def entry_candidates(self) -> list:
        return self._lists()[1]

    def decode_candidates(self) -> list:
        return self._lists()[2]

    def ready_replicas(self) -> list:
        _, e, d = self._lists()
        return e + d if d else e

    def choose_entry(self, r, allowed=None) -> Replica | None:
        """The entry replica for r; ``allowed``: the pool names r's draft device connects to
        (dsim.specdec.topology), None for any.  None when no allowed pool has a ready replica."""
        cands = self.entry_candidates()
        if allowed is not None:
            cands = [c for c in cands if c.pool.name in allowed]
            if not cands:
                return None
        if self.affinity == "session" and r.session >= 0:
            rep = self.sessions.get(r.session)
            if rep is not None and rep.state == READY and rep.pool.role != "decode":
                return rep
            rep = self.router.choose(r, cands)
            self.sessions[r.session] = rep
            return rep
        return self.router.choose(r, cands)

    def choose_decode(self, r) -> Replica:
        c = self._cache                  # _lists(), inline (once per handoff)
        cands = c[2] if c[0] == self.fleet._version else self._lists()[2]
        if self.affinity == "session" and r.session >= 0:
            rep = self.dec_sessions.get(r.session)
            if rep is not None and rep.state == READY:
                return rep
            rep = self.decode_router.choose(r, cands)
            self.dec_sessions[r.session] = rep
            return rep
        return self.decode_router.choose(r, cands)


class NetworkTransfer:
    """KV transfers of a disaggregated cluster over the scenario's network: a replica is the
    topology node of its own name, else of its pool's name (a pool = a host or rack), else it is
    attached automatically where the preset allows it (clos: round-robin over leaves; complete)."""

    def __init__(self, network, cluster):
        self.net = network
        self.count = 0
        self.bytes = 0.0
        self.nodes: dict = {}
        self._named: set = set()         # replica names that are topology nodes themselves
        for p in cluster.pools:
            where = f"{p.spec.path}.name" if p.spec.path else "cluster"
            if not network.topo.has(p.name):
                if not network.topo.attaches_new_devices and not any(
                        network.topo.has(f"{p.name}-{i}") for i in range(p.spec.replicas)):
                    network.topo.ensure(p.name, where)      # raises: the pool is not in the topology
            self.nodes[p.name] = p.name if network.topo.has(p.name) else None
        pre = [n for p in cluster.pools if p.role == "prefill" for n in [self.nodes[p.name]] if n]
        dec = [n for p in cluster.pools if p.role == "decode" for n in [self.nodes[p.name]] if n]
        for a in pre:
            for b in dec:
                if network.topo.route(a, b) is None:
                    raise ConfigError(network.topo.path, f"{a} -> {b}",
                                      "a network path from every prefill pool to every decode pool")

    def node(self, rep_name: str, pool: str) -> str:
        if rep_name in self._named:                 # a node stays one (the topology never drops nodes)
            return rep_name
        topo = self.net.topo
        if topo.has(rep_name):
            self._named.add(rep_name)
            return rep_name
        if self.nodes.get(pool):
            return self.nodes[pool]
        topo.ensure(rep_name, "network")
        return rep_name

    def send(self, src, dst, nbytes: float, src_pool: str = "", dst_pool: str = "", streams: int = 1, then=None):
        """One message over the replicas' network links (pipeline stages share them: ``streams`` unused);
        with ``then``, ``then(ev)`` is called at its arrival and nothing is returned (the flow is the
        arrival's event: Network.send)."""
        self.count += 1
        self.bytes += nbytes
        named = self._named
        return self.net.send(src if src in named else self.node(src, src_pool),
                             dst if dst in named else self.node(dst, dst_pool), nbytes, True, then)

    def summary(self) -> dict:
        return {"transfers": self.count, "bytes": self.bytes, "over": "network (see the network section)"}


class Fleet:
    """All clusters of a scenario, the gateway (global router + admission) and the bookkeeping."""

    def __init__(self, sim, scn, check_invariants: bool = False, network=None, tracer_factory=None,
                 keep_steps: bool = False):
        self.sim = sim
        self.network = network
        self.tracer_factory = tracer_factory     # inst -> step observer (vLLM trace emission), or None
        self.replica_hooks: list = []            # f(replica) on every new replica (speculative decoding)
        self.done_hooks: list = []               # f(request) when a request completes or is rejected
        self.spec = scn.fleet
        self.base_dir = scn.base_dir
        self.check = check_invariants
        self.keep_steps = keep_steps or scn.timeline     # timeline.json lists every step of every replica
        self.migrations = 0           # live migrations (Rebalance with migrate)
        self.migrated_bytes = 0.0
        self.order_watchers = 0      # readers of the ledger's finish order (controllers' windows)
        self.extra_actors = 0        # draft devices, controllers: processes besides the replicas (BC-14)
        self.fabric_actors = 0       # ... of them the network's timer and outage processes
        self._version = 0
        self.clusters = [Cluster(self, c, i, network) for i, c in enumerate(self.spec.clusters)]
        self.pools = {p.name: p for c in self.clusters for p in c.pools}
        self.global_router = None
        if len(self.clusters) > 1:
            self.global_router = RouterSlot(self, self.spec.global_router, "router.global")
            self.cluster_views = [ClusterView(c) for c in self.clusters]
        self.admission = build_admission(self.spec.admission, "cluster.admission", scn.slo_ttft_ms)
        _check_parallel_groups(self.spec, scn)
        for c in self.clusters:
            for p in c.pools:
                for _ in range(p.spec.replicas):
                    p.add_replica(0.0)
        self.arrived = 0
        self.n_completed = 0
        self.n_rejected = 0              # admission or replica
        self.live: dict = {}             # rid -> arrived request not finished yet
        self.ledger = RequestLedger()    # finished requests, as columns (the objects are dropped)
        self.admission_rejected = 0
        self.arrivals_done = False
        self.booked: dict = {}          # rid -> booked work on its current replica
        self.in_transfer = 0
        self.ingress = None              # (request, replica) -> event when it reaches the replica, or None
        self.speculation = None          # the SpecRuntime of a speculative run (dsim.specdec.runtime)
        self.reach = None                # request -> pool names it may be routed to, or None (auto-topology)
        self.scale_events: list = []    # (time, pool, action, replica)
        self._pools_by_replica: dict = {}
        self._disagg = any(c.disagg for c in self.clusters)

    # ---- gateway ---------------------------------------------------------------------------
    def arrival_reads(self) -> int:
        """What an arrival reads of a replica: 2 anything (a router or admission policy reading KV
        use, a network hop into the replica, a reachability filter, P/D, several clusters), 1 only
        its queue counts (a counts-only router with live views), 0 nothing (the only entry replica:
        the router has no choice to make).  Quiet stretches may run past arrivals below 2."""
        if (self.global_router is not None or self.ingress is not None or self.reach is not None
                or self._disagg or type(self.admission) is not Always):
            return 2
        slot = self.clusters[0].router
        if slot.staleness > 0:
            return 2
        if len(self.clusters[0].entry_candidates()) == 1:
            return 0
        return 1 if slot.router.counts_only else 2

    def entries_unread(self) -> bool:
        """Nothing but queue-count readers (arrivals with ``arrival_reads() < 2``) looks at a replica
        between a request's arrival and the replica's next step end: no controllers, draft devices or
        network (other actors, reading at their own times), no done hooks, no speculation.  Replicas
        may then keep their arrival-to-queue entries without events (Instance._take_in)."""
        return (not self.extra_actors and not self.done_hooks and self.speculation is None
                and self.network is None and self.arrival_reads() < 2)

    def decode_past(self) -> float | None:
        """For a decode replica's quiet stretches (``fastforward._horizon_pd``): None unless the fleet is
        one P/D cluster behind the plain gateway (then an arrival reads and changes only entry
        replicas, and nothing but handoffs, the decode router and KV deliveries reach a decode
        replica); else how long after an arrival its enqueue comes at the soonest: the least ``a0``
        of the entry replicas' arrival-to-queue delays (``AlphaModel``, ``a1 >= 0``), 0 if unbounded."""
        if (not self._disagg or len(self.clusters) != 1 or self.global_router is not None
                or self.ingress is not None or self.reach is not None or type(self.admission) is not Always
                or self.speculation is not None):
            return None
        past = float("inf")
        for p in self.clusters[0].pools:
            if p.role == "decode":
                continue
            for rep in p.replicas:
                q = rep.inst.queueing
                if type(q) is not AlphaModel or not (q.a0 > 0 and q.a1 >= 0):
                    return 0.0
                past = min(past, q.a0)
        return past if past < float("inf") else 0.0

    @property
    def done(self) -> bool:
        return self.arrivals_done and self.arrived == self.n_completed + self.n_rejected

    def arrive(self, r, replica: Replica | None = None) -> None:
        """r reaches the gateway now: the routers pick its replica, or ``replica`` is given (a client
        that talks to one replica directly: ``dsim serve --replica-ports``)."""
        self.arrived += 1
        self.live[r.rid] = r
        if (replica is None and self.reach is None and self.ingress is None and self.global_router is None
                and type(self.admission) is Always):
            # the plain gateway: one cluster's router, no admission policy, no hop (the steps below, inline)
            cluster = self.clusters[0]
            rep = cluster.choose_entry(r)
            if rep.pool.role == "decode":
                check(False, "pool isolation: an arrival routed to a decode pool")
            work = cluster.router.router.routed_work(r)
            rep.outstanding += 1
            rep.pending_tokens += work
            self.booked[r.rid] = work
            r.state = ROUTED
            r.t_routed = self.sim.env._now
            rep.inst.submit(r, True)
            return
        allowed = self.reach(r) if self.reach is not None else None
        if replica is not None:
            cluster, rep = replica.pool.cluster, replica
        elif allowed is not None:
            cluster, rep = self._route_within(r, allowed)
            if rep is None:              # none of the device's pools has a ready replica
                r.state = REJECTED
                r.reject_reason = "unreachable"
                self.admission_rejected += 1
                self._finish(r)
                return
        elif self.global_router is not None:
            cluster = self.global_router.choose(r, self._live_clusters()).cluster
            rep = cluster.choose_entry(r)
        else:
            cluster = self.clusters[0]
            rep = cluster.choose_entry(r)
        check(rep.pool.role != "decode", "pool isolation: an arrival routed to a decode pool")
        reason = self.admission.reject(r, rep, self.sim.now)
        if reason is not None:
            r.state = REJECTED
            r.reject_reason = reason
            self.admission_rejected += 1
            self._finish(r)
            return
        self._book(rep, r, cluster.router.router.routed_work(r))
        r.state = ROUTED
        r.t_routed = self.sim.now
        hop = self.ingress(r, rep) if self.ingress is not None else None
        if hop is None:
            rep.inst.submit(r, True)
            return
        self.in_transfer += 1            # on its way from the gateway into the replica (seed 004 ROUTED)

        def reached(_e, r=r, rep=rep):
            self.in_transfer -= 1
            rep.inst.submit(r)
        hop.callbacks.append(reached)

    def _route_within(self, r, allowed) -> tuple:
        """(cluster, replica) among the pools in ``allowed`` only (a draft device's connectivity):
        the global router picks among the clusters holding one of them with a ready replica."""
        if self.global_router is None:
            c = self.clusters[0]
            return c, c.choose_entry(r, allowed)
        views = [v for v in self.cluster_views
                 if any(rep.pool.name in allowed for rep in v.cluster.entry_candidates())]
        if not views:
            return None, None
        cluster = self.global_router.choose(r, views).cluster
        return cluster, cluster.choose_entry(r, allowed)

    def _live_clusters(self) -> list:
        live = [v for v in self.cluster_views if v.cluster.entry_candidates()]
        return live or self.cluster_views

    def _book(self, rep: Replica, r, work: float) -> None:
        rep.outstanding += 1
        rep.pending_tokens += work
        self.booked[r.rid] = work

    def _unbook(self, rep: Replica, r) -> None:
        rep.outstanding -= 1
        rep.pending_tokens -= self.booked.pop(r.rid)

    # ---- replica callbacks -----------------------------------------------------------------
    def _on_done(self, rep: Replica, r) -> None:
        rep.outstanding -= 1                             # _unbook, inline (once per request)
        rep.pending_tokens -= self.booked.pop(r.rid)
        self._finish(r)
        if rep.state == DRAINING:
            self._maybe_retire(rep)

    def _finish(self, r) -> None:
        """r completed or was rejected: the hooks run first (speculation moves its token times to the
        device), then its final fields are checked and recorded, and the object leaves the fleet."""
        for hook in self.done_hooks:
            hook(r)
        if r.state == COMPLETED:
            self.n_completed += 1
            if not (r.arrival <= r.t_routed <= r.t_queued <= r.t_scheduled <= r.t_first_token <= r.t_completion
                    and r.n_out == r.max_tokens):           # message built only on failure (per request)
                check(False, f"causality or token count violated for request {r.rid}")
            if self._disagg:
                self._check_isolated(r)
            elif r.prefill_replica is not None:
                check(False, f"pool isolation: request {r.rid} has a prefill replica without P/D")
        else:
            self.n_rejected += 1
        del self.live[r.rid]
        self.ledger.add(r)

    def _on_handoff(self, rep: Replica, r) -> None:
        """A prefill replica produced r's first token: pick a decode replica, move the KV."""
        rep.outstanding -= 1                             # _unbook, inline (once per request)
        rep.pending_tokens -= self.booked.pop(r.rid)
        r.prefill_replica = rep.name
        pool = rep.pool
        cluster = pool.cluster
        dec = cluster.choose_decode(r)
        dpool = dec.pool
        if dpool.role != "decode":
            check(False, "pool isolation: a handoff routed outside the decode pool")
        work = r.max_tokens - 1                          # _book, inline
        dec.outstanding += 1
        dec.pending_tokens += work
        self.booked[r.rid] = work
        dec.incoming += 1
        self.in_transfer += 1
        nbytes = r.num_computed * pool.spec.model.kv_bytes_per_token
        # pipeline stages move their own layers' KV in parallel (dsim.cluster.transfer)
        streams = min(pool.engine.pipeline_parallel_size, dpool.engine.pipeline_parallel_size)
        cluster.transfer.send(rep.name, dec.name, nbytes, pool.name, dpool.name, streams,
                              lambda e: self._kv_arrived(rep, dec, r, e._ok))

    def _kv_arrived(self, src: Replica, dec: Replica, r, ok: bool = True) -> None:
        src.inst.release_handoff(r)
        self.in_transfer -= 1
        dec.incoming -= 1
        if not ok:
            # the network gave up (max_retries): like vLLM's kv_load_failure_policy "fail", the request
            # ends with an error; the decode pool never runs a prefill (pool isolation)
            self._unbook(dec, r)
            r.state = REJECTED
            r.reject_reason = "kv_transfer_failed"
            self._finish(r)
            if src.state == DRAINING:
                self._maybe_retire(src)
            return
        r.kv_ready = r.prompt_len
        r.t_kv_ready = self.sim.env._now
        if src.state == DRAINING:
            self._maybe_retire(src)
        dec.inst.submit(r)

    def _migrate(self, src: Replica, dst: Replica, r) -> None:
        """A running request left ``src`` with its KV: send the KV, then resume on ``dst``."""
        self._unbook(src, r)
        self._book(dst, r, r.max_tokens - r.n_out)
        dst.incoming += 1
        self.in_transfer += 1
        self.migrations += 1
        cluster = src.pool.cluster
        if cluster.migration is None:
            net = getattr(self, "network", None)
            cluster.migration = (NetworkTransfer(net, cluster) if net is not None
                                 else build_transfer(None, self.sim.env))
        nbytes = r.num_computed * src.pool.spec.model.kv_bytes_per_token
        self.migrated_bytes += nbytes
        ev = cluster.migration.send(src.name, dst.name, nbytes, src.pool.name, dst.pool.name)
        ev.callbacks.append(lambda e: self._migrated(src, dst, r, e.ok))

    def _migrated(self, src: Replica, dst: Replica, r, ok: bool) -> None:
        src.inst.release_handoff(r)
        self.in_transfer -= 1
        dst.incoming -= 1
        r.kv_ready = r.num_computed if ok else 0          # a lost transfer: recompute there
        if src.state == DRAINING:
            self._maybe_retire(src)
        dst.inst.submit(r)

    def _maybe_retire(self, rep: Replica) -> None:
        if rep.state == DRAINING and rep.idle:
            rep.state = RETIRED
            rep.t_retired = self.sim.now
            self.scale_events.append((self.sim.now, rep.pool.name, "retired", rep.name))

    # ---- control actions -------------------------------------------------------------------
    def pool(self, name: str) -> Pool:
        p = self.pools.get(name)
        if p is None:
            raise ValueError(f"no pool {name!r} (pools: {', '.join(self.pools)})")
        return p

    def scale_out(self, pool: str, n: int = 1) -> int:
        p = self.pool(pool)
        added = 0
        for _ in range(n):
            live = len(p.ready) + len(p.starting)
            if p.spec.max_replicas is not None and live >= p.spec.max_replicas:
                break
            rep = p.add_replica(p.cold_start_s())
            self.scale_events.append((self.sim.now, p.name, "scale_out", rep.name))
            added += 1
        return added

    def scale_in(self, pool: str, n: int = 1) -> int:
        p = self.pool(pool)
        removed = 0
        for _ in range(n):
            rep = p.remove_replica()
            if rep is None:
                break
            self.scale_events.append((self.sim.now, p.name, "scale_in", rep.name))
            removed += 1
        return removed

    def rebalance(self, pool: str, migrate: bool = False) -> int:
        """Move requests that have not started (still waiting, never scheduled) from the longest
        queues of the pool to the shortest until no two ready replicas differ by more than one;
        they hold no KV, so the move is free (their prefix-cache hits on the old replica are lost).
        With ``migrate`` also move running decoders from the replica running the most to the one
        running the fewest (live migration, as Llumnix does): each leaves at the end of its step
        and its KV crosses the interconnect (or the network) before it resumes on the new replica."""
        p = self.pool(pool)
        moved = 0
        reps = p.ready
        if len(reps) < 2:
            return 0
        if migrate:
            hi = max(reps, key=lambda x: len(x.inst.running) - len(x.inst._leaving))
            lo = min(reps, key=lambda x: len(x.inst.running) + x.incoming)
            k = (len(hi.inst.running) - len(hi.inst._leaving) - len(lo.inst.running) - lo.incoming) // 2
            if k > 0:
                moved += hi.inst.migrate_out(k, lambda r, hi=hi, lo=lo: self._migrate(hi, lo, r))
        while True:
            hi = max(reps, key=lambda x: len(x.inst.waiting))
            lo = min(reps, key=lambda x: len(x.inst.waiting))
            if len(hi.inst.waiting) - len(lo.inst.waiting) <= 1:
                break
            r = hi.inst.take_unstarted()
            if r is None:
                break
            self._unbook(hi, r)
            self._book(lo, r, p.cluster.router.router.routed_work(r))
            lo.inst.submit(r)
            moved += 1
        return moved

    # ---- invariants ------------------------------------------------------------------------
    def replicas(self) -> list:
        return [r for p in self.pools.values() for r in p.replicas]

    def check_conservation(self) -> None:
        placed = 0
        for rep in self.replicas():
            i = rep.inst
            check(len(i.waiting) + i.in_alpha + len(i.running) + i.n_completed + i.n_rejected
                  + len(i.transferring) + i.handed_off + i.moved_out + i.loading + len(i.swapped) == i.submitted,
                  f"{rep.name}: conservation")
            placed += len(i.waiting) + i.in_alpha + len(i.running) + i.loading + len(i.swapped)
        check(placed + self.in_transfer + self.n_completed + self.n_rejected == self.arrived,
              "fleet conservation: arrived != queued + running + in transfer + completed + rejected")
        for rep in self.replicas():
            check(rep.state != RETIRED or rep.inst.idle, f"{rep.name} retired with work")

    def check_event_queue(self) -> None:
        """BC-14: the pending events are bounded by the requests in flight and the actors."""
        n = len(self.sim.env._queue)
        active = self.arrived - self.n_completed - self.n_rejected
        actors = len(self.replicas()) + self.extra_actors
        bound = EVENTS_PER_REQUEST * active + EVENTS_PER_ACTOR * actors + EVENTS_FIXED
        if n > bound:
            check(False, f"BC-14: {n} pending events > {bound} ({active} requests in flight, {actors} actors)")

    def _check_isolated(self, r) -> None:
        """P/D pool isolation of a completed request: the first token came from a prefill replica
        and every later token from a decode replica of the same cluster."""
        pool = self._pool_of(r.replica)
        if not pool.cluster.disagg:
            check(r.prefill_replica is None)
        elif r.max_tokens == 1:
            check(pool.role == "prefill" and r.prefill_replica is None)
        else:
            pre = self._pool_of(r.prefill_replica)
            if not (pre.role == "prefill" and pool.role == "decode" and pre.cluster is pool.cluster):
                check(False, f"pool isolation violated for request {r.rid}")   # message built only on failure
            # speculation's device-issued requests have their token times as the device saw them
            first = self.speculation.first_token_at_server(r) if self.speculation is not None else r.t_first_token
            if not first <= r.t_handoff <= r.t_kv_ready <= r.t_completion:
                check(False, f"P/D causality violated for request {r.rid}")

    def _pool_of(self, replica: str):
        """The pool of a replica by name (names are never reused; the map grows with the fleet)."""
        pool = self._pools_by_replica.get(replica)
        if pool is None:
            self._pools_by_replica = {rep.name: rep.pool for rep in self.replicas()}
            pool = self._pools_by_replica[replica]
        return pool


def _check_parallel_groups(spec, scn) -> None:
    """What PP virtual engines and DP ranks are not combined with yet (each needs a decision on how a
    group of them takes part): P/D roles (DP ranks; PP virtual engines take them), speculation, the CPU tier,
    swap preemption, controllers that scale."""
    for c in spec.clusters:
        for p in c.pools:
            pp = p.engine.pipeline_parallel_size * p.engine.data_parallel_size
            if pp == 1:
                continue
            key = "pipeline_parallel_size" if p.engine.pipeline_parallel_size > 1 else "data_parallel_size"
            where = f"{p.path}.engine.{key}" if p.path else f"engine.{key}"
            why = ("a P/D role" if p.role != "mixed" and p.engine.data_parallel_size > 1
                   else "speculation" if scn.spec is not None
                   else "engine.kv_offload" if p.engine.kv_offload is not None
                   else "engine.preemption_mode: swap" if p.engine.preemption_mode == "swap"
                   else "cluster.controllers" if spec.controllers else None)
            if why is not None:
                raise ConfigError(where, getattr(p.engine, key), f"1 with {why} (PP virtual engines and DP ranks are not combined "
                                  "with it yet)")
