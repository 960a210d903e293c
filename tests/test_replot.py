"""``dsim plot DIR``: a run's plots redrawn from its files are the run's own plots (same files, same
bytes), for one replica and for a fleet; a folder that is no run report is one line, exit 2."""
from pathlib import Path

import pytest

from dsim.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path, name, scn, n, *extra):
    out = tmp_path / name
    assert main(["run", scn, "--set", f"workload.num_requests={n}", "--out", str(out), "--quiet", *extra]) == 0
    return out


def _pngs(d: Path) -> dict:
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.png"))}


@pytest.mark.parametrize("scn, n", [("quickstart", 80), (str(ROOT / "scenarios" / "router_comparison.yaml"), 120)])
def test_plot_redraws_the_runs_plots(scn, n, tmp_path, capsys):
    full = _run(tmp_path, "full", scn, n)
    bare = _run(tmp_path, "bare", scn, n, "--no-plots")
    assert not (bare / "plots").exists()
    assert main(["plot", str(bare)]) == 0
    want = _pngs(full / "plots")
    assert set(want) == {"latency_cdf.png", "timeline.png"}
    assert _pngs(bare / "plots") == want
    # the redrawn files are the report's own: dsim may replace the folder afterwards
    assert "plots/timeline.png" in (bare / ".dsim-report").read_text().splitlines()
    assert main(["run", scn, "--set", f"workload.num_requests={n}", "--out", str(bare), "--quiet", "--no-plots"]) == 0
    # --out: a new folder holding only the PNGs
    assert main(["plot", str(full), "--out", str(tmp_path / "elsewhere")]) == 0
    assert _pngs(tmp_path / "elsewhere") == want


def test_plot_draws_from_the_files(tmp_path):
    """Another requests.csv gives another latency plot: the plot reads the folder, nothing cached."""
    d = _run(tmp_path, "r", "quickstart", 60, "--no-plots")
    assert main(["plot", str(d)]) == 0
    before = (d / "plots" / "latency_cdf.png").read_bytes()
    lines = (d / "requests.csv").read_text().splitlines()
    (d / "requests.csv").write_text("\n".join(lines[:20]) + "\n")
    assert main(["plot", str(d)]) == 0
    assert (d / "plots" / "latency_cdf.png").read_bytes() != before


def test_plot_refuses_a_folder_that_is_not_a_run_report(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "notes.txt").write_text("mine")
    for target in (tmp_path / "x", tmp_path / "missing"):
        assert main(["plot", str(target)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"dsim: error: {target}") and err.count("\n") == 1 and "Traceback" not in err
    assert sorted(p.name for p in (tmp_path / "x").iterdir()) == ["notes.txt"]
