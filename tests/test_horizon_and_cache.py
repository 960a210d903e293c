"""Horizon/drain reporting, LRU eviction of the prefix cache, and the optional timeline."""
import json

import dsim
from helpers import scenario, trace_file


def test_horizon_without_drain_reports_unfinished(tmp_path):
    wl = {"type": "poisson", "rate": 50, "num_requests": 400, "prompt_tokens": 200, "output_tokens": 300}
    res = dsim.run(scenario(workload=wl, horizon_s=2.0, drain=False, latency={"model": "roofline"}))
    s = res.summary["requests"]
    assert s["unfinished"] > 0 and s["not_arrived"] > 0
    assert s["completed"] + s["unfinished"] + s["not_arrived"] + s["rejected"] == 400
    assert all(r.t_completion is None or r.t_completion <= 2.0 for r in res.requests)
    drained = dsim.run(scenario(workload=wl, horizon_s=2.0, latency={"model": "roofline"}))
    d = drained.summary["requests"]
    assert d["unfinished"] == 0 and d["completed"] == 400 - d["not_arrived"]


def _hit_of_last(tmp_path, fillers):
    rows = [{"arrival_s": 0.0, "prompt_tokens": 64, "output_tokens": 1, "prefix_group": 0}]
    rows += [{"arrival_s": 0.01 * (i + 1), "prompt_tokens": 64, "output_tokens": 1} for i in range(fillers)]
    rows.append({"arrival_s": 1.0, "prompt_tokens": 64, "output_tokens": 1, "prefix_group": 0})
    p = tmp_path / f"t{fillers}.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = dsim.run(scenario(workload={"type": "trace", "path": str(p)},
                            engine={"enable_prefix_caching": True, "num_gpu_blocks": 8, "block_size": 16}))
    return max(res.requests, key=lambda r: r.rid).cached_tokens


def test_prefix_cache_lru_eviction(tmp_path):
    # 8 blocks; the group-0 prompt occupies 4. Two unique 4-block requests afterwards take the
    # 4 never-used blocks, then the LRU ones -> the cached prefix is evicted.
    assert _hit_of_last(tmp_path, 0) == 48          # (64 - 1) // 16 = 3 full blocks hit
    assert _hit_of_last(tmp_path, 1) == 48          # the filler takes the 4 untouched blocks
    assert _hit_of_last(tmp_path, 2) == 0           # the second filler evicts the cached prefix


def test_timeline_json(tmp_path):
    p = trace_file(tmp_path, [(0.0, 50, 3)])
    res = dsim.run(scenario(workload={"type": "trace", "path": str(p)}, output={"plots": False, "timeline": True}),
                   tmp_path / "o")
    ev = json.loads((res.out_dir / "timeline.json").read_text())["traceEvents"]
    steps = [e for e in ev if e["ph"] == "X"]
    assert len(steps) == 3 and steps[0]["args"]["prefill_tokens"] == 50
    # re-running into the same folder without a timeline drops the old one: no mixed reports
    dsim.run(scenario(workload={"type": "trace", "path": str(p)}, output={"plots": False}), tmp_path / "o")
    assert sorted(x.name for x in (tmp_path / "o").iterdir()) == [".dsim-report", "manifest.json", "requests.csv",
                                                                  "summary.json", "timeline.csv"]
