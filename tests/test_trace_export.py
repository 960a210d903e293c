"""``dsim trace generate``: the exported JSONL replays to the very requests the scenario drew (every
column of requests.csv byte for byte), for generated, mixed, shared-prefix and trace workloads."""
import copy
import json
from pathlib import Path

import pytest

import dsim
from dsim.cli import main
from dsim.config.scenario import load_scenario
from dsim.workload.export import generate_trace

ROOT = Path(__file__).resolve().parents[1]
SCN = ROOT / "scenarios"


def _small(name: str, edit) -> dict:
    raw = copy.deepcopy(load_scenario(str(SCN / name)).raw)
    edit(raw["workload"])
    raw.setdefault("output", {})["plots"] = False
    return raw


def _classes(n):
    def edit(wl):
        for c in wl["classes"]:
            c["num_requests"] = n
    return edit


def _num(n):
    def edit(wl):
        wl["num_requests"] = n
    return edit


def _trace_file(raw, tmp_path):
    wl = raw["workload"]
    wl["path"] = str((SCN / wl["path"]).resolve())


CASES = {
    "poisson": ("trace_roundtrip.yaml", _num(150)),
    "mix_priorities": ("priority_classes.yaml", _classes(80)),
    "mix_slo_classes": ("edf_slo_classes.yaml", _classes(60)),
    "shared_prefix_multi_turn": ("pd_disagg.yaml", _num(150)),
    "prompt_pool": ("prompt_pool_tp4.yaml", _num(150)),
    "staged_shared_prefix": ("staged_shared_prefix.yaml", _num(150)),
    "closed_loop": ("closed_loop.yaml", _num(120)),              # max_concurrency stays in the workload
    "speculation": ("trained_gamma_head.yaml", _num(50)),
    "burst_factor": ("burst_factor.yaml", _num(150)),           # simultaneous arrivals survive the trip
}


def _roundtrip(raw, tmp_path):
    scn = load_scenario(raw, base_dir=SCN)
    trace = tmp_path / "w.jsonl"
    n = generate_trace(scn, trace)
    a = dsim.run(scn, tmp_path / "a", plots=False)
    replay = copy.deepcopy(raw)
    wl = {"type": "trace", "path": str(trace)}
    if raw["workload"].get("max_concurrency") is not None:
        wl["max_concurrency"] = raw["workload"]["max_concurrency"]
    replay["workload"] = wl
    dsim.run(load_scenario(replay, base_dir=SCN), tmp_path / "b", plots=False)
    assert n == len(a.requests)
    return trace, (tmp_path / "a" / "requests.csv").read_bytes(), (tmp_path / "b" / "requests.csv").read_bytes()


@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_trace_replays_to_identical_requests(case, tmp_path):
    name, edit = CASES[case]
    trace, a, b = _roundtrip(_small(name, edit), tmp_path)
    assert a == b
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    if case.startswith("mix"):
        assert len({r["tenant"] for r in recs}) >= 2          # the tenant column carries the mix
    if case == "burst_factor":
        assert len({r["arrival_s"] for r in recs}) < len(recs) / 2
    if case not in ("poisson", "closed_loop", "speculation", "burst_factor"):
        assert any("segments" in r or "priority" in r for r in recs)


def test_trace_workload_exports_itself(tmp_path):
    """A trace scenario (prefix groups) exports to a trace that replays the same requests."""
    raw = _small("trace_jsonl.yaml", lambda wl: None)
    _trace_file(raw, tmp_path)
    _, a, b = _roundtrip(raw, tmp_path)
    assert a == b


def test_round_trip_would_catch_a_lost_column(tmp_path):
    """Dropping the segments column (prefix-cache identity) changes the replayed requests: the
    comparison above is sensitive to what the export writes."""
    raw = _small("pd_disagg.yaml", _num(150))
    scn = load_scenario(raw, base_dir=SCN)
    trace = tmp_path / "w.jsonl"
    generate_trace(scn, trace)
    recs = [json.loads(ln) for ln in trace.read_text().splitlines()]
    for r in recs:
        r.pop("segments", None)
    trace.write_text("".join(json.dumps(r) + "\n" for r in recs))
    a = dsim.run(scn, tmp_path / "a", plots=False)
    raw["workload"] = {"type": "trace", "path": str(trace)}
    b = dsim.run(load_scenario(raw, base_dir=SCN), tmp_path / "b", plots=False)
    ca = [r for r in a.to_pandas()["cached_prefix_tokens"]]
    cb = [r for r in b.to_pandas()["cached_prefix_tokens"]]
    assert ca != cb


def test_cli_trace_generate_and_bad_input(tmp_path, capsys):
    out = tmp_path / "q.jsonl"
    assert main(["trace", "generate", "quickstart", "--out", str(out), "--set", "workload.num_requests=20"]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 20 and set(json.loads(lines[0])) == {"arrival_s", "prompt_tokens", "output_tokens"}
    assert main(["trace", "generate", "quickstart", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsim: error: --out") and err.count("\n") == 1
    assert main(["trace", "generate", "quickstart", "--out", str(out), "--set", "workload.rate=-1"]) == 2


@pytest.mark.parametrize("seg, why", [("[[1, 5]]", "add up to prompt_tokens"), ('"x"', "[id, tokens] pairs"),
                                      ("[[1, 0], [2, 10]]", "[id, tokens] pairs")])
def test_bad_segments_column_is_a_path_qualified_error(seg, why, tmp_path, capsys):
    t = tmp_path / "t.jsonl"
    t.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2, "segments": %s}\n' % seg)
    s = tmp_path / "s.yaml"
    s.write_text(f"name: s\nmodel: meta-llama/Llama-3.1-8B\nhardware: H100-SXM\nworkload: {{type: trace, path: {t}}}\n")
    assert main(["validate", str(s)]) == 2
    err = capsys.readouterr().err
    assert f"{t}:1.segments" in err and why in err
