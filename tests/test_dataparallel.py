"""engine.data_parallel_size with expert parallelism: the step's parts by hand, a lone rank's step
composed by hand, ranks in lockstep, EP's memory, and what DP refuses."""
import pytest

import dsim
from dsim.config.engine import EngineConfig
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency.base import BatchShape
from dsim.latency.roofline import RooflineModel
from dsim.serving.dataparallel import DPRoofline

from helpers import scenario

MOE = "Qwen/Qwen3-30B-A3B"


def _parts(tp=1, dp=4):
    m, d = load_model(MOE, "model", None), load_device("H100-SXM", "hardware")
    return m, d, DPRoofline(RooflineModel(m, d, tp), dp)


def test_expert_and_all_to_all_parts_by_hand():
    m, d, p = _parts()
    mlp = 3 * m.hidden_size * m.expert_intermediate_size                       # gated expert MLP weights
    # a GPU holds 128 / 4 experts and computes 1/4 of every token's k expert MLPs
    assert p.local_experts == m.num_experts / 4
    assert p._flops_expert == pytest.approx(2 * m.num_moe_layers * m.experts_per_token * mlp / 4)
    assert p._expert_bytes_one * p.local_experts == pytest.approx(m.num_moe_layers * m.num_experts * mlp * 2 / 4)
    # dispatch + combine per MoE layer: k copies of the hidden state each way
    a2a = 2 * m.num_moe_layers * (d.interconnect_latency_s
                                  + 10 * m.experts_per_token * m.hidden_size * 2 / d.interconnect_bytes_s)
    assert p.a2a_time(10) == pytest.approx(a2a)
    # dense + experts on one GPU = the whole roofline when one GPU holds everything (dp = 1)
    _, _, one = _parts(dp=1)
    rf = one.rf
    b = BatchShape(decode_tokens=64, decode_ctx_sum=64 * 1000, num_sampled=64, running=64)
    assert one._flops_dense + one._flops_expert == pytest.approx(rf._flops_lin)
    assert one.dense_time(b) < rf.step_time(b) < one.dense_time(b) + one.expert_time(64) + 1e-12


def _run(dp, n=1, out=2, rate=1000.0, **eng):
    return dsim.run(scenario(model=MOE, latency={"model": "roofline"},
                             engine={"data_parallel_size": dp, "enable_expert_parallel": dp > 1, "max_num_seqs": 64,
                                     "enable_prefix_caching": False, **eng},
                             workload={"type": "constant", "rate": rate, "num_requests": n, "prompt_tokens": 500,
                                       "output_tokens": out}), check_invariants=True)


def test_a_lone_rank_step_composed_by_hand():
    res = _run(2)
    (r,) = res.requests
    reps = {rep.name: rep for rep in res.fleet.replicas()}
    assert sorted(reps) == ["replica0.dp0", "replica0.dp1"]
    step = reps[r.replica].inst.step_model
    p = step.parts
    b = BatchShape(decode_tokens=1, decode_ctx_sum=501, num_sampled=1, running=1)
    own = step.host_model.host_time(b) + p.dense_time(b)
    assert r.t_last_token - r.t_first_token == pytest.approx(own + p.expert_time(1) + p.a2a_time(1), rel=1e-9)


def test_ranks_step_in_lockstep():
    res = _run(2, n=40, out=30, rate=200.0)
    assert res.summary["requests"]["completed"] == 40
    logs = [list(zip(rep.inst.log.t_end, rep.inst.log.dur)) for rep in res.fleet.replicas()]
    assert all(len(lg) > 10 for lg in logs)
    # two ranks' steps are the same interval or do not overlap at all
    ends = {t for t, _ in logs[1]}
    for t, dur in logs[0]:
        for u, dv in logs[1]:
            overlap = min(t, u) - max(t - dur, u - dv)
            assert overlap <= 1e-12 or (t == u and dur == dv), (t, dur, u, dv)
    assert len(ends & {t for t, _ in logs[0]}) > 10
    assert res.summary["efficiency"]["gpus"] == 2


def test_ep_leaves_more_room_for_kv():
    m, d = load_model(MOE, "model", None), load_device("H100-SXM", "hardware")
    one = EngineConfig(max_num_seqs=64).kv_blocks(m, d)
    ep4 = EngineConfig(max_num_seqs=64, data_parallel_size=4, enable_expert_parallel=True).kv_blocks(m, d)
    mlp = 3 * m.hidden_size * m.expert_intermediate_size
    freed = m.num_moe_layers * m.num_experts * mlp * m.bytes_per_param * 3 / 4          # 3/4 of the experts
    per_block = m.kv_bytes_per_token * 16
    assert ep4 - one == pytest.approx(freed / per_block, abs=1)


@pytest.mark.parametrize("over,key", [
    ({"model": "meta-llama/Llama-3.1-8B"}, "engine.data_parallel_size"),                # dense: use replicas
    ({"engine": {"enable_expert_parallel": False}}, "engine.data_parallel_size"),       # no EP
    ({"latency": {"model": "blackbox", "beta": [1000, 0, 0]}}, "latency.model"),
    ({"engine": {"data_parallel_size": 2, "enable_expert_parallel": True, "pipeline_parallel_size": 2}},
     "engine.data_parallel_size"),
])
def test_dp_refusals(over, key):
    base = scenario(model=MOE, latency={"model": "roofline"},
                    engine={"data_parallel_size": 2, "enable_expert_parallel": True})
    for k, v in over.items():
        base[k] = {**base[k], **v} if k == "engine" else v
    with pytest.raises(dsim.ConfigError, match=f"^{key}"):
        dsim.run(base)
