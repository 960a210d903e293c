"""Conversation-level metrics (requests grouped by session) and the tail plot per class, checked
against numbers recomputed here from requests.csv with plain Python."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest

import dsim
from dsim.metrics.exact import percentiles

ROOT = Path(__file__).resolve().parents[1]
MULTI_TURN = {
    "name": "conv", "seed": 3, "model": "meta-llama/Llama-2-7b-hf", "hardware": "H100-SXM",
    "engine": {"max_num_seqs": 16, "max_model_len": 4096},
    "workload": {"type": "poisson", "rate": 6, "num_requests": 120, "prompt_tokens": 200, "output_tokens": 40,
                 "shared_prefix": {"num_groups": 3, "users_per_group": 4, "system_prompt_len": 64,
                                   "multi_turn": True, "max_context_tokens": 4096}},
}


def _rows(out: Path) -> list:
    with open(out / "requests.csv", newline="") as f:
        return list(csv.DictReader(f))


def _by_session(rows) -> dict:
    conv: dict = {}
    for r in rows:
        if r["session"] != "":
            conv.setdefault(int(r["session"]), []).append(r)
    return conv


def test_conversations_recomputed_from_requests_csv(tmp_path):
    dsim.run(MULTI_TURN, tmp_path / "o", plots=False)
    out = tmp_path / "o"
    conv = _by_session(_rows(out))
    summary = json.loads((out / "summary.json").read_text())["conversations"]
    done = {s: t for s, t in conv.items() if all(r["state"] == "completed" for r in t)}
    assert summary["conversations"] == len(conv) == 12          # 3 groups x 4 users
    assert summary["completed"] == len(done)
    assert summary["turns"]["mean"] == pytest.approx(120 / 12)
    dur = [max(float(r["completion_s"]) for r in t) - min(float(r["arrival_s"]) for r in t)
           for t in done.values()]
    assert summary["duration_ms"]["mean"] == pytest.approx(1e3 * float(np.mean(dur)), rel=1e-6)
    assert summary["duration_ms"]["p99"] == pytest.approx(1e3 * float(percentiles(np.array(dur), 99)), rel=1e-6)
    ttft = [np.mean([float(r["ttft_ms"]) for r in t]) for t in done.values()]
    assert summary["ttft_mean_ms"]["mean"] == pytest.approx(float(np.mean(ttft)), rel=1e-6)
    with open(out / "conversations.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [int(r["session"]) for r in table] == sorted(conv)
    for r in table:
        turns = conv[int(r["session"])]
        assert int(r["turns"]) == len(turns)
        assert int(r["output_tokens"]) == sum(int(t["generated_tokens"]) for t in turns)


def test_a_cut_conversation_is_not_completed(tmp_path):
    """A horizon that stops arrivals mid-conversation: the turns never sent make it incomplete."""
    scn = json.loads(json.dumps(MULTI_TURN))
    scn["horizon_s"], scn["drain"] = 8.0, False
    dsim.run(scn, tmp_path / "o", plots=False)
    conv = _by_session(_rows(tmp_path / "o"))
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())["conversations"]
    done = [s for s, t in conv.items() if all(r["state"] == "completed" for r in t)]
    assert summary["completed"] == len(done) < summary["conversations"]
    assert summary["completion_rate"] == pytest.approx(len(done) / len(conv))


def test_no_sessions_no_conversations(tmp_path):
    res = dsim.run(str(ROOT / "scenarios" / "quickstart.yaml"), tmp_path / "o", plots=False,
                   overrides=["workload.num_requests=50"])
    assert "conversations" not in res.summary
    assert not (tmp_path / "o" / "conversations.csv").exists()


def test_tail_plot_per_tenant_and_its_table(tmp_path):
    out = tmp_path / "o"
    dsim.run(str(ROOT / "scenarios" / "priority_classes.yaml"), out, overrides=["workload.classes[0].num_requests=200",
                                                                              "workload.classes[1].num_requests=200"])
    png = out / "plots" / "tails.png"
    assert png.stat().st_size > 10_000
    rows = _rows(out)
    html = (out / "report.html").read_text()
    assert "Tails by tenant" in html
    for tenant in {r["tenant"] for r in rows}:
        ttft = np.array([float(r["ttft_ms"]) for r in rows if r["tenant"] == tenant and r["ttft_ms"]])
        p99 = float(percentiles(ttft, 99))
        shown = f"{p99:,.0f} ms" if p99 >= 100 else f"{p99:.3g} ms"
        assert shown in html, (tenant, shown)
    before = png.read_bytes()
    png.unlink()
    from dsim.report.replot import plot_folder
    drawn = plot_folder(out)
    assert png in drawn and png.read_bytes() == before          # `dsim plot` draws the same file
