"""workload.burst_factor (seed 002 Appendix A item 4) on poisson arrivals and trace replay, and a
trace's prompt / output length overrides (seed 002 section 4, ``prompt_length_override``)."""
import json

import numpy as np
import pytest

from dsim.config.errors import ConfigError
from dsim.core.rng import PartitionedRNG
from dsim.workload.generator import build_workload

POISSON = {"type": "poisson", "rate": 20, "duration_s": 20000, "prompt_tokens": 100, "output_tokens": 10}


def build(wl, seed=3):
    w, desc = build_workload(wl, PartitionedRNG(seed), None)
    return w, desc


def counts(times, window, span):
    return np.bincount((np.asarray(times) // window).astype(int), minlength=int(span / window))[:int(span / window)]


def rows(w):
    return [(r.arrival, r.prompt_len, r.max_tokens, r.segments, r.session, r.tenant) for r in w]


@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 10.0])
def test_poisson_burst_factor_is_the_variance_to_mean_ratio_of_counts(factor):
    """Compound Poisson: in every window the count's variance / mean is the factor, at the same rate.
    400,000 arrivals (fixed seed) in 20,000 windows of 1 s and 2,000 of 10 s: the ratio must be within
    10 % of the factor (the estimate's relative standard error, sqrt(2 / windows), is 1 % and 3 %),
    the rate within 3 %."""
    w, _ = build({**POISSON, "burst_factor": factor})
    t = w.arrival_times()
    assert len(t) / 20000 == pytest.approx(20, rel=0.03)
    for window in (1.0, 10.0):
        c = counts(t, window, 20000)
        assert c.var() / c.mean() == pytest.approx(factor, rel=0.10), window
    if factor > 1:      # bursts are simultaneous arrivals of mean size (factor + 1) / 2
        _, size = np.unique(t, return_counts=True)
        assert size.mean() == pytest.approx((factor + 1) / 2, rel=0.05)


def test_burst_factor_one_is_byte_identical_to_no_factor(tmp_path):
    plain, d0 = build(POISSON)
    one, d1 = build({**POISSON, "burst_factor": 1})
    assert rows(plain) == rows(one) and d0 == d1
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps({"arrival_s": 0.37 * i, "prompt_tokens": 10 + i, "output_tokens": 5}) + "\n"
                         for i in range(50)))
    trace = {"type": "trace", "path": str(p)}
    a, da = build(trace)
    b, db = build({**trace, "burst_factor": 1.0})
    assert rows(a) == rows(b) and da == db


def poisson_trace(tmp_path, n=50000, rate=10.0):
    t = np.cumsum(np.random.default_rng(1).exponential(1 / rate, n))
    p = tmp_path / "poisson.jsonl"
    p.write_text("".join(json.dumps({"arrival_s": float(x), "prompt_tokens": 100 + i % 7, "output_tokens": 10 + i % 5})
                         + "\n" for i, x in enumerate(t)))
    return p, t


def test_trace_bursts_group_consecutive_requests_at_the_first_ones_time(tmp_path):
    p, recorded = poisson_trace(tmp_path)
    w, desc = build({"type": "trace", "path": str(p), "burst_factor": 5})
    got = w.arrival_times()
    reqs = list(w)
    # same requests in the same order; none later than recorded; each at a recorded time
    assert [(r.prompt_len, r.max_tokens) for r in reqs] == [(100 + i % 7, 10 + i % 5) for i in range(len(recorded))]
    assert np.all(got <= recorded) and np.all(np.diff(got) >= 0) and np.isin(got, recorded).all()
    assert desc["burst_factor"] == 5
    # bursts: simultaneous groups of geometric size, E[N^2] / E[N] = 5 (mean 3), within 3 %
    _, size = np.unique(got, return_counts=True)
    assert size.mean() == pytest.approx(3, rel=0.03)
    assert (size ** 2).mean() / size.mean() == pytest.approx(5, rel=0.03)
    # the trace was Poisson (ratio 1): windows short against a burst's span (3 / 10 req/s) see the
    # factor (within 5 %); long ones keep the trace's own ratio (within 15 % of 1 at 10 s)
    span = float(recorded[-1])
    c0 = counts(recorded, 0.002, span)
    assert c0.var() / c0.mean() == pytest.approx(1, rel=0.05)
    short = counts(got, 0.002, span)
    assert short.var() / short.mean() == pytest.approx(5, rel=0.05)
    long = counts(got, 10.0, span)
    assert long.var() / long.mean() == pytest.approx(1, rel=0.15)


def test_burst_factor_is_refused_below_one_and_with_infinite_rate():
    with pytest.raises(ConfigError, match=r"^workload.burst_factor"):
        build({**POISSON, "burst_factor": 0.5})
    with pytest.raises(ConfigError, match=r"^workload.burst_factor"):
        build({"type": "poisson", "rate": "inf", "num_requests": 10, "prompt_tokens": 1, "output_tokens": 1,
               "burst_factor": 2})


def test_length_overrides_replace_the_traces_lengths_and_keep_its_arrivals(tmp_path):
    p, recorded = poisson_trace(tmp_path, n=2000)
    base = {"type": "trace", "path": str(p)}
    w, _ = build({**base, "prompt_length_override": 300,
                  "output_length_override": {"dist": "uniform", "low": 20, "high": 40}})
    reqs = list(w)
    assert np.array_equal(w.arrival_times(), recorded)
    assert {r.prompt_len for r in reqs} == {300}
    outs = np.array([r.max_tokens for r in reqs])
    assert outs.min() == 20 and outs.max() == 40 and outs.mean() == pytest.approx(30, abs=0.5)
    # only the output overridden: the prompts stay the trace's
    w2, _ = build({**base, "output_length_override": 7})
    assert [(r.prompt_len, r.max_tokens) for r in w2] == [(100 + i % 7, 7) for i in range(2000)]


def test_prompt_override_and_trace_content(tmp_path):
    # prefix groups share their first prefix_tokens of the new lengths
    p = tmp_path / "g.jsonl"
    p.write_text("".join(json.dumps({"arrival_s": i, "prompt_tokens": 50, "output_tokens": 5, "prefix_group": 0})
                         + "\n" for i in range(4)))
    w, _ = build({"type": "trace", "path": str(p), "prefix_tokens": 30, "prompt_length_override": 80})
    assert all(r.prompt_len == 80 and r.segments[0] == (1, 30) and sum(n for _, n in r.segments) == 80 for r in w)
    # Mooncake block ids cover the new prompt as far as they go
    m = tmp_path / "m.jsonl"
    m.write_text(json.dumps({"timestamp": 0, "input_length": 1024, "output_length": 8, "hash_ids": [1, 2]}) + "\n")
    (r,) = list(build({"type": "trace", "path": str(m), "prompt_length_override": 600})[0])
    assert sum(n for _, n in r.segments) == 600 and r.segments[1][1] == 88
    # rows that give their own segments cannot take a new prompt length
    s = tmp_path / "s.jsonl"
    s.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1, "segments": [[1, 3]]}) + "\n")
    with pytest.raises(ConfigError, match=r"^workload.prompt_length_override"):
        build({"type": "trace", "path": str(s), "prompt_length_override": 9})
    assert list(build({"type": "trace", "path": str(s), "output_length_override": 9})[0])[0].max_tokens == 9
