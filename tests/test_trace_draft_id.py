"""A trace's draft_id column (seed 002, "Canonical Trace Mapping for Draft Sweeps"): a row that names a
draft device is opened by it; other rows keep the cohort / round-robin binding; sessions follow."""
import json

import pytest
from helpers import scenario

from dsim.config.errors import ConfigError
from dsim.config.scenario import load_scenario
from dsim.core.rng import PartitionedRNG
from dsim.runner import simulate
from dsim.workload.export import trace_record
from dsim.workload.generator import build_workload

DRAFTS = [{"name": "ph", "profile": "phone-flagship", "count": 2, "rtt_ms": 40, "bw_mbps": 20},
          {"name": "lp", "profile": "laptop-rtx4060", "count": 2, "rtt_ms": 8, "bw_mbps": 300}]


def write(tmp_path, recs):
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"prompt_tokens": 64, "output_tokens": 16, **r}) + "\n" for r in recs))
    return p


def devices(tmp_path, recs):
    scn = scenario(latency={"model": "roofline"}, workload={"type": "trace", "path": str(write(tmp_path, recs))},
                   speculation={"mode": "distributed", "drafts": DRAFTS})
    ses = simulate(load_scenario(scn))
    return [ses.spec.states[i].device.name for i in range(len(recs))]


def test_rows_naming_a_device_go_to_it(tmp_path):
    recs = [{"arrival_s": 0.1 * i, "draft_id": d} for i, d in enumerate(["lp-1", "lp-1", "ph-0", "lp-1", "ph-1"])]
    assert devices(tmp_path, recs) == ["lp-1", "lp-1", "ph-0", "lp-1", "ph-1"]
    # without the column the same rows go to every device in turn
    plain = [{"arrival_s": r["arrival_s"]} for r in recs]
    assert devices(tmp_path, plain) == ["ph-0", "ph-1", "lp-0", "lp-1", "ph-0"]


def test_a_session_stays_on_the_device_its_row_named(tmp_path):
    recs = [{"arrival_s": 0.0, "session": 7, "draft_id": "lp-0"}, {"arrival_s": 0.5, "session": 7},
            {"arrival_s": 0.6}, {"arrival_s": 0.9, "session": 7}]
    got = devices(tmp_path, recs)
    assert got[0] == got[1] == got[3] == "lp-0"
    assert got[2] == "ph-0"          # the round robin is not moved by named rows


def test_unknown_device_is_a_path_qualified_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^workload \(request 1\)\.draft_id: .*ph-0\.\.1"):
        devices(tmp_path, [{"arrival_s": 0.0}, {"arrival_s": 0.1, "draft_id": "tablet-3"}])


def test_draft_id_is_read_and_written_back(tmp_path):
    p = write(tmp_path, [{"arrival_s": 0.0, "draft_id": "ph-1"}, {"arrival_s": 1.0}])
    w, _ = build_workload({"type": "trace", "path": str(p)}, PartitionedRNG(0), None)
    a, b = list(w)
    assert (a.draft_id, b.draft_id) == ("ph-1", "")
    assert trace_record(a)["draft_id"] == "ph-1" and "draft_id" not in trace_record(b)


def test_draft_id_is_ignored_without_draft_devices(tmp_path):
    """A canonical trace replayed in fused mode (no devices) runs: nothing to bind."""
    scn = scenario(latency={"model": "roofline"},
                   workload={"type": "trace", "path": str(write(tmp_path, [{"arrival_s": 0.0, "draft_id": "ph-0"}]))},
                   speculation={"mode": "fused"})
    ses = simulate(load_scenario(scn))
    assert ses.spec.states[0].device is None
