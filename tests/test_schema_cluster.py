"""The declared ``cluster:`` section (dsim.config.schema.cluster): typed values, messages, JSON Schema."""
from pathlib import Path

import numpy as np
import pytest

from dsim.config.schema.jsonschema import described_schema

from dsim import ConfigError
from dsim.config.scenario import load_scenario
from dsim.config.schema.base import parse
from dsim.config.schema.cluster import (ClusterConfig, DisaggregationConfig, KvTransferConfig, PlainRouter,
                                        PoolConfig, PrefixAffinityRouter, QueueCapAdmission,
                                        SemiClairvoyantRouter, SloGuardAdmission, TokenBucketAdmission)

from helpers import scenario

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
WL = {"type": "poisson", "rate": 5, "num_requests": 5, "prompt_tokens": 50, "output_tokens": 5}


def cluster(**c):
    return parse(ClusterConfig, c, "cluster")


def test_hetero_fleet_parses_into_typed_clusters():
    scn = load_scenario(SCENARIOS / "hetero_fleet.yaml")
    c = scn.config.cluster
    assert isinstance(c, ClusterConfig) and c.pools is None
    assert c.router == PlainRouter(policy="least_outstanding")
    assert c.admission == QueueCapAdmission(policy="queue_cap", max_waiting=64)
    assert [x.name for x in c.clusters] == ["dc-h100", "dc-a100"]
    assert c.clusters[0].router.policy == "jsq" and c.clusters[1].router.policy == "weighted_power_of_two"
    small = c.clusters[1].pools[1]
    assert (small.name, small.hardware, small.replicas, small.engine.to_dict()) == ("a100-small", "A100-40GB", 1,
                                                                                   {"max_num_seqs": 128})
    # the fleet: names, paths, the global router, and engines merged over the top-level engine
    f = scn.fleet
    assert [(x.name, x.path) for x in f.clusters] == [("dc-h100", "cluster.clusters[0]"),
                                                       ("dc-a100", "cluster.clusters[1]")]
    assert f.global_router is c.router and f.clusters[1].router is c.clusters[1].router
    pools = {p.name: p for p in f.pools}
    assert pools["a100-small"].path == "cluster.clusters[1].pools[1]"
    assert pools["a100-small"].engine.max_num_seqs == 128 and pools["a100"].engine.max_num_seqs == 256
    assert pools["a100-small"].engine.max_num_batched_tokens == 2048         # the shared key stays
    assert pools["h100"].latency.to_dict() == {"model": "roofline"}


def test_pd_and_autoscaler_scenarios_parse():
    pd = load_scenario(SCENARIOS / "pd_disagg.yaml")
    c = pd.config.cluster
    assert c.affinity == "session" and [p.role for p in c.pools] == ["prefill", "decode"]
    assert c.disaggregation == DisaggregationConfig(decode_router={"policy": "least_kv"},
                                                    kv_transfer={"latency_ms": 0.05, "bandwidth_gb_s": 50})
    assert pd.fleet.clusters[0].disaggregation is c.disaggregation
    auto = load_scenario(SCENARIOS / "autoscale_ramp.yaml").config.cluster
    pool, ctrl = auto.pools[0], auto.controllers[0]
    assert (pool.min_replicas, pool.max_replicas, pool.cold_start_s) == (1, 4, 20)
    assert (ctrl.type, ctrl.pool, ctrl.interval_s, ctrl.scale_in_kv, ctrl.cooldown_s) == \
        ("autoscaler", "a100", 5, 0.15, 20)
    assert (ctrl.scale_out_kv, ctrl.scale_in_busy) == (0.9, 1.0)                    # defaults


def test_defaults_and_bare_names():
    c = cluster(pools=[{"name": "a"}])
    assert c.router == PlainRouter(policy="round_robin", staleness_s=0)
    assert c.admission is None and c.controllers == [] and c.clusters is None
    assert not c.given("router") and c.to_dict() == {"pools": [{"name": "a"}]}
    p = c.pools[0]
    assert p == PoolConfig(name="a") and (p.replicas, p.role, p.min_replicas, p.max_replicas) == (1, "mixed", 1, None)
    # P/D without a disaggregation section: its defaults in the fleet
    pd = cluster(pools=[{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}])
    assert pd.disaggregation is None and pd.disaggregated
    assert DisaggregationConfig().decode_router.policy == "least_outstanding"
    assert KvTransferConfig() == KvTransferConfig(latency_ms=0.1, bandwidth_gb_s=25)
    a = cluster(pools=[{"name": "a"}], admission={"policy": "token_bucket", "rate": 5})
    assert a.admission == TokenBucketAdmission(policy="token_bucket", rate=5) and a.admission.burst is None
    assert cluster(pools=[{"name": "a"}], admission="slo_guard").admission == SloGuardAdmission(policy="slo_guard")
    r = cluster(pools=[{"name": "a"}], router={"policy": "semi_clairvoyant", "estimate": "mean"}).router
    assert r == SemiClairvoyantRouter(policy="semi_clairvoyant", estimate="mean", sigma=0.5, mean_output_tokens=256)
    r = cluster(pools=[{"name": "a"}], router={"policy": "prefix_affinity", "max_queue_gap": np.int64(8)}).router
    assert r == PrefixAffinityRouter(policy="prefix_affinity", max_queue_gap=8)


def test_builders_take_the_typed_sections():
    from dsim.cluster.admission import TokenBucket, build_admission
    from dsim.cluster.routers import PrefixAffinity, build_router
    from dsim.cluster.transfer import build_transfer
    rng = np.random.default_rng(0)
    r, stale = build_router(PrefixAffinityRouter(policy="prefix_affinity", max_queue_gap=3, staleness_s=0.5), rng)
    assert isinstance(r, PrefixAffinity) and r.gap == 3 and stale == 0.5
    tb = build_admission(TokenBucketAdmission(policy="token_bucket", rate=0.5), "cluster.admission", None)
    assert isinstance(tb, TokenBucket) and tb.burst == 1.0                      # max(1, rate)
    assert build_admission(SloGuardAdmission(policy="slo_guard"), "cluster.admission", 250).ttft_s == 0.25
    with pytest.raises(ConfigError, match=r"^cluster\.admission\.ttft_ms: this key to be set \(the scenario has no "
                                          r"slo\.ttft_ms\)$"):
        build_admission(SloGuardAdmission(policy="slo_guard"), "cluster.admission", None)
    t = build_transfer(None, env=None)
    assert (t.latency_s, t.bw) == (0.1e-3, 25e9)


def test_a_pools_latency_replaces_the_shared_one():
    s = scenario(latency={"model": "blackbox", "beta": [1000, 0, 0]}, workload=WL,
                 cluster={"pools": [{"name": "a"}, {"name": "b", "latency": {"model": "roofline"}}]})
    pools = {p.name: p for p in load_scenario(s).fleet.pools}
    assert pools["a"].latency.to_dict() == {"model": "blackbox", "beta": [1000, 0, 0]}
    assert pools["b"].latency.to_dict() == {"model": "roofline"}


@pytest.mark.parametrize("section, message", [
    ({"pools": [{"name": "a"}], "router": "shortest"},
     "cluster.router.policy: got 'shortest', expected one of jiq, jsq, least_kv, least_outstanding, power_of_two, "
     "prefix_affinity, random, round_robin, semi_clairvoyant, slack, spec_aware, weighted_power_of_two"),
    ({"pools": [{"name": "a"}], "router": {"policy": "jsq", "stale": 1}},
     "cluster.router.stale: unknown key; did you mean 'staleness_s'? (known keys here: policy, staleness_s)"),
    ({"pools": [{"name": "a"}], "router": {"policy": "jsq", "staleness_s": 1e-300}},
     "cluster.router.staleness_s: got 1e-300, expected 0 (fresh views) or a period >= 1e-06 s"),
    ({"pools": [{"name": "a"}], "router": {"policy": "jsq", "max_queue_gap": 1}},
     "cluster.router.max_queue_gap: unknown key (known keys here: policy, staleness_s)"),
    ({"pools": [{"name": "a", "replicas": 2, "max_replicas": 1}]},
     "cluster.pools[0].max_replicas: got 1, expected >= replicas (2) and min_replicas (1)"),
    ({"pools": [{"name": "a", "replicas": 2, "min_replicas": 3}]},
     "cluster.pools[0].min_replicas: got 3, expected <= replicas (2)"),
    ({"pools": []}, "cluster.pools: got [], expected a non-empty list of pools"),
    ({"pools": [{"name": "p", "role": "prefill"}]},
     "cluster.pools: got ['prefill'], expected prefill/decode disaggregation: at least one prefill pool and one "
     "decode pool, and no mixed pool in the same cluster"),
    ({"pools": [{"name": "a"}], "disaggregation": {}},
     "cluster.disaggregation: got {}, expected pools with role: prefill and role: decode"),
    ({"pools": [{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}],
      "disaggregation": {"kv_transfer": {"bandwidth_gb_s": 0}}},
     "cluster.disaggregation.kv_transfer.bandwidth_gb_s: got 0, expected a number >= 1.25e-07"),
    ({"pools": [{"name": "a"}], "admission": {"policy": "token_bucket"}}, "cluster.admission.rate: this key to be set"),
    ({"pools": [{"name": "a"}], "controllers": [{"type": "autoscaler", "pool": "b"}]},
     "cluster.controllers[0].pool: got 'b', expected one of a"),
    ({"clusters": [{"name": "c", "pools": [{"name": "a"}]}, {"name": "d", "pools": [{"name": "a"}]}]},
     "cluster.clusters[1].pools[0].name: got 'a', expected a unique pool name (also used at "
     "cluster.clusters[0].pools[0])"),
    ({"clusters": [{"name": "c", "pools": [{"name": "a"}]}], "pools": [{"name": "b"}]},
     "cluster.pools: either pools (one cluster) or clusters, not both"),
    ({"clusters": [{"name": "c", "pools": [{"name": "a"}]}], "affinity": "session"},
     "cluster.affinity: set on each of clusters[i] when clusters are listed, not here"),
    ({}, "cluster.pools: this key to be set (a non-empty list of pools), or a list of clusters"),
])
def test_bad_sections_name_the_key(section, message):
    with pytest.raises(ConfigError) as e:
        load_scenario(scenario(workload=WL, cluster=section))
    assert str(e.value) == message


def test_pool_errors_from_the_builder_keep_their_paths():
    with pytest.raises(ConfigError, match=r"^cluster\.pools\[0\]\.engine: got 5, expected a mapping$"):
        load_scenario(scenario(workload=WL, cluster={"pools": [{"name": "a", "engine": 5}]}))
    with pytest.raises(ConfigError, match=r"^cluster\.pools\[0\]\.engine\.max_num_seqs: got 0"):
        load_scenario(scenario(workload=WL, cluster={"pools": [{"name": "a", "engine": {"max_num_seqs": 0}}]}))
    no_model = {k: v for k, v in scenario(workload=WL, cluster={"pools": [{"name": "a"}]}).items() if k != "model"}
    with pytest.raises(ConfigError, match=r"^cluster\.pools\[0\]\.model: a model here or at the top level$"):
        load_scenario(no_model)


def test_json_schema_describes_every_key():
    js = described_schema(ClusterConfig)
    props = js["properties"]
    assert set(props) == {"router", "affinity", "pools", "clusters", "disaggregation", "admission", "controllers"}
    assert all(p.get("description") for p in props.values())
    router = props["router"]["anyOf"]
    assert "jsq" in router[0]["enum"] and router[0]["type"] == "string"       # a bare name is offered too
    defs = js["$defs"]
    for name in ("PoolConfig", "ClusterItemConfig", "DisaggregationConfig", "KvTransferConfig", "AutoscalerConfig",
                 "TokenBucketAdmission", "SemiClairvoyantRouter"):
        assert all(p.get("description") for p in defs[name]["properties"].values()), name
    pool = defs["PoolConfig"]["properties"]
    assert pool["replicas"]["minimum"] == 1 and pool["replicas"]["maximum"] == 10_000
    assert pool["role"]["enum"] == ["mixed", "prefill", "decode"] and defs["PoolConfig"]["required"] == ["name"]
