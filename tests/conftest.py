import os
import shutil
import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# Property tests draw a fixed example set in CI (derandomize), so a red build always reproduces;
# `pytest --hypothesis-profile=explore` searches fresh examples locally.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile("ci")


def pytest_configure(config):
    # pytest-xdist registers this marker itself; registered here too so a run without xdist (a single
    # file, `-p no:xdist`) does not warn about the modules that group their tests on one worker
    config.addinivalue_line("markers", "xdist_group(name): under `--dist loadgroup`, run on one worker")


@pytest.fixture(scope="session")
def wheel_venv(tmp_path_factory):
    """(python, env, wheel): a wheel built from a clean copy of the checkout (no stale build/ or
    egg-info can hide a missing file), installed without dependencies into a fresh venv (no system
    site-packages) that finds dsim's dependencies in the environment pytest runs in, after its own
    site-packages, so the wheel's dsim wins; ``env`` is this environment without PYTHONPATH (a
    checkout on it would win).  Built once a session: tests/test_packaging.py and
    tests/test_examples.py both read it (their tests are one xdist group, so one worker builds it)."""
    tmp = tmp_path_factory.mktemp("wheel")
    root = Path(__file__).resolve().parents[1]
    src = tmp / "src"
    shutil.copytree(root, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "results", "tests",
                                                             "experiments", "docs", "__pycache__", "_examples",
                                                             ".*"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp / "whl"), str(src)],
                   check=True, cwd=tmp, env=env)
    env_dir = tmp / "venv"
    venv.EnvBuilder(system_site_packages=False, with_pip=True).create(env_dir)
    py = env_dir / "bin" / "python"
    wheel = next((tmp / "whl").glob("dsim-*.whl"))
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", str(wheel)], check=True, cwd=tmp, env=env)
    # appended only once the wheel is in (pip would take a dsim out there for this one)
    inner = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True, env=env).stdout.strip())
    outer = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (inner / "zz_outer_env.pth").write_text("".join(f"{d}\n" for d in sorted(outer)))
    return py, env, wheel
