"""`dsim baseline` and `dsim compare`: a metric moved when it left the seed-to-seed spread of a
baseline (or --tolerance between two plain runs); exit 0 / 1 / 2; the stored baselines of shipped
scenarios still hold for the current code (the CI regression check)."""
import json
from pathlib import Path

import pytest

from dsim.cli import main
from dsim.explore.baseline import compare, load_side, make_baseline
from dsim.shipped import resolve

ROOT = Path(__file__).resolve().parents[1]
BASELINES = ROOT / "tests" / "fixtures" / "baselines"
QUICK = BASELINES / "quickstart.json"
# re-run with every seed of the baseline (the rest are checked against the one run of
# tests/test_scenarios.py, which is the first seed of their baseline)
RERUN = ("quickstart", "burst", "router_comparison", "pd_disagg")
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", [BASELINES / f"{n}.json" for n in RERUN], ids=lambda p: p.stem)
def test_shipped_scenario_within_its_baseline(path):
    stored = json.loads(path.read_text())
    scn = stored["scenario"]
    fresh = make_baseline(resolve(scn["source"]), len(stored["seeds"]), scn["overrides"])
    assert fresh["scenario"]["scenario_sha256"] == scn["scenario_sha256"], (
        f"{scn['source']} changed since its baseline; if meant, re-record: {stored['command']}")
    assert fresh["seeds"] == stored["seeds"]
    res = compare(load_side(path), {**load_side(path), "label": "current", "metrics": fresh["metrics"]})
    assert res["moved"] == [], f"moved beyond the seed spread: {res['moved']}; if meant, re-record: " \
                               f"{stored['command']}"
    assert len(res["metrics"]) >= 55 and {"p99_ttft_ms", "p99_tpot_ms", "goodput_fraction"} <= set(fresh["metrics"])


def test_every_shipped_scenario_has_a_current_baseline():
    """Each scenario under scenarios/ has tests/fixtures/baselines/NAME.json, made by
    tests/fixtures/make_baselines.py from this version of the scenario file with the scenario
    tests' shortening, well formed (each metric's mean/std/min/max are those of its values)."""
    import statistics
    import sys
    sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
    sys.path.insert(0, str(ROOT / "tests"))
    from make_baselines import command, stale
    from test_scenarios import SHORTEN

    from dsim.explore.evaluate import resolve as load
    names = sorted(p.stem for p in BASELINES.glob("*.json"))
    assert names == [p.stem for p in SCENARIOS], "a baseline per shipped scenario, and none for others: " \
        "PYTHONPATH=. python tests/fixtures/make_baselines.py --missing"
    for path in SCENARIOS:
        over = SHORTEN.get(path.name) or []
        doc = json.loads((BASELINES / f"{path.stem}.json").read_text())
        why = stale(path.stem, over)
        assert why is None, f"{path.stem}: {why}; re-make: PYTHONPATH=. python tests/fixtures/make_baselines.py " \
                            f"{path.stem}"
        assert doc["kind"] == "dsim-baseline" and doc["format"] == 1
        assert doc["command"] == command(path.stem, len(doc["seeds"]), over)
        seed = load(str(path), over).seed
        assert doc["seeds"] == [seed + i for i in range(len(doc["seeds"]))] and len(doc["seeds"]) >= 3
        assert {"p99_ttft_ms", "completed", "duration"} <= set(doc["metrics"]), path.stem
        for k, st in doc["metrics"].items():
            v = st["values"]
            assert len(v) == len(doc["seeds"]) and min(v) == st["min"] and max(v) == st["max"], (path.stem, k)
            assert st["mean"] == pytest.approx(statistics.fmean(v), rel=1e-12, abs=1e-12), (path.stem, k)
            assert st["std"] == pytest.approx(statistics.stdev(v), rel=1e-9, abs=1e-12), (path.stem, k)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cmp") / "q"
    assert main(["run", "quickstart", "--out", str(out), "--no-plots", "--quiet"]) == 0   # seed 1: in the baseline
    return out


def _edited(run_dir, tmp_path, name, **metrics):
    s = json.loads((run_dir / "summary.json").read_text())
    s["metrics"].update(metrics)
    p = tmp_path / name
    p.write_text(json.dumps(s))
    return p


def test_compare_flags_a_move_beyond_the_seed_spread_and_not_one_within(run_dir, tmp_path, capsys):
    st = json.loads(QUICK.read_text())["metrics"]["p99_ttft_ms"]
    spread = max(st["max"] - st["min"], 3 * st["std"])
    assert main(["compare", str(QUICK), str(run_dir)]) == 0
    assert "0 of " in capsys.readouterr().out
    within = _edited(run_dir, tmp_path, "within.json", p99_ttft_ms=st["mean"] + 0.8 * spread)
    assert main(["compare", str(QUICK), str(within)]) == 0
    capsys.readouterr()
    beyond = _edited(run_dir, tmp_path, "beyond.json", p99_ttft_ms=st["mean"] + 1.2 * spread)
    assert main(["compare", str(QUICK), str(beyond), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["moved"] == ["p99_ttft_ms"]
    row = next(r for r in doc["metrics"] if r["metric"] == "p99_ttft_ms")
    assert row["limit"] == pytest.approx(spread) and row["a"] == pytest.approx(st["mean"])
    assert main(["compare", str(QUICK), str(beyond), "--moved"]) == 1    # the table names it
    out = capsys.readouterr().out
    assert "p99_ttft_ms" in out and "MOVED" in out and "1 of " in out and "p50_ttft_ms" not in out


def test_the_spread_is_the_range_or_three_std_whichever_is_wider():
    def side(values, kind="baseline"):
        import statistics
        st = {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
              "min": min(values), "max": max(values)}
        return {"label": kind, "kind": kind, "metrics": {"m": st}}
    a = side([10.0, 11.0, 12.0])              # mean 11, std 1, range 2: limit 3 std = 3
    assert compare(a, side([13.9], "run"))["moved"] == []
    assert compare(a, side([14.1], "run"))["moved"] == ["m"]
    assert compare(a, side([7.9], "run"))["moved"] == ["m"]
    b = side([0.0] + [5.0] * 8 + [10.0])      # std 2.36: the range 10 is wider than 3 std (7.07)
    assert next(iter(compare(a, b)["metrics"]))["limit"] == pytest.approx(10.0)
    assert compare(side([4.0, 5.0, 6.0]), b)["moved"] == []        # mean 5 vs 5
    assert compare(a, side([14.1], "run"), tolerance=0.5)["moved"] == []      # 0.5 x 11 = 5.5 > 3


def test_two_plain_runs_need_a_tolerance(run_dir, tmp_path, capsys):
    st = json.loads((run_dir / "summary.json").read_text())["metrics"]
    assert main(["compare", str(run_dir), str(run_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsim: error: --tolerance:") and err.count("\n") == 1
    b10 = _edited(run_dir, tmp_path, "b10.json", p99_tpot_ms=st["p99_tpot_ms"] * 1.10)
    b2 = _edited(run_dir, tmp_path, "b2.json", p99_tpot_ms=st["p99_tpot_ms"] * 1.02)
    assert main(["compare", str(run_dir), str(b10), "--tolerance", "0.05"]) == 1
    assert "1 of " in capsys.readouterr().out
    assert main(["compare", str(run_dir), str(b2), "--tolerance", "0.05"]) == 0
    assert main(["compare", str(run_dir), str(b2), "--tolerance", "-1"]) == 2


@pytest.mark.parametrize("make,what", [
    (lambda t: t / "missing", "(not found)"),
    (lambda t: t, "(this folder has no summary.json)"),
    (lambda t: (t / "x.json").write_text("{not json") and t / "x.json", "valid JSON"),
    (lambda t: (t / "y.json").write_text('{"a": 1}') and t / "y.json", "a dsim run folder"),
    (lambda t: (t / "z.json").write_text('{"kind": "dsim-baseline", "format": 1, "metrics": {"m": {"mean": 1}}}')
     and t / "z.json", "metrics.m"),
])
def test_bad_input_is_one_line_exit_2(make, what, tmp_path, capsys):
    bad = make(tmp_path)
    assert main(["compare", str(QUICK), str(bad)]) == 2
    cap = capsys.readouterr()
    assert cap.out == "" and cap.err.count("\n") == 1 and cap.err.startswith(f"dsim: error: {bad}")
    assert what in cap.err


def test_baseline_refuses_bad_input_without_writing(tmp_path, capsys):
    out = tmp_path / "b.json"
    assert main(["baseline", "quickstart", "--seeds", "1", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("dsim: error: --seeds: got 1")
    assert main(["baseline", "quickstart", "--set", "engine.max_num_seqs=0", "--out", str(out)]) == 2
    assert "engine.max_num_seqs" in capsys.readouterr().err
    assert main(["baseline", "no_such_scenario", "--out", str(out)]) == 2
    capsys.readouterr()
    assert main(["baseline", "quickstart", "--out", str(tmp_path)]) == 2      # a folder: refused before running
    err = capsys.readouterr().err
    assert err.startswith("dsim: error: --out:") and "this is a folder" in err and err.count("\n") == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []
