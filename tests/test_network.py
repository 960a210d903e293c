"""Network layer: exact transfer times, fair sharing, loss statistics, outages, topologies, errors."""
import math

import numpy as np
import pytest
import simpy

from dsim import ConfigError
from dsim.config.schema.base import parse
from dsim.config.schema.network import NetworkConfig
from dsim.network.build import build_network

MB = 1e6 / 8            # bytes/s per Mb/s


def net(raw, seed=0):
    env = simpy.Environment()
    return env, build_network(parse(NetworkConfig, raw, "network"), env, np.random.default_rng(seed))


LINK = {"links": [{"src": "a", "dst": "b", "rtt_ms": 10, "bw_mbps": 80}]}   # 10 MB/s, 5 ms one way


def run_sends(env, n, sends):
    out = {}

    def go(i, t, src, dst, nbytes):
        yield env.timeout(t)
        out[i] = yield n.send(src, dst, nbytes)
    for i, s in enumerate(sends):
        env.process(go(i, *s))
    env.run()
    return [out[i] for i in range(len(sends))]


def test_one_transfer_takes_latency_plus_bytes_over_bandwidth_plus_overhead():
    env, n = net(dict(LINK, serialization_overhead_us=50))
    (rec,) = run_sends(env, n, [(1.0, "a", "b", 2e6)])
    assert rec.end - rec.start == pytest.approx(50e-6 + 2e6 / (80 * MB) + 0.005, rel=1e-12)
    assert rec.path == ("a", "b") and rec.retries == 0 and rec.nbytes == 2e6



def test_a_send_without_a_record_arrives_at_the_same_time():
    env, n = net(LINK)
    (rec,) = run_sends(env, n, [(0.0, "a", "b", 1e6)])
    env2, n2 = net(LINK)
    ev = n2.send("a", "b", 1e6, record=False)
    env2.run()
    assert ev.ok and ev.value is None and env2.now == rec.end
    assert n2.summary(1.0)["links"] == n.summary(1.0)["links"]


def test_two_concurrent_transfers_share_and_finish_together():
    env, n = net(LINK)
    a, b = run_sends(env, n, [(0.0, "a", "b", 1e6), (0.0, "a", "b", 1e6)])
    assert a.end == pytest.approx(b.end) == pytest.approx(2e6 / (80 * MB) + 0.005)
    # a later, smaller flow: PS gives each half while both run (exact fluid arithmetic)
    env, n = net(LINK)
    big, small = run_sends(env, n, [(0.0, "a", "b", 1e6), (0.05, "a", "b", 2e5)])
    bw = 80 * MB
    # big alone 0.05 s (0.5 MB), then both at bw/2: small needs 0.04 s, big then has 0.3 MB left alone
    assert small.end == pytest.approx(0.05 + 2e5 / (bw / 2) + 0.005)
    assert big.end == pytest.approx(0.09 + (1e6 - 0.5e6 - 0.2e6) / bw + 0.005)
    # opposite directions do not share (full duplex)
    env, n = net(LINK)
    x, y = run_sends(env, n, [(0.0, "a", "b", 1e6), (0.0, "b", "a", 1e6)])
    assert x.end == pytest.approx(1e6 / bw + 0.005) == pytest.approx(y.end)


def test_max_min_fairness_across_a_bottleneck():
    # a-b fast, b-c slow: flow a->c is limited by b-c, so flow a->b gets the rest of a-b
    raw = {"links": [{"src": "a", "dst": "b", "rtt_ms": 0, "bw_mbps": 800},
                     {"src": "b", "dst": "c", "rtt_ms": 0, "bw_mbps": 80}]}
    env, n = net(raw)
    ac, ab = run_sends(env, n, [(0.0, "a", "c", 1e6), (0.0, "a", "b", 7e6)])
    assert ac.end == pytest.approx(1e6 / (80 * MB))           # 10 MB/s on the bottleneck
    assert ab.end == pytest.approx(7e6 / (720 * MB))          # 90 MB/s: what a-b has left


def test_a_flow_left_alone_on_a_link_still_shares_its_other_links():
    """x on a-b ends while f (a-b-c) is left alone on a-b: f still shares b-c with g, so both go on at
    half of b-c (not f at all of it, which would carry 1.5x b-c's bandwidth)."""
    raw = {"links": [{"src": "a", "dst": "b", "rtt_ms": 0, "bw_mbps": 80},
                     {"src": "b", "dst": "c", "rtt_ms": 0, "bw_mbps": 80}]}
    env, n = net(raw)
    x, f, g = run_sends(env, n, [(0.0, "a", "b", 1e6), (0.0, "a", "c", 2e6), (0.0, "b", "c", 2e6)])
    assert x.end == pytest.approx(0.2)                       # 5 MB/s each on both links while x runs
    assert f.end == pytest.approx(0.4) and g.end == pytest.approx(0.4)
    assert n.summary(0.4)["links"]["b->c"]["utilization"] <= 1 + 1e-12


def test_retransmissions_match_the_loss_rate():
    p, N = 0.2, 10_000
    env, n = net(dict(LINK, loss_pct=p * 100, retransmit_timeout_ms=50), seed=3)
    recs = run_sends(env, n, [(i * 0.001, "a", "b", 1000) for i in range(N)])
    retries = sum(r.retries for r in recs)
    # retries per transfer are geometric: mean p/(1-p), variance p/(1-p)^2
    mean, sd = N * p / (1 - p), math.sqrt(N * p) / (1 - p)
    assert abs(retries - mean) < 4 * sd and retries == n.retries
    one = next(r for r in recs if r.retries == 1)
    assert one.end - one.start >= 0.05                       # paid the timeout once


def test_outage_delays_exactly_the_transfers_it_overlaps():
    raw = dict(LINK, failures=[{"link": ["a", "b"], "start_s": 1.0, "end_s": 1.3}])
    env, n = net(raw)
    t = 1e6 / (80 * MB)                                       # 0.1 s on the wire
    before, across, after = run_sends(env, n, [(0.5, "a", "b", 1e6), (0.95, "a", "b", 1e6), (1.4, "a", "b", 1e6)])
    assert before.end - before.start == pytest.approx(t + 0.005)
    assert across.end - across.start == pytest.approx(t + 0.005 + 0.3) and across.waited_s == pytest.approx(0.3)
    assert after.end - after.start == pytest.approx(t + 0.005)
    s = n.summary(2.0)
    assert s["outage_wait_s"] == pytest.approx(0.3) and s["outages"][0]["end_s"] == 1.3


def test_failover_moves_flows_to_another_path():
    raw = {"links": [{"src": "a", "dst": "b", "rtt_ms": 2, "bw_mbps": 80},
                     {"src": "a", "dst": "c", "rtt_ms": 4, "bw_mbps": 80},
                     {"src": "c", "dst": "b", "rtt_ms": 4, "bw_mbps": 80}],
           "outage_policy": "failover", "failures": [{"link": ["a", "b"], "start_s": 0.05, "end_s": 10}]}
    env, n = net(raw)
    (r,) = run_sends(env, n, [(0.0, "a", "b", 1e6)])
    assert r.path == ("a", "c", "b") and r.waited_s == 0
    assert r.end == pytest.approx(0.1 + 0.004)                # bytes keep flowing; latency of the new path


def test_clos_paths_and_latencies_by_hand():
    raw = {"clos": {"spine_count": 2, "leaf_count": 3, "hop_latency_ms": 0.5, "device_edge_latency_ms": 0.1,
                    "attach": {"x": 0, "y": 0, "z": 2}}}
    env, n = net(raw)
    t = n.topo
    assert t.route("x", "y") == ["x", "leaf0", "y"]
    assert t.route("x", "z") == ["x", "leaf0", "spine0", "leaf2", "z"]
    assert n.latency_s("x", "y") == pytest.approx(0.2e-3)
    assert n.latency_s("x", "z") == pytest.approx(2 * 0.1e-3 + 2 * 0.5e-3)
    assert n.bottleneck_bytes_s("x", "z") == pytest.approx(400_000 * MB)
    t.ensure("w", "here")                                     # auto-attached round-robin: leaf0
    assert t.route("w", "x") == ["w", "leaf0", "x"]


def test_complete_graph_and_jitter_are_seeded():
    raw = {"complete": {"rtt_ms": 20, "bw_mbps": 800, "devices": ["p", "q"]},
           "jitter": {"rtt": {"dist": "normal", "scale_ms": 2}, "bandwidth": {"dist": "lognormal", "scale_pct": 10}}}
    runs = []
    for _ in range(2):
        env, n = net(raw, seed=9)
        runs.append([r.end for r in run_sends(env, n, [(i * 0.1, "p", "q", 1e5) for i in range(200)])])
    assert runs[0] == runs[1]
    d = np.array(runs[0]) - np.arange(200) * 0.1
    base = 0.01 + 1e5 / (800 * MB)
    assert abs(d.mean() - base) < 0.5e-3 and d.std() > 0.5e-3


@pytest.mark.parametrize("raw,match", [
    ({"links": [{"src": "a", "dst": "b", "rtt_ms": 1, "bw_mbps": -5}]}, r"network\.links\[0\]\.bw_mbps: got -5,"),
    ({"links": [{"src": "a", "dst": "a", "rtt_ms": 1, "bw_mbps": 5}]}, r"network\.links\[0\]\.dst"),
    ({"links": [{"src": "a", "dst": "b", "rtt_ms": 1}]}, r"network\.links\[0\]\.bw_mbps"),
    ({"clos": {"spine_count": 1, "leaf_count": 2, "hop_latency_ms": 1, "device_edge_latency_ms": 1,
               "attach": {"x": 5}}}, r"network\.clos\.attach\.x"),
    ({}, "exactly one of links, clos or complete"),
    (dict(LINK, failures=[{"link": ["a", "zz"], "start_s": 1, "end_s": 2}]), r"network\.failures\[0\]\.link"),
    (dict(LINK, jitter={"rtt": {"dist": "cauchy", "scale_ms": 1}}), r"network\.jitter\.rtt\.dist"),
])
def test_bad_topology_input(raw, match):
    with pytest.raises(ConfigError, match=match):
        net(raw)


def test_unknown_device_and_disconnected_path():
    env, n = net({"links": [{"src": "a", "dst": "b", "rtt_ms": 1, "bw_mbps": 5},
                            {"src": "c", "dst": "d", "rtt_ms": 1, "bw_mbps": 5}]})
    with pytest.raises(ConfigError, match="network.send: got 'zz'"):
        n.send("a", "zz", 10)
    with pytest.raises(ValueError, match="no network path from a to c"):
        n.send("a", "c", 10)


# ---- the P/D hook ----------------------------------------------------------------------------------
def _pd(network, wl=None, **dis):
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import scenario
    return scenario(latency={"model": "roofline"},
                    workload=wl or {"type": "constant", "rate": 2, "num_requests": 40, "prompt_tokens": 1000,
                                    "output_tokens": 10},
                    cluster={"pools": [{"name": "pre", "role": "prefill"}, {"name": "dec", "role": "decode"}],
                             "disaggregation": dis},
                    network=network)


def test_pd_kv_moves_over_the_network(tmp_path):
    import dsim
    raw = {"links": [{"src": "pre", "dst": "dec", "rtt_ms": 1, "bw_mbps": 8000}], "serialization_overhead_us": 30}
    res = dsim.run(_pd(raw), tmp_path / "o", check_invariants=True, plots=True)
    kv = res.scenario.model.kv_bytes_per_token
    for r in res.requests:
        # sparse arrivals: each transfer has the link to itself
        assert r.t_kv_ready - r.t_handoff == pytest.approx(30e-6 + 1000 * kv / (8000 * MB) + 0.5e-3, rel=1e-9)
    net = res.summary["network"]
    assert net["transfers"] == 40 and net["links"]["pre->dec"]["bytes"] == pytest.approx(40 * 1000 * kv)
    assert (tmp_path / "o" / "plots" / "network.png").is_file()


def test_pd_network_errors():
    import dsim
    raw = {"links": [{"src": "x", "dst": "dec", "rtt_ms": 1, "bw_mbps": 8000}]}
    with pytest.raises(ConfigError, match=r"cluster\.pools\[0\]\.name: got 'pre'"):
        dsim.run(_pd(raw))
    ok = {"links": [{"src": "pre", "dst": "dec", "rtt_ms": 1, "bw_mbps": 8000}]}
    with pytest.raises(ConfigError, match=r"cluster\.disaggregation\.kv_transfer"):
        dsim.run(_pd(ok, kv_transfer={"latency_ms": 1}))
    apart = {"links": [{"src": "pre", "dst": "x", "rtt_ms": 1, "bw_mbps": 8000},
                       {"src": "dec", "dst": "y", "rtt_ms": 1, "bw_mbps": 8000}]}
    with pytest.raises(ConfigError, match=r"network\.links: got 'pre -> dec'.*a network path"):
        dsim.run(_pd(apart))
    with pytest.raises(ConfigError, match=r"network\.links\[0\]\.rtt_ms"):
        dsim.run(_pd({"links": [{"src": "pre", "dst": "dec", "rtt_ms": -1, "bw_mbps": 8000}]}))
