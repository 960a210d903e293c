"""The declared ``network`` section: shipped scenarios parse into typed values, bad input is refused at
load with a path-qualified message, the JSON Schema describes every key, and the failure-link rule
(checked without a graph) agrees with the graph the builder makes."""
import itertools
from pathlib import Path

import numpy as np
import pytest

from dsim.config.schema.jsonschema import described_schema
import simpy

import dsim
from dsim import ConfigError
from dsim.config.schema.base import parse
from dsim.config.schema.network import NetworkConfig
from dsim.network.build import build_network

SCN = Path(__file__).resolve().parents[1] / "scenarios"
LINK = {"links": [{"src": "a", "dst": "b", "rtt_ms": 10, "bw_mbps": 80}]}


def link(src, dst, rtt_ms=1, bw_mbps=5):
    return {"src": src, "dst": dst, "rtt_ms": rtt_ms, "bw_mbps": bw_mbps}


def test_pd_network_parses_into_the_typed_section():
    net = dsim.load_scenario(SCN / "pd_network.yaml").config.network
    assert isinstance(net, NetworkConfig) and net.kind == "clos" and net.links is None and net.complete is None
    c = net.clos
    assert (c.spine_count, c.leaf_count, c.hop_latency_ms, c.device_edge_latency_ms) == (2, 2, 0.002, 0.001)
    assert (c.spine_bw_mbps, c.edge_bw_mbps) == (100000, 200000)
    assert c.attach == {"prefill-0": 0, "prefill-1": 0, "decode-0": 1, "decode-1": 1}
    assert net.serialization_overhead_us == 20 and net.outage_policy == "failover"
    assert net.jitter.rtt is None and (net.jitter.bandwidth.dist, net.jitter.bandwidth.scale_pct) == ("lognormal", 5)
    assert [(f.link, f.start_s, f.end_s) for f in net.failures] == [(["leaf0", "spine0"], 10, 20)]
    # what the file leaves out takes the documented defaults
    assert (net.loss_pct, net.retransmit_timeout_ms, net.max_retries, net.timeline_bin_s) == (0, 200, None, 1.0)
    assert not net.given("loss_pct") and net.given("failures")


def test_explicit_links_parse_in_order():
    net = dsim.load_scenario(SCN / "draft_sweep_multicluster.yaml").config.network
    assert net.kind == "links" and len(net.links) == 12
    lk = net.links[3]
    assert (lk.src, lk.dst, lk.rtt_ms, lk.bw_mbps) == ("datacenter", "dc-h100-0", 0.02, 100000)


def test_no_network_section_is_none():
    assert dsim.load_scenario(SCN / "quickstart.yaml").config.network is None


@pytest.mark.parametrize("sets,message", [
    (["network.clos.attach.decode-0=2"], "network.clos.attach.decode-0: got 2, expected a leaf index in 0..1"),
    (["network.clos.attach.decode-0=x"], "network.clos.attach.decode-0: got 'x', expected an integer"),
    (["network.failures[0].link=[leaf0, spine2]"],
     "network.failures[0].link: got ['leaf0', 'spine2'], expected [a, b]: two devices joined by a link of the "
     "topology"),
    (["network.failures[0].link=[decode-0, leaf0]"],          # decode-0 hangs off leaf1
     "network.failures[0].link: got ['decode-0', 'leaf0'], expected [a, b]: two devices joined by a link"),
    (["network.failures[0].end_s=5"], "network.failures[0].end_s: got 5, expected > start_s (10)"),
    (["network.jitter.bandwidth.dist=cauchy"],
     "network.jitter.bandwidth.dist: got 'cauchy', expected one of lognormal, normal, uniform"),
    (["network.clos.edge_bw_mbps=0"],
     "network.clos.edge_bw_mbps: got 0, expected a bandwidth >= 0.001 Mb/s (1 kbit/s)"),
    (["network.loss_pct=100"], "network.loss_pct: got 100, expected a number <= 99"),
    (["network.outage_polcy=wait"], "network.outage_polcy: unknown key; did you mean 'outage_policy'?"),
    (["network.links=[]"], "network: got ['clos', 'failures', 'jitter', 'links', 'outage_policy', "
                           "'serialization_overhead_us'], expected exactly one of links, clos or complete"),
])
def test_bad_values_are_refused_at_load(sets, message):
    with pytest.raises(ConfigError) as e:
        dsim.load_scenario(SCN / "pd_network.yaml", overrides=sets)
    assert str(e.value).startswith(message)


@pytest.mark.parametrize("raw,message", [
    ({}, "network: exactly one of links, clos or complete"),
    ({"link": []}, "network.link: unknown key; did you mean 'links'?"),
    ({"links": []}, "network.links: got [], expected a non-empty list of {src, dst, rtt_ms, bw_mbps}"),
    ({"links": [link("a", "b"), link("b", "a", rtt_ms=2)]},
     "network.links[1]: got ['b', 'a'], expected one link per pair of devices"),
    ({"links": [link("a", "a")]},
     "network.links[0].dst: got 'a', expected a device other than src"),
    ({"links": [{"src": "a", "dst": "b", "rtt_ms": 1}]}, "network.links[0].bw_mbps: this key to be set"),
    ({"complete": None}, "network.complete.rtt_ms: this key to be set"),
    ({"complete": {"rtt_ms": 1, "bw_mbps": 5, "devices": "pq"}},
     "network.complete.devices: got 'pq', expected a list of device names"),
    (dict(LINK, jitter={"rtt": {"dist": "normal"}}), "network.jitter.rtt.scale_ms: this key to be set"),
    (dict(LINK, max_retries=-1), "network.max_retries: got -1, expected a number >= 0"),
    (dict(LINK, failures=[{"link": ["a"], "start_s": 1, "end_s": 2}]),
     "network.failures[0].link: got ['a'], expected [a, b]"),
])
def test_bad_sections(raw, message):
    with pytest.raises(ConfigError) as e:
        parse(NetworkConfig, raw, "network")
    assert str(e.value).startswith(message)


def test_device_names_written_as_numbers_are_names():
    raw = {"complete": {"rtt_ms": 1, "bw_mbps": 5, "devices": ["p", 7]},
           "failures": [{"link": [7, "p"], "start_s": 0, "end_s": 1}]}
    net = parse(NetworkConfig, raw, "network")
    assert net.complete.devices == ["p", "7"] and net.failures[0].link == ["7", "p"]


@pytest.mark.parametrize("raw", [
    {"links": [link("a", "b"), link("b", "c")]},
    {"complete": {"rtt_ms": 1, "bw_mbps": 5, "devices": ["p", "q", "r"]}},
    {"clos": {"spine_count": 2, "leaf_count": 3, "hop_latency_ms": 1, "device_edge_latency_ms": 1,
              "attach": {"x": 0, "y": 2, "leaf9": 1}}},
])
def test_joins_is_the_builders_graph(raw):
    cfg = parse(NetworkConfig, raw, "network")
    g = build_network(cfg, simpy.Environment(), np.random.default_rng(0)).topo.g
    names = list(g.nodes) + ["zz", "leaf3", "spine2", "leaf01"]
    for a, b in itertools.product(names, names):
        assert cfg.joins(a, b) == g.has_edge(a, b), (a, b)


def test_json_schema_describes_every_key():
    js = described_schema(NetworkConfig)
    defs = js["$defs"]
    for props in [js["properties"]] + [d["properties"] for d in defs.values()]:
        for key, p in props.items():
            assert p.get("description"), key
    assert set(js["properties"]) == {"links", "clos", "complete", "serialization_overhead_us", "loss_pct",
                                     "retransmit_timeout_ms", "max_retries", "jitter", "outage_policy",
                                     "timeline_bin_s", "failures"}
    assert {"Link", "Clos", "Complete", "Jitter", "RttJitter", "BandwidthJitter", "Failure"} <= set(defs)
    assert defs["Link"]["properties"]["bw_mbps"]["minimum"] == 0.001
    assert defs["Clos"]["properties"]["attach"]["additionalProperties"]["type"] == "integer"
    assert js["properties"]["outage_policy"]["enum"] == ["wait", "failover"]
    from dsim.config.schema.scenario import ScenarioConfig
    assert "NetworkConfig" in described_schema(ScenarioConfig)["$defs"]
