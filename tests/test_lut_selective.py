"""Selective batching from a LUT's cost split (issue 43 item 11; seed 002 section 5.2): the
non-attention work of the step's tokens in one batched pass plus each request's attention."""
import math
from pathlib import Path

import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency.base import BatchShape
from dsim.latency.lut import LutModel, LutTable, export_rows, read_lut, rows_to_csv

from helpers import scenario

ROOT = Path(__file__).resolve().parents[1]
L7 = load_model("meta-llama/Llama-2-7b-hf")
H100 = load_device("H100-SXM")
CTX, MBS = [128, 256, 512, 1024, 2048], [1, 2, 4, 8]


class Toy:
    """1 ms a pass + 0.01 ms a token, attention 1e-6 ms a causal pair and 1e-5 ms a decode context token."""

    def step_time(self, b):
        tokens = b.prefill_tokens + b.decode_tokens
        if not tokens:
            return 0.0
        return (1.0 + 0.01 * tokens + 1e-6 * b.prefill_attn_pairs + 1e-5 * b.decode_ctx_sum) * 1e-3


def _table(model, tmp_path, split=True):
    rows = export_rows(model, L7, H100, 1, CTX, MBS, verify_k=(1,), split=split, source="test")
    p = tmp_path / "t.csv"
    p.write_text(rows_to_csv(rows))
    return p, LutTable(read_lut(p), str(p))


def test_selective_batching_reconstructs_a_mixed_step_by_hand(tmp_path):
    _, t = _table(Toy(), tmp_path)
    row = [r for r in read_lut(tmp_path / "t.csv") if r["phase"] == "fused_decode" and r["context_len"] == 1024
           and r["microbatch"] == 1][0]
    assert math.isclose(row["cost_attn_ms"], 1e-5 * 1024, rel_tol=1e-6)
    assert math.isclose(row["cost_nonatt_ms"], 1.01, rel_tol=1e-9)
    b = BatchShape(prefill_tokens=512, num_prefill=1, prefill_attn_pairs=512 * 513 // 2, num_sampled=5,
                   decode_tokens=4, decode_ctx_sum=4 * 1024, running=5)
    truth = Toy().step_time(b)
    sel = LutModel(t, selective=True)
    # nonatt(516 tokens) = 1 + 5.16 ms, between the 512- and 1024-token prefill rows; attention per request
    assert math.isclose(sel.nonatt_ms(516), 1 + 0.01 * 516, rel_tol=1e-6)
    assert math.isclose(sel.step_time(b), truth, rel_tol=1e-6)
    # whole-pass rows charge the prefill row + the decode row - one pass: off by the decode row's extra cost
    assert not math.isclose(LutModel(t).step_time(b), truth, rel_tol=1e-4)
    assert sel.energy_mj > 0
    # above the table's largest pass the last segment is extended (Toy: exactly linear)
    assert math.isclose(sel.nonatt_ms(6000), 1 + 0.01 * 6000, rel_tol=1e-6)
    # verify rows (2 requests checking 1 draft at context 1024) beside a 512-token prefill and 4 decoders:
    # each verify request pays its own verify row's attention, the prefill its prefill row's
    v = BatchShape(prefill_tokens=512 + 4, num_prefill=3, prefill_attn_pairs=512 * 513 // 2 + 2 * (2 * 1024 + 3),
                   prefill_ctx_tokens=2 * 1024, num_verify=2, verify_tokens=4, verify_ctx_sum=2 * 1024,
                   num_sampled=7, decode_tokens=4, decode_ctx_sum=4 * 1024, running=7)
    assert math.isclose(sel.step_time(v), Toy().step_time(v), rel_tol=1e-6)


def test_selective_is_closer_to_the_source_model_on_mixed_batches(tmp_path):
    from dsim.latency.roofline import RooflineModel
    rf = RooflineModel(L7, H100)
    _, t = _table(rf, tmp_path)
    sel, whole = LutModel(t, selective=True), LutModel(t)
    err_s = err_w = 0.0
    for nd, ctx, chunk in [(8, 2000, 1024), (4, 600, 2000), (2, 1500, 300), (8, 300, 1800), (6, 1800, 700)]:
        b = BatchShape(prefill_tokens=chunk, num_prefill=1, prefill_attn_pairs=chunk * (chunk + 1) // 2,
                       num_sampled=nd + 1, decode_tokens=nd, decode_ctx_sum=nd * ctx, running=nd + 1)
        tr = rf.step_time(b)
        err_s += abs(sel.step_time(b) / tr - 1)
        err_w += abs(whole.step_time(b) / tr - 1)
    assert err_s < err_w


def test_selective_batching_needs_the_split_and_no_tails(tmp_path):
    lut = str(ROOT / "luts" / "llama-2-7b_h100_tp1.csv")          # shipped: no cost split
    with pytest.raises(ConfigError, match=r"latency.selective_batching: got True, expected cost_nonatt_ms"):
        dsim.run(scenario(model="meta-llama/Llama-2-7b-hf",
                          latency={"model": "lut", "path": lut, "selective_batching": True}))
    p, _ = _table(Toy(), tmp_path)
    with pytest.raises(ConfigError, match=r"latency.tail: got True, expected false with selective_batching"):
        dsim.run(scenario(model="meta-llama/Llama-2-7b-hf",
                          latency={"model": "lut", "path": str(p), "selective_batching": True, "tail": True}))
    res = dsim.run(scenario(model="meta-llama/Llama-2-7b-hf",
                            latency={"model": "lut", "path": str(p), "selective_batching": True}))
    assert res.summary["requests"]["completed"] == 10
    assert res.manifest["latency"]["selective_batching"] is True
