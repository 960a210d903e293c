"""Conversations on their way to a target and back, for the speculative-decoding runtime: which
draft device opens each conversation (cohorts, sessions, turns), the devices' issue loops (open
loop, or closed loop with think time), the prompt's upload over the device's link and its hop from
the gateway to the chosen replica, the hand-over to the fleet, and, when a conversation finishes,
the replica-to-device latency added to its first and last token times (TTFT and E2E are seen on
the device).  A mixin of ``SpecRuntime`` (dsim.specdec.runtime), which owns the state it reads."""
from __future__ import annotations

import math

from ..config.errors import ConfigError
from ..core.request import COMPLETED
from .config import PER_TARGET
from .state import SpecState


class SmoothWeighted:
    """Smooth weighted round robin over ``items``: each pick adds every item's weight to its credit,
    takes the item with the most credit (the first on a tie) and charges it the total weight.  After
    n picks item i was taken n * w_i / W times to within one (interleaved, not in blocks), with no
    random draw: the same trace binds the same way in every run.  Equal weights: plain round robin."""

    def __init__(self, items, weights):
        self.items = list(items)
        self.weights = [float(w) for w in weights]
        self.total = sum(self.weights)
        self.credit = [0.0] * len(self.items)

    def pick(self):
        c = self.credit
        best = 0
        for i, w in enumerate(self.weights):
            c[i] += w
            if c[i] > c[best]:
                best = i
        c[best] -= self.total
        return self.items[best]


def capability(dev) -> float:
    """A device's weight under cohort_assignment: capability: its group's ``weight``, else its drafting
    speed (batch-1 draft tokens per second of the drafter on its profile, at an empty context)."""
    w = dev.group.weight
    return w if w is not None else 1.0 / dev.token_time(0)


class Conversations:
    def _bind(self, reqs) -> None:
        """Canonical trace mapping (seed 002): a request whose trace row names a device (draft_id)
        goes to it; one whose tenant names a group's cohort goes to that group, others to every
        device; within that pool in turn (round_robin) or by capability (``SmoothWeighted``); a
        session stays on the device that opened it (a row's draft_id wins)."""
        if not self.devices:          # fused or plain: a canonical trace's draft ids name nothing here
            return
        weighted = self.cfg.cohort_assignment == "capability"
        by_name = {d.name: d for d in self.devices}
        by_cohort: dict = {}
        for d in self.devices:
            if d.group.cohort is not None:
                by_cohort.setdefault(d.group.cohort, []).append(d)
        turn: dict = {}
        sessions: dict = {}
        for r in reqs:
            dev = sessions.get(r.session) if r.session >= 0 else None
            if r.draft_id:
                dev = by_name.get(r.draft_id)
                if dev is None:
                    names = sorted({f"{d.group.name}-0..{d.group.count - 1}" for d in self.devices})
                    raise ConfigError(f"workload (request {r.label or r.rid}).draft_id", r.draft_id,
                                      f"a draft device ({', '.join(names)})")
                if r.session >= 0:
                    sessions.setdefault(r.session, dev)
            if dev is None:
                pool = by_cohort.get(r.tenant, self.devices)
                key = r.tenant if r.tenant in by_cohort else None
                if weighted:
                    wrr = turn.get(key)
                    if wrr is None:
                        wrr = turn[key] = SmoothWeighted(pool, [capability(d) for d in pool])
                    dev = wrr.pick()
                else:
                    i = turn.get(key, 0)
                    dev = pool[i % len(pool)]
                    turn[key] = i + 1
                if r.session >= 0:
                    sessions[r.session] = dev
            dev.requests.append(r)

    def _ingress(self, r, rep):
        """A prompt that reached the gateway crosses the datacenter to the chosen replica."""
        st = self.states.get(r.rid)
        if st is None or st.device is None or not self.net.topo.has(rep.name):
            return None
        t0 = self.env.now
        ev = self.net.send(self.gw, rep.name, self.cfg.header_bytes + r.prompt_len * self.cfg.token_bytes, False)

        def hop_done(_e):
            st.net_s += self.env.now - t0
        ev.callbacks.append(hop_done)
        return ev

    def _issue(self, dev):
        env = self.env
        grp = dev.group
        for r in dev.requests:
            t = max(r.arrival, dev.next_free) if grp.closed_loop else r.arrival
            if self.horizon is not None and t >= self.horizon:
                self.unissued += 1
                continue
            if t > env.now:
                yield env.timeout(t - env.now)
            r.arrival = env.now
            if grp.closed_loop:
                ev = env.event()
                self._upload(dev, r, ev)
                yield ev
                dev.next_free = r.t_completion + self._think(dev) if r.t_completion is not None else env.now
            else:
                self._upload(dev, r, None)
        self.devices_done += 1
        self._maybe_done()

    def _issue_direct(self, reqs):
        """Fused or plain decoding without draft devices: requests reach the target directly."""
        env = self.env
        for r in reqs:
            if self.horizon is not None and r.arrival >= self.horizon:
                break
            if r.arrival > env.now:
                yield env.timeout(r.arrival - env.now)
            r.arrival = env.now
            self._start(r, None)
        self.fleet.arrivals_done = True

    def _think(self, dev) -> float:
        dist, mean, sigma = dev.group.think
        if mean <= 0 or dist == "constant":
            return mean
        if dist == "exponential":
            return float(dev.think_rng.exponential(mean))
        mu = math.log(mean) - sigma * sigma / 2           # lognormal with the given mean
        return float(dev.think_rng.lognormal(mu, sigma))

    def _maybe_done(self) -> None:
        if self.devices_done == len(self.devices) and self.uploading == 0:
            self.fleet.arrivals_done = True

    def _upload(self, dev, r, done_ev) -> None:
        cfg = self.cfg
        self.uploading += 1
        t0 = self.env.now
        ev = self.net.send(dev.name, self.gw, cfg.header_bytes + r.prompt_len * cfg.token_bytes, False)

        def arrived(_e):
            self.uploading -= 1
            self._start(r, dev, done_ev, self.env.now - t0)
            self._maybe_done()
        ev.callbacks.append(arrived)

    def _start(self, r, dev, done_ev=None, net_s: float = 0.0) -> SpecState:
        cfg = self.cfg
        cond = self.cond
        if cfg.policy in PER_TARGET:
            pol = None
        else:                     # a conditioned request's policy predicts with its own acceptance (pool rules aside)
            pol = cfg.make_policy(cond.model(r, cfg.acceptance) if cond is not None and cfg.portfolio is None else None)
        st = SpecState(self, dev, pol, cfg.mode != "off")
        st.done_ev = done_ev
        st.net_s = net_s
        if cond is not None:
            st.temp = cond.temperature(r)
            if r.sampling is not None and r.sampling[2]:
                self.domain_of[r.rid] = r.sampling[2]
        if cfg.portfolio is not None:
            st.drafter = cfg.portfolio.first(r.prompt_len, st.temp)
        self.states[r.rid] = st
        if st.speculative:
            r.spec = st
        self.fleet.arrive(r)
        return st

    def _finished(self, r) -> None:
        st = self.states.get(r.rid)
        if st is None:
            return
        if r.state == COMPLETED and st.device is not None:
            down = self.net.latency_s(self._dc(r.replica), st.device.name) + self.net.overhead_s
            st.first_at_server = r.t_first_token
            r.t_first_token += down
            r.t_last_token += down
            r.t_completion += down
            st.net_s += down
        ev = st.done_ev
        if ev is not None:
            ev.succeed()
