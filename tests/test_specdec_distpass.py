"""The distributed rounds' short ways (docs/performance.md, "Round three, second pass: distributed
rounds") against the general ways, bit for bit: a target's verified rounds in one pass
(``SpecRuntime.dist_pass``: dist_step instead of round_done per row) and a lone message's start
and end inline (``Network.lean``: send and _tick instead of _begin, _arm, _settle and _deliver),
with the previous pass's short ways (``Network.fast``, ``DraftDevice.direct``) on and off."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
import simpy

from dsim.config.scenario import load_scenario
from dsim.network.fabric import Network
from dsim.network.topology import Topology
from dsim.runner import simulate
from dsim.specdec.devices import DraftDevice
from dsim.specdec.gamma import DISTRIBUTED, FUSED, Telemetry
from dsim.specdec.modes import DraftingModes
from dsim.specdec.runtime import SpecRuntime
from dsim.specdec.state import TargetState

ROOT = Path(__file__).resolve().parents[1]
STATE = ("rounds", "verified", "accepted", "drafted", "fused_rounds", "dist_rounds", "rollbacks", "tvt_max",
         "acc_est", "tpot_est", "last_k", "last_a", "k", "drafted_now", "t_ready", "t_last", "deadline", "net_s")


def _outcome(name, overrides):
    ses = simulate(load_scenario(str(ROOT / "scenarios" / name), overrides + ["output.plots=false"]))
    rt = ses.spec
    net = rt.net
    reqs = sorted((r.rid, r.t_first_token, r.t_completion, r.n_out, r.energy_j, r.kv_peak_bytes) for r in ses.reqs)
    states = sorted((rid, tuple(getattr(st, f) for f in STATE)) for rid, st in rt.states.items())
    tgts = sorted((n, t.verified, t.accepted, t.rounds, t.ready_n, t.cold_starts) for n, t in rt.targets.items())
    reps = [(rep.name, rep.inst.kv.free_count, rep.inst.itl_extra, rep.inst.num_steps) for rep in ses.fleet.replicas()]
    links = sorted((k, lk.bytes, lk.busy_s, sorted(lk.bins.items())) for k, lk in net.links.items())
    fabric = (net.count, net.delivered, net.total_s, net.waited_s, net.next_fid, net.seq, net.summary(ses.sim.env.now))
    devs = [(d.name, d.busy_s, d.energy_j, d.tokens, d.throttled_s, d.last_end) for d in rt.devices]
    counts = (list(rt.by_context.items()), list(rt.by_second.items()), rt.spills, rt.link_fused, rt.cold_avoided)
    return reqs, states, tgts, reps, links, fabric, devs, counts, ses.sim.env.now


CASES = {   # scenario, overrides: each case reaches a different part of the rounds' code
    # hybrid: the RTT schedule moved early so rounds switch to fused and back; a cold fused drafter
    "hybrid": ("hybrid_rtt.yaml", ["workload.num_requests=20", "speculation.drafts[0].count=10",
                                   "speculation.drafts[0].rtt_schedule=[[1.5, 150], [3.0, 15]]"]),
    # two device groups, acceptance back-off gamma
    "backoff": ("mobile_cloud_distributed.yaml", ["workload.num_requests=8"]),
    # a gamma policy that wants each round's feedback (on_round with the RTT)
    "feedback": ("trained_gamma_head.yaml", ["workload.num_requests=5"]),
    # prompt uploads share the uplinks (the solver), the link-utilisation guard reads the link books
    # (without its repro log, which sends every row the general way)
    "shared links": ("hybrid_link_guard.yaml", ["workload.num_requests=16", "output.repro_log=false"]),
}


def _ways(name, overrides, monkeypatch, every=False):
    """(short ways on, this pass's off, with ``every`` every short way off too, else None) and how
    often this pass's short ways ran."""
    steps, delivers = [], []
    step, deliver = SpecRuntime.dist_step, Network._deliver
    monkeypatch.setattr(SpecRuntime, "dist_step", lambda self, *a: (steps.append(1), step(self, *a))[1])
    monkeypatch.setattr(Network, "_deliver", lambda self, *a, **kw: (delivers.append(1), deliver(self, *a, **kw))[1])
    on = _outcome(name, overrides)
    taken = (len(steps), on[5][1] - len(delivers))      # one-pass steps, messages delivered inline
    steps.clear()
    delivers.clear()
    monkeypatch.setattr(SpecRuntime, "dist_pass", False)
    monkeypatch.setattr(Network, "lean", False)
    off = _outcome(name, overrides)
    assert not steps and len(delivers) == off[5][1]     # the switches really turn the short ways off
    if not every:
        return on, off, None, taken
    monkeypatch.setattr(Network, "fast", False)
    monkeypatch.setattr(DraftDevice, "direct", False)
    return on, off, _outcome(name, overrides), taken


@pytest.mark.parametrize("case", sorted(CASES))
def test_short_ways_give_the_general_ways_bit_for_bit(case, monkeypatch):
    every = case == "hybrid"                             # (the previous pass's short ways off too: once)
    on, off, general, (steps, inline) = _ways(*CASES[case], monkeypatch, every)
    assert steps > 20 and inline > 100                  # both short ways carried the run
    assert on == off
    assert not every or on == general


def test_hybrid_case_switches_modes_and_loads_the_drafter():
    """The hybrid case reaches what it is there for: fused and distributed rounds, a cold start."""
    on = _outcome(*CASES["hybrid"])
    states, tgts = on[1], on[2]
    assert sum(s[1][4] for s in states) > 50 and sum(s[1][5] for s in states) > 50      # fused, distributed
    assert tgts[0][5] >= 1                              # the fused drafter was loaded


def _star(bw, latency_s, devices):
    env = simpy.Environment()
    g = nx.Graph()
    g.add_node("gw")
    topo = Topology(g, "links", "test")
    for d in devices:
        topo.add_link(d, "gw", latency_s, bw)
    return env, Network(env, topo, np.random.default_rng(0), bin_s=0.05)


def test_lean_messages_through_outages_bins_and_records(monkeypatch):
    """Random traffic on three access links (lone and overlapping messages, both directions, some
    with a TransferRecord, some crossing timeline bins, one link down for a while): the same arrival
    times and values, link books and fabric totals with and without the inline start and end."""
    def traffic(lean):
        monkeypatch.setattr(Network, "lean", lean)
        env, net = _star(2e6, 0.004, ("d0", "d1", "d2"))
        rng = np.random.default_rng(11)
        out = []

        def user(d):
            for i in range(50):
                yield env.timeout(float(rng.exponential(0.04)))
                n = float(rng.integers(1, 150_000))
                src, dst = (d, "gw") if i % 3 else ("gw", d)
                if i % 5 == 0:                          # an event with a TransferRecord, waited for
                    ev = net.send(src, dst, n)
                    ev.callbacks.append(lambda e, d=d: out.append((d, env.now, tuple(e.value))))
                else:
                    net.send(src, dst, n, False, lambda e, d=d, n=n: out.append((d, n, env.now, e._value)))

        def outage():
            yield env.timeout(0.3)
            net._set_link(frozenset(("d1", "gw")), False)
            yield env.timeout(0.2)
            net._set_link(frozenset(("d1", "gw")), True)
        for d in ("d0", "d1", "d2"):
            env.process(user(d))
        env.process(outage())
        env.run()
        books = sorted((k, lk.bytes, lk.busy_s, sorted(lk.bins.items())) for k, lk in net.links.items())
        return out, books, (net.total_s, net.waited_s, net.delivered, net.count), net.summary(env.now)
    lean, general = traffic(True), traffic(False)
    assert lean == general
    assert lean[2][1] > 0                               # messages waited out the outage
    assert len(lean[0]) == 150


class _Modes(DraftingModes):
    """The mode selector alone: a configuration, a clock, no network."""

    def __init__(self, mode, switch, spill_pct=None):
        self.cfg = SimpleNamespace(mode=mode, switch=switch, kv_spill_pct=spill_pct)
        self._switch = self.switch_keys(switch)
        self.env = simpy.Environment()
        self.spills = self.link_fused = self.cold_avoided = 0


def _tel(rtt_ms=10.0, queue=0, kv=0.5):
    return Telemetry(100, 4, 3, 0.7, queue, kv, rtt_ms, 20.0, 50.0, 0.0)


def test_mode_selector_thresholds_by_hand():
    """rtt_load: distributed while RTT <= max_rtt_ms and the verify queue <= max_verify_queue (both
    bounds included), fused beyond either, above the KV spill and when the device is away or gone;
    gamma_policy: the policy's own choice while the device is there."""
    sw = {"policy": "rtt_load", "max_rtt_ms": 60.0, "max_verify_queue": 64}
    sel = _Modes("hybrid", sw, spill_pct=85.0)
    warm = TargetState(None, True, 1.0)
    here = SimpleNamespace(device=SimpleNamespace(windows=(), available_from=lambda t: t), fused_until=-1.0)
    assert sel._mode(here, _tel(60.0, 64), FUSED, warm) == DISTRIBUTED
    assert sel._mode(here, _tel(60.0000001, 64), DISTRIBUTED, warm) == FUSED
    assert sel._mode(here, _tel(60.0, 65), DISTRIBUTED, warm) == FUSED
    assert sel._mode(here, _tel(kv=0.86), DISTRIBUTED, warm) == FUSED and sel.spills == 1
    away = SimpleNamespace(device=DraftDevice.__new__(DraftDevice), fused_until=-1.0)
    away.device.windows = ((1.0, 2.0),)
    assert sel._mode(away, _tel(), DISTRIBUTED, warm) == FUSED         # not available until t = 1
    sel.env.run(until=3.0)
    assert sel._mode(away, _tel(), DISTRIBUTED, warm) == FUSED         # gone for good
    pol = _Modes("hybrid", {**sw, "policy": "gamma_policy"})
    assert pol._mode(here, _tel(500.0, 999), DISTRIBUTED, warm) == DISTRIBUTED
    assert pol._mode(here, _tel(), FUSED, warm) == FUSED
    assert _Modes("distributed", sw)._mode(here, _tel(500.0, 999), FUSED, warm) == DISTRIBUTED


def test_no_one_pass_with_a_log_or_drafter_memory(monkeypatch):
    """A repro log (which records every decision) or drafter memory on the devices (which
    round_done updates): no step takes the one pass, and the run is the one without the switch."""
    steps = []
    step = SpecRuntime.dist_step
    monkeypatch.setattr(SpecRuntime, "dist_step", lambda self, *a: (steps.append(1), step(self, *a))[1])
    for name, over in (("hybrid_link_guard.yaml", ["workload.num_requests=6"]),
                       ("draft_kv_sessions.yaml", ["workload.num_requests=6"])):
        on = _outcome(name, over)
        assert not steps
        monkeypatch.setattr(SpecRuntime, "dist_pass", False)
        assert _outcome(name, over) == on
        monkeypatch.setattr(SpecRuntime, "dist_pass", True)
