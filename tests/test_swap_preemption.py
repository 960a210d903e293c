"""Swap preemption (engine.preemption_mode: swap, dsim.serving.swap) against hand-computed times."""
import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.config.hardware import load_device
from dsim.core.request import Request
from dsim.metrics.vllm_traces import _journey_spans
from helpers import scenario, trace_file

KV_TOKEN = 2 * 32 * 8 * 128 * 2      # Llama-3.1-8B: K and V x 32 layers x 8 KV heads x 128 dims x 2 bytes


def _bw():
    d = load_device("H100-SXM", "hardware")
    return d.pcie_bytes_s * d.pcie_efficiency       # the CPU tier's effective host-link rate per GPU


def run_trace(tmp_path, rows, check=True, **over):
    p = trace_file(tmp_path, rows)
    res = dsim.run(scenario(workload={"type": "trace", "path": str(p)}, **over), check_invariants=check)
    return {r.rid: r for r in res.requests}, res


TINY = {"num_gpu_blocks": 4, "block_size": 4, "max_model_len": 64}


def test_swap_copy_time_is_on_the_step_timeline(tmp_path):
    # tests/test_scheduler.py's preemption case (1 ms steps, 4 blocks of 4 tokens): B is preempted
    # at 3 ms with 7 computed tokens = 2 blocks.  Swap: the step starting at 3 ms is longer by
    # 2 blocks out, A (alone) finishes at 8 ms + t_out, B comes back in the next step (2 blocks
    # in, decoding its 3rd token, no prefill) and finishes 6 steps later.
    t_blk = 4 * KV_TOKEN / _bw()
    t_out = t_in = 2 * t_blk
    reqs, res = run_trace(tmp_path, [(0.0, 6, 8), (0.0001, 6, 8)], engine={**TINY, "preemption_mode": "swap"})
    a, b = reqs[0], reqs[1]
    assert [t * 1e3 for t in b.preempt_times] == [3.0]
    assert a.t_completion == pytest.approx(0.008 + t_out, abs=1e-12)
    assert b.resume_times == ((pytest.approx(0.008 + t_out, abs=1e-12), "DECODE"),)
    assert b.t_completion == pytest.approx(0.014 + t_out + t_in, abs=1e-12)
    # B's 3rd token: at the end of the swap-in step, 6 ms + copies after the preemption
    assert [(v, w) for v, w in res.instance.itl_extra] == [(pytest.approx(0.006 + t_out + t_in, abs=1e-12), 1)]
    assert sum(res.instance.log.prefill_tokens) == 12          # the two prompts once: nothing recomputed
    s = res.summary["scheduler"]
    assert (s["preemptions"], s["swap_outs"], s["swap_ins"], s["swap_fallbacks"]) == (1, 1, 1, 0)
    assert (s["swap_out_blocks"], s["swap_in_blocks"]) == (2, 2)
    assert s["swapped_bytes"] == 4 * 4 * KV_TOKEN
    assert s["swap_copy_s"] == pytest.approx(t_out + t_in, rel=1e-12)
    assert s["swap_capacity_blocks"] == 4 * 1024 ** 3 // (4 * KV_TOKEN)       # vLLM's default 4 GiB
    # recompute, for contrast: no copy, B's 8 tokens prefilled again
    reqs, res = run_trace(tmp_path, [(0.0, 6, 8), (0.0001, 6, 8)], engine=TINY)
    assert reqs[1].t_completion * 1e3 == pytest.approx(14.0) and sum(res.instance.log.prefill_tokens) == 20
    assert reqs[1].resume_times == ((pytest.approx(0.008), "PREFILL"),)
    assert "swap_outs" not in res.summary["scheduler"]


LONG = [(0.0, 1000, 40), (0.0001, 1000, 40)]
LONG_ENGINE = {"num_gpu_blocks": 126, "block_size": 16, "max_model_len": 2048}
PER_TOKEN = {"model": "blackbox", "beta": [1000, 10, 0]}     # 1 ms a step + 10 us a prefill token


def test_swap_skips_the_recompute_of_a_long_prompt(tmp_path):
    # A and B (1000-token prompts) fill 63 + 63 blocks; at step 10 A has 1008 tokens computed (63
    # full blocks) and needs a 64th for the next one: B (1007 computed, 8 out) is preempted.  It
    # comes back when A finishes.  Recompute prefills its 1008 tokens again (10.08 ms more); swap
    # copies 63 blocks out and 63 in instead (2 x 2.75 ms at 48 GB/s).
    t_blk = 16 * KV_TOKEN / _bw()
    rec, res_r = run_trace(tmp_path, LONG, engine=LONG_ENGINE, latency=PER_TOKEN)
    swp, res_s = run_trace(tmp_path, LONG, engine={**LONG_ENGINE, "preemption_mode": "swap"}, latency=PER_TOKEN)
    assert len(rec[1].preempt_times) == len(swp[1].preempt_times) == 1
    assert rec[1].preempt_times == swp[1].preempt_times
    assert res_s.summary["scheduler"]["swap_out_blocks"] == 63
    assert swp[0].t_completion - rec[0].t_completion == pytest.approx(63 * t_blk, abs=1e-12)   # A pays the out copy
    gain = rec[1].t_completion - swp[1].t_completion
    assert gain == pytest.approx(1008 * 10e-6 - 2 * 63 * t_blk, abs=1e-12)
    assert gain > 0.004
    assert sum(res_r.instance.log.prefill_tokens) == 2000 + 1008
    assert sum(res_s.instance.log.prefill_tokens) == 2000


def test_a_request_swapped_mid_prefill_keeps_its_chunks(tmp_path):
    # 256-token steps: B's 1000-token prompt is chunked; A's decode runs out of blocks while B is
    # still prefilling, so B is preempted with some chunks done.  Swap keeps them: B's first token
    # comes earlier and fewer prompt tokens are computed than with recompute.
    eng = {"num_gpu_blocks": 70, "block_size": 16, "max_model_len": 2048, "max_num_batched_tokens": 256}
    rows = [(0.0, 900, 200), (0.0001, 1000, 4)]
    rec, res_r = run_trace(tmp_path, rows, engine=eng, latency=PER_TOKEN)
    swp, res_s = run_trace(tmp_path, rows, engine={**eng, "preemption_mode": "swap"}, latency=PER_TOKEN)
    assert rec[1].preempt_times and swp[1].preempt_times
    assert swp[1].resume_times[0][1] == "PREFILL"
    assert swp[1].t_first_token < rec[1].t_first_token
    assert sum(res_s.instance.log.prefill_tokens) == 1900 < sum(res_r.instance.log.prefill_tokens)


@pytest.mark.parametrize("blocks,swaps", [(62, 0), (63, 1)])
def test_a_full_swap_space_falls_back_to_recompute(tmp_path, blocks, swaps):
    # B needs 63 blocks of 16 x 128 KiB: a swap space one block short recomputes it, exactly as
    # preemption_mode: recompute does; one of exactly 63 blocks swaps it
    gib = blocks * 16 * KV_TOKEN / 1024 ** 3
    rec, _ = run_trace(tmp_path, LONG, engine=LONG_ENGINE, latency=PER_TOKEN)
    swp, res = run_trace(tmp_path, LONG, engine={**LONG_ENGINE, "preemption_mode": "swap", "swap_space": gib},
                         latency=PER_TOKEN)
    s = res.summary["scheduler"]
    assert s["swap_capacity_blocks"] == blocks
    assert (s["swap_outs"], s["swap_fallbacks"]) == (swaps, 1 - swaps)
    same = [(r.t_first_token, r.t_completion, r.preempt_times) for r in rec.values()] == \
           [(r.t_first_token, r.t_completion, r.preempt_times) for r in swp.values()]
    assert same == (swaps == 0)


@pytest.mark.parametrize("chunked", [True, False])
def test_swapped_requests_come_back_before_waiting_ones(tmp_path, chunked):
    # C (2-token prompt) arrives at 4 ms while B is swapped out and one block is free: it would
    # fit, but the swapped request goes first (vLLM V0), so C starts only once B is back
    rows = [(0.0, 6, 8), (0.0001, 6, 8), (0.004, 2, 2)]
    eng = {**TINY, "preemption_mode": "swap", "enable_chunked_prefill": chunked, "max_num_batched_tokens": 64}
    reqs, _ = run_trace(tmp_path, rows, engine=eng)
    b, c = reqs[1], reqs[2]
    assert b.preempt_times and c.t_scheduled >= b.resume_times[0][0] > 0.008
    assert all(r.t_completion is not None for r in reqs.values())


def test_recompute_is_the_default_and_unchanged(tmp_path):
    rows = [(0.0, 6, 8), (0.0001, 6, 8)]
    a, ra = run_trace(tmp_path, rows, engine=TINY)
    b, rb = run_trace(tmp_path, rows, engine={**TINY, "preemption_mode": "recompute", "swap_space": 16})
    assert ra.summary == rb.summary
    assert [(r.t_first_token, r.t_completion) for r in a.values()] == [(r.t_first_token, r.t_completion) for r in b.values()]


def test_journey_has_a_resume_after_each_preemption():
    r = Request(7, 0.0, 100, 10)
    r.t_queued, r.t_scheduled, r.t_first_token, r.t_completion, r.t_last_token = 0.0, 0.001, 0.002, 0.01, 0.01
    r.n_out = 10
    r.preempt_times = (0.003, 0.006)
    r.resume_times = ((0.004, "DECODE"), (0.008, "PREFILL"))
    _, core = _journey_spans([r], 0.0)
    ev = [(e["name"], int(e["timeUnixNano"]), {a["key"]: list(a["value"].values())[0] for a in e["attributes"]})
          for e in core[0]["events"]]
    sched = [(t, a["phase"], a["schedule.kind"]) for n, t, a in ev if n == "journey.SCHEDULED"]
    assert sched == [(1_000_000, "PREFILL", "FIRST"), (4_000_000, "DECODE", "RESUME"), (8_000_000, "PREFILL", "RESUME")]
    names = [n for n, _, _ in ev]
    i = names.index("journey.PREEMPTED")
    assert names[i:i + 4] == ["journey.PREEMPTED", "journey.SCHEDULED", "journey.PREEMPTED", "journey.SCHEDULED"]


def test_swap_refusals():
    with pytest.raises(ConfigError, match=r"^engine\.preemption_mode"):
        dsim.run(scenario(engine={"preemption_mode": "swap", "enable_prefix_caching": True,
                                  "kv_offload": {"cpu_gb": 10}}))
    with pytest.raises(ConfigError, match=r"^engine\.preemption_mode"):
        dsim.run(scenario(engine={"preemption_mode": "swapp"}))
    with pytest.raises(ConfigError, match=r"^engine\.swap_space"):
        dsim.run(scenario(engine={"swap_space": -1}))
    with pytest.raises(ConfigError, match=r"^engine\.pipeline_parallel_size"):
        dsim.run(scenario(engine={"preemption_mode": "swap", "pipeline_parallel_size": 2,
                                  "tensor_parallel_size": 1}, latency={"model": "roofline"}))


def test_a_request_swapped_out_when_the_run_stops_is_counted_unfinished():
    # stopped at 50 ms without draining, one request is still in the swap space: request
    # conservation (checked at the end) and the load views count it
    eng = {"num_gpu_blocks": 60, "block_size": 16, "max_model_len": 2048, "preemption_mode": "swap",
           "max_num_batched_tokens": 256}
    wl = {"type": "poisson", "rate": 200, "num_requests": 150, "output_tokens": {"dist": "uniform", "min": 5, "max": 200},
          "prompt_tokens": {"dist": "uniform", "min": 20, "max": 400}}
    res = dsim.run({**scenario(engine=eng, workload=wl), "horizon_s": 0.05, "drain": False}, check_invariants=True)
    rep = res.fleet.replicas()[0]
    assert len(rep.inst.swapped) == 1 and res.summary["scheduler"]["swap_outs"] == 1
    assert res.summary["requests"]["unfinished"] == res.summary["requests"]["submitted"] - res.summary["requests"]["completed"]
    assert rep.waiting == len(rep.inst.waiting) + rep.inst.in_alpha + 1
