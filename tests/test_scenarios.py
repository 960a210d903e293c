"""Every scenario under scenarios/ validates and runs (shortened where it is long)."""
from pathlib import Path

import pytest

import dsim

ROOT = Path(__file__).resolve().parents[1]
SHORTEN = {"azure_conv.yaml": ["workload.num_requests=300"], "kv_offload_cpu.yaml": ["workload.num_requests=300"],
           "pipeline_parallel.yaml": ["workload.num_requests=300"], "dp_ep_moe.yaml": ["workload.num_requests=400"],
           "edge_draft_batching.yaml": ["workload.num_requests=150"], "tree_drafts.yaml": ["workload.num_requests=120"],
           "pd_speculation.yaml": ["workload.num_requests=150"],
           "draft_sweep_single_target.yaml": ["workload.num_requests=100"],
           "draft_sweep_multicluster.yaml": ["workload.num_requests=150"]}


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_scenario_runs(path, tmp_path):
    res = dsim.run(str(path), tmp_path / "out", overrides=SHORTEN.get(path.name), check_invariants=True,
                   plots=False)
    s = res.summary
    assert s["requests"]["completed"] + s["requests"]["rejected"] == s["requests"]["submitted"] > 0
    assert (tmp_path / "out" / "requests.csv").read_text().count("\n") == len(res.requests) + 1
