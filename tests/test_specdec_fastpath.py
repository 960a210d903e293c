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


def _free_queue(kv) -> list:
    """The KV free queue in order: cached blocks by content, runs of anonymous blocks by length
    (adjacent runs merged: the one pass returns a stretch of rows' blocks as one run)."""
    out = []
    for key, n in kv.free_q.items():
        if n and out and isinstance(out[-1], int):
            out[-1] += n
        else:
            out.append(n if n else key)
    return out


def _outcome(scn):
    ses = simulate(load_scenario(scn), check_invariants=True)
    reqs = sorted((r.rid, r.t_first_token, r.t_completion, r.n_out, r.energy_j, r.kv_peak_bytes) for r in ses.reqs)
    states = sorted((rid, tuple(getattr(st, f) for f in STATE)) for rid, st in ses.spec.states.items())
    rt = ses.spec
    tgts = sorted((n, t.verified, t.accepted, t.rounds) for n, t in rt.targets.items())
    reps = [(rep.name, rep.inst.kv.free_count, list(rep.inst.kv.cached.items()), _free_queue(rep.inst.kv),
             rep.inst.itl_extra) for rep in ses.fleet.replicas()]
    return reqs, states, tgts, list(rt.by_context.items()), list(rt.by_second.items()), reps


CASES = {
    "specpp": {"mode": "fused", "acceptance": CURVE, "gamma": {"policy": "specpp", "threshold": 0.6, "k_max": 8},
               "cold_start": {"initially_warm": True}},
    "static_penalty": {"mode": "fused", "acceptance": CURVE, "gamma": {"k": 5},
                       "partial_verification": {"rollback_penalty_ms": 0.5}, "cold_start": {"initially_warm": True}},
    "edf": {"mode": "fused", "acceptance": {"geometric": 0.7}, "gamma": {"k": 3}, "verify_order": "edf",
            "cold_start": {"initially_warm": True}},
    # no k_for: every row goes the general way inside the one pass, between rows it takes
    "backoff": {"mode": "fused", "acceptance": CURVE, "gamma": {"policy": "acceptance_backoff"},
                "cold_start": {"initially_warm": True}},
    # one policy per target (the conversations have none of their own): the general way too
    "backpressure": {"mode": "fused", "acceptance": CURVE, "gamma": {"policy": "backpressure"},
                     "cold_start": {"initially_warm": True}},
}
# per-request temperatures and acceptance (several gamma tables), prefix caching with shared prompts (the
# completions inside a step free hashed blocks between rows whose anonymous blocks the pass holds back)
MIXED = {"workload": {"type": "mix", "classes": [
    {"name": "code", "type": "poisson", "rate": 20, "num_requests": 30, "temperature": 0.0, "domain": "code",
     "prompt_tokens": 300, "output_tokens": {"dist": "lognormal", "mean": 80, "std": 60, "min": 8, "max": 300},
     "shared_prefix": {"num_groups": 3, "users_per_group": 4, "system_prompt_len": 200, "multi_turn": True,
                       "max_context_tokens": 4096}},
    {"name": "chat", "type": "poisson", "rate": 20, "num_requests": 30, "temperature": 1.0, "domain": "chat",
     "prompt_tokens": 200, "output_tokens": {"dist": "lognormal", "mean": 80, "std": 60, "min": 8, "max": 300}}]},
    "engine": {"enable_prefix_caching": True, "num_gpu_blocks": 400},
    "speculation": {"mode": "fused", "acceptance": {"curve": "eagle-3-llama-3.1-8b-mt-bench"},
                    "gamma": {"policy": "specpp", "threshold": 0.6, "k_max": 8},
                    "acceptance_rules": [{"domain": "code", "acceptance": {"curve": "eagle-3-llama-3.1-8b-humaneval"}}],
                    "cold_start": {"initially_warm": True}}}


def _three_ways(scn, monkeypatch):
    """(one pass, rows through fused_round, the general way only) and the rounds each way took."""
    rows = []
    orig_step, orig_round = SpecRuntime.fused_step, SpecRuntime.fused_round
    monkeypatch.setattr(SpecRuntime, "fused_step", lambda self, inst, spec, *a: (rows.append(len(spec)),
                                                                                  orig_step(self, inst, spec, *a)))
    rounds = []
    monkeypatch.setattr(SpecRuntime, "fused_round", lambda self, *a: (rounds.append(1), orig_round(self, *a)))
    one = _outcome(scn)
    taken = (sum(rows), len(rounds))
    assert taken[1] == 0                             # the one pass does not call fused_round
    monkeypatch.setattr(SpecRuntime, "one_pass", False)
    rows.clear()
    short = _outcome(scn)
    assert not rows
    monkeypatch.setattr(SpecRuntime, "fast_target", lambda self, inst: None)
    init = SpecRuntime.__init__

    def general_only(self, *a, **kw):                              # _next_round's fast path off too
        init(self, *a, **kw)
        self._fused_fast = False
    monkeypatch.setattr(SpecRuntime, "__init__", general_only)
    rounds.clear()
    general = _outcome(scn)
    assert not rows and not rounds
    return one, short, general, taken


@pytest.mark.parametrize("name", sorted(CASES))
def test_one_pass_and_short_way_give_the_general_way_bit_for_bit(name, monkeypatch):
    one, short, general, (rows, _) = _three_ways(_scn(CASES[name]), monkeypatch)
    assert rows > 500                                # the one pass did carry the run
    assert one == short == general


def test_one_pass_with_temperatures_rules_and_a_prefix_cache(monkeypatch):
    scn = _scn(MIXED["speculation"])
    scn.update({k: v for k, v in MIXED.items() if k != "speculation"})
    scn["engine"] = {**scn["engine"], **MIXED["engine"]}
    one, short, general, (rows, _) = _three_ways(scn, monkeypatch)
    assert rows > 500
    assert one[5][0][2]                              # hashed blocks were cached
    assert len({st[1][-4] for st in one[1]}) > 1     # several gammas chosen
    assert one == short == general


BASE_FUSED = {"mode": "fused", "acceptance": CURVE, "gamma": {"k": 3}, "cold_start": {"initially_warm": True}}
BREAKS = {   # each breaks one precondition of fast_target: no round may take the short way or the one pass
    "cold drafter": {"cold_start": {"initially_warm": False}},
    "tree": {"tree": {"topk": 2, "tokens": 6, "sibling_acceptance": 0.5}},
    "levels": {"fused_drafter": "meta-llama/Llama-3.1-8B",
               "levels": [{"name": "tiny", "drafter": "meta-llama/Llama-3.2-1B", "acceptance": CURVE}]},
    "portfolio": {"portfolio": {"drafters": [
        {"name": "small", "drafter": "meta-llama/Llama-3.2-1B", "acceptance": CURVE},
        {"name": "large", "drafter": "meta-llama/Llama-3.1-8B", "acceptance": {"geometric": 0.8}}],
        "choose": "prompt_tokens", "prompt_tokens": [400]}},
    "sampled partial verification": {"partial_verification": {"mode": "sampled", "sample_rate": 0.5}},
}


@pytest.mark.parametrize("name", sorted(BREAKS))
def test_neither_short_way_is_taken_when_a_precondition_fails(name, monkeypatch):
    """A drafter that can go cold (its cold starts and warm retention), tree drafts, drafter levels,
    a portfolio, partial verification: every round goes the general way, where those are handled."""
    taken = []
    orig_round, orig_step = SpecRuntime.fused_round, SpecRuntime.fused_step
    monkeypatch.setattr(SpecRuntime, "fused_round", lambda self, *a: (taken.append("round"), orig_round(self, *a)))
    monkeypatch.setattr(SpecRuntime, "fused_step", lambda self, *a: (taken.append("step"), orig_step(self, *a)))
    scn = _scn({**BASE_FUSED, **BREAKS[name]})
    scn["workload"]["num_requests"] = 25
    ses = simulate(load_scenario(scn))
    assert not taken
    assert sum(st.rounds for st in ses.spec.states.values()) > 100         # rounds were verified
    if name == "cold drafter":
        assert sum(t.cold_starts for t in ses.spec.targets.values()) >= 1


def test_an_override_or_a_decision_hook_takes_the_target_off_the_short_ways():
    ses = simulate(load_scenario(_scn(BASE_FUSED)))
    rt = ses.spec
    rep = next(iter(ses.fleet.replicas()))
    tgt = rt.targets[rep.name]
    assert rt.fast_target(rep.inst) is tgt
    tgt.override = (None, 2)                         # a controller's SetSpeculation
    assert rt.fast_target(rep.inst) is None
    tgt.override = None
    rt.decision_hook = lambda r, pol: None           # dsim.explore.oracle's
    assert rt.fast_target(rep.inst) is None


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


def test_draft_time_is_the_drafters_step_times_summed_step_by_step():
    """_draft_time (per-k counts, the drafter's decode curve memoised per batch size) against the
    definition: draft step j runs every fused request with k >= j, costed by the drafter's
    step_time, summed in step order; rows that are not fused or draft nothing add nothing."""
    import random
    from types import SimpleNamespace as NS

    from dsim.config.hardware import load_device
    from dsim.config.model import load_model
    from dsim.latency.base import BatchShape
    from dsim.latency.roofline import RooflineModel
    from dsim.serving.speculative import SpeculativeSteps

    dm = RooflineModel(load_model("meta-llama/Llama-3.2-1B"), load_device("H100-SXM"), 1)
    inst = SpeculativeSteps()
    inst.draft_cost, inst.mixed_drafts, inst.draft_model = None, False, dm

    def by_definition(spec):
        t = 0.0
        fused = [(k, r.num_computed) for r, k, _ in spec if k and r.spec.fused]
        for j in range(1, max([k for k, _ in fused], default=0) + 1):
            on = [c for k, c in fused if k >= j]
            t += dm.step_time(BatchShape(decode_tokens=len(on), decode_ctx_sum=sum(c + j for c in on),
                                         num_sampled=len(on), running=len(on)))
        return t

    rnd = random.Random(5)
    for _ in range(300):
        spec = [[NS(num_computed=rnd.randint(1, 9000), spec=NS(fused=rnd.random() < 0.9)), rnd.randint(0, 9), 0]
                for _ in range(rnd.randint(1, 40))]
        assert inst._draft_time(spec) == by_definition(spec)
    assert inst._draft_time([[NS(num_computed=10, spec=NS(fused=False)), 4, 0]]) == 0.0
