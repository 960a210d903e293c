"""Examples for wheel users: `dsim examples DIR` copies the shipped scenarios and the data they read,
`dsim run quickstart` finds a shipped scenario by name; both from a wheel installed into a fresh venv."""
import subprocess
from pathlib import Path

import pytest
import yaml

from dsim.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_examples_copies_into_a_new_folder_and_refuses_a_non_empty_one(tmp_path, capsys):
    dest = tmp_path / "ex"
    assert main(["examples", str(dest)]) == 0
    names = sorted(p.stem for p in (ROOT / "scenarios").glob("*.yaml"))
    assert sorted(p.stem for p in (dest / "scenarios").glob("*.yaml")) == names
    assert (dest / "luts" / "llama-2-7b_h100_tp1.csv").is_file()            # lut.yaml's ../luts/
    assert (dest / "scenarios" / "data" / "sample_trace.jsonl").is_file()
    assert (dest / "examples" / "real" / "RTX4090_Llama-3.1-8B" / "requests.jsonl").is_file()
    assert f"{len(names)} scenarios" in capsys.readouterr().out
    assert main(["examples", str(dest)]) == 2
    assert "DIR" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["examples", str(tmp_path / "empty")]) == 0


def test_a_bare_name_runs_the_shipped_scenario_and_an_unknown_one_lists_them(tmp_path, capsys):
    assert main(["validate", "quickstart"]) == 0
    assert "ok: quickstart" in capsys.readouterr().out
    assert main(["run", "quickstar", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dsim: error: scenario: got 'quickstar'") and "quickstart, ramp" in err
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()


LOOP = r"""
import contextlib, io, sys
from pathlib import Path
import dsim
from dsim.cli import main
assert "site-packages" in dsim.__file__, dsim.__file__
done = []
for f in sorted(Path("dsim-examples/scenarios").glob("*.yaml")):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = main(["run", str(f), "--set", "workload.num_requests=20", "--quiet", "--no-plots",
                   "--out", f"out/{f.stem}"])
        how = "run"
        if rc == 2 and "workload.num_requests: unknown key" in out.getvalue():   # class-mix workloads
            rc, how = main(["validate", str(f)]), "validate"
    assert rc == 0, (f.name, out.getvalue()[-600:])
    done.append(how)
print(done.count("run"), done.count("validate"))
"""


@pytest.mark.xdist_group("wheel_venv")         # conftest's wheel_venv: built once, by one worker
def test_wheel_ships_the_examples_and_every_copied_scenario_runs(wheel_venv, tmp_path):
    py, env, wheel = wheel_venv
    import zipfile
    listed = zipfile.ZipFile(wheel).namelist()
    assert "dsim/_examples/scenarios/quickstart.yaml" in listed and "dsim/_examples/luts/llama-2-7b_h100_tp1.csv" in listed
    work = tmp_path / "empty"
    work.mkdir()
    r = subprocess.run([str(py), "-m", "dsim.cli", "examples"], cwd=work, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (work / "dsim-examples" / "scenarios" / "quickstart.yaml").is_file()
    r = subprocess.run([str(py), "-c", LOOP], cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    ran, validated = map(int, r.stdout.split())
    paths = sorted((ROOT / "scenarios").glob("*.yaml"))
    mixes = sum((yaml.safe_load(p.read_text()).get("workload") or {}).get("type") == "mix" for p in paths)
    assert ran + validated == len(paths) and validated == mixes     # only class mixes lack num_requests
    r = subprocess.run([str(py), "-m", "dsim.cli", "run", "quickstart", "--set", "workload.num_requests=20",
                        "--no-plots", "--quiet"], cwd=work, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert [p.name.startswith("quickstart-") for p in (work / "results").iterdir()] == [True]
