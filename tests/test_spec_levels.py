"""Multi-level speculation (seed 002 Appendix A item 3; dsim/specdec/levels.py): a tiny drafter's
drafts verified and extended by a mid drafter, whose tokens the target verifies."""
import numpy as np
import pytest
from helpers import assert_refused
from test_specdec import run, spec_scn

from dsim.config.model import load_model
from dsim.config.hardware import load_device
from dsim.latency.base import BatchShape
from dsim.latency.roofline import RooflineModel
from dsim.specdec.acceptance import GeometricAcceptance
from dsim.specdec.devices import DraftDevice
from dsim.specdec.levels import Chain, Level

TINY = "meta-llama/Llama-3.2-1B"


def chain(rate):
    return Chain([Level("tiny", None, GeometricAcceptance(rate), {})])


def test_expected_tokens_per_target_verify_by_hand():
    # tiny accepts 0.8 per position against the mid drafter, k = 3; the target accepts the mid's 0.7
    p_n = {1: 0.2, 2: 0.8 * 0.2, 3: 0.8 ** 2 * 0.2, 4: 0.8 ** 3}          # mid hands up a + 1 tokens
    tau = {n: 1 + sum(0.7 ** i for i in range(1, n + 1)) for n in p_n}      # the target on n mid tokens
    hand = sum(p_n[n] * tau[n] for n in p_n)
    assert hand == pytest.approx(2.4344512, abs=1e-9)
    c = chain(0.8)
    assert c.handed_up(100, 3, 0.0) == pytest.approx(p_n, abs=1e-12)
    assert c.expected_tokens(GeometricAcceptance(0.7), 100, 3, 0.0) == pytest.approx(hand, abs=1e-12)
    # three levels: each level's output is the next one's input
    c3 = Chain([Level("a", None, GeometricAcceptance(0.5), {}), Level("b", None, GeometricAcceptance(0.9), {})])
    d = c3.handed_up(100, 1, 0.0)           # a hands up 1 (p .5) or 2 tokens; b accepts of those
    assert d == pytest.approx({1: 0.5 * 0.1 + 0.5 * 0.1, 2: 0.5 * 0.9 + 0.5 * 0.9 * 0.1, 3: 0.5 * 0.81})


def test_draws_follow_the_composed_distribution():
    c = chain(0.6)
    rng = np.random.default_rng(1)
    n = 40000
    draws = [c.draw(rng, 100, 4, 0.0)[-1] for _ in range(n)]
    for k, p in c.handed_up(100, 4, 0.0).items():
        assert abs(draws.count(k) / n - p) < 4 * (p * (1 - p) / n) ** 0.5


def test_sampled_loop_gives_the_expected_tokens_per_target_verify():
    spec = {"mode": "fused", "acceptance": {"geometric": 0.7}, "gamma": {"k": 3},
            "levels": [{"name": "tiny", "drafter": TINY, "acceptance": {"geometric": 0.8}}]}
    ses = run(spec_scn(spec, n=4, out=3000, rate=1), check=False)
    sts = list(ses.spec.states.values())
    rounds = sum(s.rounds for s in sts)
    tps = (sum(s.accepted for s in sts) + rounds) / rounds
    assert rounds > 3000
    assert tps == pytest.approx(2.4344512, rel=0.03)
    lv = ses.spec.mechanisms_summary()["levels"]
    assert lv["tiny"]["drafted_tokens"] == 3 * lv["rounds"]
    # the mid accepted 0.8 per position of the tiny's 3: E[a + 1] = 1 + .8 + .64 + .512
    assert lv["top"]["tokens_handed_up_per_round"] == pytest.approx(2.952, rel=0.03)


def test_fused_step_costs_every_level():
    """Everything accepted: the tiny drafts 3, the mid (the fused drafter) verifies them in one chunk
    of 4 and hands up 4, the target verifies 4 in a chunk of 5: step 2 is the three costs."""
    spec = {"mode": "fused", "acceptance": {"geometric": 1.0}, "gamma": {"k": 3},
            "fused_drafter": "meta-llama/Llama-3.1-8B",
            "levels": [{"name": "tiny", "drafter": TINY, "acceptance": {"geometric": 1.0}}]}
    ses = run(spec_scn(spec, out=12))
    inst = ses.fleet.replicas()[0].inst
    gpu = load_device("H100-SXM")
    tiny = RooflineModel(load_model(TINY), gpu, 1)
    mid = RooflineModel(load_model("meta-llama/Llama-3.1-8B"), gpu, 1)

    def chunk(m, c, p):
        return m.step_time(BatchShape(prefill_tokens=c, num_prefill=1, prefill_attn_pairs=c * p + c * (c + 1) // 2,
                                      prefill_ctx_tokens=p, num_sampled=c, prefill_chunk_sq=c * c, running=1))
    p = 100
    verify = inst.step_model.step_time(BatchShape(prefill_tokens=5, num_prefill=1, prefill_attn_pairs=5 * p + 15,
                                                  prefill_ctx_tokens=p, num_sampled=1, prefill_chunk_sq=25, running=1))
    drafts = sum(tiny.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=p + j, num_sampled=1, running=1))
                 for j in (1, 2, 3))
    assert inst.log.dur[1] == pytest.approx(verify + drafts + chunk(mid, 4, p), rel=1e-12)
    assert inst.log.decode_tokens[1] == 5           # the target verified the mid's 4 tokens


def test_device_drafts_each_level_on_its_own_roofline(monkeypatch):
    seen = []
    orig = DraftDevice.submit

    def spy(self, k, ctx, done, lost=None, steps=None, model=None, seconds=None):
        seen.append((self, k, ctx, seconds))
        return orig(self, k, ctx, done, lost, steps, model, seconds)
    monkeypatch.setattr(DraftDevice, "submit", spy)
    spec = {"mode": "distributed", "acceptance": {"geometric": 1.0}, "gamma": {"k": 2},
            "drafter": "meta-llama/Llama-3.1-8B",
            "levels": [{"name": "tiny", "drafter": TINY, "acceptance": {"geometric": 1.0}}],
            "drafts": [{"name": "lap", "profile": "laptop-rtx4060", "count": 1, "rtt_ms": 10, "bw_mbps": 50}]}
    ses = run(spec_scn(spec, out=20))
    dev = ses.spec.devices[0]
    tiny, mid = dev.prof.roofline(load_model(TINY)), dev.step
    assert seen
    for _, k, ctx, secs in seen:
        assert k == 2
        hand = sum(tiny.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=ctx + j, num_sampled=1, running=1))
                   for j in (1, 2))
        hand += mid.step_time(BatchShape(prefill_tokens=3, num_prefill=1, prefill_attn_pairs=3 * ctx + 6,
                                         prefill_ctx_tokens=ctx, num_sampled=3, prefill_chunk_sq=9, running=1))
        assert secs == pytest.approx(hand, rel=1e-12)
    assert dev.busy_s == pytest.approx(sum(s for *_, s in seen), rel=1e-12)
    assert dev.tokens == 2 * len(seen)
    (st,) = ses.spec.states.values()
    assert st.verified == st.accepted and st.accepted % 3 == 0 or st.rounds > 0   # mid hands up 3 per round
    assert ses.spec.mechanisms_summary()["levels"]["top"]["tokens_handed_up_per_round"] == 3.0


@pytest.mark.parametrize("sets,where", [
    (["speculation.levels=[{drafter: Qwen/Qwen2.5-7B-Instruct}]"], "speculation.levels[0].drafter"),
    (["speculation.levels=[{drafter: meta-llama/Llama-3.2-1B}]", "speculation.tree={topk: 2}"], "speculation.tree"),
    (["speculation.levels=[]"], "speculation.levels"),
    (["speculation.replay_log=log.jsonl"], "speculation.replay_log"),
])
def test_bad_levels_are_refused(sets, where, tmp_path, capsys):
    assert_refused("multi_level_drafts", sets, where, tmp_path, capsys)


def test_lower_levels_read_acceptance_at_the_requests_own_temperature():
    """A request sampled at T=1 (its tenant's key; the scenario's temperature is 0): the tiny drafter's
    acceptance against the mid is read at T=1 too (EAGLE-3 MT-bench curve: geometric 0.793598, not
    0.900187 at T=0), so the mid hands up E[a + 1] = 1 + p + p^2 + p^3 of k = 3 drafts."""
    from test_spec_conditioning import EAGLE3, mix_scn, run as run_scn, tenant
    ses = run_scn(mix_scn({"acceptance": {"geometric": 0.7}, "temperature": 0.0, "gamma": {"k": 3},
                           "levels": [{"name": "tiny", "drafter": TINY, "acceptance": {"curve": EAGLE3}}]},
                          tenant("hot", 12, temperature=1.0, output_tokens=400)))
    p = 0.793598
    got = ses.spec.mechanisms_summary()["levels"]["top"]["tokens_handed_up_per_round"]
    assert got == pytest.approx(1 + p + p ** 2 + p ** 3, rel=0.03)       # at T=0 it would be 3.439
