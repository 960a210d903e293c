"""Acceptance models: sampling statistics, interpolation, the shipped published curves."""
from pathlib import Path

import numpy as np
import pytest
import yaml

from dsim.config.errors import ConfigError
from dsim.specdec.acceptance import (CurveAcceptance, GeometricAcceptance, conditional_from_cumulative,
                                     curves_from_published, geometric_rate_for_tau, load_curves,
                                     sample_accepted, tokens_per_step)

ROOT = Path(__file__).resolve().parents[1]
CURVES = ROOT / "dsim" / "data" / "acceptance" / "published_curves.yaml"
CSV = ROOT.parent / "shared" / "data" / "acceptance" / "published_acceptance.csv"


def test_tokens_per_step_by_hand():
    assert tokens_per_step([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert tokens_per_step([1.0, 1.0, 1.0]) == 4.0 and tokens_per_step([0.0, 0.9]) == 1.0


def test_sampling_distribution_matches_the_chain():
    """P(n accepted) = prod_{i<n} a_i (1 - a_n): chi-square-like check on 50,000 seeded draws."""
    probs = (0.9, 0.7, 0.5)
    rng = np.random.default_rng(1)
    n = 50_000
    counts = np.bincount([sample_accepted(rng, probs) for _ in range(n)], minlength=4)
    expect = np.array([0.1, 0.9 * 0.3, 0.9 * 0.7 * 0.5, 0.9 * 0.7 * 0.5]) * n
    assert np.all(np.abs(counts - expect) < 4 * np.sqrt(expect))
    assert 1 + (np.arange(4) * counts).sum() / n == pytest.approx(tokens_per_step(probs), rel=0.01)


def test_cumulative_to_conditional_and_geometric_inverse():
    assert conditional_from_cumulative([0.8, 0.4, 0.1]) == pytest.approx([0.8, 0.5, 0.25])
    with pytest.raises(ValueError):
        conditional_from_cumulative([0.5, 0.6])
    a = geometric_rate_for_tau(3.61, 6)
    assert tokens_per_step([a] * 6) == pytest.approx(3.61, abs=1e-9)
    with pytest.raises(ValueError):
        geometric_rate_for_tau(7.5, 6)


def test_curve_interpolation_and_memo():
    c = CurveAcceptance({"name": "x", "points": [
        {"temperature": 0, "context_len": 0, "conditional": [0.8, 0.6]},
        {"temperature": 0, "context_len": 1023, "conditional": [0.4, 0.2]},
        {"temperature": 1, "context_len": 0, "conditional": [0.6, 0.4]}]})
    mid = int(np.expm1(np.log1p(1023) / 2))
    p = c.probabilities(mid, 2, 0)
    assert p[0] == pytest.approx(0.6, abs=0.01) and p[1] == pytest.approx(0.4, abs=0.01)
    assert c.probabilities(10 ** 6, 2, 0) == pytest.approx((0.4, 0.2))          # clamped
    assert c.probabilities(0, 4, 0) == pytest.approx((0.8, 0.6, 0.6, 0.6))       # k beyond: last rate
    assert c.probabilities(0, 1, 0.5) == pytest.approx((0.7,))                    # between temperatures
    c.probabilities(0, 1, 0.5)
    assert c.probabilities.cache_info().hits >= 1
    assert GeometricAcceptance(0.3).probabilities(100, 3) == (0.3, 0.3, 0.3)


def test_shipped_curves_are_current_and_reproduce_tau_within_3pct():
    if CSV.is_file():
        built = curves_from_published(CSV)
        shipped = yaml.safe_load(CURVES.read_text())["acceptance_curves"]["curves"]
        assert [c["name"] for c in built] == [c["name"] for c in shipped]
    curves = load_curves(CURVES)
    assert len(curves) >= 25
    rng = np.random.default_rng(7)
    for name, c in curves.items():
        k, t = c.meta["k"], c.meta["temperature"]
        probs = c.probabilities(0, k, t)
        sim = 1 + np.mean([sample_accepted(rng, probs) for _ in range(20_000)])
        assert sim == pytest.approx(c.meta["tokens_per_verify_step"], rel=0.03), name


def test_bad_curve_file_errors(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"acceptance_curves": {"spec_version": "1.0", "curves": [
        {"name": "a", "points": [{"conditional": [0.5, 1.5]}]}]}}))
    with pytest.raises(ConfigError, match=r"curves\[0\].points\[0\].conditional"):
        load_curves(p)
    p.write_text(yaml.safe_dump({"acceptance_curves": {"spec_version": "0.9", "curves": []}}))
    with pytest.raises(ConfigError, match="spec_version"):
        load_curves(p)
