"""A draft device's memory (dsim/specdec/devmem.py): the drafter KV kept across rounds and a
session's turns with an LRU bound, and cold drafter loads with warm devices preferred."""
import json

import pytest
from helpers import assert_refused, scenario
from test_specdec import ROOF, run

from dsim.config.model import load_model
from dsim.latency.base import BatchShape
from dsim.specdec.devices import DraftDevice
from dsim.specdec.devmem import shared_prefix

LAPTOP = {"name": "lap", "profile": "laptop-rtx4060", "count": 1, "rtt_ms": 10, "bw_mbps": 50}


def trace(tmp_path, rows):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(p)


def dist(tmp_path, rows, drafts=None, **extra):
    spec = {"mode": "distributed", "acceptance": {"geometric": 1.0}, "gamma": {"k": 2},
            "drafts": drafts or [LAPTOP], **extra}
    return run(scenario(latency=ROOF, workload={"type": "trace", "path": trace(tmp_path, rows)}, speculation=spec))


def spy_submits(monkeypatch):
    seen = []
    orig = DraftDevice.submit

    def spy(self, k, ctx, done, lost=None, steps=None, model=None, seconds=None, req=None):
        seen.append((self.name, req.rid if req is not None else None, ctx, k))
        return orig(self, k, ctx, done, lost, steps, model, seconds, req)
    monkeypatch.setattr(DraftDevice, "submit", spy)
    return seen


def test_shared_prefix():
    assert shared_prefix(((1, 1000), (-1, 20)), ((1, 1000), (-1, 20), (2, 200))) == 1020
    assert shared_prefix(((1, 1000), (-1, 20)), ((1, 1000), (-1, 12), (2, 8))) == 1012
    assert shared_prefix(((1, 1000),), ((3, 1000),)) == 0
    assert shared_prefix(None, ((1, 5),)) == 0


TWO_TURNS = [
    {"arrival_s": 0.0, "prompt_tokens": 1000, "output_tokens": 20, "session": 7, "segments": [[1, 1000]]},
    {"arrival_s": 5.0, "prompt_tokens": 1220, "output_tokens": 20, "session": 7,
     "segments": [[1, 1000], [-1, 20], [2, 200]]},
]


def test_two_turn_session_by_hand(tmp_path, monkeypatch):
    """Everything accepted, k = 2: a turn drafts 7 rounds at contexts prompt + 3 i (the last one
    capped to no drafts at the target).  The first round of turn 1 prefills the 1,000-token prompt;
    every later round lacks one token (all drafts accepted: the last one was never fed back).  Turn
    2's prompt starts with turn 1's prompt and answer: the device holds 1,019 of those tokens (the
    last answer token was never computed), so it prefills 1,220 - 1,019 = 201, then one per round."""
    seen = spy_submits(monkeypatch)
    ses = dist(tmp_path, TWO_TURNS, draft_kv={"cache_tokens": 100000})
    assert [c for _, _, c, _ in seen] == [1000 + 3 * i for i in range(7)] + [1220 + 3 * i for i in range(7)]
    mem = ses.spec.devices[0].mem
    assert mem.reused_tokens == 1019
    assert mem.prefill_tokens == (1000 + 6) + (201 + 6)
    # the time: each round's first forward runs the missing tokens + 1 instead of one decode step
    model = ses.spec.devices[0].step

    def extra(miss, ctx):
        have, c = ctx - miss, miss + 1
        return (model.step_time(BatchShape(prefill_tokens=c, num_prefill=1,
                                           prefill_attn_pairs=c * have + c * (c + 1) // 2, prefill_ctx_tokens=have,
                                           num_sampled=1, prefill_chunk_sq=c * c, running=1))
                - model.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=ctx + 1, num_sampled=1, running=1)))
    hand = extra(1000, 1000) + extra(201, 1220)
    hand += sum(extra(1, 1000 + 3 * i) + extra(1, 1220 + 3 * i) for i in range(1, 7))
    plain = dist(tmp_path, TWO_TURNS).spec.devices[0].busy_s
    assert mem.dev.busy_s - plain == pytest.approx(hand, rel=1e-9)
    # without session reuse turn 2 starts from nothing
    alone = dist(tmp_path, TWO_TURNS, draft_kv={"cache_tokens": 100000, "session_reuse": False}).spec.devices[0].mem
    assert alone.reused_tokens == 0 and alone.prefill_tokens == (1000 + 6) + (1220 + 6)
    summ = ses.spec.mechanisms_summary()["draft_memory"]["lap"]
    assert summ["prefill_tokens"] == 1213 and summ["reused_tokens"] == 1019


def test_lru_evicts_the_least_recent_conversation(tmp_path, monkeypatch):
    """Two conversations on one device.  A cache of 1,500 tokens holds one: each round evicts the
    other, so every round re-prefills its whole context.  With room for both, only the first rounds
    prefill their prompts."""
    rows = [{"arrival_s": 0.0, "prompt_tokens": 1000, "output_tokens": 30},
            {"arrival_s": 0.0, "prompt_tokens": 1000, "output_tokens": 30}]
    seen = spy_submits(monkeypatch)
    small = dist(tmp_path, rows, draft_kv={"cache_tokens": 1500}).spec.devices[0].mem
    ctxs = [c for _, _, c, _ in seen]
    order = [rid for _, rid, _, _ in seen]
    assert sum(order[i] != order[i + 1] for i in range(len(order) - 1)) > 10      # the two alternate
    assert small.prefill_tokens == sum(ctxs)
    assert small.evictions == len(ctxs) - 1
    seen.clear()
    big = dist(tmp_path, rows, draft_kv={"cache_tokens": 5000}).spec.devices[0].mem
    assert big.evictions == 0
    assert big.prefill_tokens == 2000 + len(seen) - 2
    assert big.used == 0                          # finished conversations without a session are freed


EDGE = {"name": "edge", "profile": "edge-orin-agx", "count": 2, "rtt_ms": 5, "bw_mbps": 100}
SPACED = [{"arrival_s": 5.0 * i, "prompt_tokens": 200, "output_tokens": 30} for i in range(4)]


def test_warm_device_is_chosen_and_a_cold_start_is_charged_once(tmp_path):
    load = {"storage_gb_s": 2.0, "warm_at_start": 1}
    one_b = load_model("meta-llama/Llama-3.2-1B")
    load_s = one_b.weight_bytes / 2e9                 # 16-bit weights from storage at 2 GB/s
    # bound (round robin): the cold box gets requests 1 and 3 and loads once, for request 1
    ses = dist(tmp_path, SPACED, drafts=[EDGE], draft_load=load)
    warm, cold = ses.spec.devices
    assert [r.rid for r in warm.requests] == [0, 2] and [r.rid for r in cold.requests] == [1, 3]
    assert (warm.mem.cold_starts, cold.mem.cold_starts) == (0, 1)
    assert cold.mem.load_wait_s == pytest.approx(load_s, rel=1e-12)
    e2e = {r.rid: r.t_completion - r.arrival for r in ses.reqs}
    assert e2e[1] - e2e[0] == pytest.approx(load_s, abs=2e-3)   # the first round waited for the load
    assert e2e[3] - e2e[2] == pytest.approx(0.0, abs=2e-3)      # warm by then
    # warm first: every conversation goes to the warm box, nothing loads
    ses = dist(tmp_path, SPACED, drafts=[EDGE], draft_load={**load, "placement": "warm_first"})
    warm, cold = ses.spec.devices
    assert [r.rid for r in warm.requests] == [0, 1, 2, 3] and not cold.requests
    assert warm.mem.cold_starts + cold.mem.cold_starts == 0
    assert ses.spec.mechanisms_summary()["draft_memory"]["edge"]["cold_starts"] == 0


def test_warm_first_spills_to_a_cold_device_past_max_active(tmp_path):
    rows = [{"arrival_s": 0.001 * i, "prompt_tokens": 200, "output_tokens": 200} for i in range(3)]
    ses = dist(tmp_path, rows, drafts=[EDGE],
               draft_load={"warm_at_start": 1, "placement": "warm_first", "max_active": 2})
    warm, cold = ses.spec.devices
    assert [r.rid for r in warm.requests] == [0, 1] and [r.rid for r in cold.requests] == [2]
    assert cold.mem.cold_starts == 1 and warm.mem.active == cold.mem.active == 0


def test_an_idle_device_unloads_after_its_retention(tmp_path):
    ses = dist(tmp_path, SPACED, drafts=[{**EDGE, "count": 1}],
               draft_load={"warm_retention_s": 2.0, "placement": "warm_first"})
    (dev,) = ses.spec.devices
    assert dev.mem.cold_starts == 3                   # warm at the start; each later request reloads


@pytest.mark.parametrize("sets,where", [
    (["speculation.draft_kv={cache_tokens: -1}"], "speculation.draft_kv.cache_tokens"),
    (["speculation.draft_load={placement: nearest}"], "speculation.draft_load.placement"),
    (["speculation.draft_load={placement: warm_first}"], "speculation.drafts[0].closed_loop"),
    (["speculation.draft_kv={cache_tokens: 100}", "speculation.tree={topk: 2}"], "speculation.tree"),
])
def test_bad_device_memory_keys_are_refused(sets, where, tmp_path, capsys):
    assert_refused("mobile_cloud_distributed", sets, where, tmp_path, capsys)


def test_a_batching_device_loads_before_its_first_batch(tmp_path):
    load = {"storage_gb_s": 2.0, "warm_at_start": 0}
    rows = SPACED[:2]
    box = {**EDGE, "count": 1, "max_batch": 4}
    cold = dist(tmp_path, rows, drafts=[box], draft_load=load)
    warm = dist(tmp_path, rows, drafts=[box])
    (dev,) = cold.spec.devices
    load_s = load_model("meta-llama/Llama-3.2-1B").weight_bytes / 2e9
    assert dev.mem.cold_starts == 1 and dev.mem.load_wait_s == pytest.approx(load_s, rel=1e-12)
    e2e = [r.t_completion - r.arrival for r in cold.reqs]
    e2e0 = [r.t_completion - r.arrival for r in warm.reqs]
    assert e2e[0] - e2e0[0] == pytest.approx(load_s, abs=2e-3) and e2e[1] == pytest.approx(e2e0[1], abs=2e-3)


def test_warm_first_keeps_a_trace_rows_device(tmp_path):
    rows = [dict(r, draft_id="edge-1") if i == 2 else r for i, r in enumerate(SPACED)]
    ses = dist(tmp_path, rows, drafts=[EDGE], draft_load={"warm_at_start": 1, "placement": "warm_first"})
    warm, cold = ses.spec.devices
    assert [r.rid for r in warm.requests] == [0, 1, 3] and [r.rid for r in cold.requests] == [2]
    assert cold.mem.cold_starts == 1
