"""The shipped physics defaults (dsim/latency/coefficients/physics_default.yaml) have the structure
docs/latency-models.md documents term by term, and the fit's linearisation is exact at its point."""
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import fit_physics as F  # noqa: E402

from dsim.latency.physics import DEFAULT_COEFFS, load_coefficients  # noqa: E402

# zero by a documented physical reason (docs/latency-models.md, "Default coefficients, term by term")
ZERO_BETA = {6, 9, 10, 11}          # prefill share, GQA ratio, 1/tokens, preemption EMA (0-based)
ZERO_ALPHA = {0, 1, 2, 4, 5, 6, 7, 8, 9, 10}


def test_shipped_defaults_are_the_fitted_groups_and_the_documented_zeros():
    c = load_coefficients(DEFAULT_COEFFS)
    p = F.values_of(DEFAULT_COEFFS, F.GROUPS)          # exits if the file is not of this structure
    alpha, beta = F.coefficients(F.GROUPS, p)
    assert np.allclose(alpha, c.alpha) and np.allclose(beta, c.beta)
    assert {i for i, v in enumerate(c.alpha) if v == 0} == ZERO_ALPHA
    fitted_zero = {i for (members, *_), v in zip(F.GROUPS.values(), p) if v == 0 for side, i in members if side == "b"}
    assert {i for i, v in enumerate(c.beta) if v == 0} == ZERO_BETA | fitted_zero
    for (members, lo, hi, *_), v in zip(F.GROUPS.values(), p):    # every group inside its physical range
        assert lo <= v <= hi, members
    assert c.beta[12] == c.beta[13] == 1.0                       # CPU-offload times at the physical rate
    fitted = c.trained_on["fitted"]
    assert fitted["compute_scale"] >= 1 and fitted["memory_scale"] >= 1     # never faster than the datasheet


def test_linearisation_reproduces_the_simulation_at_its_point():
    rng = np.random.default_rng(0)
    p = [1.3, 1.2, 2.0, 1e-3, 0.0, 0.0, 1e-3, 0.02]
    rows = [("run", "s", "tpot", float(rng.uniform(0.01, 1)), float(rng.uniform(0.01, 1)),
             rng.uniform(0, 1, F.P.N_ALPHA + F.P.N_BETA)) for _ in range(12)]
    A, y = F.design(rows, F.GROUPS, p)
    assert np.allclose(A @ np.asarray(p) - y, [sim / real - 1 for *_, real, sim, _ in rows], atol=1e-12)
    # a group moved by d changes each prediction by (sensitivity of its members) x d / real
    q = list(p)
    q[0] += 0.1
    members = [F.P.N_ALPHA + i for _, i in F.GROUPS["compute_scale"][0]]
    got = A @ np.asarray(q) - y - (A @ np.asarray(p) - y)
    want = [0.1 * sum(sens[j] for j in members) / real for *_, real, _, sens in rows]
    assert np.allclose(got, want, atol=1e-12)
