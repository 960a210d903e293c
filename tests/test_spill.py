"""A run whose step logs and ledger spill to disk writes the same report as one kept in memory.

The thresholds are shrunk so a 3,000-request run crosses them several times; by default they are
crossed only past ~2.6 x 10^5 steps (``steplog.SPILL_STEPS``) or 1.3 x 10^5 requests
(``ledger.SPILL_ROWS``), where the in-memory columns would be most of the process."""
import filecmp

import numpy as np
import pytest

import dsim.metrics.exact as exact
import dsim.metrics.ledger as ledger
import dsim.metrics.vllm_bench as vllm_bench
from dsim.core.spill import SpillFile
from dsim.runner import run
from dsim.serving import steplog

from helpers import bench_scenario


def _scenario(replicas: int) -> dict:
    return bench_scenario(3000, replicas)


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_spilled_run_writes_the_same_bytes(replicas, tmp_path, monkeypatch):
    kept = run(_scenario(replicas), tmp_path / "kept", plots=False)
    assert not kept.requests.spilled
    monkeypatch.setattr(steplog, "CHUNK", 1024)
    monkeypatch.setattr(steplog, "SPILL_STEPS", 4096)
    monkeypatch.setattr(ledger, "SPILL_ROWS", 500)
    monkeypatch.setattr(ledger, "ITER_ROWS", 300)
    monkeypatch.setattr(exact, "MEM_ITEMS", 2000)
    monkeypatch.setattr(vllm_bench, "BLOCK_ROWS", 300)      # the peaks over ten blocks, not one
    spilled = run(_scenario(replicas), tmp_path / "spilled", plots=False)
    assert spilled.requests.spilled
    logs = [rep.inst.log for rep in spilled.fleet.replicas()]
    assert all(log._n_spilled >= 4096 for log in logs)
    assert sum(log.steps for log in logs) == sum(rep.inst.num_steps for rep in spilled.fleet.replicas())
    for name in ("summary.json", "requests.csv"):
        assert filecmp.cmp(tmp_path / "kept" / name, tmp_path / "spilled" / name, shallow=False), name


def test_memory_holds_a_bounded_tail_while_the_run_goes_on(monkeypatch):
    """What stays in memory between spills is below the thresholds at every point of a run."""
    from dsim.config.scenario import load_scenario
    from dsim.runner import Session
    monkeypatch.setattr(steplog, "CHUNK", 1024)
    monkeypatch.setattr(steplog, "SPILL_STEPS", 4096)
    monkeypatch.setattr(ledger, "SPILL_ROWS", 500)
    ses = Session(load_scenario(_scenario(1)))
    led, log = ses.fleet.ledger, ses.fleet.replicas()[0].inst.log
    for k in range(1, 16):                     # 150 s at 20 req/s, in 10 s slices
        ses.advance(10.0 * k)
        assert led.n - led._n_spilled < 500 + ledger.BATCH
        assert len(log.dur) < 4096 + 1024 and len(log.t_end) <= 1024
        assert led.nbytes >= 40 * (led.n - len(led._buf))    # every flushed row is still there, on disk
    assert led.spilled and log.steps > 4096 > len(log.dur)


def _traced_peak(f, *args):
    """(f(*args), the most bytes it had allocated at once above its start, by tracemalloc)."""
    import tracemalloc
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        out = f(*args)
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_the_end_of_run_readers_hold_a_block_of_rows_not_the_run(monkeypatch):
    """What a long run does at its end stays within a few arrays of one value a request: the vLLM
    peak metrics read a spilled ledger ``BLOCK_ROWS`` rows at a time (their largest allocation is a
    block's temporaries, whatever the run's length; they made ~30 arrays of one float a request
    and a sorted copy of ~14 a request at once before: 578 MB peak at 10^6 requests), with the
    result of one pass over the whole columns; the whole summary holds ~140 bytes a request
    (~500 before)."""
    from dsim.metrics.summary import summarize
    from dsim.runner import Session
    from dsim.config.scenario import load_scenario
    monkeypatch.setattr(steplog, "CHUNK", 1024)
    monkeypatch.setattr(steplog, "SPILL_STEPS", 4096)
    monkeypatch.setattr(ledger, "SPILL_ROWS", 500)
    monkeypatch.setattr(ledger, "ITER_ROWS", 250)
    monkeypatch.setattr(exact, "MEM_ITEMS", 4000)
    n = 2000
    ses = Session(load_scenario(bench_scenario(n)))
    ses.end = ses.run_to_end()
    led = ses.reqs
    assert led.spilled and led.n == n
    monkeypatch.setattr(vllm_bench, "BLOCK_ROWS", 10**9, raising=False)
    whole = vllm_bench.peaks(led)
    monkeypatch.setattr(vllm_bench, "BLOCK_ROWS", 250, raising=False)
    got, peak = _traced_peak(vllm_bench.peaks, led)
    assert got == whole and got["max_concurrent_requests"] > 0
    # a block of 250 rows: ~30 arrays of 2 KB, the buckets of ~150 simulated seconds and the
    # reads; one array of the whole run's values is 16 KB
    assert peak < 300_000, peak              # 116 KB here; 870 KB before
    summary, peak = _traced_peak(summarize, ses.scn, ses.fleet, led, ses.end, ses.action_log)
    assert summary["metrics"]["max_concurrent_requests"] == whole["max_concurrent_requests"]
    assert peak < 250 * n, peak / n          # 137 B a request here; 502 before


def test_bench_reports_the_bytes_it_spilled(monkeypatch):
    from dsim.bench import bench
    assert bench(2000)["spilled_mb"] == 0.0
    monkeypatch.setattr(steplog, "CHUNK", 1024)
    monkeypatch.setattr(steplog, "SPILL_STEPS", 4096)
    monkeypatch.setattr(ledger, "SPILL_ROWS", 500)
    out = bench(2000)
    # at least the 2,000 rows' ~70 bytes of columns and 16 bytes of each of 3 x 4,096 steps
    assert out["spilled_mb"] * 2**20 > 2000 * 70 + 16 * 3 * 4096


def test_a_spilled_ledger_survives_pickling(monkeypatch):
    """Results travel between processes (sweep workers): the spill file goes with its bytes."""
    import pickle
    monkeypatch.setattr(ledger, "SPILL_ROWS", 300)
    res = run(bench_scenario(1000), plots=False)
    assert res.requests.spilled
    back = pickle.loads(pickle.dumps(res.requests))
    assert back.col("t_completion").tolist() == res.requests.col("t_completion").tolist()
    assert [r.rid for r in back][-3:] == [997, 998, 999] and back[500].n_out == res.requests[500].n_out
    empty = pickle.loads(pickle.dumps(SpillFile()))
    assert empty.nbytes == 0 and empty.put(np.arange(3)) == (0, np.dtype(int).str, 3)


def test_a_full_temporary_directory_is_a_clear_error_and_writes_nothing(tmp_path, monkeypatch, capsys):
    import errno

    import yaml

    import dsim.core.spill as spill
    from dsim.cli import main

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(spill.tempfile, "TemporaryFile", full)
    monkeypatch.setattr(ledger, "SPILL_ROWS", 500)
    path = tmp_path / "long.yaml"
    path.write_text(yaml.safe_dump({**_scenario(1), "name": "long"}))
    assert main(["run", str(path), "--out", str(tmp_path / "out"), "--no-plots", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dsim: error: a long run spills") and "No space left on device" in err and "TMPDIR" in err
    assert "internal error" not in err and not (tmp_path / "out").exists()


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_process_spills_to_a_file_of_its_own():
    """The online planner forks the run: after go_private a child's new segments go to its own file
    and the segments from before the fork are read without moving the shared file position, so
    two children and the parent never read each other's bytes."""
    import os

    import numpy as np

    from dsim.core.spill import SpillFile
    sf = SpillFile()
    a = sf.put(np.arange(1000, dtype=np.int64))
    pids = []
    for k in (1, 2):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            ok = 0
            try:
                os.close(r)
                SpillFile.go_private()
                b = sf.put(np.full(500, k, dtype=np.int64))
                for _ in range(50):              # interleave with the other child
                    ok += int(np.array_equal(sf.get(a), np.arange(1000)) and np.all(sf.get(b) == k))
                os.write(w, bytes([ok]))
            finally:
                os._exit(0)
        os.close(w)
        pids.append((pid, r))
    for pid, r in pids:
        assert os.read(r, 1) == bytes([50])
        os.close(r)
        os.waitpid(pid, 0)
    c = sf.put(np.full(300, 7, dtype=np.int64))
    assert np.array_equal(sf.get(a), np.arange(1000)) and np.all(sf.get(c) == 7)
