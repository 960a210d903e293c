"""A sweep on a real Dask cluster: scheduler and workers started as their own processes in another
working directory, the scenario reading a trace file by a relative path.  A point travels as data
(dsim.explore.portable), so the table equals the joblib one byte for byte."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import dsim

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / "scenarios" / "trace_jsonl.yaml"        # workload.path: a relative path to a JSONL trace


def _start(args, cwd, log):
    # a temporary folder of their own: the workers start without any unpacked point's files, so
    # they must fetch them from the cluster's store
    (Path(cwd) / "tmp").mkdir(exist_ok=True)
    return subprocess.Popen([sys.executable, "-m", *args], cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                                 "TMPDIR": str(Path(cwd) / "tmp")})


@pytest.fixture
def dask_cluster(tmp_path):
    pytest.importorskip("distributed", reason="the Dask test needs dask[distributed] (dev extra)")
    from distributed import Client
    elsewhere = tmp_path / "elsewhere"                   # no scenarios/ here: paths would not resolve
    elsewhere.mkdir()
    sched_file = tmp_path / "scheduler.json"
    log = open(tmp_path / "cluster.log", "w")
    procs = [_start(["distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard",
                     "--scheduler-file", str(sched_file)], elsewhere, log)]
    try:
        deadline = time.time() + 60
        while not sched_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        assert sched_file.exists(), (tmp_path / "cluster.log").read_text()
        for _ in range(2):
            procs.append(_start(["distributed.cli.dask_worker", "--scheduler-file", str(sched_file), "--nthreads",
                                 "1", "--nworkers", "1", "--no-dashboard", "--local-directory", str(elsewhere)],
                                elsewhere, log))
        import json
        address = json.loads(sched_file.read_text())["address"]
        with Client(address, timeout=60) as c:
            c.wait_for_workers(2, timeout=90)
            assert all(Path(d).resolve() == elsewhere.resolve()
                       for d in c.run(os.getcwd).values())      # the workers really run elsewhere
        yield address
    finally:
        for p in procs[::-1]:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        log.close()


def test_sweep_on_a_dask_cluster_in_another_folder_equals_joblib(tmp_path, dask_cluster, monkeypatch):
    import pickle

    from dsim.explore import portable
    monkeypatch.chdir(ROOT)                              # the driver names the scenario as the README does
    rel = os.path.relpath(TRACE, ROOT)
    sent = []

    def spy(calls, engine, put):                         # what each point carries to the cluster
        out = real_share(calls, engine, put)
        sent.extend(len(pickle.dumps(c)) for c in out)
        return out
    real_share = portable.share
    monkeypatch.setattr(portable, "share", spy)
    kw = dict(overrides=["workload.num_requests=40"], seeds=1)
    local = dsim.sweep(rel, ["engine.max_num_seqs=8,32,64"], out=tmp_path / "local", **kw)
    remote = dsim.sweep(rel, ["engine.max_num_seqs=8,32,64"], out=tmp_path / "remote", backend="dask",
                        address=dask_cluster, jobs=2, **kw)
    assert [r["status"] for r in remote] == ["ok"] * 3, [r.get("error") for r in remote]
    assert (tmp_path / "remote" / "results.csv").read_bytes() == (tmp_path / "local" / "results.csv").read_bytes()
    assert [r for r in remote] == [r for r in local]
    trace = (TRACE.parent / "data" / "sample_trace.jsonl").stat().st_size
    assert len(sent) == 3 and max(sent) < trace / 5, (sent, trace)    # the trace went once, not per point


def test_a_sweep_whose_every_point_failed_exits_1(tmp_path, capsys):
    """Every point failing (bad values) used to exit 0 with a table of errors."""
    from dsim.cli import main
    q = str(ROOT / "scenarios" / "quickstart.yaml")
    base = ["--set", "workload.num_requests=10", "--quiet"]
    assert main(["sweep", q, "--grid", "workload.rate=-1,0", "--out", str(tmp_path / "a"), *base]) == 1
    assert "every point failed (2)" in capsys.readouterr().err
    assert main(["sweep", q, "--grid", "workload.rate=-1,5", "--out", str(tmp_path / "b"), *base]) == 0
    assert "1 failed" in capsys.readouterr().out


def test_a_packed_point_carries_its_files_and_runs_anywhere(tmp_path, monkeypatch):
    """pack() replaces every file the scenario names with its bytes; the unpacked point runs from a
    folder where the original paths do not exist and gives the same row."""
    from dsim.explore.evaluate import evaluate
    from dsim.explore.portable import pack
    pkg = pack(str(TRACE), ["workload.num_requests=20"])
    assert len(pkg["files"]) == 1 and not Path(pkg["scenario"]["workload"]["path"]).is_absolute()
    monkeypatch.chdir(tmp_path)
    assert evaluate(pkg, [], None) == evaluate(str(TRACE), ["workload.num_requests=20"], None)


def test_packing_shares_one_copy_and_unpacking_repairs_and_reports(tmp_path, monkeypatch):
    """Every point naming one trace shares one copy of its bytes in the driver; a worker folder whose
    files a temp cleaner removed is written again; an unwritable temp folder is a ConfigError row,
    not a crash of the sweep."""
    import tempfile
    from dsim.config.errors import ConfigError
    from dsim.explore.portable import pack, unpack
    a, b = pack(str(TRACE), ["workload.num_requests=5"]), pack(str(TRACE), ["workload.num_requests=6"])
    (name,) = a["files"]
    assert a["files"][name] is b["files"][name]
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _, folder = unpack(a)
    (folder / name).unlink()
    _, again = unpack(a)
    assert again == folder and (folder / name).read_bytes() == a["files"][name]
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the folder should be")
    monkeypatch.setattr(tempfile, "tempdir", str(blocked))
    with pytest.raises(ConfigError, match="a writable temporary folder"):
        unpack(a)


def test_a_sweep_refused_before_any_point_leaves_no_folder_it_made(tmp_path):
    """A connection error (here: --address without a cluster backend, found when the points are
    handed out) removes the sweep folder this command created; a folder the user had stays."""
    from dsim.config.errors import ConfigError
    q = str(ROOT / "scenarios" / "quickstart.yaml")
    kw = dict(overrides=["workload.num_requests=5"], jobs=2, address="127.0.0.1:1")
    with pytest.raises(ConfigError, match="only with --backend dask or ray"):
        dsim.sweep(q, ["workload.rate=1,2"], out=tmp_path / "new", **kw)
    assert not (tmp_path / "new").exists()
    mine = tmp_path / "mine"
    mine.mkdir()
    with pytest.raises(ConfigError, match="only with --backend dask or ray"):
        dsim.sweep(q, ["workload.rate=1,2"], out=mine, **kw)
    assert mine.is_dir()


def test_sharing_puts_each_file_once_and_points_carry_references(tmp_path):
    """N points over one large trace: the engine's store receives its bytes once and each point
    pickles small (a Dask point carries the scattered data's key).  That a worker without the file
    fetches it through the reference is the cluster tests' job (their workers start with an empty
    temporary folder)."""
    import pickle
    from dsim.explore.portable import Shared, share, ship
    big = tmp_path / "big.jsonl"
    line = (TRACE.parent / "data" / "sample_trace.jsonl").read_text().splitlines()[0]
    big.write_text((line + "\n") * 20_000)               # a few MB
    scn = tmp_path / "s.yaml"
    scn.write_text(TRACE.read_text().replace("data/sample_trace.jsonl", "big.jsonl"))
    puts = []

    class Scattered:                                      # what client.scatter returns: a handle with a key
        def __init__(self, blob):
            self.blob, self.key = blob, f"bytes-{len(blob)}"

    def put(blob):
        puts.append(len(blob))
        return Scattered(blob)
    calls = share([ship((str(scn), [f"workload.num_requests={n}"], None)) for n in (5, 6, 7, 8)], "dask", put)
    assert puts == [big.stat().st_size] and puts[0] > 2_000_000
    assert all(len(pickle.dumps(c)) < 10_000 for c in calls)
    shared = [b for c in calls for b in c[0]["files"].values()]
    assert len(shared) == 4 and all(isinstance(b, Shared) and b is shared[0] for b in shared)
    assert pickle.loads(pickle.dumps(shared[0])).key == f"bytes-{puts[0]}"


def test_a_worker_whose_copy_the_memory_manager_dropped_still_gets_the_file(dask_cluster):
    """A broadcast scatter puts a file on every worker, but Dask's active memory manager removes the
    extra copies within seconds; a point landing on a worker without one fetches the file through
    the dataset the run published (a bare Future of the key never resolved: 60 s, then an error)."""
    from distributed import Client

    from dsim.explore.backends import backend_context
    from dsim.explore.portable import share
    blob = os.urandom(1 << 16)
    with backend_context("dask", 2, dask_cluster) as (name, kwargs, put):
        client = kwargs["client"]
        from dsim.explore.portable import MARK
        pkg = {MARK: 1, "files": {"trace.jsonl": blob}}
        (call,) = share([({**pkg}, [])], name, put)
        shared = call[0]["files"]["trace.jsonl"]
        client.amm.run_once()                      # drop the extra copies now, not in a few seconds
        deadline = time.time() + 20
        while len(next(iter(client.who_has([shared.ref]).values()))) > 1 and time.time() < deadline:
            time.sleep(0.2)
        workers = list(client.scheduler_info()["workers"])
        assert len(next(iter(client.who_has([shared.ref]).values()))) == 1 < len(workers)
        # the task is dsim's own method: the workers (started elsewhere) cannot import this test module
        got = [client.submit(type(shared).fetch, shared, workers=[w], pure=False).result(timeout=60)
               for w in workers]
        assert got == [blob, blob]
    with Client(dask_cluster) as c:
        assert not [d for d in c.list_datasets() if str(d).startswith("dsim-file-")]     # tidied away
