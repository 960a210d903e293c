"""Acceptance conditioned per request (issue 43.1): temperature and top_p carried by the request
(a tenant's keys, a trace's columns), domain labels and pools matched by speculation.acceptance_rules."""
import json

import pytest
from helpers import scenario

from dsim.config.errors import ConfigError
from dsim.config.scenario import load_scenario
from dsim.runner import simulate
from dsim.specdec.acceptance import GeometricAcceptance, tokens_per_step
from dsim.specdec.conditioning import TopP
from dsim.specdec.config import SHIPPED_CURVES
from dsim.specdec.acceptance import load_curves

ROOF = {"model": "roofline"}
EAGLE3 = "eagle-3-llama-3.1-8b-mt-bench"          # merged T=0 / T=1 curve (6.13 / 4.24 tokens per step)


def tenant(name, n, **keys):
    return {"name": name, "type": "poisson", "rate": 20, "num_requests": n, "prompt_tokens": 64,
            "output_tokens": 200, **keys}


def mix_scn(spec, *tenants, **kw):
    return scenario(latency=ROOF, workload={"type": "mix", "classes": list(tenants)},
                    speculation={"mode": "fused", "gamma": {"k": 8}, **spec}, **kw)


def run(s):
    return simulate(load_scenario(s), check_invariants=True)


def per_domain(ses):
    from dsim.metrics.speculation import by_domain
    return by_domain([(r, ses.spec.states[r.rid]) for r in ses.reqs], ses.spec.domain_of)


def test_top_p_blends_greedy_and_hot_acceptance_by_hand():
    """a(T, p) = a(0) + p (a(T) - a(0)) per position: on the EAGLE-3 MT-bench curve (geometric
    0.900187 at T=0, 0.793598 at T=1), T=1 and top_p=0.5 gives 0.8468925 at every position; T=0
    is untouched; top_p=1 is the curve."""
    c = load_curves(SHIPPED_CURVES)[EAGLE3]
    assert TopP(c, 0.5).probabilities(0, 3, 1.0) == pytest.approx((0.8468925,) * 3, abs=1e-6)
    assert TopP(c, 0.5).probabilities(0, 3, 0.0) == c.probabilities(0, 3, 0.0)
    assert TopP(c, 1.0).probabilities(100, 4, 0.7) == pytest.approx(c.probabilities(100, 4, 0.7))
    # the merged curve interpolates the published temperatures: tau(T=1) = 4.24, tau(T=0) = 6.13
    assert tokens_per_step(c.probabilities(0, 8, 1.0)) == pytest.approx(4.24, abs=1e-3)
    assert tokens_per_step(c.probabilities(0, 8, 0.0)) == pytest.approx(6.13, abs=1e-3)
    g = GeometricAcceptance(0.6)                 # no temperature dependence: top_p moves nothing
    assert TopP(g, 0.3).probabilities(0, 2, 1.0) == (0.6, 0.6)


def test_tenant_temperature_top_p_and_domain_condition_each_request():
    """Three tenants on one fused target, one curve file: a T=0 tenant, a T=1 tenant and a T=1,
    top_p=0.5 tenant; and a 'code' domain whose rule is a geometric 0.3.  Each tenant's measured
    tokens per verify step is its own curve's (k = 8: 6.13, 4.24, the blend's, 1.43) within
    sampling error, where one scenario-wide curve gives every tenant the same."""
    ses = run(mix_scn({"acceptance": {"curve": EAGLE3}, "temperature": 0.0,
                       "acceptance_rules": [{"domain": "code", "acceptance": {"geometric": 0.3}}]},
                      tenant("greedy", 40), tenant("hot", 40, temperature=1.0, domain="chat"),
                      tenant("nucleus", 40, temperature=1.0, top_p=0.5, domain="nucleus"),
                      tenant("code", 40, domain="code")))
    d = per_domain(ses)
    c = load_curves(SHIPPED_CURVES)[EAGLE3]
    want = {"": 6.13, "chat": 4.24, "nucleus": tokens_per_step(TopP(c, 0.5).probabilities(0, 8, 1.0)),
            "code": tokens_per_step([0.3] * 8)}
    for dom, tau in want.items():
        assert d[dom]["tokens_per_verify_step"] == pytest.approx(tau, rel=0.08), (dom, d[dom])
    assert d["code"]["tokens_per_verify_step"] < 1.6 < d["chat"]["tokens_per_verify_step"] < 5 < d[""]["tokens_per_verify_step"]


def test_a_pool_rule_applies_to_the_replicas_of_its_pool():
    """Two pools behind round robin; the rule for pool 'weak' gives it geometric 0.2, the other
    keeps 0.9: acceptance per replica follows the pool that verified the drafts."""
    s = scenario(latency=ROOF, workload={"type": "poisson", "rate": 20, "num_requests": 40, "prompt_tokens": 64,
                                         "output_tokens": 100},
                 cluster={"router": "round_robin", "pools": [{"name": "strong", "replicas": 1},
                                                             {"name": "weak", "replicas": 1}]},
                 speculation={"mode": "fused", "gamma": {"k": 4}, "acceptance": {"geometric": 0.9},
                              "acceptance_rules": [{"pool": "weak", "acceptance": {"geometric": 0.2}}]})
    ses = run(s)
    rate = {n: t.accepted / t.verified for n, t in ses.spec.targets.items()}
    # a chain of k = 4 at rate p accepts (p + p^2 + p^3 + p^4) / 4 of its drafts
    assert rate["strong-0"] == pytest.approx(sum(0.9 ** i for i in range(1, 5)) / 4, rel=0.06)
    assert rate["weak-0"] == pytest.approx(sum(0.2 ** i for i in range(1, 5)) / 4, rel=0.2)


def test_trace_columns_carry_sampling_and_round_trip(tmp_path):
    """temperature / top_p / domain trace columns reach the request, are checked with the row's
    path, and `dsim trace generate` writes a tenant's keys back as columns."""
    from dsim.workload.export import trace_record
    p = tmp_path / "t.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in [
        {"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5, "temperature": 0.7, "domain": "code"},
        {"arrival_s": 0.1, "prompt_tokens": 10, "output_tokens": 5, "top_p": 0.9},
        {"arrival_s": 0.2, "prompt_tokens": 10, "output_tokens": 5}]))
    s = scenario(latency=ROOF, workload={"type": "trace", "path": str(p)},
                 speculation={"mode": "fused", "acceptance": {"geometric": 0.5}})
    ses = run(s)
    reqs = sorted(ses.workload, key=lambda r: r.rid)
    got = [r.sampling for r in reqs]
    assert got == [(0.7, None, "code"), (None, 0.9, ""), None]
    assert [ses.spec.states[r.rid].temp for r in reqs] == [0.7, 0.0, 0.0]
    assert trace_record(reqs[0])["domain"] == "code" and trace_record(reqs[1])["top_p"] == 0.9
    p.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5, "top_p": 0}) + "\n")
    with pytest.raises(ConfigError, match=r"t.jsonl:1.top_p"):
        run(s)


def test_rules_are_checked():
    base = {"mode": "fused", "acceptance": {"geometric": 0.5}}
    with pytest.raises(ConfigError, match=r"speculation.acceptance_rules\[0\].domain"):
        load_scenario(scenario(latency=ROOF, speculation={**base, "acceptance_rules": [
            {"acceptance": {"geometric": 0.1}}]}))
    with pytest.raises(ConfigError, match=r"speculation.acceptance_rules\[0\].pool"):
        run(scenario(latency=ROOF, speculation={**base, "acceptance_rules": [
            {"pool": "nope", "acceptance": {"geometric": 0.1}}]}))


def test_without_conditioning_nothing_changes():
    """No rules, top_p 1 and no request sampling: the runtime keeps its unconditioned paths."""
    ses = run(scenario(latency=ROOF, speculation={"mode": "fused", "acceptance": {"geometric": 0.5}}))
    assert ses.spec.cond is None and all(st.acc is None for st in ses.spec.states.values())


def test_first_matching_rule_wins():
    """speculation.acceptance_rules: the first rule that matches a request gives its model, later
    matches (a domain-only rule after a domain+pool one, a catch-all) are not consulted."""
    from types import SimpleNamespace
    from dsim.specdec.conditioning import Conditioning
    base, code_weak, code, anyone = (GeometricAcceptance(p) for p in (0.9, 0.1, 0.5, 0.3))
    cfg = SimpleNamespace(rules=[("code", "weak", code_weak), ("code", None, code), (None, None, anyone)],
                          top_p=1.0, temperature=0.0)
    cond = Conditioning(cfg, {"w-0": "weak", "s-0": "strong"})

    def req(domain):
        return SimpleNamespace(sampling=(None, None, domain))
    assert cond.model(req("code"), base, "w-0") is code_weak
    assert cond.model(req("code"), base, "s-0") is code
    assert cond.model(req("chat"), base, "w-0") is anyone
    assert Conditioning(SimpleNamespace(rules=[("code", None, code)], top_p=1.0, temperature=0.0),
                        {}).model(req("chat"), base) is base
