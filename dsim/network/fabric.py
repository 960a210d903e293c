"""Transfers over the topology: a fluid model with max-min fair bandwidth sharing.

A transfer is: per-message overhead -> the bytes flow along the path at the rate max-min
fairness gives them (each link's bandwidth shared by the flows crossing it: processor sharing,
not a FIFO) -> the last byte propagates (one-way latency of the path, with RTT jitter).  A lost
message (probability ``loss_pct``) is noticed ``retransmit_timeout_ms`` after it was sent and
sent again; retries are counted.  During an outage a link carries nothing: flows crossing it wait
(``outage_policy: wait``) or move to the best path that avoids every down link (``failover``;
they wait if there is none).  Only the transfer phase waits; bytes already propagating arrive.

The whole fabric is driven by one timer (the earliest projected flow completion).  A flow start
or end re-solves only the flows that share a link with it, directly or through other flows: in a
star of access links that is one flow; nothing is done per byte or per packet.
"""
from __future__ import annotations

import heapq
import math
import operator
from simpy.events import NORMAL

from ..config.errors import ConfigError
from ..config.limits import FLOW_WORK_PER_MSG, MAX_FLOW_WORK
from ..cluster.transfer import TransferRecord
from .books import LinkBooks
from .fairshare import water_fill
from .topology import Topology

SHARES_KEPT = 4_096             # component shapes whose fair shares are remembered (Network._shares)
_SEQ = operator.attrgetter("seq")


class Link:
    __slots__ = ("u", "v", "bw", "latency_s", "flows", "up", "bytes", "busy_s", "bins", "edge", "since", "key",
                 "runs")

    def __init__(self, u, v, bw, latency_s, key=None):
        self.u, self.v, self.bw, self.latency_s = u, v, bw, latency_s
        self.key = key                  # the scenario key that set its bandwidth
        self.runs: dict = {}            # long constant stretches of whole bins, as a difference array:
        #                                 bytes per bin change by runs[i] from bin i on
        self.flows: dict = {}
        self.up = True
        self.bytes = 0.0
        self.busy_s = 0.0
        self.bins: dict = {}
        self.edge = frozenset((u, v))
        self.since = None               # start of the current busy stretch (up and carrying a flow)


class _Flow:
    # ``callbacks``, ``_ok``, ``_value``, ``_defused``: a flow sent with ``then`` is itself the SimPy
    # event of its arrival (scheduled when it arrives, as its done event would have been)
    __slots__ = ("fid", "src", "dst", "nbytes", "eff", "remaining", "rate", "links", "nodes", "done",
                 "start", "retries", "prop", "waited", "t", "seq", "ver", "record", "then",
                 "callbacks", "_ok", "_value", "_defused")


class Wake:
    """A bare SimPy event with fixed callbacks, for the hot loops that would otherwise make a
    ``Timeout`` and a lambda per wake-up: ``env.schedule(ev, NORMAL, delay)`` gives it the key a
    ``Timeout(env, delay)`` made at that moment gets.  ``arg``: whatever the callback needs."""
    __slots__ = ("callbacks", "_ok", "_value", "arg")

    def __init__(self, fn, arg=None):
        self.callbacks = [fn]
        self._ok = True
        self._value = None
        self.arg = arg


class Network(LinkBooks):
    """``send(src, dst, nbytes) -> simpy event`` whose value is a TransferRecord."""

    # False sends every message through the fluid solver (_resolve), also one alone on its path:
    # the general path that the alone-on-its-path start must equal (tests set it)
    fast = True
    # False: a lone message's start and end go through _begin, _arm, _settle and _deliver (the
    # general functions that send's and _tick's inline one-link branches must equal; tests set it)
    lean = True

    def __init__(self, env, topo: Topology, rng, overhead_s=0.0, loss=0.0, rto_s=0.2, max_retries=None,
                 rtt_jitter=None, bw_jitter=None, policy="wait", bin_s=1.0):
        self.env = env
        self.topo = topo
        self.rng = rng
        self.overhead_s = overhead_s
        self.loss = loss
        self.rto_s = rto_s
        self.max_retries = max_retries
        self.rtt_jitter = rtt_jitter
        self.bw_jitter = bw_jitter
        self.policy = policy
        self.bin_s = bin_s
        self.links: dict = {}
        self._link_paths: dict = {}     # (src, dst) -> (route's node list, its links)
        self.active: dict = {}          # fid -> flow
        self.heap: list = []            # (projected finish, seq, version, flow)
        self.timer_at = math.inf
        self.seq = 0
        self.gen = 0
        self.next_fid = 0
        self.down: set = set()
        self.count = 0
        self.retries = 0
        self.failed = 0
        self.waited_s = 0.0
        self.total_s = 0.0              # sum of transfer durations (send to arrival)
        self.delivered = 0
        self.outages: list = []
        self.work = 0                   # flows re-solved so far (the cost of the run's fabric)
        self.alone = 0                  # flows started alone on their path, without the solver
        self.work_cap = MAX_FLOW_WORK
        self.path = "network"
        self._shares: dict = {}         # component shape -> {path: max-min share}; cleared when a link goes down or up

    # ---- paths ----------------------------------------------------------------------------------
    def link(self, u, v) -> Link:
        lk = self.links.get((u, v))
        if lk is None:
            e = self.topo.g.edges[u, v]
            lk = self.links[(u, v)] = Link(u, v, e["bw"], e["latency_s"], e.get("key"))
        return lk

    def _path(self, src, dst, avoid_down: bool):
        nodes = self.topo.route(src, dst, frozenset(self.down) if (avoid_down and self.down) else frozenset())
        if nodes is None:
            return None, None
        hit = self._link_paths.get((src, dst))
        if hit is not None and hit[0] is nodes:    # the topology's cached route: same links
            return hit
        hit = self._link_paths[src, dst] = nodes, tuple(self.link(u, v) for u, v in zip(nodes, nodes[1:]))
        return hit

    def latency_s(self, src, dst) -> float:
        return self.topo.latency_s(src, dst)

    def bottleneck_bytes_s(self, src, dst) -> float:
        return self.topo.bottleneck_bytes_s(src, dst)

    def carried_bytes(self, u, v) -> float:
        """Bytes the link u -> v has carried so far, the flows crossing it now counted up to now
        (read without settling them, so reading changes nothing)."""
        lk = self.links.get((u, v))
        if lk is None:
            return 0.0
        now = self.env.now
        return lk.bytes + sum(f.rate * (now - f.t) for f in lk.flows.values())

    # ---- the API --------------------------------------------------------------------------------
    def send(self, src: str, dst: str, nbytes: float, record: bool = True, then=None):
        """Start a transfer now; the returned event fires when the last byte has arrived, with a
        TransferRecord as its value (None with ``record=False``, for callers that only wait).
        With ``then``, nothing is returned: ``then(ev)`` is called at the arrival instead (``ev``
        carries the same value), without an event made for it now."""
        if nbytes < 0:
            raise ValueError(f"nbytes must be >= 0, got {nbytes}")
        key = (src, dst)
        hit = self._link_paths.get(key)
        if hit is not None and not self.down and hit[0] is self.topo._paths.get(key):
            nodes, links = hit          # the route is cached and no link is down: nothing to look up
        else:
            for d in (src, dst):
                if not self.topo.has(d):
                    self.topo.ensure(d, "network.send")
            nodes, links = self._path(src, dst, self.policy == "failover")
            if nodes is None:
                nodes, links = self._path(src, dst, False)
                if nodes is None:
                    raise ValueError(f"no network path from {src} to {dst}")
        f = _Flow()
        f.fid = fid = self.next_fid
        self.next_fid += 1
        f.src, f.dst, f.nbytes = src, dst, nbytes
        f.nodes, f.links = nodes, links
        f.eff = eff = nbytes / self.bw_jitter.sample(self.rng) if self.bw_jitter is not None else float(nbytes)
        env = self.env
        if len(links) == 1 and self.lean and self.fast and self.overhead_s <= 0:
            lk = links[0]
            if not lk.flows and lk.up:
                # alone on an access link that is up: _begin's alone-on-its-path branch and _arm,
                # inline (the same fields, the same heap entry, the timer armed by the same rule)
                now = env._now
                f.then = then
                f.done = done = env.event() if then is None else None
                f.start = now
                f.retries = 0
                f.waited = 0.0
                f.ver = 1
                f.record = record
                self.count += 1
                f.remaining = eff
                f.t = now
                f.seq = seq = self.seq
                self.seq += 1
                self.active[fid] = f
                self.alone += 1
                lk.flows[fid] = f
                lk.since = now
                f.rate = r = lk.bw
                t = now + eff / r
                heapq.heappush(self.heap, (t, seq, 1, f))
                if t < self.timer_at:          # _schedule_next's decision (see _begin)
                    self.timer_at = t
                    self.gen = gen = self.gen + 1
                    heapq.heappush(env._queue, (now + max(0.0, t - now), NORMAL, next(env._eid), Wake(self._tick, gen)))
                return done
        f.then = then
        f.done = env.event() if then is None else None
        f.start = env._now
        f.retries = 0
        f.waited = 0.0
        f.ver = 0
        f.record = record
        self.count += 1
        if self.overhead_s > 0:
            # env.timeout(overhead) with a callback, as a Wake: the same heap key, no Timeout or closure
            heapq.heappush(env._queue, (env._now + self.overhead_s, NORMAL, next(env._eid), Wake(self._begun, f)))
        else:
            self._begin(f)
        return f.done

    # ---- fluid engine ---------------------------------------------------------------------------
    # Lazy and incremental: a flow's bytes are settled only when its rate changes or it ends, and
    # a start or end re-solves only the connected component of flows that share a link with it
    # (max-min fairness is independent across components, so the rates are those a global solve
    # gives).  Completions sit in a heap of projected finish times (stale entries skipped by
    # version), so an event costs O(component), not O(all flows x links).
    def _begin(self, f) -> None:
        if not f.links:                            # src == dst: nothing crosses a link
            self._deliver(f, 0.0)
            return
        now = self.env._now
        f.remaining = f.eff
        f.rate = 0.0
        f.t = now
        f.seq = self.seq
        self.seq += 1
        self.active[f.fid] = f
        links = f.links
        if self.fast and len(links) == 1:
            lk = links[0]
            if not lk.flows:
                # alone on a one-link path (an access link): it gets the link's bandwidth and no
                # other flow's rate changes, so there is nothing to re-solve (what _resolve would
                # conclude; _fill gives one flow its bottleneck)
                self.alone += 1
                lk.flows[f.fid] = f
                f.ver += 1
                if lk.up:
                    lk.since = now
                    f.rate = r = lk.bw
                    t = now + f.remaining / r
                    heapq.heappush(self.heap, (t, f.seq, f.ver, f))
                    # _schedule_next's decision: every valid heap entry ends no sooner than the armed
                    # timer, so the first valid entry is this one exactly when it ends before it
                    if t < self.timer_at:
                        self._arm(t)
                else:
                    self._schedule_next()
                return
        for lk in links:
            if not lk.flows and lk.up:
                lk.since = now
            lk.flows[f.fid] = f
        self._resolve(links)

    def _begun(self, ev) -> None:
        self._begin(ev.arg)

    def _settle(self, f, now: float) -> None:
        """Move ``f``'s bytes from its last settlement to ``now`` at its current rate."""
        dt = now - f.t
        if dt <= 0:
            return
        r = f.rate
        if r > 0:
            moved = r * dt
            f.remaining -= moved
            b = self.bin_s
            t0 = f.t
            i = int(t0 // b) if b else 0
            one_bin = b and now <= (i + 1) * b  # the common case, inlined: _bin's first and only bin
            for lk in f.links:
                lk.bytes += moved
                if one_bin:
                    bins = lk.bins
                    bins[i] = bins.get(i, 0.0) + moved     # r x (now - t0): the same product
                elif b:
                    self._bin(lk, t0, now, r)
        elif any(not lk.up for lk in f.links):
            f.waited += dt
        f.t = now

    def _settle_all(self) -> None:
        now = self.env.now
        for f in self.active.values():
            self._settle(f, now)
        for lk in self.links.values():
            if lk.since is not None:
                lk.busy_s += now - lk.since
                lk.since = now

    def _component(self, links) -> list:
        """Flows connected to ``links`` through shared links, in the order they started.  Flows on
        one path share its links: each path's links are walked once, not once per flow."""
        if len(links) == 1 and len(links[0].flows) <= 1:
            flows = list(links[0].flows.values())
            if not flows or len(flows[0].links) == 1:
                return flows                       # an access link carrying one flow that crosses no other
        n = len(self.active)                       # the flows on links (a flow is on its links while active)
        for lk in links:
            if len(lk.flows) == n:                 # a link every flow crosses (a spine): they are all connected
                flows = list(self.active.values())
                if n > 1:
                    flows.sort(key=_SEQ)
                return flows
        seen = set()
        paths = set()
        comp: dict = {}
        stack = list(links)
        while stack:
            lk = stack.pop()
            if lk in seen:
                continue
            seen.add(lk)
            for fid, f in lk.flows.items():
                if fid not in comp:
                    comp[fid] = f
                    p = f.links
                    if p not in paths:
                        paths.add(p)
                        stack.extend(p)
        flows = list(comp.values())
        if len(flows) > 1:
            flows.sort(key=_SEQ)
        return flows

    def _resolve(self, links) -> None:
        flows = self._component(links)
        self.work += len(flows)
        if self.work > self.work_cap:
            self._check_work()
        if not flows:                              # the links emptied: no rate to change
            self._schedule_next()
            return
        now = self.env.now
        settle = self._settle
        for f in flows:
            settle(f, now)
        shares = self._shares_for(flows)
        heap = self.heap
        push = heapq.heappush
        for f in flows:
            f.ver += 1
            f.rate = rate = shares[f.links]
            if rate > 0:
                push(heap, (f.t + f.remaining / rate, f.seq, f.ver, f))
        self._schedule_next()

    def _shares_for(self, flows: list) -> dict:
        """{path: max-min share} of a component (flows in start order), as ``_fill`` gives them.
        Flows on one path are interchangeable (the filling fixes a link's flows all at once and
        takes the same share off each link per flow), and the tie-breaking link order is that in
        which the paths first appear, so the shares are a function of the component's shape: its
        paths in order of first appearance with their flow counts, given which links are up.  The
        first component of a shape runs ``_fill``; later ones read its answer."""
        shape: dict = {}
        for f in flows:
            p = f.links
            shape[p] = shape.get(p, 0) + 1
        key = tuple(shape.items())
        shares = self._shares.get(key)
        if shares is None:
            self._fill(flows)
            shares = {f.links: f.rate for f in flows}
            if len(self._shares) >= SHARES_KEPT:
                self._shares.clear()
            self._shares[key] = shares
        return shares

    def _check_work(self) -> None:
        """Stop a run whose fabric work explodes (thousands of flows sharing links that barely move
        them, or a lossy network resending every message) with an error naming the key, instead of
        running for hours or out of memory."""
        self.work_cap = MAX_FLOW_WORK + FLOW_WORK_PER_MSG * self.count
        if self.work <= self.work_cap:
            return
        n = len(self.active)
        tail = (f"the run would need more than {MAX_FLOW_WORK:.0e} flow updates ({n:,} transfers in flight "
                "share the links)")
        if self.loss >= 0.5 or (self.loss > 0 and self.retries >= self.count):   # resends: most of the work
            raise ConfigError(f"{self.path}.loss_pct", self.loss * 100, f"at {self.loss * 100:g}% loss every message "
                              f"is sent {1 / (1 - self.loss):.3g} times on average and {tail}; lower it, set "
                              "max_retries, or send fewer requests", show_value=False)
        votes: dict = {}
        for f in self.active.values():
            lk = min(f.links, key=lambda lk: lk.bw)
            votes[lk] = votes.get(lk, 0) + 1
        lk = max(votes, key=votes.get) if votes else None
        key = (lk.key if lk is not None else None) or self.path
        rate = f"{lk.bw * 8 / 1e6:g} Mbit/s is too slow for this workload: " if lk is not None else ""
        raise ConfigError(key, None, f"{rate}{tail}; raise the bandwidth or send fewer requests "
                          "(workload.num_requests, horizon_s)", show_value=False)

    _fill = staticmethod(water_fill)

    def _schedule_next(self) -> None:
        """One timer, at the earliest projected completion (re-armed only when that moves earlier;
        a timer that fires early finds nothing due and re-arms)."""
        heap = self.heap
        while heap and heap[0][2] != heap[0][3].ver:
            heapq.heappop(heap)                    # stale: the flow's rate changed or it ended
        if not heap:
            return
        t = heap[0][0]
        if t < self.timer_at:
            self._arm(t)

    def _arm(self, t: float) -> None:
        """Arm the timer for ``t``: a ``Wake`` given the key ``env.timeout(max(0, t - now))`` would
        get (``Environment.schedule``'s push, inlined)."""
        self.timer_at = t
        self.gen += 1
        env = self.env
        now = env._now
        heapq.heappush(env._queue, (now + max(0.0, t - now), NORMAL, next(env._eid), Wake(self._tick, self.gen)))

    def _tick(self, ev) -> None:
        if ev.arg != self.gen:                     # a timer armed before a sooner one: stale
            return
        self.timer_at = math.inf
        now = self.env._now
        # flows within 1 ns of finishing are done (float sums of the clock are not exact; a
        # byte-based tolerance would stall once rate x clock ulp exceeds it)
        # at large simulated times the clock's own step exceeds 1 ns: allow one ulp of it too, or a
        # flow whose last byte is due "now" could be re-ticked forever at the same time
        # (below 2^21 s four ulps of the clock are under 1 ns: the max is 1e-9 without the ulp call)
        due = now + 1e-9 if now < 2097152.0 else now + max(1e-9, 4 * math.ulp(now))
        heap = self.heap
        finished = []
        while heap and heap[0][0] <= due:
            _, _, ver, f = heapq.heappop(heap)
            if ver == f.ver:
                finished.append(f)
        if len(finished) > 1:
            finished.sort(key=_SEQ)
        touched = []                               # links that still carry flows: re-solved below
        active = self.active
        sure = not self.loss and self.rtt_jitter is None   # no draw: _sent's delay is the path's latency
        quick = sure and self.lean
        b = self.bin_s
        queue = self.env._queue
        eid = self.env._eid
        for f in finished:
            links = f.links
            if quick and f.then is not None and not f.record and len(links) == 1:
                # a one-link flow sent with ``then``: _settle, the loop below and _deliver inline,
                # the same operations in the same order, less the finished flow's own remaining
                # bytes and settle time, which nothing reads again (docs/performance.md, "Round
                # three, second pass: distributed rounds")
                lk = links[0]
                t0 = f.t
                dt = now - t0
                if dt > 0:
                    r = f.rate
                    if r > 0:
                        moved = r * dt
                        i = int(t0 // b) if b else 0
                        lk.bytes += moved
                        if b and now <= (i + 1) * b:
                            bins = lk.bins
                            bins[i] = bins.get(i, 0.0) + moved
                        elif b:
                            self._bin(lk, t0, now, r)
                    elif not lk.up:
                        f.waited += dt
                f.ver += 1
                del active[f.fid]
                prop = 0
                prop += lk.latency_s
                flows = lk.flows
                del flows[f.fid]
                if flows:
                    touched.append(lk)
                elif lk.since is not None:
                    lk.busy_s += now - lk.since
                    lk.since = None
                if f.waited:                   # (adding 0.0 changes no sum of waits)
                    self.waited_s += f.waited
                end = now + prop
                self.total_s += end - f.start
                self.delivered += 1
                f.callbacks = [f.then]
                f._ok = True
                f._value = None
                heapq.heappush(queue, (end, NORMAL, next(eid), f))     # env.schedule(f, NORMAL, prop)
                continue
            self._settle(f, now)
            f.ver += 1
            del active[f.fid]
            prop = 0
            for lk in f.links:
                prop += lk.latency_s
                flows = lk.flows
                del flows[f.fid]
                if flows:
                    touched.append(lk)
                elif lk.since is not None:
                    lk.busy_s += now - lk.since
                    lk.since = None
            if sure:
                self._deliver(f, prop)
            else:
                self._sent(f)
        if touched:
            self._resolve(touched)
        else:
            self._schedule_next()

    def _sent(self, f) -> None:
        """The last byte left the sender: lost (retry after the timeout) or delivered after the
        path's propagation delay."""
        if self.loss > 0 and float(self.rng.random()) < self.loss:
            f.retries += 1
            self.retries += 1
            if self.max_retries is not None and f.retries > self.max_retries:
                self.failed += 1
                self._deliver(f, 0.0, failed=True)
                return
            ev = self.env.timeout(self.rto_s)
            ev.callbacks.append(lambda _e, f=f: self._begin(f))
            return
        prop = 0
        for lk in f.links:
            prop += lk.latency_s
        if self.rtt_jitter is not None:
            prop = max(0.0, prop + self.rtt_jitter.sample(self.rng) / 2)
        self._deliver(f, prop)

    def _deliver(self, f, delay: float, failed: bool = False) -> None:
        self.waited_s += f.waited
        end = self.env._now + delay
        self.total_s += end - f.start
        self.delivered += 1
        rec = (TransferRecord(f.src, f.dst, f.nbytes, f.start, end, f.retries, tuple(f.nodes), f.waited)
               if f.record else None)
        ev = f.done
        if ev is None:                  # sent with ``then``: the flow is the arrival's event
            ev = f
            f.callbacks = [f.then]
        if failed:
            ev._ok = False
            ev._value = ConnectionError(f"transfer {f.src}->{f.dst} lost after {f.retries - 1} retries")
            ev._defused = True
        else:
            ev._ok = True
            ev._value = rec
        env = self.env
        heapq.heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), ev))    # env.schedule(ev, NORMAL, delay)

    def set_latency(self, u, v, latency_s: float) -> None:
        """Change an edge's one-way latency from now on (both directions; transfers already past
        their last byte keep the delay they were given)."""
        self.topo.add_link(u, v, latency_s, self.topo.g.edges[u, v]["bw"])
        for key in ((u, v), (v, u)):
            lk = self.links.get(key)
            if lk is not None:
                lk.latency_s = latency_s

    # ---- outages --------------------------------------------------------------------------------
    def _set_link(self, edge: frozenset, up: bool) -> None:
        self._settle_all()
        now = self.env.now
        u, v = tuple(edge)
        for a, b in ((u, v), (v, u)):
            lk = self.link(a, b)
            lk.up = up
            if not up and lk.since is not None:
                lk.busy_s += now - lk.since
            lk.since = now if (up and lk.flows) else None
        (self.down.discard if up else self.down.add)(edge)
        self._shares.clear()                       # the shares were solved with the old link states
        if not up and self.policy == "failover":
            for f in list(self.active.values()):
                if any(lk.edge == edge for lk in f.links):
                    nodes, links = self._path(f.src, f.dst, True)
                    if nodes is not None:
                        for lk in f.links:
                            del lk.flows[f.fid]
                            if not lk.flows and lk.since is not None:
                                lk.busy_s += now - lk.since
                                lk.since = None
                        f.nodes, f.links = nodes, links
                        for lk in links:
                            if not lk.flows and lk.up:
                                lk.since = now
                            lk.flows[f.fid] = f
        self.timer_at = math.inf                   # re-arm from scratch: rates may have dropped
        self._resolve([lk for f in self.active.values() for lk in f.links])

    def _outage(self, edge, start, end):
        env = self.env
        if start > env.now:
            yield env.timeout(start - env.now)
        self._set_link(edge, False)
        yield env.timeout(end - start)
        self._set_link(edge, True)
