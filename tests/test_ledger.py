"""The ledger of finished requests: what goes in comes back, field by field, in id order."""
import random

import numpy as np
import pytest

from dsim.core.request import COMPLETED, PENDING, REJECTED, Request
import dsim.metrics.ledger as ledger_mod
from dsim.metrics.ledger import FIELDS, RequestLedger


def _random_request(rng: random.Random, rid: int) -> Request:
    r = Request(rid, rng.choice([0.0, rng.random() * 100]), rng.randint(1, 5000), rng.randint(1, 5000))
    r.state = rng.choice([COMPLETED, REJECTED, PENDING])
    for name in ("t_routed", "t_queued", "t_scheduled", "t_first_token", "t_last_token", "t_completion",
                 "t_handoff", "t_kv_ready", "ttft_slo_ms", "tpot_slo_ms"):
        setattr(r, name, rng.choice([None, 0.0, rng.random() * 1e3, float("inf")]))
    r.n_out = rng.randint(0, r.max_tokens)
    r.num_computed = rng.randint(0, 10_000)
    r.cached_tokens, r.kv_ready, r.priority = rng.randint(0, 99), rng.randint(0, 99), rng.randint(-5, 5)
    r.prefix_group = rng.choice([-1, 3, 2**40])
    r.session = rng.choice([-1, 7, 5 << 32])
    r.replica = rng.choice([None, "a-0", "b-1"])
    r.prefill_replica = rng.choice([None, "p-0"])
    r.label, r.tenant = rng.choice(["", "x", "y"]), rng.choice(["", "t1"])
    r.reject_reason, r.slo_class = rng.choice(["", "queue_full"]), rng.choice(["", "gold"])
    r.preempt_times = rng.choice([(), (1.5,), (0.25, 2.0)])
    return r


@pytest.mark.parametrize("spill", [None, 5])
@pytest.mark.parametrize("batch", [1, 7, 2048])
def test_rows_come_back_field_by_field_in_id_order(batch, spill, monkeypatch):
    monkeypatch.setattr(ledger_mod, "BATCH", batch)     # columns made in the middle of a run too
    if spill:                                           # columns in the spill file, read back 64 rows at a time
        monkeypatch.setattr(ledger_mod, "SPILL_ROWS", spill)
        monkeypatch.setattr(ledger_mod, "ITER_ROWS", 64)
    rng = random.Random(3)
    reqs = [_random_request(rng, i) for i in range(300)]
    led = RequestLedger()
    for r in rng.sample(reqs, len(reqs)):          # finished in any order
        led.add(r)
    led.seal()
    assert led.spilled == bool(spill)
    assert len(led) == 300
    back = list(led)
    assert [r.rid for r in back] == list(range(300))
    for a, b in zip(reqs, back):
        for name, _, _ in FIELDS:
            assert getattr(a, name) == getattr(b, name), (a.rid, name)
        assert a.preempt_times == b.preempt_times
    assert led[-1].rid == 299 and led[17].t_first_token == reqs[17].t_first_token
    assert [r.rid for r in led[5:8]] == [5, 6, 7]
    ttft = led.col("t_first_token")
    has = led.present("t_first_token")
    assert has.tolist() == [r.t_first_token is not None for r in reqs]
    assert ttft[has].tolist() == [r.t_first_token for r in reqs if r.t_first_token is not None]
    assert led.strings("replica") == [r.replica for r in reqs]
    assert led.col("session").dtype == np.int64 and led.col("session").tolist() == [r.session for r in reqs]


def test_fields_never_set_read_as_their_defaults():
    led = RequestLedger()
    r = Request(0, 0.0, 10, 1)
    r.t_scheduled = 0.0                             # equal to the stored default: no column is made
    led.add(r)
    led.seal()
    (back,) = led
    assert back.t_scheduled == 0.0 and back.t_first_token is None and back.replica is None
    assert back.label == "" and back.session == -1 and back.prefix_group == -1
    assert led.col("t_scheduled").tolist() == [0.0]
    assert np.isnan(led.col("t_completion")).all()
    assert led.col("session").tolist() == [-1]


@pytest.mark.parametrize("spill", [None, 2])
@pytest.mark.parametrize("batch", [2, 2048])
def test_rows_since_read_the_order_of_finishing_and_sealing_freezes(batch, spill, monkeypatch):
    monkeypatch.setattr(ledger_mod, "BATCH", batch)
    if spill:
        monkeypatch.setattr(ledger_mod, "SPILL_ROWS", spill)
    led = RequestLedger()
    for rid in (4, 1, 9):
        r = Request(rid, float(rid), 1, 1)
        r.t_completion = 10.0 + rid
        led.add(r)
    assert led.spilled == (spill is not None and batch == 2)    # rows 0-1 spilled, row 2 in memory
    rows = led.since(1)
    assert rows.col("rid").tolist() == [1, 9] and rows.col("t_completion").tolist() == [11.0, 19.0]
    with pytest.raises(RuntimeError):
        led.col("rid")                             # columns are read after seal
    led.seal()
    assert led.col("rid").tolist() == [1, 4, 9]
    with pytest.raises(RuntimeError):
        led.add(Request(2, 0.0, 1, 1))


@pytest.mark.parametrize("spill", [None, 1])
def test_a_length_past_32_bits_widens_its_column(spill, monkeypatch):
    """An unbounded length distribution can draw a prompt past 2**31 tokens (kept as int64 by the
    workload): the 32-bit column widens instead of failing (after the first row spilled as 32 bits,
    too)."""
    if spill:
        monkeypatch.setattr(ledger_mod, "BATCH", 1)
        monkeypatch.setattr(ledger_mod, "SPILL_ROWS", spill)
    led = RequestLedger()
    big = Request(1, 0.0, 3_000_000_000, 5)
    big.state = REJECTED
    for r in (Request(0, 0.0, 7, 5), big):
        led.add(r)
    led.seal()
    assert led.col("prompt_len").tolist() == [7, 3_000_000_000] and led[1].prompt_len == 3_000_000_000
