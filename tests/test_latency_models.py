"""unified5, physics (integration), calibrated_tps and vidur: hand-computed values and behaviour."""
import math
import time

import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency import vidur as V
from dsim.latency.base import BatchShape
from dsim.latency.calibrated_tps import CalibratedTPSModel, saturation_penalty
from dsim.latency.physics import PhysicsModel, load_coefficients
from dsim.latency.unified5 import Unified5Model

from helpers import scenario

H100 = load_device("H100-SXM")
L7 = load_model("meta-llama/Llama-2-7b-hf")
MIX = load_model("mistralai/Mixtral-8x7B-v0.1")


# ---- unified5 -----------------------------------------------------------------------------
def test_unified5_decode_step_by_hand():
    b = BatchShape(decode_tokens=10, decode_ctx_sum=10_000, num_sampled=10, running=10)
    # Llama-2-7B: 32 layers x (4 x 4096^2 attention + 3 x 4096 x 11008 MLP) = 6,476,005,376 weights
    params = 32 * (4 * 4096 ** 2 + 3 * 4096 * 11008)
    assert params == 6_476_005_376
    t_dc = (10 * 2 * params + 10_000 * 4 * 32 * 4096) / 989.4e12 * 1e6
    t_mem = (params * 2 + (10_000 + 10) * 2 * 32 * 4096 * 2) / 3350e9 * 1e6
    want = 0.093 * t_dc + 0.910 * t_mem + 68.3 * 32 + 12.9 * 10
    got = Unified5Model(L7, H100, 1).step_time(b) * 1e6
    assert math.isclose(got, want, rel_tol=1e-12)


def test_unified5_prefill_uses_causal_chunk_attention():
    m = Unified5Model(L7, H100, 1)
    c, p = 512, 1024
    b = BatchShape(prefill_tokens=c, num_prefill=1, prefill_attn_pairs=c * p + c * (c + 1) // 2,
                   prefill_ctx_tokens=p, num_sampled=1, prefill_chunk_sq=c * c, running=1)
    t_pf, t_dc, mem, L, B = m.basis(b)
    assert t_dc == 0 and L == 32 and B == 1
    assert math.isclose(t_pf, (c * 2 * 6_476_005_376 + (c * p + c * (c + 1) // 2) * 4 * 32 * 4096) / 989.4e12 * 1e6)
    assert math.isclose(mem, (6_476_005_376 * 2 + (p + 2 * c) * 2 * 32 * 4096 * 2) / 3350e9 * 1e6)


def test_unified5_moe_effective_experts_and_expert_parallel():
    tp = Unified5Model(MIX, H100, 2)
    assert tp.weight_us(1) < tp.weight_us(2) < tp.weight_us(4) == tp.weight_us(100)   # min(E, B k)
    one = tp.weight_us(1)
    assert math.isclose(tp.weight_us(4) - one, 6 * tp._expert_us)                      # 2 -> 8 experts
    ep = Unified5Model(MIX, H100, 2, expert_parallel=True)
    assert ep.ep == 2 and ep._experts == 4
    assert math.isclose(ep._expert_us, 2 * tp._expert_us)     # whole experts, not a 1/TP slice
    b = BatchShape(decode_tokens=64, decode_ctx_sum=64 * 500, num_sampled=64, running=64)
    assert ep.step_time(b) > 0 and ep._a2a_us_per_tok > 0


def test_unified5_alpha_timing_in_a_run(tmp_path):
    res = dsim.run(scenario(latency={"model": "unified5"}, workload={
        "type": "constant", "rate": 1, "num_requests": 3, "prompt_tokens": 100, "output_tokens": 5}))
    for r in res.requests:
        assert math.isclose(r.t_queued - r.arrival, 0.019615, abs_tol=1e-9)       # alpha0
        assert math.isclose(r.t_completion - r.t_last_token, 0.00185, abs_tol=1e-9)  # alpha1, E2E only
    assert res.manifest["latency"]["post_us"] == 1850.0


# ---- physics (simulation side) -------------------------------------------------------------
def _physics_model() -> PhysicsModel:
    from dsim.config.scenario import load_scenario
    from dsim.runner import prepare
    scn = load_scenario(scenario(latency={"model": "physics"}))
    ses = prepare(scn)
    inst = ses.fleet.replicas()[0].inst
    assert inst.step_model is inst.queueing and ses.desc["latency"]["model"] == "physics"
    return inst.step_model


def test_physics_batch_mapping_is_exact_chunk_work():
    m = _physics_model()
    c, p = 512, 1024
    b = BatchShape(prefill_tokens=c, num_prefill=1, prefill_attn_pairs=c * p + c * (c + 1) // 2,
                   prefill_ctx_tokens=p, num_sampled=1, prefill_chunk_sq=c * c, running=1)
    assert m.beta_input(b).sum_prefill_attn_work == (p + c) * c        # seed Iteration 5's 1536 x 512
    two = BatchShape(prefill_tokens=300 + 200, num_prefill=2,
                     prefill_attn_pairs=(300 * 301 // 2) + (200 * 100 + 200 * 201 // 2),
                     prefill_ctx_tokens=100, prefill_chunk_sq=300 ** 2 + 200 ** 2, running=2)
    assert m.beta_input(two).sum_prefill_attn_work == 300 * 300 + 300 * 200


def test_physics_preemption_ema_and_step_floor():
    m = _physics_model()
    b = BatchShape(decode_tokens=4, decode_ctx_sum=400, num_sampled=4, running=4, num_preempted=2)
    m.step_time(b)
    assert math.isclose(m.ema, 0.3 * 0.5)
    m.step_time(b._replace(num_preempted=0))
    assert math.isclose(m.ema, 0.7 * 0.15)
    assert m.step_time(BatchShape()) == 0.0


def test_physics_coefficient_file_errors(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("physics_coefficients:\n  spec_version: '2.0'\n  alpha_coefficients: []\n")
    with pytest.raises(ConfigError, match="spec_version"):
        load_coefficients(f)
    f.write_text("physics_coefficients:\n  spec_version: '1.0'\n  alpha_coefficients: [1, 2]\n"
                 "  beta_coefficients: []\n")
    with pytest.raises(ConfigError, match=r"c.yaml: physics_coefficients.alpha_coefficients.*11 finite"):
        load_coefficients(f)
    with pytest.raises(ConfigError, match="latency.coefficients"):
        dsim.run(scenario(latency={"model": "physics", "coefficients": str(tmp_path / "missing.yaml")}))


def test_physics_hardware_mismatch_is_reported():
    res = dsim.run(scenario(hardware="A100-80GB", latency={"model": "physics"}))
    assert "fitted on H100-SXM" in res.manifest["latency"]["warning"]


# ---- calibrated_tps (seed 001) -------------------------------------------------------------
def test_calibrated_tps_formulas():
    m = CalibratedTPSModel(1)
    assert math.isclose(m.step_time(BatchShape(decode_tokens=8)), math.sqrt(8) / 200)
    assert math.isclose(m.step_time(BatchShape(prefill_tokens=512, num_prefill=1)), 512 / 3000)  # 17 % util
    assert saturation_penalty(80) == 0 and math.isclose(saturation_penalty(90), 0.05)
    assert math.isclose(saturation_penalty(96), 0.19) and math.isclose(saturation_penalty(100), 0.35)
    busy = BatchShape(prefill_tokens=2850, num_prefill=4)            # 95 % util: 10 % penalty
    assert math.isclose(m.step_time(busy), 2850 / (3000 * 0.9))
    spec = CalibratedTPSModel(1, speculative=True)
    assert math.isclose(spec.step_time(BatchShape(decode_tokens=8)), 0.6 * math.sqrt(8) / 200)


def test_calibrated_tps_scale_out_matches_seed_claim():
    # seed 001: "1->2 GPUs: ~1.9x throughput"; decode at batch 8 gives 1.87x with its formulas
    one, two = CalibratedTPSModel(1), CalibratedTPSModel(2)
    b = BatchShape(decode_tokens=8)
    assert 1.8 < one.step_time(b) / two.step_time(b) < 1.95


def test_calibrated_tps_seed_calibration_scenario():
    """Seed 001's calibration test: batch 8, 1 GPU, 12 req/s, 512-token prompts, 128 outputs.

    The seed expects TTFT 500-700 ms, TPOT 60-80 ms and a bounded queue.  Its own formulas say
    otherwise: decode at batch 8 is sqrt(8)/200 s = 14 ms per token, a request holds a slot for
    ~1.9 s, so 8 slots serve ~4 req/s and 12 req/s overloads the replica.  This test pins what
    the formulas give (docs/latency-models.md lists the disagreement)."""
    wl = {"type": "poisson", "rate": 12, "num_requests": 600, "prompt_tokens": 512, "output_tokens": 128}
    res = dsim.run(scenario(model="meta-llama/Llama-2-7b-hf", hardware="A100-80GB",
                            engine={"max_num_seqs": 8, "max_num_batched_tokens": 2048},
                            latency={"model": "calibrated_tps"}, workload=wl))
    s = res.summary
    assert 14 < s["latency_ms"]["tpot"]["mean"] < 40             # seed: 60-80
    assert s["latency_ms"]["ttft"]["mean"] > 10_000               # seed: 500-700 (queue runs away)
    assert s["throughput"]["requests_per_s"] < 5
    low = dsim.run(scenario(model="meta-llama/Llama-2-7b-hf", hardware="A100-80GB",
                            engine={"max_num_seqs": 8, "max_num_batched_tokens": 2048},
                            latency={"model": "calibrated_tps"}, workload=dict(wl, rate=2)))
    assert low.summary["scheduler"]["peak_waiting"] < 20           # the seed's bounded queue holds at 2 req/s
    assert 512 / 3000 * 1e3 < low.summary["latency_ms"]["ttft"]["p50"] < 400


# ---- vidur ---------------------------------------------------------------------------------
def test_vidur_operator_fit_interpolates_and_extrapolates():
    rows = V._read_csv(V.find_profile(L7, "H100-SXM")[0])
    rows = [r for r in rows if r["num_tensor_parallel_workers"] == "1"]
    import numpy as np
    x = np.array([float(r["num_tokens"]) for r in rows])
    y = np.array([float(r["time_stats.mlp_up_proj.median"]) for r in rows])
    lo = x <= 2048
    m = V.OperatorModel(x[lo], y[lo])
    p = m.predict(x[~lo])
    assert np.sum(np.abs(p - y[~lo])) / np.sum(y[~lo]) < 0.10      # beyond the trained range
    assert m.predict([4 * 4096])[0] > 1.9 * m.predict([2 * 4096])[0] * 0.9   # keeps growing ~linearly


def test_vidur_build_time_cache_and_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("DSIM_CACHE_DIR", str(tmp_path))
    V.trained.cache_clear()
    t0 = time.perf_counter()
    a = V.VidurModel(L7, H100, 1, max_tokens=2048)
    assert time.perf_counter() - t0 < 60
    assert list((tmp_path / "vidur").glob("*.joblib"))
    V.trained.cache_clear()
    monkeypatch.setattr(V, "_train", lambda *a, **k: (_ for _ in ()).throw(AssertionError("retrained")))
    b = V.VidurModel(L7, H100, 1, max_tokens=2048)              # from the joblib cache
    assert (a.table_s == b.table_s).all()
    assert all(b.table_s[1:] >= b.table_s[:-1])
    V.trained.cache_clear()
    with pytest.raises(ConfigError, match="MoE"):
        V.find_profile(MIX, "H100-SXM")
    with pytest.raises(ConfigError, match="hardware"):
        V.find_profile(L7, "RTX4090")


def test_vidur_unprofiled_tp_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DSIM_CACHE_DIR", str(tmp_path))
    V.trained.cache_clear()
    with pytest.raises(ConfigError, match="tensor_parallel_size"):
        V.VidurModel(L7, H100, 3)
    V.trained.cache_clear()


def test_vidur_tp_comm_choice():
    l70 = load_model("meta-llama/Llama-2-70b-hf")
    prof = V.VidurModel(l70, H100, 4, max_tokens=256)
    roof = V.VidurModel(l70, H100, 4, max_tokens=256, tp_comm="roofline")
    assert prof.comm == "profiled all_reduce" and roof.comm == "roofline all_reduce"
    b = BatchShape(decode_tokens=32, decode_ctx_sum=32 * 800, num_sampled=32, running=32)
    assert roof.step_time(b) < prof.step_time(b)       # NCCL's small-message floor vs vLLM-like ring
    with pytest.raises(ConfigError, match="tp_comm"):
        dsim.run(scenario(model="meta-llama/Llama-2-70b-hf", engine={"tensor_parallel_size": 4},
                          latency={"model": "vidur", "tp_comm": "nccl"}))


# ---- what the replica hands the models ------------------------------------------------------
def _record_shapes(monkeypatch):
    """The batches the replica's model is asked (the first model asked: the pool's estimator, a
    copy asked for base rates by the summary's gpu_utilization, comes after the run)."""
    from dsim.latency.blackbox import BlackboxModel
    shapes = []
    orig = BlackboxModel.step_time
    first = []

    def rec(self, b):
        if not first:
            first.append(self)
        if self is first[0]:
            shapes.append(b)
        return orig(self, b)
    monkeypatch.setattr(BlackboxModel, "step_time", rec)
    return shapes


def test_replica_reports_chunk_squares_and_running(monkeypatch):
    shapes = _record_shapes(monkeypatch)
    dsim.run(scenario(engine={"max_num_batched_tokens": 2048, "max_model_len": 8192},
                      workload={"type": "constant", "rate": 1, "num_requests": 1, "prompt_tokens": 5000,
                                "output_tokens": 3}))
    pre = [(b.prefill_tokens, b.prefill_chunk_sq, b.prefill_ctx_tokens, b.running) for b in shapes if b.num_prefill]
    assert pre == [(2048, 2048 ** 2, 0, 1), (2048, 2048 ** 2, 2048, 1), (904, 904 ** 2, 4096, 1)]
    m = _physics_model()
    assert m.beta_input(shapes[2]).sum_prefill_attn_work == 5000 * 904


def test_replica_reports_preemptions_per_step(monkeypatch):
    shapes = _record_shapes(monkeypatch)
    res = dsim.run(scenario(engine={"num_gpu_blocks": 40, "max_model_len": 1024},
                            workload={"type": "constant", "rate": 1000, "num_requests": 8, "prompt_tokens": 100,
                                      "output_tokens": 200}))
    assert res.instance.num_preemptions > 0
    assert sum(b.num_preempted for b in shapes) == res.instance.num_preemptions
    assert all(1 <= b.running <= 8 for b in shapes)


def test_physics_alpha_reads_the_load_view():
    from dsim.latency.base import LoadView
    from dsim.latency.physics import AlphaInput, PhysicsCoefficients, alpha_features
    base = _physics_model()
    c = base.cfg
    alpha = tuple(0.01 * (i + 1) for i in range(11))
    m = PhysicsModel(c, PhysicsCoefficients(alpha, base.beta, 0.3, {}, "test"))
    m.ema = 0.2

    class Req:
        prompt_len = 800
    view = LoadView(running=100, waiting=7, kv_used_blocks=3000, kv_total_blocks=4000, prefix_hit_tokens=320)
    want = AlphaInput(100, 7, 0.75, 800, 0.4, 1000 * c.block_size * c.kv_bytes_per_token, 0.2)
    f = alpha_features(c, want)
    assert math.isclose(m.delay(Req(), view), sum(a * x for a, x in zip(alpha, f)), rel_tol=1e-12)
    busier = view._replace(waiting=70)
    assert m.delay(Req(), busier) > m.delay(Req(), view)


def test_physics_run_passes_replica_state_to_alpha(monkeypatch):
    seen = []
    orig = PhysicsModel.delay

    def rec(self, request, state=None):
        seen.append(state)
        return orig(self, request, state)
    monkeypatch.setattr(PhysicsModel, "delay", rec)
    wl = {"type": "poisson", "rate": 50, "num_requests": 200, "prompt_tokens": 64, "output_tokens": 50,
          "shared_prefix": {"num_groups": 2, "users_per_group": 4, "system_prompt_len": 256}}
    dsim.run(scenario(latency={"model": "physics"}, engine={"enable_prefix_caching": True}, workload=wl))
    assert len(seen) == 200 and seen[0].running == seen[0].waiting == seen[0].kv_used_blocks == 0
    assert max(s.running for s in seen) > 0 and max(s.prefix_hit_tokens for s in seen) >= 256
    assert all(0 <= s.kv_used_blocks <= s.kv_total_blocks for s in seen)
