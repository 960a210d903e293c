"""Acceptance left to the one pass (SpecRuntime.accept_rows keeps a step's uniforms, the one pass or
decide_rows compares them after the step) against deciding every row at the step's start: the same
requests, round state, rollbacks and random stream, bit for bit; a run stopped at its horizon with a
step under way counts that step's rollbacks too (docs/performance.md, "Round three, second pass")."""
import pytest
from test_specdec_walk import CASES, _outcome, _scn, SPECPP

from dsim.config.scenario import load_scenario
from dsim.metrics.speculation import spec_summary
from dsim.runner import simulate
from dsim.specdec.runtime import SpecRuntime

FUSED_STEP, DECIDE = SpecRuntime.fused_step, SpecRuntime.decide_rows      # before any test wraps them
DEFERRED = {
    "specpp": CASES["specpp"],
    "edf": CASES["edf"],
    "datacenter_fused": CASES["datacenter_fused"],
    # no k_for: every row goes the general way inside the one pass, with the acceptance it decided
    "backoff": _scn({**SPECPP, "gamma": {"policy": "acceptance_backoff"}}),
    # devices, hybrid mode: the target is not fast, _verified's general loop decides the rows first
    "hybrid_rtt": CASES["hybrid_rtt"],
}


def _counted(monkeypatch):
    """(steps the one pass decided, steps decide_rows decided)."""
    seen = [0, 0]

    def step(self, inst, spec, *a):
        seen[0] += id(spec) in self.deferred
        return FUSED_STEP(self, inst, spec, *a)

    def decide(self, rows):
        seen[1] += id(rows) in self.deferred
        return DECIDE(self, rows)
    monkeypatch.setattr(SpecRuntime, "fused_step", step)
    monkeypatch.setattr(SpecRuntime, "decide_rows", decide)
    return seen


@pytest.mark.parametrize("name", sorted(DEFERRED))
def test_acceptance_left_to_the_one_pass_gives_the_step_start_decision_bit_for_bit(name, monkeypatch):
    seen = _counted(monkeypatch)
    later, _ = _outcome(DEFERRED[name], monkeypatch)
    if name == "hybrid_rtt":
        assert seen[1] > 300                         # the general loop decided the rows
    else:
        assert seen[0] > 80 and seen[1] == 0         # the one pass did
    states = later[2]
    assert sum(st[1][6] for st in states) > 50       # rollbacks were counted
    monkeypatch.setattr(SpecRuntime, "defer_accept", False)
    seen[:] = [0, 0]
    now, _ = _outcome(DEFERRED[name], monkeypatch)
    assert seen == [0, 0]
    assert later == now


def test_a_rollback_penalty_or_conditioned_acceptance_is_decided_at_the_step_start(monkeypatch):
    """A penalty lengthens the step by the rows' rejections, so they must be known before it; a
    conditioned acceptance (a rule per domain) is not the one the one pass reads."""
    seen = _counted(monkeypatch)
    simulate(load_scenario(CASES["tight"]))          # rollback_penalty_ms: 0.5
    rules = _scn({**SPECPP, "acceptance_rules": [{"pool": "default", "acceptance": {"geometric": 0.5}}]}, n=20)
    ses = simulate(load_scenario(rules))
    assert ses.spec.cond is not None
    assert seen == [0, 0]


def test_a_step_under_way_at_the_horizon_counts_its_rollbacks(monkeypatch):
    """Stopped at the horizon (drain: false) in the middle of a step: its rows were drawn but not
    compared; the summary's rollbacks are the ones deciding at the step's start gives."""
    scn = {**CASES["datacenter_fused"], "horizon_s": 2.0, "drain": False}

    def rollbacks():
        ses = simulate(load_scenario(scn))
        pending = len(ses.spec.deferred)
        summ = spec_summary(ses.spec, ses.reqs, ses.end, {})
        return pending, summ["rollbacks"], sorted((rid, st.rollbacks) for rid, st in ses.spec.states.items())
    pending, later, per_conv = rollbacks()
    assert pending == 1                              # the step under way
    monkeypatch.setattr(SpecRuntime, "defer_accept", False)
    pending, now, per_conv_now = rollbacks()
    assert pending == 0
    assert later == now > 10 and per_conv == per_conv_now
