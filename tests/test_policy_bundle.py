"""Policy bundles (issue 43 item 8, seed 002 section 6 "policy bundles", 5.6 policy_version): one
versioned file of policies a scenario loads; its policies are the run's, and the manifest names it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import dsim
from dsim.config.errors import ConfigError
from dsim.config.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
BUNDLE = ROOT / "scenarios" / "policies" / "queue_aware_v1.yaml"

SCN = {
    "seed": 3, "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
    "cluster": {"router": "random", "clusters": [
        {"name": "a", "router": "random", "pools": [{"name": "p", "replicas": 2}]},
        {"name": "b", "router": "round_robin", "pools": [{"name": "q", "replicas": 1}]}]},
    "workload": {"type": "poisson", "rate": 20, "num_requests": 30, "prompt_tokens": 100, "output_tokens": 10},
    "slo": {"tpot_ms": 50},
    "speculation": {"mode": "fused", "gamma": {"policy": "static", "k": 4}},
    "output": {"plots": False},
}


def write(tmp_path, scn, bundle=BUNDLE):
    (tmp_path / "b.yaml").write_text(bundle.read_text() if isinstance(bundle, Path) else yaml.safe_dump(bundle))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**scn, "policy_bundle": "b.yaml"}))
    return p


def test_the_bundles_policies_replace_the_scenarios_and_the_manifest_names_it(tmp_path):
    scn = load_scenario(write(tmp_path, SCN))
    cfg = scn.config
    assert cfg.cluster.router.policy == "jsq"
    assert [c.router.policy for c in cfg.cluster.clusters] == ["jsq", "jsq"]
    assert scn.spec.policy == "acceptance_backoff" and scn.spec.verify_order == "edf"
    assert scn.policy_bundle["name"] == "queue_aware" and scn.policy_bundle["version"] == "1"
    res = dsim.run(str(tmp_path / "s.yaml"), tmp_path / "out", plots=False)
    man = json.loads((res.out_dir / "manifest.json").read_text())
    assert man["policy_bundle"]["name"] == "queue_aware" and man["policy_bundle"]["version"] == "1"
    assert man["policy_bundle"]["policies"]["verify_order"] == "edf"
    # the run is the one the policies give when written into the scenario by hand
    by_hand = json.loads(json.dumps(SCN))
    by_hand["cluster"]["router"] = "jsq"
    for c in by_hand["cluster"]["clusters"]:
        c["router"] = "jsq"
    by_hand["speculation"].update(gamma={"policy": "acceptance_backoff"}, verify_order="edf")
    ref = dsim.run(load_scenario(by_hand), plots=False)
    assert res.summary["latency_ms"] == ref.summary["latency_ms"]
    plain = dsim.run(load_scenario(SCN), plots=False)            # and not the scenario's own policies
    assert plain.summary["latency_ms"] != res.summary["latency_ms"]


def test_set_overrides_win_over_the_bundle(tmp_path):
    scn = load_scenario(write(tmp_path, SCN), ["speculation.verify_order=fcfs", "cluster.router=round_robin"])
    assert scn.spec.verify_order == "fcfs" and scn.config.cluster.router.policy == "round_robin"
    assert scn.spec.policy == "acceptance_backoff"


def test_a_bad_bundle_is_refused_with_its_key(tmp_path):
    with pytest.raises(ConfigError, match=r"^policy_bundle\(b.yaml\).routr: unknown key"):
        load_scenario(write(tmp_path, SCN, {"policy_bundle": {"name": "x", "version": 1, "routr": "jsq"}}))
    with pytest.raises(ConfigError, match=r"^policy_bundle\(b.yaml\).version"):
        load_scenario(write(tmp_path, SCN, {"policy_bundle": {"name": "x", "router": "jsq"}}))
    with pytest.raises(ConfigError, match=r"^policy_bundle\(b.yaml\).decode_router: .*disaggregated"):
        load_scenario(write(tmp_path, SCN, {"policy_bundle": {"name": "x", "version": "2", "decode_router": "jsq"}}))
    with pytest.raises(ConfigError, match=r"^policy_bundle\(b.yaml\).gamma"):
        load_scenario(write(tmp_path, SCN, {"policy_bundle": {"name": "x", "version": 2, "gamma": {"policy": "nope"}}}))
