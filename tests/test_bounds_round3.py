"""Reliability round three (issue 36, items 2, 5 and part of 6): bounded work and the Python API's
boundary.  Each test failed before its fix."""
import numpy as np
import pytest
import simpy

import dsim
from dsim import ConfigError
from dsim.network import fabric
from dsim.network.fabric import build_network

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCN = ROOT / "scenarios"


# ---- the network's work is bounded ----------------------------------------------------------------
def test_a_transfer_of_days_keeps_its_timeline_in_closed_form():
    """1 MB at 1 kbit/s takes 8,000 s: 8,000 one-second bins per link grew to gigabytes with many
    such transfers (pd_network at 0.001 Mbit/s: MemoryError); whole bins are now one run."""
    env = simpy.Environment()
    n = build_network({"links": [{"src": "a", "dst": "b", "rtt_ms": 0, "bw_mbps": 0.001}]}, env,
                      np.random.default_rng(0))
    done = n.send("a", "b", 1e6)
    env.run()
    assert done.value.end == pytest.approx(8000.0)
    lk = n.links["a", "b"]
    assert len(lk.bins) <= 2 and len(lk.runs) == 2
    xs, ys, width = n.timeline(lk)
    assert sum(ys) == pytest.approx(1e6) and width == 1.0 and 8000 <= len(xs) <= 8001
    assert ys[0] == ys[7999] == pytest.approx(125)
    xs, ys, width = n.timeline(lk, max_bins=100)
    assert sum(ys) == pytest.approx(1e6) and width > 1 and len(xs) <= 100
    assert ys[0] == pytest.approx(125 * width)        # 100 % of the link in a whole coarse bin


@pytest.mark.parametrize("overrides,key", [
    (["network.clos.spine_bw_mbps=0.001", "network.clos.edge_bw_mbps=0.001"], "network.clos."),
    (["network.loss_pct=99"], "network.loss_pct"),
])
def test_network_work_that_explodes_is_an_error_naming_the_key(monkeypatch, overrides, key):
    """loss_pct=99 (every message sent ~100 times, hundreds of flows sharing the spines) ran past
    60 s; past a work budget the run stops with a one-line error naming the key (budget lowered here
    so the test is fast; the shipped scenario stays far below it)."""
    monkeypatch.setattr(fabric, "MAX_FLOW_WORK", 20_000)
    with pytest.raises(ConfigError, match=r"flow updates") as e:
        dsim.run(str(SCN / "pd_network.yaml"), overrides=overrides + ["workload.num_requests=300"], plots=False)
    assert str(e.value).startswith(key)
    res = dsim.run(str(SCN / "pd_network.yaml"), overrides=["workload.num_requests=300"], plots=False)
    assert res.summary["requests"]["completed"] == 300


def test_slow_draft_links_name_the_drafts_key(monkeypatch):
    monkeypatch.setattr(fabric, "MAX_FLOW_WORK", 5_000)
    monkeypatch.setattr(fabric, "FLOW_WORK_PER_MSG", 20)     # pd_speculation re-solves ~1.5 per message
    with pytest.raises(ConfigError, match=r"^speculation\.drafts\[0\]\.bw_mbps: 0\.001 Mbit/s is too slow"):
        dsim.run(str(SCN / "pd_speculation.yaml"), plots=False,
                 overrides=["speculation.drafts[0].bw_mbps=0.001", "workload.num_requests=100"])


# ---- sizes refused before parsing or allocating ------------------------------------------------------
def test_a_scenario_file_over_the_cap_is_refused_before_parsing(tmp_path):
    """A 48 MB list under an unknown key parsed for over a minute before 'unknown key'."""
    from dsim.config.limits import MAX_SCENARIO_BYTES
    p = tmp_path / "big.yaml"
    head = (SCN / "quickstart.yaml").read_text() + "junk: ["
    p.write_text(head + "1," * ((MAX_SCENARIO_BYTES - len(head)) // 2 + 1) + "1]\n")
    assert p.stat().st_size > MAX_SCENARIO_BYTES
    with pytest.raises(ConfigError, match=r"big\.yaml: a scenario file .* under 4 MiB \(it has [\d,]+ bytes\)"):
        dsim.load_scenario(p)


def test_a_grid_of_millions_of_points_is_refused_before_allocating(tmp_path):
    vals = list(range(1, 3001))
    with pytest.raises(ConfigError, match=r"^--grid: at most 100,000 runs .* 9,000,000"):
        dsim.sweep(str(SCN / "quickstart.yaml"), [("workload.rate", vals), ("engine.max_num_seqs", vals)],
                   out=tmp_path / "sw")
    assert not (tmp_path / "sw").exists()
    with pytest.raises(ConfigError, match=r"^--grid: at most 100,000 runs .* 200,000"):
        dsim.sweep(str(SCN / "quickstart.yaml"), [("workload.rate", [1, 2])], seeds=100_000)
