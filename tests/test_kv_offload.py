"""engine.kv_offload: the CPU tier of the prefix cache.  A prefix evicted from the GPU comes back
over PCIe at the time computed by hand; blocks are conserved across the tiers; the tier raises the
hit rate and lowers TTFT when the shared prefixes do not fit in GPU KV; bad input is refused."""
import json

import pytest

import dsim
from dsim.config.hardware import load_device
from dsim.config.model import load_model

from helpers import assert_refused, scenario

B0, B1 = 1000.0, 100.0          # blackbox step: 1 ms + 0.1 ms per prefill token


def _trace(tmp_path, rows):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(dict(zip(("arrival_s", "prompt_tokens", "output_tokens", "prefix_group"), r)))
                         + "\n" for r in rows))
    return p


def _run(tmp_path, offload, rows):
    return dsim.run(scenario(latency={"model": "blackbox", "beta": [B0, B1, 0], "alpha": [0, 0, 0]},
                             engine={"num_gpu_blocks": 40, "enable_prefix_caching": True, "max_num_seqs": 4,
                                     **({"kv_offload": offload} if offload else {})},
                             workload={"type": "trace", "path": str(_trace(tmp_path, rows)), "prefix_tokens": 320}),
                    check_invariants=True)


# r0 computes a 320-token prefix (20 blocks) and one block of its own; r1 (another group, 39
# blocks) takes the 19 never-used blocks and 20 of r0's from the 40-block GPU cache, which frees a
# request's blocks tail first, so only r0's first block survives there; r2 wants the prefix again:
# block 0 hits on the GPU, blocks 1-19 come back from the CPU tier
ROWS = [(0.0, 336, 1, 1), (1.0, 624, 1, 2), (2.0, 336, 1, 1)]


def test_a_prefix_evicted_from_the_gpu_is_loaded_back_at_pcie_speed(tmp_path):
    dev, model = load_device("H100-SXM", "hardware"), load_model("meta-llama/Llama-3.1-8B", "model", None)
    block_s = model.kv_bytes_per_token * 16 / (dev.pcie_bytes_s * dev.pcie_efficiency)
    res = _run(tmp_path, {"cpu_gb": 1}, ROWS)
    r2 = sorted(res.requests, key=lambda r: r.rid)[2]
    # 19 blocks over PCIe, then one step computing the 16 tokens past the prefix
    assert r2.cached_tokens == 320
    assert r2.t_first_token - r2.arrival == pytest.approx(19 * block_s + (B0 + 16 * B1) / 1e6, rel=1e-9)
    k = res.summary["kv_cache"]
    assert (k["cpu_tier"]["loaded_blocks"], k["cpu_tier"]["hit_tokens"], k["cpu_tier"]["requests_loaded"]) == (19, 304, 1)
    assert k["gpu_hit_tokens"] == 16
    # without the tier r2 hits block 0 on the GPU and recomputes the other 320 tokens in one step
    base = sorted(_run(tmp_path, None, ROWS).requests, key=lambda r: r.rid)[2]
    assert base.cached_tokens == 16
    assert base.t_first_token - base.arrival == pytest.approx((B0 + 320 * B1) / 1e6, rel=1e-9)


def test_without_overlap_the_load_lengthens_the_step(tmp_path):
    dev, model = load_device("H100-SXM", "hardware"), load_model("meta-llama/Llama-3.1-8B", "model", None)
    block_s = model.kv_bytes_per_token * 16 / (dev.pcie_bytes_s * dev.pcie_efficiency)
    r2 = sorted(_run(tmp_path, {"cpu_gb": 1, "overlap": False}, ROWS).requests, key=lambda r: r.rid)[2]
    assert r2.t_first_token - r2.arrival == pytest.approx(19 * block_s + (B0 + 16 * B1) / 1e6, rel=1e-9)


def test_on_evict_stores_only_what_the_gpu_drops(tmp_path):
    wt = _run(tmp_path, {"cpu_gb": 1}, ROWS[:2]).summary["kv_cache"]["cpu_tier"]
    ev = _run(tmp_path, {"cpu_gb": 1, "policy": "on_evict"}, ROWS[:2]).summary["kv_cache"]["cpu_tier"]
    # write-through copies every block the GPU cache registers: r0's 21 full blocks and r1's 39
    # (r1's are registered as it completes, so they are still on the PCIe link when the run ends)
    assert (wt["stored_blocks"], wt["in_flight_blocks"]) == (21, 39)
    # on eviction only the 20 blocks of r0 that r1 pushed out
    assert ev["stored_blocks"] == 20
    assert _run(tmp_path, {"cpu_gb": 1, "policy": "on_evict"}, ROWS).summary["kv_cache"]["cpu_tier"]["loaded_blocks"] == 19


def test_blocks_are_conserved_across_tiers_and_hits_add_up(tmp_path):
    rows = [(0.05 * i, 336 + (i % 5) * 16, 8, i % 4) for i in range(120)]
    res = _run(tmp_path, {"cpu_gb": 0.2}, rows)           # 95 host blocks: the tier evicts too
    k = res.summary["kv_cache"]
    cpu = k["cpu_tier"]
    assert cpu["stored_blocks"] - cpu["evicted_blocks"] == cpu["resident_blocks"] <= cpu["capacity_blocks"] == 95
    assert cpu["evicted_blocks"] > 0 and cpu["loaded_blocks"] > 0
    assert cpu["hit_tokens"] == cpu["loaded_blocks"] * 16
    assert res.summary["scheduler"]["preemptions"] == 0   # so every hit is a first admission's
    assert k["prefix_hit_tokens"] == k["gpu_hit_tokens"] + cpu["hit_tokens"]


def test_the_shipped_scenario_raises_hits_and_lowers_ttft():
    from pathlib import Path
    path = str(Path(__file__).resolve().parents[1] / "scenarios" / "kv_offload_cpu.yaml")
    over = ["workload.num_requests=400"]
    on = dsim.run(path, overrides=over, plots=False).summary
    off = dsim.run(path, overrides=over + ["engine.kv_offload=null"], plots=False).summary
    assert on["kv_cache"]["prefix_hit_rate"] + on["kv_cache"]["cpu_tier"]["hit_rate"] > 2 * off["kv_cache"]["prefix_hit_rate"]
    assert on["latency_ms"]["ttft"]["p50"] < 0.5 * off["latency_ms"]["ttft"]["p50"]


@pytest.mark.parametrize("setting,key", [
    ("engine.kv_offload.cpu_gb=0", "engine.kv_offload.cpu_gb"),
    ("engine.kv_offload.policy=arc", "engine.kv_offload.policy"),
    ("engine.kv_offload.cpu_gb=0.000001", "engine.kv_offload.cpu_gb"),          # not one block
    ("engine.enable_prefix_caching=false", "engine.kv_offload"),
])
def test_bad_offload_input_is_one_line_exit_2_and_writes_nothing(setting, key, tmp_path, capsys):
    assert_refused("kv_offload_cpu", [setting], key, tmp_path, capsys)


def test_transfers_are_in_the_otlp_kv_connector_stream(tmp_path):
    from dsim.calibrate.vllm_traces import read_otlp
    res = dsim.run(scenario(latency={"model": "blackbox", "beta": [B0, B1, 0], "alpha": [0, 0, 0]},
                            engine={"num_gpu_blocks": 40, "max_num_seqs": 4, "enable_prefix_caching": True,
                                    "kv_offload": {"cpu_gb": 1}},
                            workload={"type": "trace", "path": str(_trace(tmp_path, ROWS)), "prefix_tokens": 320}),
                   vllm_traces=True)
    p = tmp_path / "traces.jsonl"
    res.write_vllm_traces(p)
    ev = read_otlp([p]).kv_events
    loads = [(t, a) for _, name, t, a in ev if name == "TransferInitiated" and a["kv.direction"] == "cpu_to_gpu"]
    done = [t for _, name, t, a in ev if name == "TransferCompleted" and a["kv.direction"] == "cpu_to_gpu"]
    assert [(a["kv.num_blocks"], a["request.id"]) for _, a in loads] == [(19, "2")]
    r2 = sorted(res.requests, key=lambda r: r.rid)[2]
    assert loads[0][0] == pytest.approx(r2.arrival, abs=1e-9) and done[0] == pytest.approx(r2.t_scheduled, abs=1e-9)
    # stores: r0's 21 blocks, r1's 39, and r2's one new block (its 19 loaded ones are resident already)
    stored = sum(a["kv.num_blocks"] for _, name, _, a in ev if name == "CacheStoreCommitted")
    assert stored == 21 + 39 + 1


def test_physics_costs_the_blocks_it_waits_for_once(tmp_path, monkeypatch):
    """With the physics model the copy is its transfer_blocks term (fed from the tier's count),
    so the replica does not add the copy time again."""
    from dsim.latency.base import BatchShape
    from dsim.latency.physics import PhysicsModel

    def run():
        return dsim.run(scenario(latency={"model": "physics"},
                                 engine={"num_gpu_blocks": 40, "max_num_seqs": 4, "enable_prefix_caching": True,
                                         "kv_offload": {"cpu_gb": 1, "overlap": False}},
                                 workload={"type": "trace", "path": str(_trace(tmp_path, ROWS)), "prefix_tokens": 320}))
    res = run()
    rep = res.fleet.replicas()[0]
    model, tier = rep.inst.step_model, rep.inst.tier
    assert model.charges_kv_loads and model.cfg.total_kv_blocks_cpu == tier.capacity
    b = BatchShape(prefill_tokens=16, num_prefill=1, prefill_attn_pairs=16 * 320 + 136, prefill_ctx_tokens=320,
                   num_sampled=1, prefill_chunk_sq=256, running=1)
    extra = model.step_time(b._replace(kv_load_blocks=19)) - model.step_time(b)
    assert extra == pytest.approx(19 * tier.block_s, rel=1e-9)          # beta for transfer_blocks is 1
    r2 = sorted(res.requests, key=lambda r: r.rid)[2]
    assert res.summary["kv_cache"]["cpu_tier"]["loaded_blocks"] == 19
    monkeypatch.setattr(PhysicsModel, "charges_kv_loads", property(lambda self: False))
    twice = sorted(run().requests, key=lambda r: r.rid)[2]
    assert (twice.t_first_token - twice.arrival) - (r2.t_first_token - r2.arrival) == pytest.approx(
        19 * tier.block_s, rel=1e-6)
