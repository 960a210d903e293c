"""Gamma policies: each decision rule checked by hand."""
import numpy as np
import pytest

from dsim.specdec.acceptance import GeometricAcceptance
from dsim.specdec.gamma import (DISTRIBUTED, FUSED, AcceptanceBackoff, BanditGamma, Backpressure, LatencyHead,
                                PIDGamma, SpecPP, StaticGamma, Telemetry)


def test_static():
    assert StaticGamma(5).choose(Telemetry()) == (DISTRIBUTED, 5)
    assert StaticGamma(3, FUSED).choose(Telemetry()) == (FUSED, 3)


def test_acceptance_backoff_aimd():
    p = AcceptanceBackoff(k0=4, k_min=1, k_max=6)
    assert p.choose(Telemetry()) == (DISTRIBUTED, 4)                              # first round
    assert p.choose(Telemetry(last_gamma=4, last_accepted=4))[1] == 5            # all accepted: +1
    assert p.choose(Telemetry(last_gamma=6, last_accepted=6))[1] == 6            # capped at k_max
    assert p.choose(Telemetry(last_gamma=6, last_accepted=2))[1] == 3            # < half: halve
    assert p.choose(Telemetry(last_gamma=1, last_accepted=0))[1] == 1            # floor
    assert p.choose(Telemetry(last_gamma=4, last_accepted=2))[1] == 4            # half: keep


def test_specpp_threshold_without_the_off_by_one():
    # rejection(i) = 1 - 0.9^i: 0.1, 0.19, 0.271, 0.344 -> the last length at or below 0.3 is 3
    p = SpecPP(GeometricAcceptance(0.9), threshold=0.3, k_min=1, k_max=8)
    assert p.choose(Telemetry()) == (DISTRIBUTED, 3)
    assert SpecPP(GeometricAcceptance(0.99), threshold=0.3, k_max=8).choose(Telemetry())[1] == 8   # never crosses
    assert SpecPP(GeometricAcceptance(0.2), threshold=0.3, k_min=2).choose(Telemetry())[1] == 2    # floor


def test_latency_head_linear_rule_fused_switch_and_smoothing():
    # gamma_hat = 10 - 0.05 * rtt_avg: rtt 60 -> 7, rtt 190 -> 0.5 -> clamped 1 -> fused
    w = np.zeros(9)
    w[4] = -0.05
    p = LatencyHead(w, bias=10.0, k_max=8, smoothing=1.0, default_k=4)
    assert p.choose(Telemetry()) == (DISTRIBUTED, 4)               # empty history: default
    p.observe(20, 60, 4)
    p.observe(20, 60, 4)
    assert p.choose(Telemetry()) == (DISTRIBUTED, 7)
    p.observe(20, 190, 7)
    p.observe(20, 190, 7)
    p.observe(20, 190, 7)
    assert p.choose(Telemetry()) == (FUSED, 1)
    s = LatencyHead(w, bias=10.0, smoothing=0.5)
    for _ in range(3):
        s.observe(20, 60, 4)
    assert s.choose(Telemetry())[1] == 7
    for _ in range(3):
        s.observe(20, 190, 7)
    assert s.choose(Telemetry()) == (DISTRIBUTED, 4)               # 0.5 * 1 + 0.5 * 7 = 4: not yet fused
    with pytest.raises(ValueError):
        LatencyHead(np.zeros(3))


def test_latency_head_mlp():
    W = np.zeros((2, 9))
    W[0, 6] = 1.0                                                   # hidden unit 0 reads acceptance_est
    p = LatencyHead([8.0, 0.0], bias=0.0, hidden=(W, np.zeros(2)))
    p.observe(10, 10, 4)
    p.observe(10, 10, 4)
    a = 0.8
    assert p.choose(Telemetry(acceptance_est=a))[1] == round(8 * a / (1 + np.exp(-a)))


def test_backpressure():
    p = Backpressure(k0=4, queue_high=10, queue_low=2, kv_high=0.9, confident=0.6)
    assert p.choose(Telemetry(verify_queue=11))[1] == 3
    assert p.choose(Telemetry(verify_queue=5, kv_utilization=0.95))[1] == 2
    assert p.choose(Telemetry(verify_queue=5))[1] == 2                            # in the band: hold
    assert p.choose(Telemetry(verify_queue=1, acceptance_est=0.5))[1] == 2         # not confident
    assert p.choose(Telemetry(verify_queue=1, acceptance_est=0.7))[1] == 3


def test_pid():
    p = PIDGamma(k0=4, target_queue=8, kp=0.25, ki=0.0, kd=0.0)
    assert p.choose(Telemetry(verify_queue=8))[1] == 4
    assert p.choose(Telemetry(verify_queue=16))[1] == 2            # 4 + 0.25 * (-8)
    assert p.choose(Telemetry(verify_queue=0))[1] == 6
    q = PIDGamma(k0=4, target_queue=8, kp=0.0, ki=0.1, k_max=8)
    ks = [q.choose(Telemetry(verify_queue=0))[1] for _ in range(10)]
    assert ks == sorted(ks) and ks[-1] == 8                        # integral action climbs to the cap
    assert q.integral < 10 * 8                                     # ... and stops integrating there


def test_bandit_finds_the_best_arm():
    rng = np.random.default_rng(0)
    p = BanditGamma(1, 6, c=0.5)
    true = {1: 1.0, 2: 1.6, 3: 2.0, 4: 1.7, 5: 1.2, 6: 0.9}
    picks = []
    for _ in range(600):
        _, k = p.choose(Telemetry())
        p.observe(k, true[k] + rng.normal(0, 0.2))
        picks.append(k)
    assert max(set(picks[-200:]), key=picks[-200:].count) == 3


def test_specpp_memo_shared_by_a_configuration_gives_the_rule_s_choice():
    from dsim.specdec.acceptance import CurveAcceptance
    from dsim.specdec.config import build_policy
    curve = CurveAcceptance({"points": [{"context_len": 10, "conditional": [0.95, 0.9, 0.85, 0.8]},
                                        {"context_len": 5000, "conditional": [0.7, 0.5, 0.4, 0.3]}]})
    memo: dict = {}
    a = build_policy("specpp", {"threshold": 0.5, "k_max": 8}, "fused", curve, memo)
    b = build_policy("specpp", {"threshold": 0.5, "k_max": 8}, "fused", curve, memo)
    ks = set()
    for ctx in (10, 300, 10, 2000, 4999, 300):
        t = Telemetry(context_len=ctx)
        fresh = SpecPP(curve, threshold=0.5, k_max=8)._choose(ctx, 0.0)
        assert a.choose(t) == b.choose(t) == (DISTRIBUTED, fresh)
        ks.add(fresh)
    assert len(ks) > 1 and len(memo[0.0]) == 4
