"""engine.moe.fused_kernel (issue 43 item 12): the routed experts as one grouped kernel or one
kernel per touched expert, in the roofline; by hand from the GEMM efficiency curve."""
import math

import pytest

import dsim
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency.base import BatchShape
from dsim.latency.roofline import RooflineModel

from helpers import scenario

H100 = load_device("H100-SXM")
QWEN = load_model("Qwen/Qwen3-30B-A3B")


def _gemm(rf, m, n, k, bpp, count=1.0):
    tc, tm = rf.gemm.terms(m, n, k, bpp, 2.0, count)
    return max(tc, tm) + rf.gemm.t0_us * 1e-6


@pytest.mark.parametrize("tokens", [1, 64, 2048])
def test_unfused_experts_by_hand(tokens):
    fused, unfused = RooflineModel(QWEN, H100, 1), RooflineModel(QWEN, H100, 1, moe_fused=False)
    L, n_up, k_down, bpp, slow = fused._moe_layers
    assert slow == 1.0
    h = QWEN.hidden_size
    touched = fused.touched_experts(tokens)
    per = tokens * QWEN.experts_per_token / touched
    grouped = L * (_gemm(fused, per, n_up, h, bpp, touched) + _gemm(fused, per, h, k_down, bpp, touched))
    one_each = L * touched * (_gemm(fused, per, n_up, h, bpp) + _gemm(fused, per, h, k_down, bpp))
    got = unfused.linear_time(tokens) - fused.linear_time(tokens)
    assert math.isclose(got, one_each - grouped, rel_tol=1e-9)
    assert got > 0                    # a launch floor per expert and smaller, less efficient streams


def test_the_key_reaches_the_replica_and_leaves_dense_models_alone():
    w = {"type": "poisson", "rate": 20, "num_requests": 30, "prompt_tokens": 200, "output_tokens": 20}
    tpot = {f: dsim.run(scenario(model="Qwen/Qwen3-30B-A3B", latency={"model": "roofline"}, workload=w,
                                 engine={"moe": {"fused_kernel": f}})).summary["latency_ms"]["tpot"]["mean"]
            for f in (True, False)}
    assert tpot[False] > tpot[True]
    dense = [dsim.run(scenario(latency={"model": "roofline"}, workload=w, engine={"moe": {"fused_kernel": f}}))
             for f in (True, False)]
    assert [r.t_completion for r in dense[0].requests] == [r.t_completion for r in dense[1].requests]
    b = BatchShape(decode_tokens=8, decode_ctx_sum=8000, num_sampled=8, running=8)
    l8 = load_model("meta-llama/Llama-3.1-8B")
    assert RooflineModel(l8, H100, moe_fused=False).step_time(b) == RooflineModel(l8, H100).step_time(b)


@pytest.mark.parametrize("fused", [True, False])
def test_calibration_terms_follow_the_kernel_choice(fused):
    """gemm_terms (what dsim calibrate fits on) at unit multipliers sums to the model's own GEMM time:
    per kind max(compute, memory), plus the launch floors, with the experts fused or one by one."""
    import numpy as np
    rf = RooflineModel(QWEN, H100, 1, moe_fused=fused)
    tokens = np.array([1.0, 64.0, 2048.0])
    c, m, floor = rf.gemm_terms(tokens, tokens)
    got = np.maximum(c, m).sum(axis=1) + floor
    want = [rf.linear_time(int(t)) + rf.head_time(int(t)) for t in tokens]
    assert np.allclose(got, want, rtol=1e-9, atol=0)
