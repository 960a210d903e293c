"""report.html beside every command's output (issue 39): self-contained (no URL, no external
script), every sweep point / plan candidate named in the page, byte-identical across two runs,
and `dsim report DIR` rebuilds the same file."""
import csv
import json
import re
from pathlib import Path

import pytest
import yaml

from dsim.cli import main
from helpers import scenario

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT / "examples" / "real"


def _scn(tmp_path, **over):
    doc = scenario(**over)
    doc["output"] = {"plots": True}
    doc["slo"] = {"ttft_ms": 500, "tpot_ms": 50}
    doc["workload"] = {"type": "poisson", "rate": 10, "num_requests": 60, "prompt_tokens": 100, "output_tokens": 8}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def _check(html_path: Path) -> str:
    text = html_path.read_text()
    assert text.startswith("<!DOCTYPE html>")
    assert "http://" not in text and "https://" not in text          # opens without a network
    assert not re.search(r"<script[^>]*\bsrc=", text) and "<link" not in text
    assert "vegaEmbed" in text and 'id="chart-1"' in text
    assert html_path.stat().st_size < 5_000_000
    return text


def _rebuilds(folder: Path, capsys=None) -> None:
    before = (folder / "report.html").read_bytes()
    (folder / "report.html").unlink()
    assert main(["report", str(folder)]) == 0
    assert (folder / "report.html").read_bytes() == before


def _data(text: str, name: str) -> list:
    m = re.search(rf'<script type="application/json" id="data-{name}">(.*?)</script>', text, re.S)
    return json.loads(m.group(1))


def test_run_report_is_self_contained_deterministic_and_rebuilt(tmp_path):
    s = _scn(tmp_path)
    for out in ("a", "b"):
        assert main(["run", str(s), "--set", "workload.rate=12", "--out", str(tmp_path / out), "--quiet"]) == 0
    a, b = tmp_path / "a" / "report.html", tmp_path / "b" / "report.html"
    text = _check(a)
    assert a.read_bytes() == b.read_bytes()
    assert "(workload.rate=12)" in text                                 # the title says what was run
    summary = json.loads((tmp_path / "a" / "summary.json").read_text())
    from dsim.report.html import esc
    assert esc(summary["error_band"]["statement"]) in text
    assert "TTFT CDF" in text and "requests running" in text and "SLO 500 ms" in text
    assert "report.html" in (tmp_path / "a" / ".dsim-report").read_text().split()
    _rebuilds(tmp_path / "a")


def test_run_without_plots_writes_no_report_and_rebuilds_one_with_timeline(tmp_path):
    """--no-plots still writes timeline.csv (dsim plot and dsim report draw from it); a report of an
    older dsim, without one, is rebuilt without a timeline and says so."""
    s = _scn(tmp_path)
    out = tmp_path / "n"
    assert main(["run", str(s), "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert not (out / "report.html").exists()
    assert main(["report", str(out)]) == 0
    assert "requests running" in _check(out / "report.html")
    (out / "timeline.csv").unlink()
    assert main(["report", str(out)]) == 0
    text = _check(out / "report.html")
    assert "No timeline.csv" in text
    assert "report.html" in (out / ".dsim-report").read_text().split()
    assert main(["run", str(s), "--out", str(out), "--quiet", "--no-plots"]) == 0   # still ours to replace


def test_sweep_report_names_every_point_and_marks_them(tmp_path):
    s = _scn(tmp_path)
    args = ["sweep", str(s), "--grid", "workload.rate=5,400", "--grid", "engine.max_num_seqs=4,64",
            "--set", "workload.num_requests=40", "--set", "slo.ttft_ms=1", "--quiet"]
    for out in ("a", "b"):
        assert main(args + ["--out", str(tmp_path / out)]) == 0
    a = tmp_path / "a" / "report.html"
    text = _check(a)
    assert a.read_bytes() == (tmp_path / "b" / "report.html").read_bytes()
    assert "(workload.num_requests=40, slo.ttft_ms=1)" in text
    pts = _data(text, "points")
    with open(tmp_path / "a" / "results.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(pts) == len(rows) == 4
    named = {(str(p["workload.rate"]), str(p["engine.max_num_seqs"])) for p in pts}
    assert named == {(r["workload.rate"], r["engine.max_num_seqs"]) for r in rows}
    assert {p["mark"] for p in pts} <= {"ok", "misses SLO", "overloaded"}
    assert any(p["mark"] != "ok" for p in pts)                         # a 1 ms TTFT SLO is missed
    _rebuilds(tmp_path / "a")


def test_sweep_png_title_names_the_overrides(tmp_path, monkeypatch):
    import dsim.explore.plots as P
    seen = {}
    real = P.sweep_plot

    def spy(rows, path, **kw):
        seen["title"] = kw.get("title")
        return real(rows, path, **kw)
    monkeypatch.setattr(P, "sweep_plot", spy)
    s = _scn(tmp_path)
    assert main(["sweep", str(s), "--grid", "workload.rate=5,10", "--set", "workload.num_requests=20",
                 "--set", "engine.max_num_seqs=32", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    name = yaml.safe_load(s.read_text()).get("name") or "s"
    assert seen["title"] == f"dsim sweep {name} (workload.num_requests=20, engine.max_num_seqs=32)"
    assert (tmp_path / "o" / "plots" / "sweep.png").is_file()


def test_capacity_and_plan_reports(tmp_path):
    s = _scn(tmp_path)
    for out in ("c1", "c2"):
        assert main(["capacity", str(s), "--slo", "ttft_p99_ms=500", "--no-band", "--set", "workload.num_requests=40",
                     "--out", str(tmp_path / out)]) == 0
    c = tmp_path / "c1" / "report.html"
    text = _check(c)
    assert c.read_bytes() == (tmp_path / "c2" / "report.html").read_bytes()
    from dsim.explore.capacity import answer_line
    from dsim.report.html import esc
    assert esc(answer_line(json.loads((tmp_path / "c1" / "capacity.json").read_text()))) in text
    _rebuilds(tmp_path / "c1")

    space = tmp_path / "space.yaml"
    space.write_text("tensor_parallel_size: [1]\nreplicas: [1, 2]\nengine.max_num_seqs: [8, 64]\n")
    for out in ("p1", "p2"):
        assert main(["plan", str(s), "--gpus", "2", "--space", str(space), "--slo", "ttft_p99_ms=500", "--no-band",
                     "--set", "workload.num_requests=40", "--out", str(tmp_path / out)]) == 0
    p = tmp_path / "p1" / "report.html"
    text = _check(p)
    assert p.read_bytes() == (tmp_path / "p2" / "report.html").read_bytes()
    cands = _data(text, "candidates")
    with open(tmp_path / "p1" / "candidates.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(cands) == len(rows) == 4
    assert {(str(c["replicas"]), str(c["engine.max_num_seqs"])) for c in cands} == \
        {(r["replicas"], r["engine.max_num_seqs"]) for r in rows}
    _rebuilds(tmp_path / "p1")


@pytest.mark.skipif(not (REAL / "RTX4090_Llama-3.1-8B").is_dir(), reason="examples/real not in this checkout")
def test_cosim_and_calibrate_reports(tmp_path):
    run = str(REAL / "RTX4090_Llama-3.1-8B")
    for out in ("x1", "x2"):
        assert main(["cosim", run, "--out", str(tmp_path / out)]) == 0
    x = tmp_path / "x1" / "report.html"
    text = _check(x)
    assert x.read_bytes() == (tmp_path / "x2" / "report.html").read_bytes()
    assert "Real vs simulated" in text and "p99" in text
    _rebuilds(tmp_path / "x1")
    assert main(["calibrate", run, "--out", str(tmp_path / "k"), "--max-evals", "2", "--no-loro"]) == 0
    text = _check(tmp_path / "k" / "report.html")
    assert "before" in text and "after" in text
    _rebuilds(tmp_path / "k")


def test_report_of_a_folder_that_is_no_report(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "a dsim output folder" in capsys.readouterr().err


def test_import_dsim_does_not_load_the_plotting_library():
    import subprocess
    import sys
    code = "import sys, dsim; print('altair' in sys.modules, 'vl_convert' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_a_planner_runs_report_lists_every_tick(tmp_path):
    """report.html of a run with the online planner has one row per tick: the replicas it chose,
    its forecast and what then happened (docs/planner.md)."""
    out = tmp_path / "p"
    assert main(["run", str(ROOT / "scenarios" / "online_planner.yaml"), "--set",
                 "cluster.controllers[0].cadence_s=40", "--out", str(out), "--quiet"]) == 0
    text = _check(out / "report.html")
    plan = json.loads((out / "summary.json").read_text())["planner"]
    assert f"Planner (simulate): {plan['ticks']} ticks, {plan['changes']} changes" in text
    table = text[text.index("Planner (simulate)"):]
    table = table[:table.index("</table>")]
    assert table.count("<tr>") == plan["ticks"] + 1                  # a header and a row per tick
    _rebuilds(out)
