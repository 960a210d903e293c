"""Quantized checkpoints (weights, compute dtype) and vLLM's --kv-cache-dtype (issue 34, item 3)."""
import copy
import json

import pytest

import dsim
from dsim.config.engine import load_engine
from dsim.config.errors import ConfigError
from dsim.config.hardware import load_device
from dsim.config.model import CATALOG_DIR, load_model, model_from_hf
from dsim.latency.base import BatchShape
from dsim.latency.roofline import RooflineModel
from helpers import scenario

SCOUT = "llama-4-scout-17b-16e-instruct-fp8-dynamic"


def _cfg(stem):
    return json.loads((CATALOG_DIR / f"{stem}.json").read_text())


def _scout_bf16():
    cfg = _cfg(SCOUT)
    cfg.pop("quantization_config")
    return model_from_hf(cfg, name="scout-bf16")


def _with_quant(stem, q, inside_text_config=False):
    cfg = _cfg(stem)
    cfg.pop("quantization_config", None)
    (cfg["text_config"] if inside_text_config else cfg)["quantization_config"] = q
    return model_from_hf(cfg, name=stem)


def test_scout_fp8_is_sized_at_one_byte_per_quantized_weight():
    fp8, bf16 = load_model("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic"), _scout_bf16()
    assert fp8.quant.compute_dtype == "fp8" and fp8.mlp_bytes_per_param == 1.0
    # its ignore list keeps every layer's attention projections (and the router, lm_head) in BF16
    assert fp8.attn_bytes_per_param == 2 and fp8.lm_head_bytes_per_param == 2
    assert fp8.total_params == bf16.total_params
    # the MLP/experts went from 2 bytes to 1: exactly their parameter count saved
    assert bf16.weight_bytes - fp8.weight_bytes == fp8.mlp_params_total
    unquantized = (fp8.num_layers * fp8.attn_params_per_layer + fp8.embedding_params + fp8.lm_head_params
                   + fp8.extra_params) / fp8.total_params
    assert 0.5 < fp8.weight_bytes / bf16.weight_bytes < 0.5 + unquantized / 2 + 1e-9
    assert fp8.weight_bytes / 1e9 == pytest.approx(112.9, abs=0.1)


def test_quantization_config_inside_text_config_is_found_too():
    q = _cfg(SCOUT)["quantization_config"]
    m = _with_quant(SCOUT, q, inside_text_config=True)
    assert m.weight_bytes == load_model(SCOUT).weight_bytes


def test_scout_fp8_fits_two_h100_at_tp2_and_bf16_does_not(tmp_path):
    over = dict(engine={"tensor_parallel_size": 2}, latency={"model": "roofline"})
    s = dsim.load_scenario(scenario(model=SCOUT, **over))
    assert s.engine.kv_blocks(s.model, s.device) * 16 > 100_000          # room for >100k tokens of KV
    res = dsim.run(s)                                                    # the whole run, end to end
    assert len(res.requests) == 10
    cfg = _cfg(SCOUT)
    cfg.pop("quantization_config")
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    bf16 = dsim.load_scenario(scenario(model={"config": str(p)}, **over))
    with pytest.raises(ConfigError, match="gpu_memory_utilization.*needs 10[0-9].[0-9] GB of weights per GPU"):
        bf16.engine.kv_blocks(bf16.model, bf16.device)
    with pytest.raises(ConfigError, match="gpu_memory_utilization"):
        dsim.run(bf16)


@pytest.mark.parametrize("q,bytes_,dtype", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}, 0.5 + 2 / 128, "bf16"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 0.5 + 2.5 / 128, "bf16"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 4, "type": "int", "group_size": 128},
        "input_activations": None}}, "ignore": ["lm_head"]}, 0.5 + 2 / 128, "bf16"),
    ({"quant_method": "compressed-tensors", "format": "int-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "group_size": None},
        "input_activations": {"num_bits": 8, "type": "int", "dynamic": True}}}, "ignore": ["lm_head"]}, 1.0, "int8"),
    ({"quant_method": "compressed-tensors", "format": "pack-quantized", "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "int", "group_size": None},
        "input_activations": None}}}, 1.0, "bf16"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, 1.0, "fp8"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}, 1.0, "fp8"),
])
def test_common_quantization_forms(q, bytes_, dtype):
    bf16 = load_model("meta-llama/Llama-3.1-8B")
    m = _with_quant("llama-3.1-8b-instruct", q)
    assert m.compute_dtype == dtype
    assert m.attn_bytes_per_param == m.mlp_bytes_per_param == pytest.approx(bytes_)
    assert m.lm_head_bytes_per_param == 2 and m.bytes_per_param == 2         # lm_head, embeddings stay BF16
    layers = m.layer_weight_bytes()
    assert layers == pytest.approx(bf16.layer_weight_bytes() * bytes_ / 2)
    assert m.weight_bytes == pytest.approx(layers + 2 * (2 * m.embedding_params + m.extra_params), abs=1)
    assert m.kv_bytes_per_token == bf16.kv_bytes_per_token                   # weights only: KV untouched


def test_int4_model_is_about_half_a_byte_per_weight():
    m = _with_quant("llama-3.1-70b-instruct", {"quant_method": "gptq", "bits": 4, "group_size": 128})
    bf16 = load_model("meta-llama/Llama-3.1-70B-Instruct")
    assert m.weight_bytes / bf16.weight_bytes == pytest.approx(0.5 / 2 + 0.03, abs=0.02)
    # 70B at ~0.52 B/weight plus BF16 embeddings fits one H100 (BF16 needs two)
    assert load_engine({}).kv_blocks(m, load_device("H100-SXM")) > 0
    with pytest.raises(ConfigError):
        load_engine({}).kv_blocks(bf16, load_device("H100-SXM"))


def test_ignore_lists_by_linear_group():
    ct = {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
          "weights": {"num_bits": 8, "type": "float"}, "input_activations": {"num_bits": 8, "type": "float"}}}}
    m = _with_quant("llama-3.1-8b-instruct", dict(ct, ignore=["lm_head", "re:.*self_attn.*"]))
    assert (m.attn_bytes_per_param, m.mlp_bytes_per_param) == (2, 1)
    half = [f"model.layers.{i}.mlp.down_proj" for i in range(16)]          # 16 of 32 layers' MLPs
    m = _with_quant("llama-3.1-8b-instruct", dict(ct, ignore=half))
    assert (m.attn_bytes_per_param, m.mlp_bytes_per_param) == (1, 1.5)
    m = _with_quant("llama-3.1-8b-instruct", {"quant_method": "gptq", "bits": 8, "group_size": -1, "lm_head": True})
    assert m.lm_head_bytes_per_param == 1 and m.attn_bytes_per_param == 1


@pytest.mark.parametrize("q,path", [
    ({"quant_method": "hqq"}, "model.quantization_config.quant_method"),
    ({"bits": 4}, "model.quantization_config.quant_method"),
    ({"quant_method": "gptq", "bits": 5}, "model.quantization_config.bits"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 3}}}},
     "model.quantization_config.config_groups.g.weights.num_bits"),
    ({"quant_method": "compressed-tensors"}, "model.quantization_config.config_groups"),
    ({"quant_method": "awq", "bits": 4, "modules_to_not_convert": "lm_head"},
     "model.quantization_config.modules_to_not_convert"),
    ("fp8", "model.quantization_config"),
])
def test_bad_quantization_config_is_a_path_qualified_error(q, path):
    cfg = _cfg("llama-3.1-8b-instruct")
    cfg["quantization_config"] = q
    with pytest.raises(ConfigError) as e:
        model_from_hf(cfg, path="model")
    assert str(e.value).startswith(path + ":")


def test_fp8_kv_cache_halves_bytes_and_doubles_blocks():
    h100 = load_device("H100-SXM")
    for name in ("meta-llama/Llama-3.1-8B", SCOUT, "deepseek-ai/DeepSeek-V2-Lite"):     # GQA, MoE, MLA
        m = load_model(name)
        tp = 2 if name == SCOUT else 1
        auto, fp8 = (load_engine({"tensor_parallel_size": tp, "kv_cache_dtype": d}) for d in ("auto", "fp8_e4m3"))
        assert m.with_kv_cache_dtype("fp8").kv_bytes_per_token * 2 == m.kv_bytes_per_token
        b16, b8 = auto.kv_blocks(m, h100), fp8.kv_blocks(m, h100)
        assert b8 == pytest.approx(2 * b16, rel=1e-3)
    s = dsim.load_scenario(scenario(engine={"kv_cache_dtype": "fp8"}))
    assert s.model.kv_bytes_per_token == load_model("meta-llama/Llama-3.1-8B").kv_bytes_per_token / 2
    # the KV traffic of a long-context decode step halves too
    m, m8 = load_model("meta-llama/Llama-3.1-8B"), s.model
    b = BatchShape(prefill_tokens=0, decode_tokens=64, num_sampled=64, prefill_attn_pairs=0,
                   decode_ctx_sum=64 * 32768, prefill_ctx_tokens=0)
    t16, t8 = RooflineModel(m, h100).step_time(b), RooflineModel(m8, h100).step_time(b)
    kv16 = m.kv_bytes_per_token * (64 * 32768 + 64) / (h100.hbm_bytes_s * 0.84)
    assert t16 - t8 == pytest.approx(kv16 / 2, rel=0.03)


def test_bad_kv_cache_dtype_is_refused():
    with pytest.raises(ConfigError, match=r"^engine\.kv_cache_dtype: got 'int8'"):
        dsim.load_scenario(scenario(engine={"kv_cache_dtype": "int8"}))
    with pytest.raises(ConfigError, match=r"^cluster\.pools\[0\]\.engine\.kv_cache_dtype"):
        dsim.load_scenario(scenario(cluster={"pools": [{"name": "a", "engine": {"kv_cache_dtype": "fp4"}}]}))


def test_fp8_model_computes_at_the_fp8_peak_where_the_device_has_one():
    fp8 = _with_quant("llama-3.1-8b-instruct", {"quant_method": "fp8", "activation_scheme": "dynamic"})
    bf16 = load_model("meta-llama/Llama-3.1-8B")
    assert fp8.compute_dtype_share == pytest.approx(1 - bf16.lm_head_params / bf16.active_params)
    prefill = BatchShape(prefill_tokens=8192, decode_tokens=0, num_sampled=1, prefill_attn_pairs=8192 * 512,
                         decode_ctx_sum=0, prefill_ctx_tokens=0)
    h100, a100 = load_device("H100-SXM"), load_device("A100-80GB")
    rf8, rf16 = RooflineModel(fp8, h100), RooflineModel(bf16, h100)
    peak = h100.peak_flops_for("fp8", fp8.compute_dtype_share)
    assert h100.peak_flops * 1.8 < peak < h100.peak_flops_for("fp8")
    assert rf8._inv_flops == pytest.approx(1 / (peak * 0.8))
    # a compute-bound prefill: close to twice as fast on H100 ...
    assert 1.7 < rf16.step_time(prefill) / rf8.step_time(prefill) < 2.0
    # ... and on A100 (no FP8 tensor cores: weight-only FP8) only the weight reads shrink
    assert RooflineModel(fp8, a100)._inv_flops == RooflineModel(bf16, a100)._inv_flops
    w8 = _with_quant("llama-3.1-8b-instruct", {"quant_method": "gptq", "bits": 8, "group_size": -1})
    assert RooflineModel(w8, h100)._inv_flops == rf16._inv_flops          # weight-only int8: BF16 GEMMs


def test_unquantized_models_are_unchanged():
    """No quantization_config: every byte count is the dtype width times the parameter count."""
    for name in ("meta-llama/Llama-3.1-8B", "mistralai/Mixtral-8x7B-v0.1", "deepseek-ai/DeepSeek-V2-Lite"):
        m = load_model(name)
        assert m.quant is None and m.compute_dtype == "bf16" and m.compute_dtype_share == 0
        assert m.weight_bytes == m.total_params * 2
        assert copy.copy(m).with_kv_cache_dtype("auto") is not None
        assert m.with_kv_cache_dtype("bfloat16").kv_bytes_per_token == m.kv_bytes_per_token
