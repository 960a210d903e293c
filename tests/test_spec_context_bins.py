"""summary.json speculation: acceptance by context bin and the gamma (k) timeline (issue 43 item 7)."""
import pytest
import yaml

import dsim
from dsim.metrics.speculation import gamma_timeline

from helpers import scenario, trace_file


def _summary(tmp_path, rows, spec):
    p = trace_file(tmp_path, rows)
    res = dsim.run(scenario(latency={"model": "roofline"}, workload={"type": "trace", "path": str(p)},
                            speculation=spec), tmp_path / "out", plots=False)
    return res.summary["speculation"]


def test_bins_add_up_and_follow_the_context_the_drafts_were_verified_at(tmp_path):
    # acceptance 0.95 at short context falling to 0.05 at 100k (log-linear): the bins must see it
    curves = tmp_path / "c.yaml"
    curves.write_text(yaml.safe_dump({"acceptance_curves": {"spec_version": "1.0", "curves": [
        {"name": "falls", "points": [{"temperature": 0.0, "context_len": 100, "conditional": [0.95] * 4},
                                     {"temperature": 0.0, "context_len": 100000, "conditional": [0.05] * 4}]}]}}))
    rows = [(0.1 * i, 100, 20) for i in range(10)] + [(0.1 * i + 0.05, 5000, 20) for i in range(10)]
    s = _summary(tmp_path, rows, {"mode": "fused", "gamma": {"k": 4},
                                  "acceptance": {"curve": "falls", "curves": str(curves)}})
    bins = s["acceptance_by_context"]
    assert sum(b["rounds"] for b in bins) == s["rounds"]
    assert sum(b["verified_tokens"] for b in bins) == s["verified_tokens"]
    assert sum(b["accepted_tokens"] for b in bins) == s["accepted_tokens"]
    # contexts: 100 .. 119 (bins 64-127) and 5000 .. 5019 (bin 4096-8191), nothing else
    assert [(b["min_tokens"], b["max_tokens"]) for b in bins] == [(64, 127), (4096, 8191)]
    short, long_ = bins
    assert short["acceptance_rate"] > 0.8 and long_["acceptance_rate"] < 0.5
    assert short["acceptance_rate"] == short["accepted_tokens"] / short["verified_tokens"]


def test_timeline_windows_add_up_to_the_totals(tmp_path):
    rows = [(0.5 * i, 200, 60) for i in range(30)]
    s = _summary(tmp_path, rows, {"mode": "fused", "gamma": {"k": 3}, "acceptance": {"geometric": 0.6}})
    tl = s["gamma_timeline"]
    assert tl["window_s"] == 1 and sum(tl["rounds"]) == s["rounds"]
    assert tl["t_s"] == sorted(tl["t_s"]) and tl["t_s"][0] == 0
    drafted = sum(n * g for n, g in zip(tl["rounds"], tl["mean_gamma"]))
    assert drafted == pytest.approx(s["drafted_tokens"]) and drafted / s["rounds"] == pytest.approx(s["mean_gamma"])
    assert all(g <= 3 for g in tl["mean_gamma"])


def test_gamma_timeline_by_hand():
    # seconds 10..259 -> 250 seconds, at most 100 windows: 3 s each, from second 10
    sec = {10: [2, 8, 8, 4], 11: [1, 2, 2, 2], 259: [1, 4, 4, 0]}
    tl = gamma_timeline(sec)
    assert tl["window_s"] == 3
    assert tl["t_s"] == [10, 259 - (259 - 10) % 3]
    assert tl["rounds"] == [3, 1] and tl["mean_gamma"] == [10 / 3, 4.0]
    assert tl["acceptance_rate"] == [6 / 10, 0.0]
    assert gamma_timeline({})["t_s"] == []
