"""Drafter portfolio and mid-decode escalation (dsim.specdec.portfolio): the choice per request,
the escalation round by hand, the drafting cost of the chosen drafter and the bad-input errors."""
import pytest
from helpers import assert_refused, scenario

from dsim.config.scenario import load_scenario
from dsim.latency.base import BatchShape
from dsim.runner import simulate
from dsim.specdec.runtime import SpecRuntime

SMALL = {"name": "small", "drafter": "meta-llama/Llama-3.2-1B", "acceptance": {"geometric": 0.0}}
LARGE = {"name": "large", "drafter": "meta-llama/Llama-3.1-8B", "acceptance": {"geometric": 1.0}}


def pf_scn(portfolio, prompt=100, out=60, n=1):
    return scenario(latency={"model": "roofline"}, model="meta-llama/Llama-3.1-70B-Instruct",
                    engine={"tensor_parallel_size": 4},
                    workload={"type": "poisson", "rate": 10, "num_requests": n, "prompt_tokens": prompt,
                              "output_tokens": out},
                    speculation={"mode": "fused", "gamma": {"k": 4}, "portfolio": portfolio})


def test_escalation_happens_exactly_when_the_estimate_drops_below_the_threshold(monkeypatch):
    # every draft of the small drafter is rejected: the estimate goes 0.7 -> 0.56 -> 0.448 -> 0.3584
    seen = []
    orig = SpecRuntime.round_done

    def spy(self, st, r, inst, k, a, last=False):
        before = st.escalations
        orig(self, st, r, inst, k, a, last)
        if k >= 0:
            seen.append((st.rounds, a, st.escalations > before))
    monkeypatch.setattr(SpecRuntime, "round_done", spy)
    for threshold, at_round in ((0.449, 2), (0.4479, 3), (0.3585, 3), (0.3583, 4)):
        seen.clear()
        ses = simulate(load_scenario(pf_scn({"drafters": [SMALL, LARGE], "prompt_tokens": [1000],
                                             "escalate_below": threshold})), check_invariants=True)
        (st,) = ses.spec.states.values()
        assert st.escalations == 1 and st.drafter_name == "large"
        switched = [n for n, _, esc in seen if esc]
        assert switched == [at_round], (threshold, seen[:6])
        # before the switch nothing is accepted (small), after it everything (large)
        assert all(a == 0 for n, a, _ in seen if n <= at_round)
        assert all(a > 0 for n, a, _ in seen[at_round:-1])


def test_no_escalation_without_a_threshold_or_a_larger_drafter():
    ses = simulate(load_scenario(pf_scn({"drafters": [SMALL, LARGE], "prompt_tokens": [1000]})))
    (st,) = ses.spec.states.values()
    assert st.escalations == 0 and st.drafter_name == "small" and st.accepted == 0
    ses = simulate(load_scenario(pf_scn({"drafters": [LARGE, SMALL], "prompt_tokens": [10],
                                         "escalate_below": 0.9})))
    (st,) = ses.spec.states.values()
    assert st.escalations == 0 and st.drafter_name == "small"       # already on the last drafter


@pytest.mark.parametrize("prompt,expected", [(100, "small"), (1000, "small"), (1001, "large")])
def test_choice_by_prompt_length(prompt, expected):
    ses = simulate(load_scenario(pf_scn({"drafters": [SMALL, LARGE], "prompt_tokens": [1000]}, prompt=prompt)))
    (st,) = ses.spec.states.values()
    assert st.drafter_name == expected


@pytest.mark.parametrize("need,expected", [(1.5, "mid"), (2.5, "large"), (6.0, "large")])
def test_choice_by_predicted_acceptance(need, expected):
    # predicted tokens per step at k = 4: small 1, mid 1 + .5 + .25 + .125 + .0625 = 1.9375, large 5
    mid = {"name": "mid", "drafter": "meta-llama/Llama-3.2-1B", "acceptance": {"geometric": 0.5}}
    ses = simulate(load_scenario(pf_scn({"drafters": [SMALL, mid, LARGE], "choose": "acceptance",
                                         "min_tokens_per_step": need})))
    (st,) = ses.spec.states.values()
    assert st.drafter_name == expected


def test_the_chosen_drafter_costs_its_own_draft_steps():
    ses = simulate(load_scenario(pf_scn({"drafters": [SMALL, LARGE], "prompt_tokens": [10]}, out=9)))
    inst = ses.fleet.replicas()[0].inst
    (st,) = ses.spec.states.values()
    assert st.drafter_name == "large"
    large = ses.spec._fused_model(inst, 1)
    assert large is not inst.draft_model and large.model.name == "meta-llama/Llama-3.1-8B"
    c, p = 5, 100
    verify = inst.step_model.step_time(BatchShape(prefill_tokens=c, num_prefill=1,
                                                  prefill_attn_pairs=c * p + c * (c + 1) // 2, prefill_ctx_tokens=p,
                                                  num_sampled=1, prefill_chunk_sq=c * c, running=1))
    drafts = sum(large.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=p + j, num_sampled=1, running=1))
                 for j in (1, 2, 3, 4))
    small = sum(inst.draft_model.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=p + j, num_sampled=1,
                                                      running=1)) for j in (1, 2, 3, 4))
    assert drafts > 2 * small
    assert inst.log.dur[1] == pytest.approx(verify + drafts, rel=1e-12)


def test_portfolio_columns_and_summary(tmp_path):
    import csv

    import dsim
    res = dsim.run(pf_scn({"drafters": [SMALL, LARGE], "prompt_tokens": [1000], "escalate_below": 0.4}, out=40, n=5),
                   tmp_path / "o")
    pf = res.summary["speculation"]["portfolio"]
    assert pf["drafters"] == {"small": {"started": 5, "finished_on": 0}, "large": {"started": 0, "finished_on": 5}}
    assert pf["escalations"] == 5
    rows = list(csv.DictReader(open(tmp_path / "o" / "requests.csv")))
    assert [r["spec_drafter"] for r in rows] == ["large"] * 5


@pytest.mark.parametrize("key,value,where", [
    ("speculation.portfolio.prompt_tokens", "[100, 50]", "speculation.portfolio.prompt_tokens"),
    ("speculation.portfolio.drafters", "[]", "speculation.portfolio.drafters"),
    ("speculation.portfolio.escalate_below", "1.5", "speculation.portfolio.escalate_below"),
    ("speculation.portfolio.choose", "random", "speculation.portfolio.choose"),
])
def test_bad_portfolio_keys_are_refused(key, value, where, tmp_path, capsys):
    assert_refused("drafter_portfolio", [f"{key}={value}"], where, tmp_path, capsys)
