"""Out-of-core statistics give the in-memory bytes: numpy's summation tree and the stable sort."""
import numpy as np
import pytest

import dsim.metrics.exact as exact
from dsim.core.spill import SpillFile
from dsim.metrics.exact import pairwise_sum, weighted_stats_chunked, weighted_stats_owned

PCTS = (50, 90, 95, 99, 99.9)


def _chunks(a, rng):
    """``a`` cut at random places (empty pieces included)."""
    return np.split(a, np.sort(rng.integers(0, a.size + 1, 12)))


@pytest.mark.parametrize("n", [0, 1, 7, 129, 65_536, 65_537, 300_001, 1_000_003])
def test_pairwise_sum_is_numpys_sum_bit_for_bit(n):
    rng = np.random.default_rng(n)
    a = rng.lognormal(0.0, 4.0, n) * rng.choice([-1.0, 1.0], n)     # wide range, cancellation: order shows
    assert pairwise_sum(iter(_chunks(a, rng)), n) == float(a.sum())
    if n > 1000:                                    # and a plain left-to-right sum would not be
        assert float(np.cumsum(a)[-1]) != float(a.sum())


@pytest.mark.parametrize("n,mem", [(5_000, 512), (120_000, 4096), (400_003, 65_536)])
def test_the_bucketed_sort_gives_the_in_memory_statistics(n, mem, monkeypatch):
    rng = np.random.default_rng(n)
    v = np.round(rng.lognormal(-5.0, 1.0, n), 5)     # many ties: their input order matters to the sums
    w = rng.integers(0, 40, n).astype(np.int32)      # weight 0: left out
    ref = weighted_stats_owned(v * 1e3, w.copy(), PCTS)
    cuts = np.sort(rng.integers(0, n + 1, 12))
    pieces = list(zip(np.split(v, cuts), np.split(w, cuts)))
    assert weighted_stats_chunked(lambda: iter(pieces), PCTS, scale=1e3) == ref      # in memory
    monkeypatch.setattr(exact, "MEM_ITEMS", mem)
    spill = SpillFile()
    got = weighted_stats_chunked(lambda: iter(pieces), PCTS, scale=1e3, spill=spill)
    assert spill.nbytes > 0                         # it went out of core
    assert got == ref


def test_one_value_repeated_fills_one_bucket(monkeypatch):
    monkeypatch.setattr(exact, "MEM_ITEMS", 64)
    v = np.full(10_000, 7.25)
    w = np.arange(1, 10_001) % 3 + 1
    got = weighted_stats_chunked(lambda: iter([(v[:5000], w[:5000]), (v[5000:], w[5000:])]), PCTS)
    assert got == weighted_stats_owned(v.copy(), w.copy(), PCTS)
    assert got["min"] == got["max"] == got["p99.9"] == 7.25 and got["count"] == int(w.sum())


def test_no_values_counts_zero():
    assert weighted_stats_chunked(lambda: iter(()), PCTS) == {"count": 0}


def _numpy_cases():
    """Arrays numpy's quantile code treats differently: one value, ties, even and odd lengths,
    negatives, a wide range, integers, and NaN."""
    rng = np.random.default_rng(7)
    yield np.array([3.5])
    yield np.array([2.0, 1.0])
    yield rng.integers(0, 4, 101).astype(float)
    yield np.round(rng.random(1000) * 100, 1)
    yield rng.lognormal(0, 3, 777) - rng.lognormal(0, 3, 777)
    yield rng.integers(-50, 50, 64)
    yield np.array([1.0, np.nan, 3.0])
    for n in rng.integers(1, 5000, 40):
        yield rng.lognormal(-3, 2, n)


def test_percentiles_and_median_are_numpys_bit_for_bit():
    qs = [0, 0.1, 1, 25, 50, 90, 95, 99, 99.9, 100, 33.333333]
    for a in _numpy_cases():
        assert exact.percentiles(a, qs).tobytes() == np.percentile(a, qs).tobytes()
        assert float(exact.percentiles(a, 99)) == float(np.percentile(a, 99)) or np.isnan(a).any()
        m = exact.median(a)
        assert (np.isnan(m) and np.isnan(np.median(a))) or m == float(np.median(a))
        u = exact.sorted_unique(a)
        assert u.dtype == np.unique(a).dtype and np.array_equal(u, np.unique(a), equal_nan=True)
    with pytest.raises(ValueError):
        exact.percentiles([], [50])
    with pytest.raises(ValueError):
        exact.percentiles([1.0], [101])


def test_a_short_run_does_not_load_numpy_ma(tmp_path):
    """np.percentile / np.median / np.unique import numpy.ma on first use (about 20 ms of a short
    run's start-up); the run path uses dsim.metrics.exact's equivalents instead."""
    import subprocess
    import sys
    code = ("import sys, numpy\n"
            "if 'numpy.ma' in sys.modules: print('numpy-itself'); raise SystemExit\n"
            "import dsim, dsim.shipped\n"
            f"dsim.run(dsim.shipped.resolve('quickstart'), {str(tmp_path / 'out')!r}, plots=False,\n"
            "         overrides=['workload.num_requests=60'])\n"
            "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    if out.strip() == "numpy-itself":
        pytest.skip("this numpy imports numpy.ma on import")
    assert out.strip() == "False"


def test_line_slope_is_polyfits_bit_for_bit():
    """The summary's queueing-delay trend fits without polyfit's input copies (``line_slope``):
    the same slope bits on delays of every shape (noisy, rounded, linear, huge spans), and
    polyfit's warning where the fit is rank-deficient."""
    from dsim.metrics.measures import delay_trend, line_slope
    rng = np.random.default_rng(7)
    for i in range(400):
        n = int(rng.integers(3, 3000))
        t = np.sort(rng.uniform(0, 10.0 ** rng.uniform(0, 9), n))
        q = rng.normal(0, 1, n).cumsum() * rng.uniform(1e-6, 10) + rng.uniform(-1, 1) * t
        if i % 5 == 0:
            q = np.round(q, 2)
        want = float(np.polyfit(t - t.min(), q, 1)[0])
        assert line_slope(t - t.min(), q) == want and delay_trend(t, q) == want
    x, y = np.full(5, 2.0), np.arange(5.0)              # one x value: rank 1
    with pytest.warns(np.exceptions.RankWarning):
        want = float(np.polyfit(x, y, 1)[0])
    with pytest.warns(np.exceptions.RankWarning):
        assert line_slope(x.copy(), y) == want
    assert line_slope(np.arange(4, dtype=np.int64), y[:4]) == float(np.polyfit(np.arange(4), y[:4], 1)[0])
