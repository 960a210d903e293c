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
