"""engine.all_reduce_algorithm (ring / tree) and the node limits of a target profile (issue 43
items 12 and 13): the all-reduce's cost by hand, where the latency models charge it, and the refusals."""
import math

import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency.base import BatchShape
from dsim.latency.collectives import all_reduce_s, all_reduce_terms
from dsim.latency.roofline import RooflineModel

from helpers import scenario

DEV = {"name": "toy", "peak_tflops_bf16": 1000, "hbm_gb_s": 3000, "memory_gb": 80,
       "interconnect_gb_s": 100, "interconnect_latency_us": 14}        # one ring/tree step: 14 / 14 = 1 us
L70 = load_model("meta-llama/Llama-3.1-70B")


def test_ring_and_tree_by_hand():
    d = load_device(DEV)
    n = 1e6
    # ring over 4: 2 (p-1) = 6 steps of 1 us + 2 (p-1)/p = 1.5 x 1 MB / 100 GB/s = 15 us
    assert math.isclose(all_reduce_s(d, 4, n, "ring"), 6e-6 + 15e-6, rel_tol=1e-12)
    # tree over 4: 2 ceil(log2 4) = 4 steps + 2 x 1 MB / 100 GB/s = 20 us
    assert math.isclose(all_reduce_s(d, 4, n, "tree"), 4e-6 + 20e-6, rel_tol=1e-12)
    # unset: the profile's per-collective 14 us + the ring's bytes
    assert math.isclose(all_reduce_s(d, 4, n), 14e-6 + 15e-6, rel_tol=1e-12)
    # over 16 GPUs latency dominates a small message: ring 30 steps, tree 8
    assert math.isclose(all_reduce_s(d, 16, 1e3, "ring"), 30e-6 + 1.875e3 / 1e11, rel_tol=1e-12)
    assert math.isclose(all_reduce_s(d, 16, 1e3, "tree"), 8e-6 + 2e3 / 1e11, rel_tol=1e-12)
    assert all_reduce_terms(d, 1, "tree")[:2] == (0.0, 0.0)
    # a step latency of its own
    d2 = load_device({**DEV, "collective_step_latency_us": 2.5})
    assert math.isclose(all_reduce_s(d2, 8, 0.0, "ring"), 14 * 2.5e-6, rel_tol=1e-12)


def test_roofline_charges_the_chosen_algorithm_per_layer():
    d = load_device(DEV)
    b = BatchShape(decode_tokens=64, decode_ctx_sum=64 * 1000, num_sampled=64, running=64)
    t = {a: RooflineModel(L70, d, 8, all_reduce=a).step_time(b) for a in (None, "ring", "tree")}
    nbytes = 64 * L70.hidden_size * L70.bytes_per_param          # one all-reduce of the step's hidden states
    per = {a: all_reduce_s(d, 8, nbytes, a) for a in t}
    for a in ("ring", "tree"):           # two all-reduces per layer: everything else is the same
        assert math.isclose(t[a] - t[None], 2 * L70.num_layers * (per[a] - per[None]), rel_tol=1e-9, abs_tol=1e-12)
    assert t["tree"] < t["ring"]         # 8 GPUs, 1 MB: 6 tree steps against 14 ring steps


def test_unset_algorithm_is_the_old_cost():
    d = load_device("H100-SXM")
    m = RooflineModel(L70, d, 4)
    ring = 2.0 * 3 / 4
    assert m._ar_fixed == 2 * L70.num_layers * d.interconnect_latency_s
    assert m._ar_per_token == 2 * L70.num_layers * ring * L70.hidden_size * L70.bytes_per_param / d.interconnect_bytes_s


def test_a_tp_group_beyond_the_node_uses_the_internode_link():
    d = load_device({**DEV, "gpus_per_node": 8, "internode_gb_s": 50, "internode_latency_us": 28})
    assert all_reduce_terms(d, 8, None) == (14e-6, 2.0 * 7 / 8, 100e9)          # inside the node
    fixed, coef, bw = all_reduce_terms(d, 16, None)
    assert (fixed, bw) == (28e-6, 50e9)
    assert math.isclose(all_reduce_s(d, 16, 1e6, "ring"), 30 * 2e-6 + 1.875e6 / 50e9, rel_tol=1e-12)
    b = BatchShape(decode_tokens=8, decode_ctx_sum=8000, num_sampled=8, running=8)
    one_node = load_device({**DEV, "gpus_per_node": 16, "internode_gb_s": 50})
    assert RooflineModel(L70, d, 16).step_time(b) > RooflineModel(L70, one_node, 16).step_time(b)


def test_device_limits_are_refused_with_their_key():
    s = scenario(model="meta-llama/Llama-3.1-70B", engine={"tensor_parallel_size": 16},
                 hardware={**DEV, "gpus_per_node": 8})
    with pytest.raises(ConfigError, match=r"engine.tensor_parallel_size: got 16, expected at most the 8 GPUs "
                                          r"of one toy node \(hardware.gpus_per_node\), or hardware.internode_gb_s"):
        dsim.run(s)
    s = scenario(model="meta-llama/Llama-3.1-70B", engine={"tensor_parallel_size": 8},
                 hardware={**DEV, "max_tensor_parallel": 4})
    with pytest.raises(ConfigError, match=r"engine.tensor_parallel_size: got 8, expected at most "
                                          r"hardware.max_tensor_parallel \(4\)"):
        dsim.run(s)
    s = scenario(model="meta-llama/Llama-3.1-70B", engine={"tensor_parallel_size": 4, "pipeline_parallel_size": 3},
                 hardware={**DEV, "max_pipeline_parallel": 2})
    with pytest.raises(ConfigError, match=r"engine.pipeline_parallel_size: got 3, expected at most "
                                          r"hardware.max_pipeline_parallel \(2\)"):
        dsim.run(s)


def test_the_key_reaches_the_replica_and_vidur_roofline_comm():
    base = dict(model="meta-llama/Llama-3.1-70B", engine={"tensor_parallel_size": 8},
                latency={"model": "roofline"}, workload={"type": "poisson", "rate": 5, "num_requests": 20,
                                                         "prompt_tokens": 200, "output_tokens": 20})
    runs = {a: dsim.run(scenario(**{**base, "engine": {"tensor_parallel_size": 8, "all_reduce_algorithm": a}}))
            for a in ("ring", "tree")}
    tpot = {a: r.summary["latency_ms"]["tpot"]["mean"] for a, r in runs.items()}
    assert tpot["tree"] < tpot["ring"]
    from dsim.latency import vidur as V
    l70 = load_model("meta-llama/Llama-2-70b-hf")
    h = load_device("H100-SXM")
    v = {a: V.VidurModel(l70, h, 4, max_tokens=64, tp_comm="roofline", all_reduce=a) for a in ("ring", "tree")}
    assert v["tree"].comm == "roofline all_reduce (tree)"
    n = 32
    want = 2 * l70.num_layers * (all_reduce_s(h, 4, n * l70.hidden_size * 2, "tree")
                                 - all_reduce_s(h, 4, n * l70.hidden_size * 2, "ring"))
    assert math.isclose(v["tree"].linear_time(n) - v["ring"].linear_time(n), want, rel_tol=1e-6, abs_tol=1e-12)
    with pytest.raises(ConfigError, match="all_reduce_algorithm: got 'star'"):
        dsim.run(scenario(**{**base, "engine": {"tensor_parallel_size": 8, "all_reduce_algorithm": "star"}}))
