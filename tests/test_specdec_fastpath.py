"""The fused rounds' short way (SpecRuntime.fast_target / fused_round) against the general way
(round_done then _next_round): same requests, same per-conversation round state, bit for bit."""
import pytest
from helpers import scenario

from dsim.config.scenario import load_scenario
from dsim.runner import simulate
from dsim.specdec.runtime import SpecRuntime

ROOF = {"model": "roofline"}
CURVE = {"curve": "draft-model-llama-3.1-8b-instruct-cnn-dm-gsm8k-humaneval-held-out"}
STATE = ("rounds", "verified", "accepted", "drafted", "fused_rounds", "dist_rounds", "rollbacks", "tvt_max",
         "acc_est", "tpot_est", "last_k", "last_a", "k", "drafted_now", "t_ready", "t_last", "deadline")


def _scn(spec, **kw):
    return scenario(latency=ROOF, workload={"type": "poisson", "rate": 40, "num_requests": 60,
                                            "prompt_tokens": {"dist": "lognormal", "mean": 400, "std": 300,
                                                              "min": 16, "max": 2000},
                                            "output_tokens": {"dist": "lognormal", "mean": 120, "std": 80,
                                                              "min": 8, "max": 400}},
                    slo={"ttft_ms": 300, "tpot_ms": 30, "tvt_ms": 60}, speculation=spec, **kw)


def _outcome(scn):
    ses = simulate(load_scenario(scn), check_invariants=True)
    reqs = sorted((r.rid, r.t_first_token, r.t_completion, r.n_out, r.energy_j, r.kv_peak_bytes) for r in ses.reqs)
    states = sorted((rid, tuple(getattr(st, f) for f in STATE)) for rid, st in ses.spec.states.items())
    return reqs, states


CASES = {
    "specpp": {"mode": "fused", "acceptance": CURVE, "gamma": {"policy": "specpp", "threshold": 0.6, "k_max": 8},
               "cold_start": {"initially_warm": True}},
    "static_penalty": {"mode": "fused", "acceptance": CURVE, "gamma": {"k": 5},
                       "partial_verification": {"rollback_penalty_ms": 0.5}, "cold_start": {"initially_warm": True}},
    "edf": {"mode": "fused", "acceptance": {"geometric": 0.7}, "gamma": {"k": 3}, "verify_order": "edf",
            "cold_start": {"initially_warm": True}},
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_short_way_gives_the_general_way_bit_for_bit(name, monkeypatch):
    scn = _scn(CASES[name])
    taken = []
    orig = SpecRuntime.fused_round

    def counting(self, *a):
        taken.append(1)
        return orig(self, *a)
    monkeypatch.setattr(SpecRuntime, "fused_round", counting)
    fast = _outcome(scn)
    assert len(taken) > 500                          # the short way did carry the run
    monkeypatch.setattr(SpecRuntime, "fast_target", lambda self, inst: None)
    init = SpecRuntime.__init__

    def general_only(self, *a, **kw):                              # _next_round's fast path off too
        init(self, *a, **kw)
        self._fused_fast = False
    monkeypatch.setattr(SpecRuntime, "__init__", general_only)
    taken.clear()
    general = _outcome(scn)
    assert not taken
    assert fast == general


def test_a_cold_drafter_takes_the_general_way(monkeypatch):
    """A drafter that can go cold (initially_warm false) keeps every round on the general way,
    where the cold start and the warm retention are handled."""
    taken = []
    orig = SpecRuntime.fused_round
    monkeypatch.setattr(SpecRuntime, "fused_round", lambda self, *a: (taken.append(1), orig(self, *a)))
    ses = simulate(load_scenario(_scn({"mode": "fused", "acceptance": CURVE, "gamma": {"k": 4},
                                       "cold_start": {"initially_warm": False}})))
    assert not taken
    assert sum(t.cold_starts for t in ses.spec.targets.values()) >= 1


def test_a_subclass_with_its_own_choose_does_not_inherit_k_for():
    """The fast path asks ``k_for`` instead of ``choose``: a policy that overrides choose() only
    would have been skipped silently."""
    from dsim.specdec.gamma import DISTRIBUTED, SpecPP, StaticGamma

    class Mine(StaticGamma):
        def choose(self, t):
            return DISTRIBUTED, 1

    class Both(StaticGamma):
        def choose(self, t):
            return DISTRIBUTED, 2

        def k_for(self, context_len, temperature):
            return 2

    assert Mine.k_for is None and Both(3).k_for(10, 0.0) == 2
    assert StaticGamma.k_for is not None and SpecPP.k_for is not None
