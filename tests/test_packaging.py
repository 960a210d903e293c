"""A regular (non-editable) install finds its package data: build a wheel, install it into a fresh
venv, run the quickstart from another folder. The repository itself holds no build or run artefacts."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.xdist_group("wheel_venv")         # conftest's wheel_venv: built once, by one worker
def test_wheel_install_runs_quickstart_from_another_folder(wheel_venv, tmp_path):
    """The wheel of a clean copy of the checkout (conftest's ``wheel_venv``), in a fresh venv, finds
    every data file dsim reads, from a folder that is not the checkout."""
    py, env, _ = wheel_venv
    env_dir = py.parent.parent
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    scn = elsewhere / "q.yaml"
    scn.write_text((ROOT / "scenarios" / "quickstart.yaml").read_text())
    code = (f"import dsim, pathlib; assert dsim.__file__.startswith({str(env_dir)!r}), dsim.__file__\n"
            "from dsim.config.hardware import load_device; load_device('A100-80GB')\n"
            "from dsim.latency.lut import schema; schema()\n"
            "from dsim.config.generations import generations; generations()\n"
            "from dsim.specdec.config import SHIPPED_CURVES; assert SHIPPED_CURVES.is_file()\n"
            "from dsim.latency.vidur import find_profile; from dsim.config.model import load_model\n"
            "find_profile(load_model('meta-llama/Llama-2-7b-hf'), 'H100-SXM')\n"
            "r = dsim.run('q.yaml', overrides=['workload.num_requests=50'], plots=False)\n"
            "assert r.summary['requests']['completed'] == 50\n"
            "assert r.manifest['versions']['git_commit'] is None   # a plain wheel knows no commit\n"
            "from dsim.latency.physics import DEFAULT_COEFFS; assert DEFAULT_COEFFS.is_file()\n"
            "from dsim.latency.efficiency import curve_for; assert not curve_for(load_device('H100-SXM')).borrowed\n"
            "from dsim.latency.credibility import zero_shot_mape; assert zero_shot_mape('physics')['stages'] > 0\n")
    out = subprocess.run([str(py), "-c", code], cwd=elsewhere, capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]


def test_suite_imports_the_installed_package_when_ci_asks():
    """CI's second step runs the suite against a wheel from outside the checkout; make sure it does."""
    import dsim
    if not os.environ.get("DSIM_EXPECT_INSTALLED"):
        pytest.skip("DSIM_EXPECT_INSTALLED unset: the suite may run against the source tree")
    assert not Path(dsim.__file__).resolve().is_relative_to(ROOT), dsim.__file__
    assert "site-packages" in dsim.__file__


ROOT_ONLY = ("results/", "build/", "dist/", "experiments/out/")        # run outputs at the top (a real run's own
ANYWHERE = (".coverage", ".pytest_cache/", "__pycache__/", ".egg-info/", # results/ under examples/ is data)
            ".hypothesis/", ".pyc", ".ipynb_checkpoints/")


def test_repository_tracks_no_build_or_run_artefacts():
    if not (ROOT / ".git").exists() or not shutil.which("git"):
        pytest.skip("not a git checkout (an installed package has no repository to check)")
    files = subprocess.run(["git", "-C", str(ROOT), "ls-files"], capture_output=True, text=True,
                           check=True).stdout.splitlines()
    bad = [f for f in files if f.startswith(ROOT_ONLY)
           or any(f"/{a}" in f"/{f}" or f.endswith(a) for a in ANYWHERE)]
    assert not bad, f"build/run artefacts tracked by git: {bad[:10]}"
