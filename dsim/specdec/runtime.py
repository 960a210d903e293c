"""Speculative decoding at run time: draft devices issue conversations, each round is drafted on
the device (distributed) or on the target (fused) and verified inside the target's busy loop.

One round of a conversation on target replica T (distributed):
    T emits tokens -> result message T -> device -> device drafts k tokens (its busy loop) ->
    bundle device -> T -> T verifies them in its next step (k + 1 query tokens) -> T emits
    accepted + 1 tokens -> ...
Fused: the target drafts with its own drafter (k draft-model steps added to the verify step), so a
round is one step.  Hybrid: a mode selector picks distributed or fused per round (RTT and verify
queue thresholds, device availability, a cold fused drafter, or the latency-head gamma policy).
Plain decoding (``mode: off``) keeps the devices and the network but verifies nothing.

Every message goes through the network layer (``Network.send``) between the device and the
``gateway`` node, or, when the network has the target replica as a node, the replica itself, so
the gateway-to-replica hop is on the path (prompts cross it after routing: the request is ROUTED
meanwhile).  TTFT and E2E are seen on the device: the replica-to-device latency is added to the
first and last token times.
"""
from __future__ import annotations

import math

import networkx as nx

from ..config.errors import ConfigError
from ..latency.roofline import RooflineModel
from ..network.fabric import Network
from ..network.topology import MBPS, Topology
from .acceptance import expected_accepted, sample_accepted
from .cohorts import CohortSteps
from .conditioning import Conditioning
from .config import PER_TARGET, SpecConfig
from .conversations import Conversations
from .devices import DraftDevice
from .devmem import DeviceMemories
from .diststep import DistSteps
from .distround import DistRound
from .eagle import EagleHead
from .fusedstep import FusedSteps
from .gamma import DISTRIBUTED, FUSED, Telemetry
from .levels import LevelRounds
from .modes import DraftingModes
from .replay import ReproLog
from .state import ACC_PRIOR, SpecState, TargetState
from .tree import draft_tree


class SpecRuntime(Conversations, DraftingModes, LevelRounds, CohortSteps, DeviceMemories, FusedSteps, DistSteps):
    """The speculative-decoding run: draft devices and their links, the targets' state, and the
    rounds (drafting, verification inside the replica's step, the gamma policy's feedback).  How
    conversations reach a target is ``Conversations`` (dsim.specdec.conversations); where a round is
    drafted, and the fused drafter's cold starts, ``DraftingModes`` (dsim.specdec.modes)."""

    def __init__(self, sim, fleet, network, cfg: SpecConfig, reqs, horizon_s=None, slo_tpot_ms=None,
                 slo_tvt_ms=None):
        self.sim = sim
        self.env = sim.env
        self.fleet = fleet
        fleet.speculation = self             # SetSpeculation actions find the runtime here
        self.cfg = cfg
        self.horizon = horizon_s
        self.slo_tpot_ms = slo_tpot_ms or 0.0
        # EDF verification: a round is due this long after its drafts are at the target
        self.round_budget_s = (slo_tvt_ms or slo_tpot_ms or 0.0) / 1e3
        if cfg.verify_order == "edf" and not self.round_budget_s:
            raise ConfigError("speculation.verify_order", "edf", "a round deadline to order by: slo.tvt_ms or "
                              "slo.tpot_ms")
        self.rng = sim.rng.stream("specdec.accept")
        self.prng = sim.rng.stream("specdec.partial")
        self.net = network if network is not None else self._star()
        self.gw = cfg.gateway
        if not self.net.topo.has(self.gw):
            raise ConfigError("speculation.gateway", self.gw, "a node of the network topology (the datacenter "
                              "side of the draft devices' links)")
        self.devices: list = []
        topo = self.net.topo
        drafter0 = cfg.portfolio.drafters[0].model if cfg.portfolio is not None else cfg.drafter
        for gi, grp in enumerate(cfg.groups):
            think_rng = sim.rng.stream(f"specdec.think.{grp.name}")
            tok_cache: dict = {}
            sum_cache: dict = {}
            for i in range(grp.count):
                name = f"{grp.name}-{i}"
                if topo.has(name):
                    raise ConfigError("speculation.drafts", name, "device names not already in the network")
                topo.add_link(name, self.gw, grp.rtt_ms / 2e3, grp.bw_mbps * MBPS, f"speculation.drafts[{gi}].bw_mbps")
                self.devices.append(DraftDevice(self.env, name, grp, drafter0, think_rng, tok_cache, sum_cache))
            for t, rtt in grp.rtt_schedule:
                self.env.process(self._set_rtt(grp, t, rtt))
        self._devmem_init()
        self.targets: dict = {}
        self.overrides: dict = {}        # pool -> SetSpeculation override for its replicas
        self.pool_drafter: dict = {}     # pool -> SetDrafter's drafter name for its replicas
        self.states: dict = {}           # rid -> SpecState
        self._models: dict = {}          # (replica or device group, portfolio index) -> drafter roofline
        self._gpu: dict = {}             # replica -> its GPU (device profile)
        self.decision_hook = None        # (request, policy) after each gamma decision (dsim.explore.oracle)
        self.spills = 0
        self.link_fused = 0              # rounds the link-utilisation guard made fused (dsim.specdec.modes)
        self.link_hist: dict = {}        # device -> [(time, bytes up, bytes down)] of its access link
        self.cold_avoided = 0
        self.uploading = 0
        self.devices_done = 0
        self.unissued = 0
        self.by_context: dict = {}       # power-of-two context bin -> [rounds, verified, accepted]
        self.by_second: dict = {}        # whole simulated second -> [rounds, drafted, verified, accepted]
        # per-request acceptance (dsim.specdec.conditioning) and the reproducibility log (dsim.specdec.replay)
        self._pool_of: dict = {}         # replica -> pool name
        self.cond = Conditioning(cfg, self._pool_of) if Conditioning.wanted(cfg, reqs) else None
        self.domain_of: dict = {}        # rid -> its request's domain label (summary.json acceptance_by_domain)
        self.log = ReproLog(replay=cfg.replay) if cfg.replay is not None else None
        # _next_round's fused fast path: chains, every draft holding KV (no partial-verification draw),
        # one drafter level, no log to write or replay
        self._fused_fast = (cfg.tree is None and cfg.partial["mode"] == "all" and cfg.levels is None
                            and self.log is None)
        self._switch = self.switch_keys(cfg.switch)     # the hybrid selector's keys, read once
        self._pv_mode = cfg.partial["mode"]
        # dist_step's rounds (dsim.specdec.diststep): chains on one drafter, a round's depth is its k
        self._chain_one = cfg.tree is None and cfg.portfolio is None and cfg.levels is None
        self._levels_init()
        self._cohorts_init()
        for i, (_, pool, _) in enumerate(cfg.rules):
            if pool is not None and pool not in fleet.pools:
                raise ConfigError(f"speculation.acceptance_rules[{i}].pool", pool,
                                  f"a pool of the cluster ({', '.join(sorted(fleet.pools))})")
        self._bind(reqs)
        fleet.replica_hooks.append(self._setup_replica)
        for rep in fleet.replicas():
            self._setup_replica(rep)
        fleet.done_hooks.append(self._finished)
        fleet.ingress = self._ingress
        if not self.devices:
            self.env.process(self._issue_direct(reqs))
        pools = self._warm_pools()       # warm-first groups: one issue loop that picks the device
        for dev in self.devices:
            if dev.group.name not in pools:
                self.env.process(self._issue(dev))
        for devs in pools.values():
            self.env.process(self._issue_pool(devs))

    # ---- construction ------------------------------------------------------------------------
    def _star(self) -> Network:
        """No network section: a gateway node the draft devices' access links end at."""
        g = nx.Graph()
        g.add_node(self.cfg.gateway)
        return Network(self.env, Topology(g, "links", "speculation.drafts"), self.sim.rng.stream("network"))

    def _setup_replica(self, rep) -> None:
        cfg = self.cfg
        spec = rep.pool.spec
        load = cfg.cold["load_s"]
        top = (RooflineModel(cfg.portfolio.drafters[0].model if cfg.portfolio is not None else cfg.fused_drafter,
                             spec.device, 1) if cfg.framework == "vanilla" else
               EagleHead(spec.model, RooflineModel(spec.model, spec.device, spec.engine.tensor_parallel_size)))
        if load is None:                 # the fused drafter's weights (the EAGLE head's; every level's)
            nbytes = cfg.fused_drafter.weight_bytes if cfg.framework == "vanilla" else top.weight_bytes
            nbytes += sum(lv.model.weight_bytes for lv in cfg.levels.levels) if cfg.levels is not None else 0
            load = nbytes / spec.device.weight_load_bytes_s
        pol = cfg.make_policy() if cfg.policy in PER_TARGET else None
        self.targets[rep.name] = TargetState(pol, cfg.cold["initially_warm"], load)
        self._pool_of[rep.name] = rep.pool.name
        self._gpu[rep.name] = spec.device
        topo = self.net.topo
        if topo.has(rep.name) and not nx.has_path(topo.g, self.gw, rep.name):
            raise ConfigError("network", rep.name, f"a path from the gateway {self.gw!r} to replica {rep.name!r} "
                              "(draft devices reach the replicas that are network nodes through it)", show_value=False)
        self.targets[rep.name].override = self.overrides.get(rep.pool.name)
        if self.pool_drafter.get(rep.pool.name) is not None:
            self.targets[rep.name].drafter = cfg.portfolio.index(self.pool_drafter[rep.pool.name])
        rep.inst.draft_model = top
        if cfg.levels is not None:
            rep.inst.draft_cost = self._levels_fused_time
        self._cohorts_setup(rep.inst)
        rep.inst.verify_edf = cfg.verify_order == "edf"
        rep.inst.mixed_drafts = cfg.tree is not None or cfg.portfolio is not None

    def _dc(self, replica: str) -> str:
        """The datacenter end of a device's messages: the replica itself when the network has it
        as a node (the gateway -> replica hop is then on the path), else the gateway."""
        return replica if replica in self.net.topo.g else self.gw

    def _set_rtt(self, grp, t: float, rtt_ms: float):
        yield self.env.timeout(t)
        for d in self.devices:
            if d.group is grp:
                self.net.set_latency(d.name, self.gw, rtt_ms / 2e3)

    def start_log(self) -> None:
        """output.repro_log: record every mode decision and acceptance outcome from now on."""
        if self.log is None:
            self.log = ReproLog(record=True)
        else:
            self.log.lines = []
        self._fused_fast = False

    # ---- the portfolio ---------------------------------------------------------------------------------
    def _acceptance(self, st):
        if st.acc is not None:           # conditioned on its request (dsim.specdec.conditioning)
            return st.acc
        pf = self.cfg.portfolio
        return self.cfg.acceptance if pf is None or st.drafter < 0 else pf.drafters[st.drafter].acceptance

    def _fused_model(self, inst, i: int):
        """Drafter i of the portfolio on this replica's GPU (drafter 0 is the replica's draft_model)."""
        key = (inst.name, i)
        m = self._models.get(key)
        if m is None:
            m = self._models[key] = RooflineModel(self.cfg.portfolio.drafters[i].model, self._gpu[inst.name], 1)
        return m

    def _device_model(self, dev, i: int):
        key = (dev.group.name, i)
        m = self._models.get(key)
        if m is None:
            m = self._models[key] = dev.prof.step_model(self.cfg.portfolio.drafters[i].model)
        return m

    def first_token_at_server(self, r) -> float:
        """When r's first token left the server (its ``t_first_token`` is when the device saw it)."""
        st = self.states.get(r.rid)
        return st.first_at_server if st is not None and st.first_at_server is not None else r.t_first_token

    # ---- the replica's callbacks -----------------------------------------------------------------
    def accept(self, st: SpecState, r, k: int):
        """(accepted drafts, extra step seconds) for a verification of k drafts."""
        if k <= 0:
            return 0, 0.0
        if self.log is not None:         # replayed and/or recorded (dsim.specdec.replay)
            return self.log.accept(self, st, r, k)
        return self.draw(st, r, k)

    def draw(self, st: SpecState, r, k: int):
        """``accept`` without the log: the outcome drawn (or its expectation taken)."""
        cfg = self.cfg
        tree = st.tree
        if tree is not None:
            a = tree.sample(self.rng, k)
            k = tree.depth(k)            # a rollback: the walk stopped above the tree's deepest level
        elif cfg.expectation:
            probs = self._acceptance(st).probabilities(r.num_computed, k, st.temp)
            a = expected_accepted(st, probs)
            # a rollback (some draft rejected) in expectation too: 1 - prod(p) of one, carried
            full = 1.0
            for p in probs:
                full *= p
            st.rb_carry += 1.0 - full
            n = int(st.rb_carry + 1e-9)
            st.rb_carry -= n
            st.rollbacks += n
            return a, n * cfg.partial["rollback_penalty_ms"] * 1e-3
        else:
            a = sample_accepted(self.rng, self._acceptance(st).probabilities(r.num_computed, k, st.temp))
        if a < k:
            st.rollbacks += 1
            return a, cfg.partial["rollback_penalty_ms"] * 1e-3
        return a, 0.0

    def accept_rows(self, rows) -> float:
        """``accept`` for each row in order, with one draw of the uniforms for all chain drafts
        (the stream gives the same numbers drawn at once or row by row)."""
        extra = 0.0
        # trees draw per level; expectation draws nothing; the log takes each row in turn
        if self.cfg.tree is not None or self.cfg.expectation or self.log is not None:
            for row in rows:
                r = row[0]
                row[2], x = self.accept(r.spec, r, row[1])
                extra += x
            return extra
        total = sum([k for _, k, _ in rows if k > 0])
        if not total:
            for row in rows:
                row[2] = 0
            return extra
        u = self.rng.random(total).tolist()
        i = 0
        temp = self.cfg.temperature
        pen = self.cfg.partial["rollback_penalty_ms"] * 1e-3
        one = self.cfg.portfolio is None and self.cond is None
        acc0 = self.cfg.acceptance
        probs_of = acc0.probabilities
        for row in rows:
            r, k, _ = row
            if k <= 0:
                row[2] = 0
                continue
            j = i                        # accepted_run, inline: leading drafts with u < p
            for p in (probs_of(r.num_computed, k, temp) if one else
                      self._acceptance(r.spec).probabilities(r.num_computed, k, r.spec.temp)):
                if u[j] >= p:
                    break
                j += 1
            a = row[2] = j - i
            i += k
            if a < k:
                r.spec.rollbacks += 1
                extra += pen
        return extra

    def round_done(self, st: SpecState, r, inst, k: int, a: int, last: bool = False) -> None:
        """k < 0: a first token (or a recompute) came out; else a verification of k drafts
        accepted a.  Records the round, feeds the gamma policy and starts the next round."""
        now = self.env._now
        if k < 0:                       # a first token (or a recompute after preemption)
            if st.in_flight or st.ready:
                return
            st.t_last = now
            self._next_round(st, r, inst)
            return
        st.ready = False
        tgt = self.targets[inst.name]
        tgt.ready_n -= 1
        tree = st.tree
        # policies see a tree by its depth
        round_s, tpot_ms = self._tally(st, r, tgt, k, tree.depth(k) if tree is not None else k, a, now)
        pf = self.cfg.portfolio
        if pf is not None and tgt.drafter is None and pf.escalate(st.drafter, st.acc_est):
            st.drafter += 1              # a larger drafter from the next round, judged afresh
            st.escalations += 1
            st.acc_est = ACC_PRIOR
        gamma = tree.depth(st.drafted_now) if tree is not None else st.drafted_now
        st.last_k, st.last_a = gamma, a
        if self.devmem and not st.fused and st.device is not None:
            st.device.mem.verified(r, a, st.drafted_now)     # the device's drafter KV keeps the valid prefix
        pol = st.policy or tgt.policy
        if getattr(pol, "wants_feedback", True):
            pol.on_round(gamma, a, round_s, self._rtt_ms(st), tpot_ms,
                         not self.slo_tpot_ms or tpot_ms <= self.slo_tpot_ms)
        if not last:
            self._next_round(st, r, inst)

    def _tally(self, st: SpecState, r, tgt, k: int, depth: int, a: int, now: float):
        """A verified round's counts and estimates (acceptance, TPOT), for ``round_done`` and
        ``fused_round``; returns (round seconds, TPOT ms)."""
        tgt.verified += k
        tgt.accepted += a
        tgt.rounds += 1
        st.rounds += 1
        st.verified += k
        st.accepted += a
        st.drafted += st.drafted_now
        # summary.json's acceptance by context bin and gamma timeline (dsim.metrics.speculation)
        c = self.by_context.get((r.num_computed - a - 1).bit_length())      # context the drafts were verified at
        if c is None:
            c = self.by_context[(r.num_computed - a - 1).bit_length()] = [0, 0, 0]
        c[0] += 1
        c[1] += k
        c[2] += a
        w = self.by_second.get(int(now))
        if w is None:
            w = self.by_second[int(now)] = [0, 0, 0, 0]
        w[0] += 1
        w[1] += st.drafted_now
        w[2] += k
        w[3] += a
        if st.fused:
            st.fused_rounds += 1
        else:
            st.dist_rounds += 1
        tvt = now - st.t_ready
        if tvt > st.tvt_max:
            st.tvt_max = tvt
        round_s = now - st.t_last
        st.t_last = now
        if depth:
            st.acc_est = 0.8 * st.acc_est + 0.2 * (a / depth)
        tpot_ms = round_s * 1e3 / (a + 1)
        est = st.tpot_est
        st.tpot_est = tpot_ms if est == 0 else 0.8 * est + 0.2 * tpot_ms
        return round_s, tpot_ms

    def fast_target(self, inst):
        """This target's TargetState when the rounds verified on it this step can go through
        ``fused_round`` (fused mode or no devices, chains, one drafter, no controller override or
        decision hook, a drafter that never goes cold), else None."""
        tgt = self.targets[inst.name]
        if (self._fused_fast and self.cfg.portfolio is None and tgt.override is None and self.decision_hook is None
                and tgt.warm_until == math.inf and (self.cfg.mode == "fused" or not self.devices)):
            return tgt
        return None

    def fused_round(self, st: SpecState, r, inst, k: int, a: int, tgt) -> None:
        """``round_done`` then ``_next_round`` for a fused round on a ``fast_target`` that is not the
        conversation's last: the same updates in the same order, less the ones that cancel
        (ready False then True, the verify queue down then up) and the branches that cannot
        apply.  Rounds it cannot take (a device in distributed or hybrid mode, a policy that wants
        feedback or the telemetry) go the general way."""
        pol = st.policy or tgt.policy
        kf = pol.k_for
        if kf is None or pol.wants_feedback or not st.fused or (st.device is not None and self.cfg.mode != "fused"):
            self.round_done(st, r, inst, k, a)
            return
        now = self.env.now
        self._tally(st, r, tgt, k, k, a, now)
        st.last_k, st.last_a = st.drafted_now, a
        # the next round (_next_round's fast path; the drafter is warm for good)
        st.drafted_now = st.k = kf(r.num_computed, st.temp)
        st.t_ready = now
        st.deadline = now + self.round_budget_s
        if inst._wake is not None:
            inst.wake()

    # ---- one round ---------------------------------------------------------------------------------
    def _rtt_ms(self, st) -> float:
        return 2e3 * self.net.topo.latency_s(st.device.name, self.gw) if st.device is not None else 0.0

    def _next_round(self, st: SpecState, r, inst) -> None:
        cfg = self.cfg
        tgt = self.targets[inst.name]
        pol = st.policy or tgt.policy
        if tgt.drafter is not None and st.drafter != tgt.drafter:   # a SetDrafter action pins the pool's drafter
            st.drafter = tgt.drafter     # judged afresh, as after an escalation
            st.acc_est = ACC_PRIOR
        if self.cond is not None and st.acc_at != (inst.name, st.drafter):
            # its acceptance on this replica (domain, pool, top_p): looked up again only when the
            # replica or the drafter changed (the request's own terms are fixed)
            st.acc = None
            st.acc = self.cond.model(r, self._acceptance(st), inst.name)
            st.acc_at = (inst.name, st.drafter)
        if (self._fused_fast and (st.device is None or cfg.mode == "fused") and tgt.override is None
                and self.decision_hook is None and getattr(pol, "k_for", None) is not None):
            # the fused round of a chain with a context-only gamma rule: the general path below
            # with the branches that cannot apply taken out (no Telemetry, no mode selector)
            k = pol.k_for(r.num_computed, st.temp)
            st.tree = None
            st.drafted_now = st.k = k
            st.fused = True
            st.draft_model = self._fused_model(inst, st.drafter) if st.drafter > 0 else None
            if tgt.warm_until != math.inf:
                wait = self._drafter_ready(tgt)
                if wait is not None:
                    self._ready_later(wait, st, inst)
                    return
            tgt.ready_n += 1
            st.ready = True
            st.t_ready = now = self.env._now
            st.deadline = now + self.round_budget_s
            if inst._wake is not None:
                inst.wake()
            return
        kv = inst.kv
        tel = Telemetry(r.num_computed, st.last_k, st.last_a, st.acc_est, len(inst.waiting) + tgt.ready_n,
                        1.0 - kv.free_count / kv.total,
                        2e3 * self.net.topo.latency_s(st.device.name, self.gw) if st.device is not None else 0.0,
                        st.tpot_est, self.slo_tpot_ms, st.temp)
        pmode, k = pol.choose(tel)
        if self.decision_hook is not None:
            self.decision_hook(r, pol)
        mode = self._mode(st, tel, pmode, tgt)
        ov = tgt.override
        if ov is not None:               # a controller's SetSpeculation for this pool
            if ov[1] is not None:
                k = ov[1]
            if ov[0] == "off":
                mode, k = FUSED, 0       # plain decoding on the target: no drafts, no messages
            elif ov[0] == FUSED or (ov[0] == DISTRIBUTED and st.device is not None
                                    and st.device.available_from(self.env._now) != math.inf):
                mode = ov[0]
        kv_rep = None
        if self.log is not None:         # replayed (mode, k, kv) of this round, when the log has it
            mode, k, kv_rep = self.log.decide(r.rid, mode, k)
            if mode == DISTRIBUTED and (st.device is None or st.device.available_from(self.env._now) == math.inf):
                mode = FUSED             # an edited log cannot send drafts to a device that is not there
        depth = k
        steps = None
        if cfg.tree is not None and k:
            tr = cfg.tree
            st.tree = draft_tree(self._acceptance(st).probabilities(r.num_computed, k, st.temp),
                                 tr.topk, tr.tokens, tr.sibling)
            k = len(st.tree)             # depth k -> the tree's drafted nodes
            steps = st.tree.draft_steps(k)
        else:
            st.tree = None
            if cfg.levels is not None:
                k = self._levels_draw(st, r, k)      # L_0 drafts k; the target verifies the top level's
        st.drafted_now = k
        pm = self._pv_mode               # cfg.partial["mode"]
        kv_k = k
        if kv_rep is not None:
            kv_k = min(kv_rep, k)
        elif pm != "all" and (pm == "first_token" or (pm == "sampled" and float(self.prng.random())
                                                      >= cfg.partial["sample_rate"])):
            kv_k = min(k, 1)
        if self.log is not None:
            self.log.decided(self.env._now, r.rid, mode, depth, kv_k)
        if mode == FUSED:
            st.fused = True
            st.k = kv_k
            st.draft_model = self._fused_model(inst, st.drafter) if st.drafter > 0 else None
            wait = None if tgt.warm_until == math.inf else self._drafter_ready(tgt)
            if wait is None:
                self._ready(st, inst)
            else:
                self._ready_later(wait, st, inst)
            return
        st.fused = False
        st.in_flight = True
        now = self.env._now
        dc = self._dc(inst.name)
        rnd = DistRound(self, st, r, inst, tgt, k, kv_k, steps, dc, now)     # its callbacks (dsim.specdec.distround)
        self.net.send(dc, st.device.name, cfg.header_bytes + (st.last_a + 1) * cfg.token_bytes, False, rnd.at_device)

    def _ready_later(self, wait, st: SpecState, inst) -> None:
        """``_ready`` when ``wait`` (the fused drafter's load) fires; a closure made here, not in
        ``_next_round``, whose locals would otherwise all be cells."""
        wait.callbacks.append(lambda _e: self._ready(st, inst))

    def _ready(self, st: SpecState, inst) -> None:
        self.targets[inst.name].ready_n += 1
        st.ready = True
        st.t_ready = self.env._now
        st.deadline = st.t_ready + self.round_budget_s
        inst.wake()

    def mechanisms_summary(self) -> dict:
        """summary.json entries of the mechanisms that are on (none by default)."""
        cfg = self.cfg
        out = {}
        if cfg.framework != "vanilla":
            out["framework"] = cfg.framework
        if cfg.levels is not None:
            out["levels"] = self.levels_summary("top")
        if self.devmem:
            out["draft_memory"] = self.devmem_summary()
        if cfg.verify_order == "context_cohort" or cfg.verify_attention != "exact":
            out["verify_cohorts"] = self.cohorts_summary()
        return out

    # ---- control ---------------------------------------------------------------------------------------
    def set_override(self, pool: str, mode: str | None, k: int | None) -> list:
        """seed 001's speculative-decoding action: from the next round, the pool's conversations run
        in ``mode`` ("off" = plain decoding, "fused", "distributed"; None keeps the selector's) with
        ``k`` drafts (None keeps the gamma policy's); both None hands control back."""
        ov = None if mode is None and k is None else (mode, k)
        self.overrides[pool] = ov
        return self._set_on_pool(pool, "override", ov)

    def set_drafter(self, pool: str, name: str | None) -> list:
        """seed 002's drafter selection as an action: from the next round, the pool's conversations
        draft with the portfolio drafter ``name`` (None: each its own again)."""
        pf = self.cfg.portfolio
        if pf is None:
            raise ValueError("SetDrafter: speculation.portfolio is not set (its drafters are what a pool switches "
                             "between)")
        idx = None if name is None else pf.index(name)
        self.pool_drafter[pool] = name
        return self._set_on_pool(pool, "drafter", idx)

    def _set_on_pool(self, pool: str, attr: str, value) -> list:
        """Set ``attr`` on every speculating target of ``pool``; the pool's replica names."""
        names = [rep.name for rep in self.fleet.pool(pool).replicas]
        for n in names:
            if n in self.targets:
                setattr(self.targets[n], attr, value)
        return names
