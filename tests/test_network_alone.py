"""Messages alone on their link and idle draft devices take a short way (dsim.network.fabric's
``Network.fast``, dsim.specdec.devices' ``DraftDevice.direct``); it must give what the general way
gives -- the fluid solver for every message, the queue for every draft job -- to the last byte, and
it must never be taken by a message that shares its link (docs/performance.md, "Round three:
distributed speculative rounds")."""
from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import networkx as nx
import numpy as np
import pytest
import simpy

import dsim
from dsim.network.fabric import Network
from dsim.network.topology import Topology
from dsim.specdec.devices import DraftDevice, DraftProfile

ROOT = Path(__file__).resolve().parents[1]


def _run(name, overrides, out, monkeypatch, fast):
    nets = []
    init = Network.__init__

    def spy(self, *a, **kw):
        init(self, *a, **kw)
        nets.append(self)
    with monkeypatch.context() as m:
        m.setattr(Network, "__init__", spy)
        m.setattr(Network, "fast", fast)
        m.setattr(DraftDevice, "direct", fast)
        dsim.run(str(ROOT / "scenarios" / name), out, overrides=overrides, plots=False)
    return nets


@pytest.mark.parametrize("name,overrides", [
    ("hybrid_rtt.yaml", ["workload.num_requests=10"]),                  # access links, RTT schedule, hybrid switch
    ("mobile_cloud_distributed.yaml", ["workload.num_requests=10"]),    # two device groups, backoff gamma
    ("hybrid_link_guard.yaml", ["workload.num_requests=20"]),           # prompt uploads share the uplinks
    ("draft_sweep_multicluster.yaml", ["workload.num_requests=8"]),    # multi-hop paths through the network
], ids=lambda v: v if isinstance(v, str) else "")
def test_short_way_equals_the_solver_and_the_queue(name, overrides, tmp_path, monkeypatch):
    general = _run(name, overrides, tmp_path / "general", monkeypatch, False)
    fast = _run(name, overrides, tmp_path / "fast", monkeypatch, True)
    for f in ("requests.csv", "summary.json"):
        assert (tmp_path / "fast" / f).read_bytes() == (tmp_path / "general" / f).read_bytes(), f
    assert sum(n.alone for n in general) == 0          # the switch really sends everything to the solver
    if name != "draft_sweep_multicluster.yaml":        # (multi-hop paths always take the solver)
        assert sum(n.alone for n in fast) > 0          # ... and the short way was taken


def _star(bw=1e6, latency_s=0.01, devices=("d0", "d1")):
    env = simpy.Environment()
    g = nx.Graph()
    g.add_node("gw")
    topo = Topology(g, "links", "test")
    for d in devices:
        topo.add_link(d, "gw", latency_s, bw)
    return env, Network(env, topo, np.random.default_rng(0))


def test_a_message_sharing_its_link_goes_through_the_solver():
    """A on d0's downlink from t=0 (1 MB at 1 MB/s), B joins it at t=0.5 (0.5 MB): they share the
    link at 0.5 MB/s each, so both last bytes leave at t=1.5 and arrive 10 ms later.  C, alone on
    d1's downlink, takes the short way: 0.2 s + 10 ms.  Had B (or A after B joined) been timed as
    alone, A would arrive at 1.01 s and B at 1.01 s."""
    env, net = _star()
    seen = {}

    def at(name):
        return lambda _e: seen.__setitem__(name, env.now)
    net.send("gw", "d0", 1e6, False, at("A"))
    net.send("gw", "d1", 2e5, False, at("C"))

    def later():
        yield env.timeout(0.5)
        work = net.work
        net.send("gw", "d0", 5e5, False, at("B"))
        assert net.work > work                     # the solver re-solved A and B
    env.process(later())
    env.run()
    assert net.alone == 2                          # A and C, not B
    assert seen["C"] == pytest.approx(0.21, abs=1e-12)
    assert seen["A"] == pytest.approx(1.51, abs=1e-12)
    assert seen["B"] == pytest.approx(1.51, abs=1e-12)
    # the link is free again: the next message is alone, as is one in the other direction meanwhile
    net.send("gw", "d0", 1e5, False, at("D"))
    net.send("d0", "gw", 1e5, False, at("E"))
    env.run()
    assert net.alone == 4
    assert seen["D"] == pytest.approx(1.51 + 0.11, abs=1e-12)
    assert seen["E"] == seen["D"]


def test_alone_and_solver_give_the_same_times_and_link_books(monkeypatch):
    """The same traffic (lone, overlapping and back-to-back messages on two links) with and without
    the short way: the same arrival times bit for bit, the same link bytes, busy times and bins."""
    def traffic(fast):
        monkeypatch.setattr(Network, "fast", fast)
        env, net = _star(bw=3e6, latency_s=0.0075)
        rng = np.random.default_rng(5)
        out = []

        def user(d):
            for _ in range(40):
                yield env.timeout(float(rng.exponential(0.05)))
                n = float(rng.integers(1, 200_000))
                net.send("gw", d, n, False, lambda _e, n=n: out.append((d, n, env.now)))
        env.process(user("d0"))
        env.process(user("d1"))
        env.run()
        books = {k: (lk.bytes, lk.busy_s, sorted(lk.bins.items())) for k, lk in net.links.items()}
        return out, books, net.alone
    fast_out, fast_books, alone = traffic(True)
    slow_out, slow_books, none = traffic(False)
    assert fast_out == slow_out
    assert fast_books == slow_books
    assert none == 0 < alone < 80                  # some messages overlapped on a link, some did not


class _Step:
    def step_time(self, b) -> float:
        return 1e-3 + 1e-7 * b.decode_ctx_sum


class _Profile(DraftProfile):
    def step_model(self, drafter):
        return _Step()


def test_idle_device_starts_as_the_queue_would(monkeypatch):
    """Jobs arriving at an idle device, at a busy one (queued) and after idle gaps shorter and longer
    than the cool-down, through thermal throttling: the same finish times and device books with
    and without the direct start."""
    prof = _Profile(name="p", kind="phone", peak_tflops=1.0, mem_gb_s=50.0, memory_gb=8.0, weight_bits=4,
                    compute_efficiency=0.5, memory_efficiency=0.5, step_overhead_ms=1.0, power_w=5.0,
                    joules_per_token=None, throttle_after_s=0.05, throttle_factor=0.6, cooldown_s=0.02)
    group = SimpleNamespace(profile=prof, available=(), max_batch=1, max_wait_s=0.0)

    def run(direct):
        monkeypatch.setattr(DraftDevice, "direct", direct)
        env = simpy.Environment()
        dev = DraftDevice(env, "p-0", group, None)
        rng = np.random.default_rng(3)
        out = []

        def user():
            for i in range(60):
                yield env.timeout(float(rng.choice([0.0, 0.001, 0.01, 0.03])))
                k, ctx = int(rng.integers(1, 8)), int(rng.integers(10, 3000))
                dev.submit(k, ctx, lambda i=i: out.append((i, env.now)))
        env.process(user())
        env.run()
        return out, (dev.busy_s, dev.energy_j, dev.throttled_s, dev.tokens, dev.hot_since, dev.last_end)
    fast, slow = run(True), run(False)
    assert fast == slow
    assert fast[1][2] > 0                          # some drafting was throttled
