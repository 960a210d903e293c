"""The verify walk (SpeculativeSteps._verify_walk: _schedule's walk when every running request is a
speculative decoder, its blocks taken in one allocate, its shape and draft seconds summed on the way)
against the general loop: the same batch shapes, step durations, requests, round state and KV pool,
bit for bit (docs/performance.md, "Round three, second pass: fused rounds")."""
from pathlib import Path

import pytest
import yaml
from helpers import scenario

import dsim.serving.instance as instance_mod
from dsim.config.scenario import load_scenario
from dsim.runner import simulate
from dsim.serving.instance import Instance

ROOT = Path(__file__).resolve().parents[1]
SHAPE, WALK = instance_mod.BatchShape, Instance._verify_walk      # before any test wraps them
ROOF = {"model": "roofline"}
CURVE = {"curve": "draft-model-llama-3.1-8b-instruct-cnn-dm-gsm8k-humaneval-held-out"}
STATE = ("rounds", "verified", "accepted", "drafted", "fused_rounds", "dist_rounds", "rollbacks", "tvt_max",
         "acc_est", "tpot_est", "last_k", "last_a", "k", "drafted_now", "t_ready", "t_last", "deadline")
SPECPP = {"mode": "fused", "acceptance": CURVE, "gamma": {"policy": "specpp", "threshold": 0.6, "k_max": 8},
          "cold_start": {"initially_warm": True}}


def _lognormal(mean, std, top):
    return {"dist": "lognormal", "mean": mean, "std": std, "min": 8, "max": top}


def _scn(spec, n=60, engine=None, prompt=(400, 300, 2000), output=(120, 80, 400), **kw):
    s = scenario(latency=ROOF, workload={"type": "poisson", "rate": 40, "num_requests": n,
                                         "prompt_tokens": _lognormal(*prompt), "output_tokens": _lognormal(*output)},
                 slo={"ttft_ms": 300, "tpot_ms": 30, "tvt_ms": 60}, speculation=spec, **kw)
    s["engine"].update(engine or {})
    return s


def _shipped(name, n):
    doc = yaml.safe_load((ROOT / "scenarios" / f"{name}.yaml").read_text())
    doc["workload"]["num_requests"] = n
    doc["output"] = {"plots": False}
    return doc


CASES = {
    "specpp": _scn(SPECPP),
    # a small pool and a small token budget: the walk preempts (blocks it holds back taken first) and the
    # budget caps k; prefix caching: allocations evict cached blocks
    "tight": _scn({**SPECPP, "partial_verification": {"rollback_penalty_ms": 0.5}}, n=50, prompt=(200, 150, 600),
                  output=(150, 80, 300),
                  engine={"num_gpu_blocks": 60, "max_num_batched_tokens": 40, "enable_prefix_caching": True}),
    # the budget binds inside the walk: k cut to budget - 1 (57 rows), to exactly the budget left (5)
    "budget": _scn({**SPECPP, "gamma": {"k": 8}}, prompt=(40, 20, 80), output=(150, 80, 300),
                   engine={"max_num_batched_tokens": 32}),
    "edf": _scn({"mode": "fused", "acceptance": {"geometric": 0.7}, "gamma": {"k": 3}, "verify_order": "edf",
                 "cold_start": {"initially_warm": True}}),
    # devices: rounds drafted elsewhere (rows not ready, rows not fused), a drafter that goes cold
    "hybrid_rtt": _shipped("hybrid_rtt", 40),
    "datacenter_fused": _shipped("datacenter_fused", 40),
}


def _outcome(scn, monkeypatch):
    """Everything the walk could change, and (walks, rows walked, walks that preempted)."""
    shapes = []
    monkeypatch.setattr(instance_mod, "BatchShape", lambda *a: (shapes.append(a), SHAPE(*a))[1])
    walks = [0, 0, 0]
    orig = WALK

    def walk(self, order, budget, now, spec):
        out = orig(self, order, budget, now, spec)
        walks[0] += 1
        walks[1] += len(spec)
        walks[2] += out[1]
        return out
    monkeypatch.setattr(Instance, "_verify_walk", walk)
    ses = simulate(load_scenario(scn), check_invariants=True)
    reqs = sorted((r.rid, r.t_first_token, r.t_completion, r.n_out, r.energy_j, r.kv_peak_bytes, r.preempt_times)
                  for r in ses.reqs)
    rt = ses.spec
    states = sorted((rid, tuple(getattr(st, f) for f in STATE)) for rid, st in rt.states.items())
    reps = [(rep.name, list(rep.inst.log.t_end), list(rep.inst.log.dur), list(rep.inst.log.kv_used),
             rep.inst.kv.free_count, list(rep.inst.kv.free_q.items()), list(rep.inst.kv.cached.items()),
             rep.inst.itl_extra, rep.inst.num_preemptions) for rep in ses.fleet.replicas()]
    out = (shapes, reqs, states, list(rt.by_context.items()), list(rt.by_second.items()), reps)
    return out, walks


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_verify_walk_gives_the_general_loop_bit_for_bit(name, monkeypatch):
    walked, (n, rows, preempting) = _outcome(CASES[name], monkeypatch)
    assert n > 80 and rows > 250                     # the walk carried the run
    if name == "tight":
        assert preempting > 20                       # ... its preemptions too
        assert walked[-1][0][-1] > 5 and walked[-1][0][6]      # preempted, blocks cached
    monkeypatch.setattr(Instance, "one_walk", False)
    general, (n, _, _) = _outcome(CASES[name], monkeypatch)
    assert n == 0
    assert walked == general


def test_the_walk_is_taken_only_when_every_running_request_verifies(monkeypatch):
    """Steps whose running list also holds a prefill chunk (a request admitted with a small token budget
    takes several steps to prefill) walk the general loop: the walk sees speculative decoders only."""
    seen, mixed = [], []
    orig_walk, orig_sched = Instance._verify_walk, Instance._schedule

    def walk(self, order, budget, now, spec):
        seen.append(all(r.spec is not None and not r.prefilling for r in order))
        return orig_walk(self, order, budget, now, spec)

    def schedule(self, now):
        mixed.append(bool(self.spec_dec) and self.n_prefilling > 0)
        return orig_sched(self, now)
    monkeypatch.setattr(Instance, "_verify_walk", walk)
    monkeypatch.setattr(Instance, "_schedule", schedule)
    simulate(load_scenario(CASES["tight"]))
    assert sum(mixed) > 50                           # steps the walk must not take
    assert len(seen) > 200 and all(seen)


@pytest.mark.parametrize("name", ["specpp", "tight"])
def test_the_one_pass_with_rows_of_different_ages_gives_the_general_way(name, monkeypatch):
    """The one pass reuses what it computed from the row before when a row's token, ready or round
    time is the same float object (rows verified together share them).  Rows of different ages (a
    row left out of steps by the budget) are made here by aging every other row's last token time
    before each step's bookkeeping, the same way in both runs; the one pass against every row
    through fused_round."""
    from dsim.specdec.runtime import SpecRuntime
    verified = Instance._verified

    def aged(self, spec, t_end, emit_t):
        for row in spec[1::2]:
            row[0].t_last_token -= 1e-3
        return verified(self, spec, t_end, emit_t)
    monkeypatch.setattr(Instance, "_verified", aged)
    one, _ = _outcome(CASES[name], monkeypatch)
    monkeypatch.setattr(SpecRuntime, "one_pass", False)
    general, _ = _outcome(CASES[name], monkeypatch)
    assert _runs_merged(one) == _runs_merged(general) and len(one[1]) > 40


def _runs_merged(outcome):
    """The outcome with each free queue's adjacent anonymous runs merged (the one pass returns a
    stretch of rows' rejected blocks as one run, under one key: tests/test_specdec_fastpath.py)."""
    def merged(items):
        out = []
        for key, n in items:
            if n and out and isinstance(out[-1], int):
                out[-1] += n
            else:
                out.append(n if n else key)
        return out
    *head, reps = outcome
    return (*head, [(*rep[:5], merged(rep[5]), *rep[6:]) for rep in reps])
