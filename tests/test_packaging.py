"""A regular (non-editable) install finds its package data: build a wheel, install it into a fresh
venv, run the quickstart from another folder."""
import shutil
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_wheel_install_runs_quickstart_from_another_folder(tmp_path):
    src = tmp_path / "src"          # a clean copy: no stale build/ or egg-info can hide a missing file
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "results", "tests",
                                                             "experiments", "docs", "__pycache__", ".*"))
    whl = tmp_path / "whl"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                    "-w", str(whl), str(src)], check=True, cwd=tmp_path)
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    wheel = next(whl.glob("dsim-*.whl"))
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, cwd=tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    scn = elsewhere / "q.yaml"
    scn.write_text((ROOT / "scenarios" / "quickstart.yaml").read_text())
    code = ("import dsim, pathlib; assert 'site-packages' in dsim.__file__, dsim.__file__\n"
            "from dsim.config.hardware import load_device; load_device('A100-80GB')\n"
            "from dsim.latency.lut import schema; schema()\n"
            "from dsim.config.generations import generations; generations()\n"
            "from dsim.specdec.config import SHIPPED_CURVES; assert SHIPPED_CURVES.is_file()\n"
            "from dsim.latency.vidur import find_profile; from dsim.config.model import load_model\n"
            "find_profile(load_model('meta-llama/Llama-2-7b-hf'), 'H100-SXM')\n"
            "r = dsim.run('q.yaml', overrides=['workload.num_requests=50'], plots=False)\n"
            "assert r.summary['requests']['completed'] == 50\n"
            "assert r.manifest['versions']['git_commit'] is None   # a plain wheel knows no commit\n"
            "from dsim.latency.physics import DEFAULT_COEFFS; assert DEFAULT_COEFFS.is_file()\n")
    out = subprocess.run([str(py), "-c", code], cwd=elsewhere, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
