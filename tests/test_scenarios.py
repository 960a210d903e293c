"""Every scenario under scenarios/ validates and runs (shortened where it is long), its requests
are the ones recorded in tests/fixtures/scenario_digests.json (by an older checkout: speed work must
not move a request), and its headline metrics stay within the seed spread of its stored baseline
(tests/fixtures/baselines/, made by tests/fixtures/make_baselines.py with the same shortening)."""
import json
import sys
from pathlib import Path

import pytest

import dsim

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from make_scenario_digests import FIXTURE, rows_digest  # noqa: E402

from dsim.explore.baseline import compare, load_side  # noqa: E402

DIGESTS = json.loads(FIXTURE.read_text())
SHORTEN = {"azure_conv.yaml": ["workload.num_requests=300"], "kv_offload_cpu.yaml": ["workload.num_requests=300"],
           "pipeline_parallel.yaml": ["workload.num_requests=300"], "dp_ep_moe.yaml": ["workload.num_requests=400"],
           "edge_draft_batching.yaml": ["workload.num_requests=150"], "tree_drafts.yaml": ["workload.num_requests=120"],
           "pd_speculation.yaml": ["workload.num_requests=150"],
           "draft_sweep_single_target.yaml": ["workload.num_requests=100"],
           "draft_sweep_multicluster.yaml": ["workload.num_requests=150"],
           "draft_sweep_hetero.yaml": ["workload.num_requests=100"], "auto_topology.yaml": ["workload.num_requests=100"],
           "online_planner.yaml": ["cluster.controllers[0].cadence_s=30"],
           "online_planner_azure.yaml": ["workload.num_requests=1500"],
           "cohort_capability.yaml": ["workload.num_requests=120"],
           "draft_kv_sessions.yaml": ["workload.num_requests=100"], "warm_draft_pool.yaml": ["workload.num_requests=100"],
           "router_spec_aware.yaml": ["workload.num_requests=300"]}
# test_scenario_runs checks every invariant at every step, which also turns the fast-forward off: 5 to 12
# times the pinned run's cost.  These scenarios run a shorter stretch there, on top of SHORTEN (their
# pinned run keeps SHORTEN's length); each shortened run reaches every line of dsim/ that the full
# invariant run reaches (tests/fixtures/check_shorten_coverage.py; pd_disagg: 5,954 lines, 1500 -> 500
# requests; prompt_pool_tp4: 5,365 lines, 600 -> 200).  Cutting hybrid_rtt to 200 requests or
# online_planner's day at 1600 arrivals missed lines (KV eviction; the planner's scale-down): not here.
CHECK_SHORTEN = {"pd_disagg.yaml": ["workload.num_requests=500"],
                 "prompt_pool_tp4.yaml": ["workload.num_requests=200"]}


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_scenario_runs(path, tmp_path):
    over = (SHORTEN.get(path.name) or []) + CHECK_SHORTEN.get(path.name, [])
    res = dsim.run(str(path), tmp_path / "out", overrides=over or None, check_invariants=True, plots=False)
    s = res.summary
    assert s["requests"]["completed"] + s["requests"]["rejected"] == s["requests"]["submitted"] > 0
    assert (tmp_path / "out" / "requests.csv").read_text().count("\n") == len(res.requests) + 1


@pytest.mark.parametrize("path", sorted((ROOT / "scenarios").glob("*.yaml")), ids=lambda p: p.name)
def test_scenario_requests_are_the_recorded_ones(path, tmp_path):
    """Run as a user runs it (no invariant checks: quiet stretches are fast-forwarded), the
    scenario's request rows hash to the digest an older checkout recorded, and no headline metric
    of the run left its baseline's seed spread (``dsim compare BASELINE RUN`` exits 0; the run is
    the baseline's first seed, so this costs no simulation of its own)."""
    pin = DIGESTS.get(path.name)
    assert pin is not None, f"{path.name}: no digest; record one with tests/fixtures/make_scenario_digests.py"
    assert pin["overrides"] == (SHORTEN.get(path.name) or [])
    dsim.run(str(path), tmp_path / "out", overrides=SHORTEN.get(path.name), plots=False)
    assert rows_digest(tmp_path / "out" / "requests.csv", pin["columns"])[1] == pin["sha256"], (
        f"{path.name}: requests differ from those recorded at {pin['recorded_at']}")
    base = ROOT / "tests" / "fixtures" / "baselines" / f"{path.stem}.json"
    if base.is_file():         # that every scenario has one is tests/test_compare.py's check
        res = compare(load_side(base), load_side(tmp_path / "out"))
        assert res["moved"] == [], (f"{path.name}: moved beyond its baseline's seed spread: {res['moved']}; if "
                                    f"meant, re-make: PYTHONPATH=. python tests/fixtures/make_baselines.py {path.stem}")


def test_shortening_entries_name_shipped_scenarios():
    """A renamed scenario must not leave a SHORTEN or CHECK_SHORTEN entry that no longer applies."""
    shipped = {p.name for p in (ROOT / "scenarios").glob("*.yaml")}
    assert set(SHORTEN) <= shipped and set(CHECK_SHORTEN) <= shipped
