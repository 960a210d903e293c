"""The command line behaves like its peers: --version, a bare `dsim` shows the commands, diagnostics
through logging behind -v/-q/--log-level, progress bars on capacity and plan, and cosim/calibrate
folders that never overwrite each other."""
import json
from pathlib import Path

import pytest

from dsim._version import __version__
from dsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "fixtures" / "vllm_bench_detailed.json"


def test_version_prints_the_package_version_and_exits_0(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"dsim {__version__}"


def test_bare_dsim_prints_usage_and_every_command_on_stderr_exit_2(capsys):
    # argparse's convention for a missing required argument: usage on stderr, exit 2
    assert main([]) == 2
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.startswith("usage: dsim")
    for cmd in ("run", "validate", "sweep", "capacity", "plan", "cosim", "calibrate", "examples"):
        assert f"\n    {cmd} " in cap.err, cmd


def _cosim(tmp_path, *flags):
    return main([*flags, "cosim", str(BENCH), "--hardware", "H100-SXM", "--no-plots",
                 "--out", str(tmp_path / "c")])


def test_log_levels_change_what_reaches_stderr_never_stdout(tmp_path, capsys):
    assert _cosim(tmp_path) == 0
    default = capsys.readouterr()
    assert "dsim: warning: vllm_bench_detailed: engine." in default.err     # assumed settings are warnings
    assert "warning" not in default.out and "mean MAPE" in default.out      # results stay on stdout
    assert _cosim(tmp_path, "-qq") == 0
    quiet = capsys.readouterr()
    assert quiet.err == "" and quiet.out == default.out
    assert _cosim(tmp_path, "--log-level", "error") == 0
    assert capsys.readouterr().err == ""
    assert _cosim(tmp_path, "-q") == 0                                       # -q keeps warnings
    assert capsys.readouterr().err == default.err
    assert _cosim(tmp_path, "-v") == 0
    verbose = capsys.readouterr().err
    assert "dsim: debug: " in verbose and default.err in verbose


def test_quiet_keeps_ray_and_dask_loggers_to_errors(tmp_path, capsys):
    import logging
    assert _cosim(tmp_path, "-q") == 0
    assert logging.getLogger("ray").level == logging.ERROR
    assert logging.getLogger("distributed").level == logging.ERROR
    assert _cosim(tmp_path) == 0
    assert logging.getLogger("ray").level == logging.WARNING


def test_progress_counts_the_simulations_run_calls_finishes(monkeypatch):
    import io

    from dsim.explore import backends
    err = io.StringIO()
    err.isatty = lambda: True
    monkeypatch.setattr(backends.sys, "stderr", err)
    with backends.progress("probe", True) as bar:
        assert list(backends.run_calls(abs, [(-1,), (-2,), (3,)])) == [1, 2, 3]
        assert bar.n == 3
    assert "3probe" in err.getvalue().replace(" ", "")
    with backends.progress("probe", False) as bar:                       # --quiet
        assert bar is None
        assert list(backends.run_calls(abs, [(-1,)])) == [1]


def test_cosim_default_folders_are_unique_per_input_scenario_and_overrides(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    base = ["cosim", str(BENCH), "--hardware", "H100-SXM", "--no-plots"]
    cal = tmp_path / "cal.yaml"
    cal.write_text("latency: {model: roofline, alpha: [0.0, 0.0, 0.0]}\n")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(BENCH.read_text()), "request_rate": 2.0}))
    for args in (base, base + ["--scenario", str(cal)], base + ["--set", "engine.max_num_seqs=4"],
                 ["cosim", str(other)] + base[2:], base):                # the last: the first again
        assert main(args) == 0, capsys.readouterr().err
    dirs = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert len(dirs) == 4, dirs                                          # a rerun replaces its own folder
    assert all(d.startswith(("cosim-vllm_bench_detailed-", "cosim-other-")) for d in dirs)
    assert all((tmp_path / "results" / d / "cosim.json").is_file() for d in dirs)


def test_calibrate_default_folder_is_hashed_too(tmp_path, monkeypatch):
    from dsim.runner import inputs_out_dir
    a = inputs_out_dir("calibrate", "r", [BENCH], {"scenario": None, "overrides": []})
    b = inputs_out_dir("calibrate", "r", [BENCH], {"scenario": None, "overrides": ["latency.model=physics"]})
    assert a.startswith("results/calibrate-r-") and a != b
    assert a == inputs_out_dir("calibrate", "r", [BENCH], {"overrides": [], "scenario": None})
