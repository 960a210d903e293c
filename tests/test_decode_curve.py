"""A step model's decode curve (dsim.latency.base.decode_curve) is its step_time of a decode-only
batch, bit for bit: quiet stretches replay steps with it, and any rounding difference would
change every timestamp after it."""
import numpy as np
import pytest

from dsim.config.engine import load_engine
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency.base import BatchShape, LatencyContext, decode_curve
from dsim.config.schema.latency import parse_latency
from dsim.latency.registry import build_latency
from dsim.latency.roofline import RooflineModel

H100 = load_device("H100-SXM")

CASES = {
    "roofline": ("meta-llama/Llama-3.1-8B", {"model": "roofline"}, {}),
    "roofline tp2": ("meta-llama/Llama-3.1-8B", {"model": "roofline"}, {"tensor_parallel_size": 2}),
    "roofline moe": ("mistralai/Mixtral-8x7B-v0.1", {"model": "roofline"}, {"tensor_parallel_size": 2}),
    "roofline eager": ("meta-llama/Llama-3.1-8B", {"model": "roofline"}, {"enforce_eager": True}),
    "roofline v0": ("meta-llama/Llama-3.1-8B", {"model": "roofline"}, {"vllm_version": "0.4.0"}),
    "roofline per-seq host": ("meta-llama/Llama-3.1-8B",
                              {"model": "roofline", "host": {"step_us": 413.7, "per_seq_us": 7.3}}, {}),
    "blackbox": ("meta-llama/Llama-3.1-8B", {"model": "blackbox", "beta": [1000, 30, 0.2]}, {}),
    "calibrated_tps": ("meta-llama/Llama-3.1-8B",
                       {"model": "calibrated_tps", "base_prefill_tps": 3000, "base_decode_tps": 200}, {}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_curve_equals_step_time_bit_for_bit(case):
    name, latency, engine = CASES[case]
    ctx = LatencyContext(load_model(name), H100, load_engine(engine), 20000)
    step, _, _ = build_latency(parse_latency(latency), ctx)
    rng = np.random.default_rng(7)
    for n in [1, 2, 7, 31, 64, 255, 256, 511, 512, 513, 1000]:
        curve = decode_curve(step, n, n)
        for ctx in rng.integers(n, n * 9000, 40).tolist():
            want = step.step_time(BatchShape(decode_tokens=n, decode_ctx_sum=ctx, num_sampled=n, running=n))
            assert curve(ctx) == want, (case, n, ctx)


def test_a_wrapper_without_a_curve_of_its_own_does_not_hand_out_the_wrapped_one():
    """A wrapper forwarding attributes (like the host layer does) would return the GPU-only curve:
    decode_curve looks the method up on the class and falls back to step_time instead."""
    gpu = RooflineModel(load_model("meta-llama/Llama-3.1-8B"), H100)

    class Slower:
        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, item):
            return getattr(self.inner, item)

        def step_time(self, b):
            return 2.0 * self.inner.step_time(b)

    w = Slower(gpu)
    assert decode_curve(w, 8, 8)(4000) == 2.0 * decode_curve(gpu, 8, 8)(4000)
