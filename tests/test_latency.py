"""Latency models: step times computed by hand from the formulas and the datasheet numbers."""
import pytest

from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency.base import AlphaModel, BatchShape
from dsim.latency.blackbox import BlackboxModel
from dsim.latency.roofline import RooflineModel

L8 = load_model("meta-llama/Llama-3.1-8B")
H100 = load_device("H100-SXM")
PLAIN = dict(compute_efficiency=1.0, memory_efficiency=1.0, overlap=1.0, curve=False)   # the flat formula


def test_decode_step_is_memory_bound_weights_plus_kv():
    m = RooflineModel(L8, H100, 1, **PLAIN)
    b = BatchShape(decode_tokens=32, decode_ctx_sum=32 * 1000, num_sampled=32)
    weights = (L8.total_params - 128256 * 4096) * 2          # embedding is gathered, not streamed
    kv = 131072 * (32 * 1000 + 32)                            # read contexts + write new tokens
    assert m.step_time(b) == pytest.approx((weights + kv) / 3.35e12, rel=1e-12)


def test_prefill_step_is_compute_bound_with_causal_attention():
    m = RooflineModel(L8, H100, 1, **PLAIN)
    c = 2048
    pairs = c * (c + 1) // 2
    b = BatchShape(prefill_tokens=c, num_prefill=1, prefill_attn_pairs=pairs, num_sampled=1)
    flops = c * 13_958_643_712 + 1_050_673_152 + pairs * 4 * 32 * 4096
    assert m.step_time(b) == pytest.approx(flops / 989.4e12, rel=1e-12)


def test_partial_overlap_adds_the_shorter_of_compute_and_memory():
    full = RooflineModel(L8, H100, 1, **PLAIN)
    none = RooflineModel(L8, H100, 1, **dict(PLAIN, overlap=0.0))
    half = RooflineModel(L8, H100, 1, **dict(PLAIN, overlap=0.5))
    c = 512
    b = BatchShape(prefill_tokens=c, num_prefill=1, prefill_attn_pairs=c * (c + 1) // 2, num_sampled=1)
    flops = c * 13_958_643_712 + 1_050_673_152 + c * (c + 1) // 2 * 4 * 32 * 4096
    tc = flops / 989.4e12
    tm = ((L8.total_params - 128256 * 4096) * 2 + 131072 * c) / 3.35e12
    assert full.step_time(b) == pytest.approx(max(tc, tm), rel=1e-12)
    assert none.step_time(b) == pytest.approx(tc + tm, rel=1e-12)      # a prefill floor of weight reading
    assert half.step_time(b) == pytest.approx(max(tc, tm) + 0.5 * min(tc, tm), rel=1e-12)


def test_tensor_parallel_splits_work_and_adds_allreduce():
    m1 = RooflineModel(L8, H100, 1, **PLAIN)
    m2 = RooflineModel(L8, H100, 2, **PLAIN)
    b = BatchShape(prefill_tokens=4096, num_prefill=2, prefill_attn_pairs=0, num_sampled=2)
    ar = 2 * 32 * (8e-6 + 1.0 * 4096 * 4096 * 2 / 450e9)     # 2 ring all-reduces per layer, (tp-1)/tp*2 = 1
    assert m2.step_time(b) == pytest.approx(m1.step_time(b) / 2 + ar, rel=1e-9)


def test_moe_reads_only_touched_experts():
    mx = load_model("mixtral-8x7b-v0.1")
    m = RooflineModel(mx, H100, 1, **PLAIN)
    one = m.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=1, num_sampled=1))
    many = m.step_time(BatchShape(decode_tokens=256, decode_ctx_sum=256, num_sampled=256))
    expert = 32 * 3 * 4096 * 14336 * 2
    # one token touches 2 of 8 experts per layer; 256 tokens touch essentially all 8
    assert many - one == pytest.approx((6 * expert + 131072 * 510) / 3.35e12, rel=1e-3)


def test_blackbox_and_alpha():
    bb = BlackboxModel(1000, 2, 30)
    assert bb.step_time(BatchShape(prefill_tokens=100, num_prefill=1, decode_tokens=10)) == pytest.approx(1.5e-3)
    assert bb.step_time(BatchShape()) == 0.0
    a = AlphaModel(100, 0.5, 7)

    class R:
        prompt_len = 200
    assert a.delay(R()) == pytest.approx(200e-6) and a.output_token_overhead() == pytest.approx(7e-6)


def test_unknown_roofline_parameter():
    with pytest.raises(TypeError):
        RooflineModel(L8, H100, 1, mfu=0.5)
