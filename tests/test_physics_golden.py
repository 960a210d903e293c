"""The physics model against its golden fixture (independently computed, 1e-10 relative)."""
import json
import math
from pathlib import Path

import pytest

from dsim.config.model import model_from_hf
from dsim.latency.physics import AlphaInput, BetaInput, PhysicsConfig, alpha_features, beta_features

FIX = json.loads((Path(__file__).parent / "fixtures" / "physics_golden.json").read_text())
TOL = FIX["tolerance_relative"]


def _config(case) -> PhysicsConfig:
    c = case["config"]
    hw, v = c["hardware"], c["vllm"]
    return PhysicsConfig.build(
        model_from_hf(c["model"], name=case["id"]), peak_flops=hw["peak_flops"], hbm_bytes_s=hw["hbm_bytes_s"],
        interconnect_bytes_s=hw["interconnect_bytes_s"], pcie_bytes_s=hw["pcie_bytes_s"],
        pcie_efficiency=hw["pcie_efficiency"], tp=c["tp"], max_num_seqs=v["max_num_seqs"],
        max_batched_tokens=v["max_batched_tokens"], chunked_prefill=v["chunked_prefill_enabled"],
        block_size=v["block_size_tokens"], total_kv_blocks_gpu=v["total_kv_blocks_gpu"],
        cpu_offloading=v["cpu_offloading"], total_kv_blocks_cpu=v["total_kv_blocks_cpu"])


def _close(got, want, what):
    if want == 0.0:
        assert abs(got) <= 1e-15, f"{what}: {got} != 0"
    else:
        assert abs(got - want) <= TOL * abs(want), f"{what}: {got!r} != {want!r}"


def test_fixture_has_the_required_coverage():
    ids = [c["id"] for c in FIX["cases"]]
    assert len(ids) >= 50 and len(set(ids)) == len(ids)        # seed 000 Iteration 6, Refinement 3
    tps = {c["config"]["tp"] for c in FIX["cases"]}
    assert {1, 2, 4, 8} <= tps
    b = [c["beta_input"] for c in FIX["cases"]]
    chunked = [c["config"]["vllm"]["chunked_prefill_enabled"] for c in FIX["cases"]]
    assert any(x["decode_tokens"] and not x["prefill_tokens"] for x in b)                    # decode-only
    assert any(x["prefill_tokens"] and not x["decode_tokens"] for x in b)                    # prefill-only
    assert any(x["prefill_tokens"] and x["decode_tokens"] and on for x, on in zip(b, chunked))  # chunked mixed
    assert any(x["decode_context_tokens"] >= 100_000 * x["decode_tokens"] > 0 for x in b)    # long context
    assert any(x["sum_prefill_attn_work"] >= 24_576 * x["prefill_tokens"] > 0 for x in b)    # late chunk
    assert any("head_dim" in c["config"]["model"] for c in FIX["cases"])                     # head_dim != h/heads
    assert any(100.0 in c["expected_alpha_features"] for c in FIX["cases"])                  # clamp reached
    assert any(c["config"]["model"].get("num_local_experts") for c in FIX["cases"])
    assert any(c["config"]["model"]["num_key_value_heads"] == c["config"]["model"]["num_attention_heads"]
               for c in FIX["cases"])
    assert any(c["config"]["vllm"]["cpu_offloading"] for c in FIX["cases"])
    assert any(c["beta_input"]["scheduled_tokens"] == 0 for c in FIX["cases"])


@pytest.mark.parametrize("case", FIX["cases"], ids=lambda c: c["id"])
def test_golden_case(case):
    cfg = _config(case)
    for k, want in case["expected_physics_config"].items():
        _close(float(getattr(cfg, k)), want, k)
    a = alpha_features(cfg, AlphaInput(**case["alpha_input"]))
    b = beta_features(cfg, BetaInput(**case["beta_input"]))
    assert len(a) == 11 and len(b) == 16
    for i, (g, w) in enumerate(zip(a, case["expected_alpha_features"])):
        _close(g, w, f"alpha_f{i + 1}")
    for i, (g, w) in enumerate(zip(b, case["expected_beta_features"])):
        _close(g, w, f"beta_f{i + 1}")


def test_seed_case_by_hand():
    """Seed 000's worked example, recomputed by hand (corrected arithmetic, see seed_case_notes)."""
    case = FIX["cases"][0]
    cfg = _config(case)
    assert cfg.flops_linear_per_token == 32 * (83_886_080 + 352_321_536) + 1_050_673_152 == 15_009_316_864
    assert cfg.kv_bytes_per_token == 131_072
    assert cfg.weight_bytes_total == 32 * (83_886_080 + 352_321_536)
    assert math.isclose(cfg.roofline_step_time, 8192 * 15_009_316_864 / 989e12, rel_tol=1e-12)
    a = alpha_features(cfg, AlphaInput(**case["alpha_input"]))
    g = 0.09375 + 0.72 - 0.09375 * 0.72
    assert math.isclose(a[10], 0.74625, rel_tol=1e-12) and math.isclose(g, 0.74625)
    assert math.isclose(a[4], g * math.log(9) * cfg.roofline_step_time, rel_tol=1e-12)
    assert math.isclose(a[7], g * 512 * 131_072 / 1_835_008, rel_tol=1e-12)      # 27.29, seed 54.58
    b = beta_features(cfg, BetaInput(**case["beta_input"]))
    assert math.isclose(b[1], 262_144 * 262_144 / 989e12, rel_tol=1e-12)          # 6.949e-5, as the seed
    assert b[5] == 512 / 8192 and b[6] == 1.0 and b[9] == 0.25 and b[10] == 1 / 512 and b[15] == 1.0
    assert b[2] == b[3] == b[4] == b[7] == b[8] == 0.0


def test_moe_activation_underflow_and_empty_guard():
    case = next(c for c in FIX["cases"] if c["id"] == "mixtral_h100_tp2_large_prefill_saturated")
    cfg = _config(case)
    assert cfg.moe_activation(2048) == 1.0
    assert cfg.moe_activation(1) == 0.25
    assert cfg.moe_activation(0) == 0.0
    assert cfg.effective_weight_bytes(0) == cfg.weight_bytes_static
    assert 0 < cfg.moe_activation(50) < 1.0 and 1.0 - cfg.moe_activation(50) < 1e-6
