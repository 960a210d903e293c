"""Arrival processes, length distributions, trace readers and shared prefixes."""
from pathlib import Path

import numpy as np
import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.config.schema.workload import parse_workload
from dsim.core.rng import PartitionedRNG
from dsim.workload.arrivals import generate_arrivals
from dsim.workload.generator import build_requests
from dsim.workload.lengths import sample_lengths

AZURE = Path(__file__).resolve().parents[1] / "scenarios/data/azure-llm-2023/AzureLLMInferenceTrace_code.csv"


def arrivals(**kw):
    return generate_arrivals(parse_workload({"prompt_tokens": 1, "output_tokens": 1, **kw}), np.random.default_rng(0))


def lengths(spec, n, rng):
    """``spec`` as the typed prompt_tokens of a workload, sampled."""
    typed = parse_workload({"type": "constant", "rate": 1, "num_requests": 1, "prompt_tokens": spec,
                            "output_tokens": 1}).prompt_tokens
    return sample_lengths(typed, "x", n, rng, None)


def test_poisson_and_gamma_rates_and_burstiness():
    p = arrivals(type="poisson", rate=20, num_requests=20000)
    g = np.diff(p)
    assert len(p) == 20000 and g.mean() == pytest.approx(1 / 20, rel=0.03)
    assert g.std() / g.mean() == pytest.approx(1.0, abs=0.05)
    ga = np.diff(arrivals(type="gamma", rate=20, cv=3.0, num_requests=20000))
    assert ga.mean() == pytest.approx(1 / 20, rel=0.08) and ga.std() / ga.mean() == pytest.approx(3.0, rel=0.1)


def test_constant_duration_and_staged():
    c = arrivals(type="constant", rate=4, duration_s=10)
    assert len(c) == 40 and np.allclose(np.diff(c), 0.25)
    s = arrivals(type="staged", stage_arrivals="constant",
                 stages=[{"rate": 2, "duration_s": 5}, {"rate": 10, "duration_s": 2}])
    assert len(s) == 10 + 20 and (s[:10] < 5).all() and (s[10:] >= 5).all()


def test_burst_has_quiet_phases_and_triple_rate():
    b = arrivals(type="burst", rate=10, quiet_s=5, burst_s=10, burst_multiplier=3, duration_s=150)
    phase = b % 15
    assert (phase >= 5).all()                              # nothing in the quiet 5 s
    assert len(b) / (10 * 10) == pytest.approx(30, rel=0.05)  # 10 cycles x 10 s x 30 req/s


def test_ramp_density_grows_linearly():
    r = arrivals(type="ramp", rate=50, ramp_s=100, duration_s=100)
    first, second = (r < 50).sum(), (r >= 50).sum()
    assert second / first == pytest.approx(3.0, rel=0.1)   # integral of t over [50,100] vs [0,50]
    assert len(r) == pytest.approx(50 * 100, rel=0.05)     # mean rate = rate (0 -> 2x rate)


def test_length_distributions(tmp_path):
    rng = np.random.default_rng(1)
    n = lengths({"dist": "normal", "mean": 256, "std": 100, "min": 2, "max": 800}, 50000, rng)
    assert n.min() >= 2 and n.max() <= 800 and n.mean() == pytest.approx(256, rel=0.02)
    ln = lengths({"dist": "lognormal", "mean": 500, "std": 300}, 100000, rng)
    assert ln.mean() == pytest.approx(500, rel=0.02) and ln.std() == pytest.approx(300, rel=0.05)
    u = lengths({"dist": "uniform", "low": 3, "high": 5}, 1000, rng)
    assert set(u.tolist()) == {3, 4, 5}
    f = tmp_path / "lens.csv"
    f.write_text("a,len\n1,7\n2,9\n")
    e = lengths({"dist": "empirical", "path": str(f), "column": "len"}, 1000, rng)
    assert set(e.tolist()) == {7, 9}


def test_azure_trace_reader():
    rq, _ = build_requests({"type": "trace", "path": str(AZURE), "num_requests": 100}, PartitionedRNG(0), None)
    assert rq[0].arrival == 0.0 and (rq[0].prompt_len, rq[0].max_tokens) == (4808, 10)
    assert rq[1].arrival == pytest.approx(0.052, abs=1e-6) and rq[1].prompt_len == 3180
    assert all(a.arrival <= b.arrival for a, b in zip(rq, rq[1:]))


def test_shared_prefix_multi_turn_segments():
    wl = {"type": "constant", "rate": 1, "num_requests": 40, "prompt_tokens": 30, "output_tokens": 10,
          "shared_prefix": {"num_groups": 2, "users_per_group": 2, "system_prompt_len": 64, "multi_turn": True,
                            "max_context_tokens": 400}}
    rq, _ = build_requests(wl, PartitionedRNG(0), None)
    for r in rq:
        assert r.segments[0] == (r.prefix_group + 1, 64)
        assert r.prompt_len == sum(n for _, n in r.segments) <= 400
    # some request continues an earlier conversation: it carries that request's answer segment
    assert any(any(sid < 0 for sid, _ in r.segments) for r in rq)


def test_question_pool_cycles_or_shuffles_a_fixed_set_of_prompts():
    base = {"type": "constant", "rate": 1, "num_requests": 25, "prompt_tokens": {"dist": "uniform", "low": 10,
            "high": 90}, "output_tokens": 10}
    sp = {"num_groups": 2, "users_per_group": 3, "system_prompt_len": 32, "question_pool": True}
    cyc, _ = build_requests({**base, "shared_prefix": {**sp, "order": "cycle"}}, PartitionedRNG(0), None)
    assert [r.session for r in cyc] == [i % 6 for i in range(25)]
    assert all(r.segments == cyc[i % 6].segments for i, r in enumerate(cyc))     # the same prompt, same length
    shuf, _ = build_requests({**base, "shared_prefix": {**sp, "order": "shuffled_cycle"}}, PartitionedRNG(0), None)
    first = [r.session for r in shuf[:6]]
    assert sorted(first) == list(range(6)) and [r.session for r in shuf] == [first[i % 6] for i in range(25)]
    rnd, _ = build_requests({**base, "shared_prefix": sp}, PartitionedRNG(0), None)
    assert len({r.segments for r in rnd}) <= 6                                   # random picks from the pool
    for bad, where in (({**sp, "question_pool": False, "order": "cycle"}, "order"),
                       ({**sp, "multi_turn": True}, "question_pool")):
        with pytest.raises(ConfigError, match=f"workload.shared_prefix.{where}"):
            build_requests({**base, "shared_prefix": bad}, PartitionedRNG(0), None)


def test_prefix_cache_hits_after_first_request(tmp_path):
    t = tmp_path / "t.jsonl"
    t.write_text('{"arrival_s": 0, "prompt_tokens": 100, "output_tokens": 2, "prefix_group": 0}\n'
                 '{"arrival_s": 1, "prompt_tokens": 120, "output_tokens": 2, "prefix_group": 0}\n'
                 '{"arrival_s": 2, "prompt_tokens": 120, "output_tokens": 2}\n')
    from helpers import scenario
    res = dsim.run(scenario(workload={"type": "trace", "path": str(t), "prefix_tokens": 80},
                            engine={"enable_prefix_caching": True}))
    r = {x.rid: x for x in res.requests}
    assert r[0].cached_tokens == 0
    assert r[1].cached_tokens == 80     # 5 full blocks of the shared 80-token prefix
    assert r[2].cached_tokens == 0      # no group: unique prompt
    off = dsim.run(scenario(workload={"type": "trace", "path": str(t), "prefix_tokens": 80},
                            engine={"enable_prefix_caching": False}))
    assert all(x.cached_tokens == 0 for x in off.requests)
    # a long hit shortens a compute-bound prefill: the second request's TTFT drops with caching on
    long = tmp_path / "long.jsonl"
    long.write_text('{"arrival_s": 0, "prompt_tokens": 4000, "output_tokens": 2, "prefix_group": 0}\n'
                    '{"arrival_s": 1, "prompt_tokens": 4000, "output_tokens": 2, "prefix_group": 0}\n')

    def ttft1(cache):
        res = dsim.run(scenario(workload={"type": "trace", "path": str(long)}, latency={"model": "roofline", "alpha": [0, 0, 0]},
                                engine={"enable_prefix_caching": cache, "max_num_batched_tokens": 8192}))
        x = max(res.requests, key=lambda q: q.rid)
        return x.cached_tokens, x.t_first_token - x.arrival
    (hit_on, ttft_on), (hit_off, ttft_off) = ttft1(True), ttft1(False)
    assert (hit_on, hit_off) == (3984, 0)
    assert ttft_on < 0.2 * ttft_off


FIX = Path(__file__).resolve().parent / "fixtures" / "traces"


def test_trace_rate_rescales_to_the_exact_mean_rate():
    rq, desc = build_requests({"type": "trace", "path": str(AZURE), "num_requests": 500, "rate": 12.5},
                              PartitionedRNG(0), None)
    span = rq[-1].arrival - rq[0].arrival
    assert rq[0].arrival == 0.0 and (len(rq) - 1) / span == pytest.approx(12.5, rel=1e-12)
    raw, _ = build_requests({"type": "trace", "path": str(AZURE), "num_requests": 500}, PartitionedRNG(0), None)
    ratio = [a.arrival / b.arrival for a, b in zip(rq[1:], raw[1:])]
    assert max(ratio) == pytest.approx(min(ratio), rel=1e-9)          # one time scale, order kept
    assert desc["rate"] == 12.5
    with pytest.raises(ConfigError, match="either rate or time_scale"):
        build_requests({"type": "trace", "path": str(AZURE), "rate": 2, "time_scale": 2}, PartitionedRNG(0), None)


def test_burstgpt_reader_drops_failed_requests():
    rq, _ = build_requests({"type": "trace", "path": str(FIX / "burstgpt_sample.csv")}, PartitionedRNG(0), None)
    assert [(r.arrival, r.prompt_len, r.max_tokens) for r in rq] == [
        (5.0, 472, 18), (118.0, 417, 276), (131.0, 1360, 281), (169.0, 1141, 125)]


def test_mooncake_hash_ids_become_prefix_cache_identity():
    rq, _ = build_requests({"type": "trace", "path": str(FIX / "mooncake_sample.jsonl")}, PartitionedRNG(0), None)
    assert [r.arrival for r in rq] == [0.0, 0.25, 0.5, 1.5]              # milliseconds -> seconds
    a, b, c, d = (r.segments for r in rq)
    assert [ln for _, ln in a] == [512, 512, 176] and sum(ln for _, ln in b) == 1100
    assert a[:2] == b[:2] and a[2][0] != b[2][0]                          # ids 0,1 shared, 2 vs 3 differ
    assert not set(x for x, _ in c) & set(x for x, _ in a)
    assert d[:2] == a[:2] and d[2][1] == 2000 - 1024                       # beyond the ids: a unique tail
    # served: the second request hits the first's two shared blocks (1024 tokens) in the prefix cache
    res = dsim.run({"model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                    "workload": {"type": "trace", "path": str(FIX / "mooncake_sample.jsonl")}})
    assert [r.cached_tokens for r in res.requests] == [0, 1024, 0, 1024]


def test_closed_loop_concurrency_is_never_exceeded_and_clocks_start_when_sent():
    from dsim.runner import simulate
    scn = dsim.load_scenario({"model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
                              "workload": {"type": "poisson", "rate": "inf", "num_requests": 60, "max_concurrency": 4,
                                           "prompt_tokens": 300, "output_tokens": 40}})
    ses = simulate(scn)
    assert ses.peak_in_flight == 4
    events = sorted([(r.arrival, 1) for r in ses.reqs] + [(r.t_completion, -1) for r in ses.reqs],
                    key=lambda e: (e[0], e[1]))
    level = peak = 0
    for _, d in events:
        level += d
        peak = max(peak, level)
    assert peak == 4                                                       # from the timestamps alone
    assert sum(1 for r in ses.reqs if r.arrival == 0.0) == 4               # the rest wait for a slot
    open_loop = simulate(dsim.load_scenario({**scn.raw, "workload": {**scn.raw["workload"], "max_concurrency": 60}}))
    assert max(r.t_first_token - r.arrival for r in ses.reqs) < max(
        r.t_first_token - r.arrival for r in open_loop.reqs)
