"""The step log folds old chunks into exact totals and plot points; what stays whole is exact."""
import random

import numpy as np

import dsim.serving.steplog as steplog
from dsim.serving.steplog import StepLog


def _fill(log: StepLog, n: int, seed: int = 5) -> list:
    rng = random.Random(seed)
    rows, t = [], 0.0
    for _ in range(n):
        t += rng.random() * 0.01
        row = (t, rng.random() * 0.01, rng.randint(0, 900), rng.randint(0, 300), rng.randint(0, 256),
               rng.randint(0, 256), rng.randint(0, 5000), rng.randint(0, 10_000))
        log.append(*row)
        rows.append(row)
    return rows


def test_folded_chunks_keep_exact_totals_peaks_and_the_extremes_for_plots(monkeypatch):
    monkeypatch.setattr(steplog, "CHUNK", 100)
    monkeypatch.setattr(steplog, "PLOT_POINTS", 10)
    log = StepLog()
    rows = _fill(log, 1234)
    cols = list(zip(*rows))
    assert log.steps == 1234 and len(log.running) == len(log.t_end) == 1234 % 100     # 12 chunks folded
    assert list(log.t_end) == list(cols[0][-34:])
    assert list(log.dur) == list(cols[1]) and list(log.itl_count) == list(cols[4])    # kept whole
    assert list(log.kv_used) == list(cols[7])
    assert log.total_tokens() == sum(cols[2]) + sum(cols[3])
    assert log.peak_running() == max(cols[5]) and log.peak_waiting() == max(cols[6])
    for name, y in (("running", cols[5]), ("waiting", cols[6]), ("depth", [a + b for a, b in zip(cols[5], cols[6])]),
                    ("kv", cols[7])):
        t, v = log.series(name)
        assert len(t) <= 12 * 10 + 4 and np.all(np.diff(t) > 0)   # time order, the same density throughout
        assert v.max() == max(y) and v.min() == min(y)                     # spikes survive
        assert set(zip(t.tolist(), v.tolist())) <= set(zip(cols[0], map(float, y)))   # real points only


def test_keep_all_keeps_every_step():
    log = StepLog(keep_all=True)
    rows = _fill(log, steplog.CHUNK + 5, seed=2)
    assert list(log.running) == [r[5] for r in rows] and list(log.prefill_tokens) == [r[2] for r in rows]
    assert list(log.t_end) == [r[0] for r in rows]
    assert log.total_tokens() == sum(r[2] + r[3] for r in rows)
