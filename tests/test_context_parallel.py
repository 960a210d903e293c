"""engine.context_parallel_size (issue 43 item 13): a step split over CP ranks, the ring KV
exchange of prefill attention and the decode combine, by hand; KV capacity and GPU count."""
import math
from pathlib import Path

import pytest

import dsim
from dsim.config.engine import load_engine
from dsim.config.errors import ConfigError
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency.base import BatchShape
from dsim.latency.context_parallel import ContextParallelStep

from helpers import scenario

DEV = load_device({"name": "toy", "peak_tflops_bf16": 1000, "hbm_gb_s": 3000, "memory_gb": 80,
                   "interconnect_gb_s": 100, "interconnect_latency_us": 14})     # ring step 1 us
L8 = load_model("meta-llama/Llama-3.1-8B")       # 32 layers, 8 KV heads x 128: 4,096 KV bytes / token / layer


class Linear:
    """A model with known parts: tokens x 1 ms + attention pairs x ``pair_s`` + decode context x 1 us."""
    name = "toy"

    def __init__(self, pair_s):
        self.pair_s = pair_s

    def step_time(self, b):
        return 1e-3 * (b.prefill_tokens + b.decode_tokens) + self.pair_s * b.prefill_attn_pairs + 1e-6 * b.decode_ctx_sum


PREFILL = BatchShape(prefill_tokens=1000, num_prefill=1, prefill_attn_pairs=500_500, prefill_ctx_tokens=3000,
                     num_sampled=1, running=1)


def test_prefill_split_and_ring_hidden_under_attention():
    cp = ContextParallelStep(Linear(1e-6), L8, DEV, tp=1, cp=2)
    # a rank: 500 tokens, 250,250 pairs; the ring (82.92 us a layer) hides under 7.8 ms of attention a layer
    assert math.isclose(cp.step_time(PREFILL), 0.5 + 0.25025, rel_tol=1e-12)


def test_exposed_ring_exchange_by_hand():
    cp = ContextParallelStep(Linear(1e-12), L8, DEV, tp=1, cp=2)
    attn_layer = 250_250e-12 / 32
    ring_layer = 1e-6 + 2000 * 4096 / 100e9        # 1 step: a + (1000 + 3000) / 2 tokens of one layer's KV / B
    want = 0.5 + 250_250e-12 + 32 * (ring_layer - attn_layer)
    assert math.isclose(cp.step_time(PREFILL), want, rel_tol=1e-12)
    cp4 = ContextParallelStep(Linear(1e-12), L8, DEV, tp=1, cp=4)    # 3 ring steps of 1,000 tokens each
    want4 = 0.25 + math.ceil(500_500 / 4) * 1e-12 + 32 * (3 * (1e-6 + 1000 * 4096 / 100e9)
                                                          - math.ceil(500_500 / 4) * 1e-12 / 32)
    assert math.isclose(cp4.step_time(PREFILL), want4, rel_tol=1e-12)


def test_decode_split_and_combine_by_hand():
    cp = ContextParallelStep(Linear(0.0), L8, DEV, tp=1, cp=2)
    b = BatchShape(decode_tokens=10, decode_ctx_sum=10_000, num_sampled=10, running=10)
    combine = 32 * (3 * 1e-6 + 3 * 0.5 * 10 * 4096 * 2 / 100e9)     # gather queries + reduce outputs, per layer
    assert math.isclose(cp.step_time(b), 5e-3 + 5e-3 + combine, rel_tol=1e-12)


def test_cp_shards_the_kv_and_counts_its_gpus():
    h100 = load_device("H100-SXM")
    one = load_engine({"tensor_parallel_size": 2})
    two = load_engine({"tensor_parallel_size": 2, "context_parallel_size": 2})
    b1, b2 = one.kv_blocks(L8, h100), two.kv_blocks(L8, h100)
    assert b2 in (2 * b1, 2 * b1 + 1)                  # same free memory per GPU, half the KV per token on it
    res = dsim.run(scenario(model="meta-llama/Llama-3.1-8B", latency={"model": "roofline"},
                            engine={"tensor_parallel_size": 2, "context_parallel_size": 2},
                            cluster={"pools": [{"name": "long", "replicas": 1}]}), check_invariants=True)
    assert res.summary["pools"]["long"]["gpus_per_replica"] == 4
    assert res.manifest["pools"]["long"]["latency"]["context_parallel"] == 2


def test_long_prompt_ttft_falls_with_cp():
    ttft = {}
    for c in (1, 2):
        s = scenario(model="meta-llama/Llama-3.1-8B", latency={"model": "roofline"},
                     engine={"context_parallel_size": c, "max_model_len": 65536, "max_num_batched_tokens": 8192},
                     workload={"type": "poisson", "rate": 0.01, "num_requests": 2, "prompt_tokens": 32000,
                               "output_tokens": 2})
        ttft[c] = dsim.run(s).summary["latency_ms"]["ttft"]["mean"]
    assert 0.45 < ttft[2] / ttft[1] < 0.6      # half the work per rank, plus the exposed exchange


def test_cp_refusals():
    with pytest.raises(ConfigError, match=r"engine.context_parallel_size: got 2, expected 1 with latency.model lut"):
        dsim.run(scenario(engine={"context_parallel_size": 2},
                          latency={"model": "lut", "path": str(Path(__file__).resolve().parents[1] / "luts" / "llama-2-7b_h100_tp1.csv")}, model="meta-llama/Llama-2-7b-hf"))
    with pytest.raises(ConfigError, match=r"engine.pipeline_parallel_size: got 2, expected 1 with context_parallel_size"):
        dsim.run(scenario(engine={"context_parallel_size": 2, "pipeline_parallel_size": 2}, latency={"model": "roofline"}))
    with pytest.raises(ConfigError, match=r"cluster.pools\[0\].engine.context_parallel_size: got 2"):
        dsim.run(scenario(latency={"model": "blackbox", "beta": [1, 1, 1]},
                          cluster={"pools": [{"name": "a", "replicas": 1, "engine": {"context_parallel_size": 2}}]}))


def test_a_cp_group_beyond_the_node_needs_the_internode_link():
    """The node limit counts TP x CP GPUs: TP 4 x CP 4 on 8-GPU nodes without an inter-node link is
    refused, though TP 4 alone fits; TP 4 x CP 2 fits."""
    node = {**{"name": "toy", "peak_tflops_bf16": 1000, "hbm_gb_s": 3000, "memory_gb": 80,
               "interconnect_gb_s": 100, "interconnect_latency_us": 14}, "gpus_per_node": 8}
    small = {"type": "poisson", "rate": 5, "num_requests": 3, "prompt_tokens": 100, "output_tokens": 2}
    with pytest.raises(ConfigError, match=r"engine.tensor_parallel_size: got 4, expected at most the 8 GPUs"):
        dsim.run(scenario(hardware=node, latency={"model": "roofline"}, workload=small,
                          engine={"tensor_parallel_size": 4, "context_parallel_size": 4}))
    res = dsim.run(scenario(hardware=node, latency={"model": "roofline"}, workload=small,
                            engine={"tensor_parallel_size": 4, "context_parallel_size": 2}))
    assert res.manifest["latency"]["context_parallel"] == 2
