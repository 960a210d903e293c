"""Invariants on generated workloads: conservation, causality, KV conservation after every step."""
import json

from hypothesis import given, settings, strategies as st

import dsim
from helpers import scenario


@st.composite
def traces(draw):
    n = draw(st.integers(1, 40))
    rows = []
    t = 0.0
    for i in range(n):
        t += draw(st.floats(0, 0.02))
        g = draw(st.one_of(st.none(), st.integers(0, 3)))
        rec = {"arrival_s": t, "prompt_tokens": draw(st.integers(1, 200)), "output_tokens": draw(st.integers(1, 60))}
        if g is not None:
            rec["prefix_group"] = g
        rows.append(rec)
    return rows


@settings(max_examples=60, deadline=None)
@given(rows=traces(), blocks=st.integers(0, 40), bs=st.sampled_from([2, 16]), chunked=st.booleans(),
       budget=st.sampled_from([32, 4096]), cache=st.booleans(), seqs=st.integers(1, 16))
def test_invariants_hold_every_step(tmp_path_factory, rows, blocks, bs, chunked, budget, cache, seqs):
    p = tmp_path_factory.mktemp("t") / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    need = max(-(-(r["prompt_tokens"] + r["output_tokens"] - 1) // bs) for r in rows)
    if not chunked:       # whole-prompt admission keeps 1 % of the blocks free (the V0 watermark)
        need = max(need, max(-(-r["prompt_tokens"] // bs) for r in rows) + 1 + int(0.01 * (need + blocks + 2)))
    res = dsim.run(scenario(workload={"type": "trace", "path": str(p), "prefix_tokens": 40},
                            latency={"model": "roofline"},
                            engine={"num_gpu_blocks": need + blocks, "block_size": bs, "max_model_len": 4096,
                                    "enable_chunked_prefill": chunked, "enable_prefix_caching": cache,
                                    "max_num_batched_tokens": budget if chunked else 4096, "max_num_seqs": seqs}),
                   check_invariants=True)
    s = res.summary
    assert s["requests"]["completed"] == len(rows)
    inst = res.instance
    assert inst.kv.free_count == inst.kv.total and all(c == 0 for c in inst.kv.cached.values())
    for r in res.requests:
        assert r.n_out == r.max_tokens
        assert r.arrival <= r.t_queued <= r.t_scheduled <= r.t_first_token <= r.t_completion
    # ITL samples account for every non-first token exactly once
    itl_count = sum(inst.log.itl_count) + sum(w for _, w in inst.itl_extra)
    assert itl_count == sum(r.max_tokens - 1 for r in res.requests)
    assert max(inst.log.running) <= seqs


def test_v0_prompt_above_the_watermark_is_rejected_not_stalled(tmp_path):
    """199-token prompt, 2-token blocks: 100 blocks of 100, but V0 keeps 1 block free -> never
    admissible; it must be rejected at arrival (the replica used to stall on it)."""
    p = tmp_path / "t.jsonl"
    p.write_text(json.dumps({"arrival_s": 0.0, "prompt_tokens": 199, "output_tokens": 1}) + "\n"
                 + json.dumps({"arrival_s": 0.1, "prompt_tokens": 50, "output_tokens": 3}) + "\n")
    eng = {"num_gpu_blocks": 100, "block_size": 2, "enable_chunked_prefill": False, "max_num_seqs": 1,
           "max_model_len": 4096, "max_num_batched_tokens": 4096}
    res = dsim.run(scenario(workload={"type": "trace", "path": str(p)}, latency={"model": "roofline"}, engine=eng),
                   check_invariants=True)
    assert res.summary["requests"]["rejected_by"] == {"kv_capacity": 1}
    assert res.summary["requests"]["completed"] == 1
    ok = dsim.run(scenario(workload={"type": "trace", "path": str(p)}, latency={"model": "roofline"},
                           engine={**eng, "num_gpu_blocks": 101}))
    assert ok.summary["requests"]["completed"] == 2           # 100 prompt blocks <= 101 - 1

