"""Derived model constants, checked against arithmetic done independently here."""
import json

import pytest

from dsim.config.engine import EngineConfig
from dsim.config.errors import ConfigError
from dsim.config.hardware import load_device
from dsim.config.model import load_model, model_from_hf


def test_llama31_8b_constants_independent():
    m = load_model("meta-llama/Llama-3.1-8B")
    h, kv, inter, L, V = 4096, 8 * 128, 14336, 32, 128256
    attn = 2 * (h * h + h * kv + h * kv + h * h)          # q, k, v, o projections, 2 FLOPs per MAC
    mlp = 2 * 3 * h * inter                               # gate, up, down
    head = 2 * h * V
    assert attn == 83_886_080
    assert mlp == 352_321_536                             # seed 000 writes 352,845,824: wrong
    assert head == 1_050_673_152                          # seed 000 writes 1,050,574,848: wrong
    assert m.flops_per_token == L * (attn + mlp) + head == 15_009_316_864   # seed: 15,025,995,776
    assert m.kv_bytes_per_token == 2 * L * kv * 2 == 131_072                # seed: 262,144 (x2 twice)
    # matmul weights + RMSNorms (2 per layer + final) = the published 8,030,261,248
    assert m.total_params == L * (attn + mlp) // 2 + 2 * V * h + (2 * L + 1) * h == 8_030_261_248
    assert m.num_kv_heads == 8 and not m.is_moe


def test_seed_roofline_step_time_with_corrected_constants():
    # seed 000 Refinement 3: max(8192 x flops_per_token / 989e12, weight bytes / 3.35e12)
    m = load_model("meta-llama/Llama-3.1-8B")
    t = max(8192 * m.flops_per_token / 989e12, 13_958_643_712 / 3.35e12)
    assert t == pytest.approx(0.1243239, rel=1e-6)
    # the seed prints 0.12435; its own (wrong) FLOPs would give 0.12446
    assert 8192 * 15_025_995_776 / 989e12 == pytest.approx(0.124462, rel=1e-5)


def test_moe_models():
    mx = load_model("mixtral-8x7b-v0.1")
    assert mx.is_moe and mx.num_experts == 8 and mx.experts_per_token == 2
    assert mx.total_params == pytest.approx(46.70e9, rel=2e-3)      # published: 46.7B
    assert mx.active_params == pytest.approx(12.9e9, rel=2e-2)      # published: 12.9B
    q = load_model("qwen3-30b-a3b")
    assert q.total_params == pytest.approx(30.5e9, rel=1e-2) and q.active_params == pytest.approx(3.3e9, rel=0.1)
    ds = load_model("deepseek-v2-lite")
    assert ds.is_mla and ds.num_shared_experts == 2 and ds.num_dense_layers == 1
    assert ds.total_params == pytest.approx(15.7e9, rel=1e-2)       # published: 15.7B
    assert ds.kv_bytes_per_token == 27 * (512 + 64) * 2             # latent + rope key per layer
    # same attention config -> same KV per token, dense or MoE (seed 004)
    assert mx.kv_bytes_per_token == load_model("meta-llama/Llama-3.1-8B").kv_bytes_per_token == 131072
    assert mx.active_params < mx.total_params


def test_bc1_rejects_bad_configs(tmp_path):
    base = json.loads(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                                  "num_key_value_heads": 8, "intermediate_size": 11008, "vocab_size": 32000}))
    model_from_hf(base)
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        model_from_hf(dict(base, num_key_value_heads=64))
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        model_from_hf({k: v for k, v in base.items() if k != "num_hidden_layers"})
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        model_from_hf(dict(base, num_local_experts=8, num_experts_per_tok=9))


def test_kv_blocks_close_to_real_vllm_run():
    # shared/data/real/llmservingsim-vllm/RTX4090_Llama-3.1-8B/meta.json: vLLM reported 2588 blocks
    e = EngineConfig(max_num_seqs=256, max_num_batched_tokens=2048, max_model_len=32768)
    got = e.kv_blocks(load_model("meta-llama/Llama-3.1-8B"), load_device("RTX4090"))
    assert abs(got - 2588) / 2588 < 0.03


def test_too_big_model_is_a_config_error():
    e = EngineConfig()
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        e.kv_blocks(load_model("llama-3.1-70b-instruct"), load_device("RTX4090"))
