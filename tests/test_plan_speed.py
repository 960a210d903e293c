"""Issue 40, round three (plans): the GEMM memo shared by models of one configuration, and the early
stop counting unfinished requests -- each must leave every answer as it was."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import dsim
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.explore import plan as plan_mod
from dsim.explore.capacity import parse_slos, probe
from dsim.explore.early_stop import run_watched
from dsim.latency import roofline
from dsim.latency.base import BatchShape
from dsim.latency.roofline import RooflineModel

ROOT = Path(__file__).resolve().parents[1]
# every step 10 ms, 8 sequences, 10 output tokens: one replica completes at most 80 req/s
CONST = {"name": "const", "seed": 3, "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
         "engine": {"max_num_seqs": 8, "max_num_batched_tokens": 2048},
         "latency": {"model": "blackbox", "beta": [10000, 0, 0], "alpha": [0, 0, 0]},
         "workload": {"type": "constant", "rate": 150, "num_requests": 1200, "prompt_tokens": 16,
                      "output_tokens": 10}}
# the same with 100 output tokens at 12 req/s: a request decodes for 1 s, one replica carries 8 req/s
LONG = {**CONST, "name": "long", "workload": {**CONST["workload"], "rate": 12, "num_requests": 600,
                                              "output_tokens": 100}}
SHAPES = [BatchShape(prefill_tokens=p, num_prefill=1 if p else 0, prefill_attn_pairs=p * p // 2, decode_tokens=d,
                     decode_ctx_sum=d * 700, num_sampled=d + (1 if p else 0), running=d + (1 if p else 0))
          for p, d in ((0, 1), (0, 37), (512, 0), (2048, 12), (1000, 255), (0, 37))]


def _replicas(n: int) -> list:
    return ["cluster=" + json.dumps({"router": "jsq", "pools": [{"name": "main", "replicas": n}]})]


def test_models_of_one_configuration_share_the_gemm_memo_and_time_steps_alike(monkeypatch):
    monkeypatch.setattr(roofline, "_SHARED", {})
    model, dev = load_model("meta-llama/Llama-3.1-70B"), load_device("H100-SXM")
    a, b = RooflineModel(model, dev, 4), RooflineModel(model, dev, 4)
    assert a._lin_cache is b._lin_cache and a._head_cache is b._head_cache
    first = [a.step_time(s) for s in SHAPES]
    assert len(a._lin_cache) == 5 and [b.step_time(s) for s in SHAPES] == first
    alone = RooflineModel(model, dev, 4)
    alone._lin_cache, alone._head_cache = {}, {}          # computed afresh, GEMM by GEMM
    assert [alone.step_time(s) for s in SHAPES] == first
    for other in (RooflineModel(model, dev, 8), RooflineModel(model, dev, 4, compute_efficiency=0.9),
                  RooflineModel(model, load_device("A100-80GB"), 4)):
        assert other._lin_cache is not a._lin_cache
    assert [RooflineModel(model, dev, 8).step_time(s) for s in SHAPES] != first

    moe = load_model("Qwen/Qwen3-30B-A3B")                  # the MoE kernel choice is part of the key
    fused, unfused = RooflineModel(moe, dev, 1), RooflineModel(moe, dev, 1, moe_fused=False)
    assert fused._lin_cache is not unfused._lin_cache
    assert unfused.linear_time(64) > fused.linear_time(64)

    class Slower(RooflineModel):                            # another GEMM timing: never shares
        def _gemm_time(self, *args, **kw):
            return 2 * super()._gemm_time(*args, **kw)
    assert Slower(model, dev, 4)._lin_cache is not a._lin_cache


@pytest.mark.parametrize("slo", ["ttft_p99_ms=200", "e2el_p99_ms=1500"])
def test_unfinished_requests_stop_an_overloaded_run_sooner(slo):
    """One replica for 12 req/s (8 of capacity): counting the requests still waiting past the bound
    stops the run before the finished ones alone would (those decode 1 s more); the full run does
    fail; runs that pass are not stopped, and give the row they give without the watch."""
    slos = parse_slos([slo])
    _, finished_only = run_watched(dsim.load_scenario(LONG, _replicas(1)), slos, 0.1, pending=False)
    _, stop = run_watched(dsim.load_scenario(LONG, _replicas(1)), slos, 0.1)
    assert stop["stopped_at_s"] < finished_only["stopped_at_s"] - 0.5
    assert stop["finished_requests"] < finished_only["finished_requests"]
    assert "still waiting for their" in stop["stop_reason"]
    assert not probe(LONG, _replicas(1), slos, 0.1, None)["pass"]
    for reps in (2, 3):
        assert probe(LONG, _replicas(reps), slos, 0.1, None, True) == probe(LONG, _replicas(reps), slos, 0.1, None)


@pytest.mark.parametrize("slo,metric", [("ttft_p99_ms=200", "ttft"), ("e2el_p99_ms=1500", "e2el"), ("ttft_p50_ms=1500", "ttft"),
                                        ("e2el_p50_ms=3000", "e2el")])
def test_the_stop_counts_only_window_requests_over_the_bound_once_each(slo, metric):
    """The count a stop claims, checked against the run to its end (the same run up to the stop):
    at the stop time, at least that many distinct window requests (arrived after the warm-up) that
    are at least the bound old end over the bound.  Counting a request twice (pending, then
    finished) or counting warm-up requests would claim more than there are."""
    slos = parse_slos([slo])
    scn = dsim.load_scenario(LONG, _replicas(1))
    _, stop = run_watched(dsim.load_scenario(LONG, _replicas(1)), slos, 0.3)
    claimed = int(stop["stop_reason"].split(" of the ")[0])
    reqs = list(dsim.run(scn).requests)
    arr = sorted(r.arrival for r in reqs)
    tw = arr[0] + 0.3 * (arr[-1] - arr[0])
    bound = float(slo.split("=")[1])
    now = stop["stopped_at_s"]
    late = [r for r in reqs if tw <= r.arrival and (now - r.arrival) * 1e3 > bound
            and ((r.t_first_token if metric == "ttft" else r.t_completion) - r.arrival) * 1e3 > bound]
    assert claimed >= 1 and len(late) >= claimed, (claimed, len(late))


def test_a_plan_answers_the_same_with_and_without_early_stop(tmp_path, monkeypatch):
    """Every kept candidate simulated (a screen that keeps all): the same best configuration, the same
    passing set with the same metrics, and every early-stopped candidate fails when run to the end."""
    honest = plan_mod.screen_family
    monkeypatch.setattr(plan_mod, "screen_family",
                        lambda scn, w, reps, slos: [{**r, "screen": "kept", "reason": ""}
                                                    for r in honest(scn, w, reps, slos)])
    space = {"tensor_parallel_size": [1], "engine.max_num_seqs": [4, 8]}
    kw = dict(gpus=4, slos=["ttft_p99_ms=200", "e2el_p99_ms=400"], screen_check=0, band=False)
    fast = plan_mod.plan(CONST, space, out=tmp_path / "a", **kw)
    monkeypatch.setattr(plan_mod, "probe", lambda *a: probe(*a[:5]))      # every run to its end
    full = plan_mod.plan(CONST, space, out=tmp_path / "b", **kw)
    assert fast["early_stopped"] >= 2 and full["early_stopped"] == 0
    key = ("tensor_parallel_size", "engine.max_num_seqs", "replicas")
    assert [tuple(c[k] for k in key) for c in fast["top"]] == [tuple(c[k] for k in key) for c in full["top"]]
    assert (tmp_path / "a" / "best.yaml").read_text() == (tmp_path / "b" / "best.yaml").read_text()
    fr = {tuple(c[k] for k in key): c for c in full["rows"] if "pass" in c}
    for c in fast["rows"]:
        if "pass" not in c:
            continue
        twin = fr[tuple(c[k] for k in key)]
        assert c["pass"] == twin["pass"]
        if c.get("early_stopped"):
            assert not twin["pass"]
        else:
            assert {k: v for k, v in c.items() if k != "reasons"} == {k: v for k, v in twin.items() if k != "reasons"}


def test_workload_rids_follow_arrival_times_for_traces_and_generated_workloads():
    """The early stop pairs each arrival with its request id (Workload.rids): a trace keeps a request
    list, a generated workload three arrays; both must give the ids of the requests the run sends."""
    from dsim.runner import Session
    trace = dsim.load_scenario(str(ROOT / "scenarios" / "capacity_70b_azure.yaml"), ["workload.num_requests=40"])
    for scn in (trace, dsim.load_scenario(LONG)):
        w = Session(scn).workload
        reqs = list(w)
        assert w.rids().tolist() == [r.rid for r in reqs] and len(reqs) == len(w)
        assert w.arrival_times().tolist() == [r.arrival for r in reqs]
