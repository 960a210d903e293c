"""Auto-topology (issue 43 item 5, seed 002 "Multi-Cluster Routing" and 5.8): speculation.topology's
affinity rules, fanout and cluster links generate the draft-to-pool connectivity
(dsim.specdec.topology); a conversation is routed only to its device's pools."""
from __future__ import annotations

import copy

import pytest

from dsim.config.errors import ConfigError
from dsim.config.scenario import load_scenario
from dsim.runner import simulate

HAND = {
    "name": "hand", "seed": 1, "model": "meta-llama/Llama-3.1-8B",
    "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
    "cluster": {"router": "random", "clusters": [
        {"name": "dc", "router": "random", "pools": [{"name": "A", "hardware": "H100-SXM", "replicas": 1},
                                                    {"name": "B", "hardware": "A100-80GB", "replicas": 1}]},
        {"name": "edge", "router": "random", "pools": [{"name": "C", "hardware": "L40S", "replicas": 1}]}]},
    "workload": {"type": "poisson", "rate": 20, "num_requests": 60, "prompt_tokens": 200, "output_tokens": 20},
    "speculation": {
        "mode": "distributed", "gamma": {"policy": "static", "k": 3},
        "drafts": [{"name": "phone", "profile": "phone-flagship", "count": 3, "rtt_ms": 40, "bw_mbps": 20},
                   {"name": "laptop", "profile": "laptop-rtx4060", "count": 2, "rtt_ms": 15, "bw_mbps": 100}],
        "topology": {"clusters": [{"name": "dc", "rtt_ms": 1, "bw_mbps": 100000},
                                  {"name": "edge", "rtt_ms": 3, "bw_mbps": 10000}],
                     "fanout_per_draft": 2,
                     "affinity_rules": {"phone": ["edge", "B"]}}},
    "output": {"plots": False},
}


def with_topology(**kw):
    d = copy.deepcopy(HAND)
    d["speculation"]["topology"].update(kw)
    return d


def test_the_generated_edges_are_the_hand_listed_ones():
    """By hand: the entry pools in declaration order are A, B (dc), C (edge).  phone's rule keeps
    B (named) and C (its cluster edge is named): [B, C]; laptop has no rule: [A, B, C].  Fanout 2:
    phone-0 {B, C}, phone-1 {C, B}, phone-2 {B, C}; laptop-0 {A, B}, laptop-1 {B, C}.  Links: access
    + gateway->cluster + 0.02 ms replica hop; the narrowest bandwidth."""
    conn = load_scenario(HAND).spec.connectivity
    assert conn.allowed == {"phone": ["B", "C"], "laptop": ["A", "B", "C"]}
    assert [conn.pools_of("phone", j) for j in range(3)] == [("B", "C"), ("C", "B"), ("B", "C")]
    assert [conn.pools_of("laptop", j) for j in range(2)] == [("A", "B"), ("B", "C")]
    got = [(e.group, e.pool, e.cluster, e.devices, round(e.rtt_ms, 6), e.bw_mbps) for e in conn.edges]
    assert got == [("phone", "B", "dc", 3, 41.02, 20), ("phone", "C", "edge", 3, 43.02, 20),
                   ("laptop", "A", "dc", 1, 16.02, 100), ("laptop", "B", "dc", 2, 16.02, 100),
                   ("laptop", "C", "edge", 1, 18.02, 100)]


def test_a_conversation_is_routed_only_to_its_devices_pools_over_the_generated_links():
    ses = simulate(load_scenario(HAND))
    conn = ses.scn.spec.connectivity
    dev = {rid: st.device.name for rid, st in ses.spec.states.items()}
    seen: dict = {}
    for r in ses.reqs:
        d = dev[r.rid]
        g, j = d.rsplit("-", 1)
        pool = r.replica.rsplit("-", 1)[0]
        assert pool in conn.pools_of(g, int(j)), (d, r.replica)
        seen.setdefault(d, set()).add(pool)
    assert all(len(s) == 2 for s in seen.values())        # the random routers used both of each device's pools
    # the messages cross the generated gateway -> cluster -> replica links (the edge's rtt)
    assert 2e3 * ses.network.latency_s("phone-0", "C-0") == pytest.approx(43.02)
    assert 2e3 * ses.network.latency_s("laptop-0", "A-0") == pytest.approx(16.02)


def test_without_the_rules_every_device_reaches_every_pool():
    conn = load_scenario(with_topology(fanout_per_draft=None, affinity_rules={})).spec.connectivity
    assert all(conn.pools_of(g, 0) == ("A", "B", "C") for g in ("phone", "laptop"))


def test_affinity_by_device_kind_and_a_group_name_wins():
    conn = load_scenario(with_topology(fanout_per_draft=1, affinity_rules={"laptop": ["C"], "phone": ["A"]})
                         ).spec.connectivity
    assert conn.allowed == {"phone": ["A"], "laptop": ["C"]}
    d = with_topology(fanout_per_draft=1, affinity_rules={"laptop": ["dc"]})     # "laptop" is a group and a kind
    d["speculation"]["drafts"][0]["profile"] = "laptop-m3pro"                      # phone group of laptop kind
    conn = load_scenario(d).spec.connectivity
    assert conn.allowed["phone"] == ["A", "B"] and conn.allowed["laptop"] == ["A", "B"]


@pytest.mark.parametrize("topo, where, what", [
    (dict(fanout_per_draft=3), "speculation.topology.fanout_per_draft", "at most the 2 pools group phone"),
    (dict(affinity_rules={"tablet": ["dc"]}), "speculation.topology.affinity_rules.tablet", "a draft group"),
    (dict(affinity_rules={"phone": ["D"]}), r"speculation.topology.affinity_rules.phone\[0\]", "a cluster"),
    (dict(clusters=[{"name": "dc", "rtt_ms": 1, "bw_mbps": 100}]), "speculation.topology.clusters",
     "missing: edge"),
])
def test_impossible_rules_are_refused_with_the_key(topo, where, what):
    with pytest.raises(ConfigError, match=f"^{where}.*{what}"):
        load_scenario(with_topology(**topo))


def test_generated_links_and_a_network_section_are_one_or_the_other():
    d = copy.deepcopy(HAND)
    d["network"] = {"links": [{"src": "gateway", "dst": "dc", "rtt_ms": 1, "bw_mbps": 1000}]}
    with pytest.raises(ConfigError, match="^speculation.topology.clusters"):
        load_scenario(d)
    d = copy.deepcopy(HAND)
    d["speculation"]["mode"] = "fused"
    d["speculation"].pop("drafts")
    with pytest.raises(ConfigError, match="^speculation.topology"):
        load_scenario(d)


def test_validate_prints_the_edges_and_the_summary_lists_them(tmp_path, capsys):
    import json

    import yaml

    from dsim.cli import main
    p = tmp_path / "hand.yaml"
    p.write_text(yaml.safe_dump(HAND))
    assert main(["validate", str(p)]) == 0
    out = capsys.readouterr().out
    assert "edge: phone -> C (edge): 3 devices, rtt 43.02 ms, 20 Mbit/s" in out
    assert "edge: laptop -> A (dc): 1 devices, rtt 16.02 ms, 100 Mbit/s" in out
    import dsim
    res = dsim.run(str(p), tmp_path / "out", plots=False)
    topo = json.loads((res.out_dir / "summary.json").read_text())["speculation"]["topology"]
    assert [(e["group"], e["pool"], e["devices"]) for e in topo["edges"]] == [
        ("phone", "B", 3), ("phone", "C", 3), ("laptop", "A", 1), ("laptop", "B", 2), ("laptop", "C", 1)]
    assert topo["generated_network"]["clusters"]["edge"] == {"rtt_ms": 3.0, "bw_mbps": 10000.0}
