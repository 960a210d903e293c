"""The hybrid mode switch reads the draft device's access-link utilisation (issue 43.2; seed 002
section 6.1 "network-aware guard", section 8 "Network Diagnostics")."""
import networkx as nx
import pytest
import simpy
from helpers import scenario

from dsim.config.scenario import load_scenario
from dsim.network.fabric import Network
from dsim.network.topology import MBPS, Topology
from dsim.runner import simulate


def test_carried_bytes_counts_a_flow_in_progress_by_hand():
    """125,000 bytes over a 1 Mbit/s link take 1 s: half-way the link has carried 62,500 bytes,
    the other direction none, and reading settles nothing."""
    env = simpy.Environment()
    g = nx.Graph()
    g.add_edge("dev", "gw", bw=1 * MBPS, latency_s=0.0)
    net = Network(env, Topology(g, "links", "x"), None)
    net.send("dev", "gw", 125_000, False)
    env.run(until=0.5)
    assert net.carried_bytes("dev", "gw") == pytest.approx(62_500)
    assert net.carried_bytes("gw", "dev") == 0.0
    env.run(until=2.0)
    assert net.carried_bytes("dev", "gw") == pytest.approx(125_000)


def spec(limit=None):
    sw = {"max_rtt_ms": 60}
    if limit is not None:
        sw["max_link_utilization"] = limit
    return {"mode": "hybrid", "acceptance": {"geometric": 0.7}, "gamma": {"k": 4}, "mode_switch": sw,
            "drafts": [{"name": "lap", "profile": "laptop-rtx4060", "count": 2, "rtt_ms": 10, "bw_mbps": 0.5}]}


def run(limit):
    # 2,000-token prompts are 8 kB: 128 ms each on a 0.5 Mbit/s link, 6 a second over 2 devices: about
    # 40 % of each link on average, above half of it in bursts
    s = scenario(latency={"model": "roofline"}, workload={"type": "poisson", "rate": 6, "num_requests": 60,
                                                          "prompt_tokens": 2000, "output_tokens": 40},
                 speculation=spec(limit))
    return simulate(load_scenario(s), check_invariants=True)


def test_a_saturated_access_link_sends_rounds_to_fused():
    """Without the key every round drafts on the device (RTT 10 ms is under the bound); with
    max_link_utilization 0.5 the rounds of a device whose link carried over half its bandwidth
    in the last second draft fused, and the guard's reading is the link's, computed again here."""
    off = run(None)
    assert sum(st.fused_rounds for st in off.spec.states.values()) == 0
    seen = []
    from dsim.specdec.runtime import SpecRuntime
    orig = SpecRuntime.link_utilization

    def spy(self, dev):
        u = orig(self, dev)
        seen.append((self.env.now, dev.name, u))
        return u
    SpecRuntime.link_utilization = spy
    try:
        on = run(0.5)
    finally:
        SpecRuntime.link_utilization = orig
    fused = sum(st.fused_rounds for st in on.spec.states.values())
    assert on.spec.link_fused == fused > 0 == on.spec.spills
    assert on.spec.link_fused == sum(1 for _, _, u in seen if u > 0.5)
    assert any(u <= 0.5 for _, _, u in seen)              # it switches back when the link is free
    assert max(u for _, _, u in seen) <= 1.0 + 1e-9       # a share of the bandwidth
