"""A sweep on a real Ray cluster: a head started as its own process (token authentication on, as
current Ray defaults it for a new cluster) in another working directory, the scenario reading a
trace by a relative path; the table equals the joblib one byte for byte.  A missing or wrong token
is a one-line error (exit 2) in seconds, not 'internal error' after 20 s of retries."""
from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import dsim

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "scenarios" / "trace_jsonl.yaml"        # workload.path: a relative path to a JSONL trace
# `-c` puts the working directory first on sys.path, and the CLI runs from the checkout (relative
# paths as the README writes them): drop it, so an installed dsim is not shadowed by the source tree
DSIM = [sys.executable, "-c", "import sys; sys.path[:] = [p for p in sys.path if p != '']; "
        "from dsim.cli import main; sys.exit(main())"]


# under pytest-xdist (`-n auto --dist loadgroup`) this module's tests share one
# worker, so its module-scoped fixture (a Ray head, ~10 s to start) runs once, not once per worker
pytestmark = pytest.mark.xdist_group("test_cluster_ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(**auth) -> dict:
    """This process's environment without any Ray token setting, plus ``auth``; HOME elsewhere so a
    ~/.ray/auth_token of the machine's user plays no part."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return {**env, "PYTHONPATH": str(Path(dsim.__file__).resolve().parents[1]), **auth}   # the dsim under test


@pytest.fixture(scope="module")
def ray_head():
    """(address, token, folder) of a one-node Ray cluster with 2 CPUs, stopped by its process id at the
    end.  Its workers run in the head's working directory ("elsewhere"), not the driver's."""
    pytest.importorskip("ray", reason="the Ray test needs ray (dev extra)")
    # a short root: Ray's Unix socket paths under it must stay below 108 characters
    base = Path(tempfile.mkdtemp(prefix="dsim-ray-"))
    (base / "elsewhere").mkdir()                          # no scenarios/ here: paths would not resolve
    (base / "home").mkdir()
    (base / "tmp").mkdir()                                # workers start without any point's files
    port, token = _free_port(), secrets.token_hex(16)
    env = _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token, HOME=str(base / "home"), TMPDIR=str(base / "tmp"))
    log = open(base / "head.log", "w")
    head = subprocess.Popen(
        [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--port", str(port), "--num-cpus", "2",
         "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(base / "ray"), "--block"],
        cwd=base / "elsewhere", env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.time() + 60
        while "--block" not in (base / "head.log").read_text() and time.time() < deadline:
            assert head.poll() is None, (base / "head.log").read_text()
            time.sleep(0.2)
        assert head.poll() is None, (base / "head.log").read_text()
        yield f"127.0.0.1:{port}", token, base
    finally:
        head.terminate()                                  # `ray start --block` stops its node on SIGTERM
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            head.kill()
            head.wait()
        try:                                              # anything of that node still alive in its group
            os.killpg(head.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        log.close()
        shutil.rmtree(base, ignore_errors=True)


REL = "scenarios/trace_jsonl.yaml"                       # the driver names the scenario as the README does


def _driver_folder(tmp_path) -> Path:
    """A user's folder with the scenario and its trace at the README's relative paths.  Not the
    checkout itself: Ray puts the driver's working directory on its workers' sys.path, and a
    checkout there would shadow an installed dsim (CI's installed-wheel step) with the source tree."""
    drv = tmp_path / "drv"
    (drv / "scenarios" / "data").mkdir(parents=True)
    shutil.copy(TRACE, drv / REL)
    shutil.copy(TRACE.parent / "data" / "sample_trace.jsonl", drv / "scenarios" / "data" / "sample_trace.jsonl")
    return drv


def _sweep(address, out, env, *extra):
    drv = _driver_folder(Path(str(out) + "-driver"))
    return subprocess.run([*DSIM, "sweep", REL, "--grid", "engine.max_num_seqs=8,32", "--set",
                           "workload.num_requests=40", "--backend", "ray", "--address", address, "--jobs", "2",
                           "--out", str(out), "--quiet", *extra],
                          cwd=drv, env=env, capture_output=True, text=True, timeout=180)


def test_sweep_on_a_ray_cluster_in_another_folder_equals_joblib(tmp_path, ray_head, monkeypatch):
    address, token, base = ray_head
    monkeypatch.chdir(_driver_folder(tmp_path))
    local = dsim.sweep(REL, ["engine.max_num_seqs=8,32"],
                       overrides=["workload.num_requests=40"], out=tmp_path / "local")
    assert [r["status"] for r in local] == ["ok", "ok"]
    done = _sweep(address, tmp_path / "remote", _env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=token,
                                                     HOME=str(base / "home")))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "remote" / "results.csv").read_bytes() == (tmp_path / "local" / "results.csv").read_bytes()


@pytest.mark.parametrize("auth", [{"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "0" * 32},      # wrong token
                                  {},                                                        # none sent
                                  {"RAY_AUTH_MODE": "token"}],                               # none found
                         ids=["wrong-token", "no-token-sent", "no-token-found"])
def test_a_refused_token_is_a_one_line_error_in_seconds(tmp_path, ray_head, auth):
    address, _, base = ray_head
    t0 = time.time()
    done = _sweep(address, tmp_path / "out", _env(**auth, HOME=str(base / "home")))
    assert time.time() - t0 < 15                          # was 20 s of retries, then 'internal error'
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr      # one line: no Ray warnings, no traceback
    assert done.stderr.startswith(f"dsim: error: --address: cannot join the Ray cluster at {address} "
                                  "(token authentication: "), done.stderr
    assert "RAY_AUTH_TOKEN" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_port_that_is_no_ray_head_is_a_one_line_error_in_seconds(tmp_path):
    """Something else answers there: Ray's client waited 40 s per try, minutes in all."""
    pytest.importorskip("ray", reason="needs ray")
    with socket.socket() as s:                            # listens, accepts, never speaks gRPC
        s.bind(("127.0.0.1", 0))
        s.listen()
        address = f"127.0.0.1:{s.getsockname()[1]}"
        t0 = time.time()
        done = _sweep(address, tmp_path / "out", _env(RAY_AUTH_MODE="disabled"))
    assert time.time() - t0 < 15
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[0] == (f"dsim: error: --address: cannot reach the Ray cluster at {address} "
                                           "(the port answered, but no Ray head replied within 3 s)")

