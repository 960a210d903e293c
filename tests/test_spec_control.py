"""Speculation under control (issue 43.7): an action that switches a pool's draft model live
(SetDrafter), and a router that reads acceptance (spec_aware)."""
from pathlib import Path
from types import SimpleNamespace

import pytest

import dsim
from dsim.cluster.control import Controller, SetDrafter, apply_action
from dsim.cluster.routers import SpecAware
from dsim.config.scenario import load_scenario
from dsim.runner import Session, simulate

ROOT = Path(__file__).resolve().parents[1]
PORTFOLIO = str(ROOT / "scenarios" / "drafter_portfolio.yaml")
# the portfolio without escalation: a conversation stays on the drafter it started on
SHORT = ["workload.num_requests=40", "speculation.portfolio.escalate_below=null"]


def test_set_drafter_moves_a_pools_conversations_to_another_drafter():
    """Pinned to 'large' (geometric 0.8) from the start, every conversation drafts with the 8B:
    its fused rounds cost the 8B and its acceptance is the 8B's (a k = 4 chain at 0.8 accepts
    (0.8 + 0.8^2 + 0.8^3 + 0.8^4) / 4 = 0.5904 of its drafts); unpinned, prompts up to 1,024 tokens
    start on 'small' (the 1B's curve: 1.916 of 4 drafts, 0.479) and the mix accepts less."""
    rates = {}
    for pin in (None, "large"):
        ses = Session(load_scenario(PORTFOLIO, SHORT), check_invariants=True)
        if pin:
            rec = apply_action(ses.fleet, SetDrafter("default", pin))
            assert rec == {"action": "set_drafter", "pool": "default", "changed": {"drafter": "large"}}
        ses.run_to_end()
        sts = list(ses.spec.states.values())
        rates[pin] = sum(st.accepted for st in sts) / sum(st.verified for st in sts)
        if pin:
            assert all(st.drafter == 1 for st in sts if st.rounds) and not any(st.escalations for st in sts)
    assert rates["large"] == pytest.approx(0.5904, rel=0.05)
    assert rates[None] < rates["large"] - 0.05


class SwitchAt(Controller):
    interval_s = 5.0

    def __init__(self):
        self.obs = []

    def act(self, obs):
        self.obs.append(obs["pools"]["default"]["speculation"])
        return [SetDrafter("default", "large")] if len(self.obs) == 1 else []


def test_set_drafter_live_from_a_controller_and_the_observation_shows_it():
    ctrl = SwitchAt()
    ses = simulate(load_scenario(PORTFOLIO, SHORT), controllers=[ctrl])
    assert ctrl.obs[0]["drafter"] is None and ctrl.obs[1]["drafter"] == "large"
    # conversations that arrived after the switch (t = 5 s) drafted with the 8B only; some earlier
    # small-drafter conversations moved to it at a round boundary
    late = [st for r, st in ((r, ses.spec.states[r.rid]) for r in ses.reqs) if r.arrival > 5.0 and st.rounds]
    assert late and all(st.drafter == 1 for st in late)
    assert any(st.drafter == 1 for r, st in ((r, ses.spec.states[r.rid]) for r in ses.reqs)
               if r.arrival < 5.0 and r.prompt_len <= 1024)


def test_set_drafter_is_refused_without_a_portfolio_or_with_an_unknown_name():
    ses = Session(load_scenario(PORTFOLIO, SHORT))
    with pytest.raises(ValueError, match="drafter: expected one of small, large"):
        apply_action(ses.fleet, SetDrafter("default", "huge"))
    ses = Session(load_scenario(str(ROOT / "scenarios" / "datacenter_fused.yaml"), ["workload.num_requests=5"]))
    with pytest.raises(ValueError, match="speculation.portfolio"):
        apply_action(ses.fleet, SetDrafter(next(iter(ses.fleet.pools)), "large"))


def view(name, depth, counts, ttft=0.0, cap=100.0):
    return SimpleNamespace(name=name, queue_depth=depth, spec_counts=counts, capacity=cap,
                           predict_ttft=lambda r: ttft)


def test_spec_aware_reads_tau_per_replica_by_hand():
    """tau = 1 + accepted / rounds over >= 32 new rounds, halved with the previous estimate; the
    score is predicted TTFT + N (queue + 1) / (capacity x tau)."""
    import numpy as np
    r = SpecAware(np.random.default_rng(0))
    req = SimpleNamespace(max_tokens=100)
    a, b = view("a", 3, (40, 120)), view("b", 2, (40, 40))          # tau 4 vs 2
    assert r.choose(req, [a, b]) is a                                  # 100*4/400 = 1.0 < 100*3/200 = 1.5
    assert r.est["a"] == [40, 120, 4.0] and r.est["b"] == [40, 40, 2.0]
    a.spec_counts = (60, 180)                                          # only 20 new rounds: estimate kept
    assert r.tau(a) == 4.0
    a.spec_counts = (72, 124)                                          # 32 rounds at tau 1.125: (4 + 1.125) / 2
    assert r.tau(a) == pytest.approx(2.5625)
    c = view("c", 0, None)                                             # not speculative: the others' mean
    b.queue_depth = 9
    assert r.choose(req, [b, c]) is c
    fresh = SpecAware(np.random.default_rng(0))
    assert fresh.choose(req, [view("x", 1, (5, 5), ttft=0.1), view("y", 1, (5, 5))]).name == "y"   # TTFT counts


def test_spec_aware_sends_more_to_the_pool_that_accepts_more():
    """router_spec_aware, shortened: the EAGLE-3 pool (tau about 4.1) gets a larger share under
    spec_aware than under jsq, and under spec_aware when both pools accept alike the shares even out."""
    path = str(ROOT / "scenarios" / "router_spec_aware.yaml")
    short = ["workload.num_requests=160"]

    def share(extra):
        res = dsim.run(path, overrides=short + extra, plots=False)
        return sum(1 for r in res.requests if r.replica.startswith("eagle")) / len(res.requests)
    aware, jsq = share([]), share(["cluster.router=jsq"])
    alike = share(["speculation.acceptance_rules=null"])
    assert aware > jsq + 0.05 and aware > 0.55
    assert abs(alike - 0.5) < 0.07
