"""deploy/: the vllm serve line parses with vLLM's own flag names back into the simulated engine, and the
Kubernetes manifests are valid against the Kubernetes OpenAPI schema (offline)."""
from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

import pytest
import yaml

import dsim
from dsim.explore.deploy import deployment_files, gpus_per_replica, k8s_name, serve_line

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ["quickstart", "pd_disagg", "pipeline_parallel", "dp_ep_moe", "fp8_scout_tp2", "priority_classes"]


def vllm_parser() -> argparse.ArgumentParser:
    """The engine arguments of `vllm serve` we emit, spelled as vLLM documents them (docs.vllm.ai,
    "Engine Arguments"): a flag dsim invents or misspells fails to parse here."""
    p = argparse.ArgumentParser(prog="vllm serve", exit_on_error=False)
    p.add_argument("model")
    for flag, typ in (("--tensor-parallel-size", int), ("--pipeline-parallel-size", int),
                      ("--data-parallel-size", int), ("--max-num-seqs", int), ("--max-num-batched-tokens", int),
                      ("--max-model-len", int), ("--block-size", int), ("--gpu-memory-utilization", float),
                      ("--kv-cache-dtype", str), ("--port", int), ("--num-gpu-blocks-override", int),
                      ("--long-prefill-token-threshold", int), ("--kv-transfer-config", json.loads)):
        p.add_argument(flag, type=typ)
    p.add_argument("--scheduling-policy", choices=["fcfs", "priority"])
    for flag in ("--enable-chunked-prefill", "--enable-prefix-caching"):
        p.add_argument(flag, action=argparse.BooleanOptionalAction)
    for flag in ("--enable-expert-parallel", "--enforce-eager", "--async-scheduling"):
        p.add_argument(flag, action="store_true")
    return p


@pytest.mark.parametrize("name", SCENARIOS)
def test_serve_line_round_trips_into_the_simulated_engine(name):
    scn = dsim.load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    for pool in scn.fleet.pools:
        line = serve_line(pool)
        words = shlex.split(line)
        assert words[:2] == ["vllm", "serve"]
        a = vllm_parser().parse_args(words[2:])
        e = pool.engine
        assert a.model == pool.model.name
        assert (a.tensor_parallel_size, a.pipeline_parallel_size, a.data_parallel_size) == (
            e.tensor_parallel_size, e.pipeline_parallel_size, e.data_parallel_size)
        assert (a.max_num_seqs, a.max_num_batched_tokens, a.max_model_len, a.block_size) == (
            e.max_num_seqs, e.max_num_batched_tokens, e.max_model_len, e.block_size)
        assert a.gpu_memory_utilization == pytest.approx(e.gpu_memory_utilization)
        assert a.enable_chunked_prefill is e.enable_chunked_prefill
        assert a.enable_prefix_caching is e.enable_prefix_caching
        assert a.enable_expert_parallel is e.enable_expert_parallel
        assert a.kv_cache_dtype == e.kv_cache_dtype
        assert a.num_gpu_blocks_override == e.num_gpu_blocks
        assert (a.kv_transfer_config is not None) is (pool.role in ("prefill", "decode"))


@pytest.mark.parametrize("name", SCENARIOS)
def test_k8s_manifests_are_valid_and_size_the_pools(name):
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (dev extra)")
    scn = dsim.load_scenario(ROOT / "scenarios" / f"{name}.yaml")
    files = deployment_files(scn)
    assert "serve.sh" in files
    pools = {p.name: p for p in scn.fleet.pools}
    seen = set()
    for fname, text in files.items():
        if not fname.endswith(".k8s.yaml"):
            continue
        docs = list(yaml.safe_load_all(text))
        assert [d["kind"] for d in docs] == ["Deployment", "Service"]
        for d in docs:
            kv.validate(d, kv.latest_version(), strict=True)     # raises on any schema violation
        dep = docs[0]
        assert dep["metadata"]["labels"]["app.kubernetes.io/component"] == fname.removesuffix(".k8s.yaml")
        pool = next(p for p in pools.values() if k8s_name(p.name) == fname.removesuffix(".k8s.yaml"))
        seen.add(pool.name)
        assert dep["spec"]["replicas"] == pool.replicas
        limits = dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == gpus_per_replica(pool.engine)
        assert docs[1]["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    assert seen == set(pools)


def test_a_broken_manifest_is_refused_by_the_validator():
    """The validator is not a rubber stamp: a Deployment without its selector is refused."""
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (dev extra)")
    scn = dsim.load_scenario(ROOT / "scenarios" / "quickstart.yaml")
    text = next(t for f, t in deployment_files(scn).items() if f.endswith(".k8s.yaml"))
    dep = next(yaml.safe_load_all(text))
    del dep["spec"]["selector"]
    with pytest.raises(kv.ValidationError):
        kv.validate(dep, kv.latest_version(), strict=True)


def test_research_policy_is_named_not_dropped():
    scn = dsim.load_scenario(ROOT / "scenarios" / "edf_slo_classes.yaml")
    text = deployment_files(scn)["serve.sh"]
    assert "dsim research policy" in text and "--scheduling-policy edf" not in text


def test_a_plan_folder_with_deploy_is_replaced_but_a_users_file_in_it_is_not(tmp_path):
    """A second `dsim plan --out` into its own folder was refused ('deploy, which dsim did not write');
    a file of the user's inside deploy/ must still stop it."""
    from dsim.config.errors import ConfigError
    from dsim.metrics.writers import AtomicOutput
    out = tmp_path / "plan"
    for _ in range(2):
        ao = AtomicOutput(out)
        ao.write_text("plan.md", "x")
        ao.write_text("deploy/serve.sh", "vllm serve m")
        ao.commit()
    assert (out / "deploy" / "serve.sh").read_text() == "vllm serve m"
    (out / "deploy" / "mine.txt").write_text("keep")
    with pytest.raises(ConfigError, match=r"deploy/mine\.txt"):
        AtomicOutput(out)
    assert (out / "deploy" / "mine.txt").read_text() == "keep"


def test_speculation_and_config_path_models_are_named_not_dropped(tmp_path):
    spec = deployment_files(dsim.load_scenario(ROOT / "scenarios" / "datacenter_fused.yaml"))["serve.sh"]
    assert "speculative decoding was simulated" in spec and "--speculative-config" in spec
    cfg = tmp_path / "my-llama" / "config.json"
    cfg.parent.mkdir()
    from importlib import resources
    src = next(p for p in resources.files("dsim.config").joinpath("catalog").iterdir() if p.name.endswith(".json"))
    cfg.write_text(src.read_text())
    doc = yaml.safe_load((ROOT / "scenarios" / "quickstart.yaml").read_text())
    doc["model"] = {"config": str(cfg)}
    text = deployment_files(dsim.load_scenario(doc))["serve.sh"]
    assert "the model was given as a config.json" in text


DNS_1035 = r"[a-z]([-a-z0-9]*[a-z0-9])?"


def test_k8s_names_are_valid_and_distinct_for_awkward_pool_names():
    """Pools named A100 and a100 wrote one a100.k8s.yaml twice and two Deployments of one name; a
    100-character name was cut to 63 (colliding with any name sharing its start); a digit-leading
    name made an invalid Service name (it must start with a letter)."""
    import re
    kv = pytest.importorskip("kubernetes_validate", reason="pip install kubernetes-validate (dev extra)")
    long = "x" * 100
    names = ["A100", "a100", long, long[:-1] + "y", "8xh100", "pool_1.fast", "h100"]
    doc = yaml.safe_load((ROOT / "scenarios" / "hetero_fleet.yaml").read_text())
    doc["cluster"]["clusters"] = [{"name": "dc", "router": "jsq", "pools": [
        {"name": n, "hardware": "H100-SXM" if i % 2 else "A100-80GB", "replicas": 1} for i, n in enumerate(names)]}]
    doc["name"] = "3rd_Fleet"                              # the app part of every object name, awkward too
    scn = dsim.load_scenario(doc)
    files = deployment_files(scn)
    manifests = {f: list(yaml.safe_load_all(t)) for f, t in files.items() if f.endswith(".k8s.yaml")}
    assert len(manifests) == len(names)                    # one file per pool, none overwritten
    objects, components = set(), set()
    for f, docs in manifests.items():
        assert re.fullmatch(DNS_1035, f.removesuffix(".k8s.yaml")) and len(f.removesuffix(".k8s.yaml")) <= 63
        for d in docs:
            kv.validate(d, kv.latest_version(), strict=True)
            name = d["metadata"]["name"]
            assert re.fullmatch(DNS_1035, name) and len(name) <= 63, name
            objects.add((d["kind"], name))
        components.add(docs[0]["spec"]["selector"]["matchLabels"]["app.kubernetes.io/component"])
    assert len(objects) == 2 * len(names) and len(components) == len(names)   # distinct Deployments, Services
    assert k8s_name("h100") == "h100" and k8s_name("quickstart-a100") == "quickstart-a100"   # clean names kept
    assert k8s_name("A100") != k8s_name("a100") and k8s_name(long) != k8s_name(long[:-1] + "y")
