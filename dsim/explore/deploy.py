"""From a judged scenario to something an operator launches: per pool, the ``vllm serve`` command
line and a Kubernetes Deployment + Service.

Why here: the plan's answer must leave dsim as a deployment, not as a YAML only dsim reads.  Every
engine knob the simulation used is written as the vLLM flag of the same meaning, so the launched
server runs the configuration that was simulated (the flags are those of vLLM's documented engine
arguments; keys vLLM does not have, like dsim's research scheduling policies, are named in a
comment instead of silently dropped)."""
from __future__ import annotations

import hashlib
import json
import re
import shlex

import yaml

# GPU Feature Discovery's product label for the shipped GPU profiles (nodeSelector
# nvidia.com/gpu.product): the pods land on the GPU type that was simulated
GPU_PRODUCT = {
    "H100-SXM": "NVIDIA-H100-80GB-HBM3", "A100-80GB": "NVIDIA-A100-SXM4-80GB",
    "A100-40GB": "NVIDIA-A100-SXM4-40GB", "L40S": "NVIDIA-L40S", "A40": "NVIDIA-A40",
    "RTX4090": "NVIDIA-GeForce-RTX-4090", "RTXPRO6000": "NVIDIA-RTX-PRO-6000-Blackwell-Server-Edition",
}
PORT = 8000
# vLLM's P/D connector of the V1 engine: both sides declare kv_both and the proxy pairs them
KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
VLLM_POLICIES = ("fcfs", "priority")


def gpus_per_replica(engine) -> int:
    return (engine.tensor_parallel_size * engine.pipeline_parallel_size * engine.data_parallel_size
            * engine.context_parallel_size)


def serve_args(pool) -> tuple[list[str], list[str]]:
    """(``vllm serve`` arguments, notes on settings vLLM has no flag for) for one pool's replica."""
    e, notes = pool.engine, []
    args = [pool.model.name,
            "--tensor-parallel-size", str(e.tensor_parallel_size),
            "--pipeline-parallel-size", str(e.pipeline_parallel_size),
            "--data-parallel-size", str(e.data_parallel_size),
            "--max-num-seqs", str(e.max_num_seqs),
            "--max-num-batched-tokens", str(e.max_num_batched_tokens),
            "--max-model-len", str(e.max_model_len),
            "--block-size", str(e.block_size),
            "--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}",
            "--enable-chunked-prefill" if e.enable_chunked_prefill else "--no-enable-chunked-prefill",
            "--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching",
            "--kv-cache-dtype", e.kv_cache_dtype,
            "--port", str(PORT)]
    if e.enable_expert_parallel:
        args.append("--enable-expert-parallel")
    if e.num_gpu_blocks is not None:
        args += ["--num-gpu-blocks-override", str(e.num_gpu_blocks)]
    if e.long_prefill_token_threshold:
        args += ["--long-prefill-token-threshold", str(e.long_prefill_token_threshold)]
    if e.max_num_partial_prefills > 1:
        args += ["--max-num-partial-prefills", str(e.max_num_partial_prefills),
                 "--max-long-partial-prefills", str(e.max_long_partial_prefills)]
    if e.enforce_eager:
        args.append("--enforce-eager")
    if e.async_scheduling:
        args.append("--async-scheduling")
    if e.scheduling_policy in VLLM_POLICIES:
        args += ["--scheduling-policy", e.scheduling_policy]
    else:
        notes.append(f"scheduling_policy {e.scheduling_policy} is a dsim research policy with no vLLM flag: "
                     "the server runs fcfs")
    if e.kv_offload is not None:
        notes.append(f"kv_offload ({e.kv_offload.cpu_gb:g} GB CPU tier): configure vLLM's CPU offloading "
                     "for your version by hand")
    if e.context_parallel_size > 1:
        notes.append(f"context_parallel_size {e.context_parallel_size}: dsim models ring-attention context "
                     "parallelism; set your engine's context-parallel option by hand")
    if e.all_reduce_algorithm:
        notes.append(f"all_reduce_algorithm {e.all_reduce_algorithm}: set NCCL_ALGO={e.all_reduce_algorithm.title()} "
                     "in the server's environment")
    if not e.moe_fused_kernel and pool.model.is_moe:
        notes.append("moe.fused_kernel false is a what-if: vLLM always runs its fused MoE kernel")
    if pool.role in ("prefill", "decode"):
        args += ["--kv-transfer-config", json.dumps(KV_TRANSFER, separators=(",", ":"))]
    return args, notes


def serve_line(pool) -> str:
    """The shell command, quoted so it can be pasted."""
    args, _ = serve_args(pool)
    return "vllm serve " + " ".join(shlex.quote(a) for a in args)


def k8s_name(text: str) -> str:
    """A Kubernetes object name for ``text``: lower case letters, digits and '-', starting with a
    letter and ending with a letter or digit, at most 63 characters (a DNS-1035 label, which
    Services require; it is also a DNS-1123 label).  A name already of that form is kept; any
    other gets a short hash of the original, so pools that differ only where the name was
    changed (``A100`` and ``a100``, two long names sharing their first 56 characters) stay
    distinct."""
    slug = re.sub(r"-{2,}", "-", re.sub(r"[^a-z0-9-]+", "-", text.lower())).strip("-")
    if not slug[:1].isalpha():
        slug = ("p-" + slug).rstrip("-")
    if slug == text and len(slug) <= 63:
        return slug
    tag = hashlib.sha256(text.encode()).hexdigest()[:6]
    return f"{slug[:63 - len(tag) - 1].rstrip('-')}-{tag}"


def k8s_manifests(pool, app: str) -> list[dict]:
    """A Deployment (``replicas`` pods of one vLLM server each) and a Service in front of it."""
    args, notes = serve_args(pool)
    name = k8s_name(f"{app}-{pool.name}")
    labels = {"app.kubernetes.io/name": k8s_name(app), "app.kubernetes.io/component": k8s_name(pool.name),
              "dsim/role": pool.role}
    version = pool.engine.vllm_version
    container = {
        "name": "vllm",
        "image": f"vllm/vllm-openai:{'v' + version if version else 'latest'}",
        "command": ["vllm", "serve"],
        "args": args,
        "ports": [{"containerPort": PORT, "name": "http"}],
        "resources": {"limits": {"nvidia.com/gpu": gpus_per_replica(pool.engine)}},
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 10},
        "volumeMounts": [{"name": "shm", "mountPath": "/dev/shm"}],
    }
    spec = {"containers": [container],
            "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}]}
    product = GPU_PRODUCT.get(pool.device.name)
    if product:
        spec["nodeSelector"] = {"nvidia.com/gpu.product": product}
    annotations = {"dsim/gpu": pool.device.name}
    if notes:
        annotations["dsim/notes"] = "; ".join(notes)
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "labels": dict(labels), "annotations": annotations},
        "spec": {"replicas": pool.replicas, "selector": {"matchLabels": dict(labels)},
                 "template": {"metadata": {"labels": dict(labels)}, "spec": spec}},
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "labels": dict(labels)},
        "spec": {"selector": dict(labels), "ports": [{"port": PORT, "targetPort": PORT, "name": "http"}]},
    }
    return [deployment, service]


def scenario_notes(scn, pool) -> list[str]:
    """What the simulated deployment has that these files do not set, said where an operator reads."""
    from ..metrics.band import get_path
    notes = []
    if scn.spec is not None:
        notes.append(f"speculative decoding was simulated ({scn.spec.mode}, drafter {scn.spec.drafter.name}): "
                     "add vLLM's --speculative-config for your version, or expect the non-speculative TPOT")
    raw = get_path(scn.raw, f"{pool.path}.model") if pool.path else None
    if raw is None:
        raw = scn.raw.get("model")
    if isinstance(raw, dict):
        notes.append(f"the model was given as a config.json ({raw.get('config')}): replace {pool.model.name!r} "
                     "by the weights' path or Hugging Face id")
    return notes


def deployment_files(scn) -> dict[str, str]:
    """File name -> text for ``deploy/``: ``serve.sh`` (one ``vllm serve`` line per pool) and
    ``<pool>.k8s.yaml`` per pool."""
    app = scn.name
    pools = scn.fleet.pools
    pd = any(p.role in ("prefill", "decode") for p in pools)
    lines = ["#!/usr/bin/env bash",
             f"# written by dsim from scenario {scn.name}: one vLLM server per replica, with the engine",
             "# settings that were simulated. Run each line on a node with the pool's GPUs.", ""]
    for p in pools:
        _, notes = serve_args(p)
        notes = notes + scenario_notes(scn, p)
        lines.append(f"# pool {p.name}: {p.replicas} replica(s) x {gpus_per_replica(p.engine)} {p.device.name} "
                     f"GPU(s), role {p.role}")
        lines += [f"# note: {n}" for n in notes]
        lines.append(serve_line(p))
        lines.append("")
    if pd:
        lines.append("# prefill/decode: put a P/D proxy in front (vLLM's disaggregated-serving proxy or llm-d); "
                     "KV moves over NIXL")
    files = {"serve.sh": "\n".join(lines).rstrip() + "\n"}
    for p in pools:
        docs = k8s_manifests(p, app)
        files[f"{k8s_name(p.name)}.k8s.yaml"] = (f"# written by dsim from scenario {scn.name}, pool {p.name}\n"
                                             + yaml.safe_dump_all(docs, sort_keys=False))
    return files
