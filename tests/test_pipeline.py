"""engine.pipeline_parallel_size: stage reservations by hand (the bubble and the overlap), one
request's token time equal to the unpipelined step plus the hops, two virtual engines filling the
pipeline, the KV split and GPU accounting, and what PP refuses."""
import math

import pytest

import dsim
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.serving.pipeline import Pipeline

from helpers import assert_refused, scenario


def test_stage_reservations_by_hand():
    p = Pipeline(2, 0.001, 0.0)                      # 1 ms between stages
    assert p.traverse(0.0, 0.010, 1) == pytest.approx(0.021)    # stage 1 [0, 10], stage 2 [11, 21] ms
    # a second batch ready at 0 waits for stage 1 only: [10, 20], then stage 2 [21, 31]
    assert p.traverse(0.0, 0.010, 1) == pytest.approx(0.031)
    # the first engine's next batch at 21 ms: stage 1 [21, 31], stage 2 waits to 32 -> 42
    assert p.traverse(0.021, 0.010, 1) == pytest.approx(0.042)
    # alone, a batch takes both stages back to back: the other stage idles (the bubble)
    q = Pipeline(4, 0.0, 0.0)
    assert q.traverse(0.0, 0.005, 1) == pytest.approx(0.020)


B0, B2 = 20000.0, 100.0          # blackbox: 20 ms a step + 0.1 ms a decode token


def _run(pp, n=1, rate=1000, out=50):
    return dsim.run(scenario(model="meta-llama/Llama-3.1-70B", hardware="A100-80GB",
                             latency={"model": "blackbox", "beta": [B0, 0, B2], "alpha": [0, 0, 0]},
                             engine={"tensor_parallel_size": 2, "pipeline_parallel_size": pp, "max_num_seqs": 64},
                             workload={"type": "constant", "rate": rate, "num_requests": n, "prompt_tokens": 100,
                                       "output_tokens": out}), check_invariants=True)


def test_one_request_pays_the_whole_model_plus_the_hops():
    dev, model = load_device("A100-80GB", "hardware"), load_model("meta-llama/Llama-3.1-70B", "model", None)
    hop = dev.interconnect_latency_s + model.hidden_size * 2 / 2 / dev.interconnect_bytes_s   # 1 token, TP 2
    (r,) = _run(2).requests
    tpot = (r.t_last_token - r.t_first_token) / (r.n_out - 1)
    assert tpot == pytest.approx((B0 + B2) / 1e6 + hop, rel=1e-9)
    (r1,) = _run(1).requests
    assert (r1.t_last_token - r1.t_first_token) / (r1.n_out - 1) == pytest.approx((B0 + B2) / 1e6, rel=1e-9)


def _hop(tokens):
    dev, model = load_device("A100-80GB", "hardware"), load_model("meta-llama/Llama-3.1-70B", "model", None)
    return dev.interconnect_latency_s + tokens * model.hidden_size * 2 / 2 / dev.interconnect_bytes_s


def _tpot(r):
    return (r.t_last_token - r.t_first_token) / (r.n_out - 1)


def test_two_virtual_engines_fill_the_bubble():
    # one request per engine: their batches alternate in the two stages, so each still gets a
    # token every (whole-model step + hop), as if alone: twice the tokens per second of one engine
    res = _run(2, n=2)
    assert sorted(r.replica for r in res.requests) == ["replica0.ve0", "replica0.ve1"]
    for r in res.requests:
        assert _tpot(r) == pytest.approx((B0 + B2) / 1e6 + _hop(1), rel=2e-3)
    assert res.summary["efficiency"]["gpus"] == 4 and _run(1).summary["efficiency"]["gpus"] == 2


def test_same_batch_on_twice_the_gpus():
    # 64 requests: one TP=2 engine runs them as one batch (B0 + 64 x B2 a token); PP=2 runs two
    # batches of 32 through stages of half the layers, a token every B0 + 32 x B2 + hop (within 1 %:
    # the requests arrive 1 ms apart, so the first and last steps run smaller batches)
    one, two = _run(1, n=64), _run(2, n=64)
    t1 = sorted(_tpot(r) for r in one.requests)[32]
    t2 = sorted(_tpot(r) for r in two.requests)[32]
    assert t1 == pytest.approx((B0 + 64 * B2) / 1e6, rel=1e-2)
    assert t2 == pytest.approx((B0 + 32 * B2) / 1e6 + _hop(32), rel=1e-2)
    assert t2 < 0.95 * t1


def test_kv_blocks_are_per_gpu_and_split_among_virtual_engines():
    from dsim.config.engine import EngineConfig
    dev, model = load_device("A100-80GB", "hardware"), load_model("meta-llama/Llama-3.1-70B", "model", None)
    tp2 = EngineConfig(tensor_parallel_size=2, max_num_seqs=64)
    pp2 = EngineConfig(tensor_parallel_size=2, pipeline_parallel_size=2, max_num_seqs=64)
    # half the layers per GPU: half the weights and twice the blocks per GPU
    assert pp2.kv_blocks(model, dev) > 2 * tp2.kv_blocks(model, dev)
    res = _run(2)
    assert res.summary["kv_cache"]["total_blocks"] == 2 * (pp2.kv_blocks(model, dev) // 2)


@pytest.mark.parametrize("setting", ["engine.pipeline_parallel_size=81",       # more stages than layers
                                     "engine.kv_offload.cpu_gb=10"])           # not combined with PP yet
def test_pp_refusals_are_one_line_exit_2_and_write_nothing(setting, tmp_path, capsys):
    assert_refused("pipeline_parallel", [setting], "engine.pipeline_parallel_size", tmp_path, capsys)


def test_stage_boundaries_between_nodes_use_the_internode_link():
    """TP 4 x PP 4 on nodes of 8 GPUs: stages 0-1 on node 0, 2-3 on node 1; only the 1 -> 2 hop
    crosses, at the NIC's rate and latency."""
    from dsim.config.engine import load_engine
    from dsim.config.hardware import load_device
    from dsim.config.model import load_model
    from dsim.serving.pipeline import build_pipeline
    m = load_model("meta-llama/Llama-3.1-70B")
    dev = {"name": "n", "peak_tflops_bf16": 1000, "hbm_gb_s": 3000, "memory_gb": 80, "interconnect_gb_s": 400,
           "interconnect_latency_us": 5, "gpus_per_node": 8, "internode_gb_s": 50, "internode_latency_us": 20}
    e = load_engine({"tensor_parallel_size": 4, "pipeline_parallel_size": 4})
    pipe = build_pipeline(e, m, load_device(dev))
    intra = (5e-6, m.hidden_size * 2 / 4 / 400e9)
    inter = (20e-6, m.hidden_size * 2 / 4 / 50e9)
    assert [h for hop in pipe.hops for h in hop] == pytest.approx([*intra, *inter, *intra], rel=1e-12)
    tokens, stage = 100, 1e-3
    want = 4 * stage + sum(f + per * tokens for f, per in pipe.hops)
    assert math.isclose(pipe.traverse(0.0, stage, tokens), want, rel_tol=1e-12)
    # one node, or no inter-node figure: the uniform hop as before
    assert build_pipeline(e, m, load_device({**dev, "gpus_per_node": 16})).hops is None
    assert build_pipeline(e, m, load_device({k: v for k, v in dev.items() if k != "internode_gb_s"})).hops is None
