"""Scheduling policies beyond FCFS/priority (EDF = least slack first, age_weighted) and SLO classes:
keys by hand, admission order end to end, per-class attainment recomputed from the requests, and
the trace columns and errors that feed them."""
import json
from dataclasses import replace
from types import SimpleNamespace as R

import pytest

import dsim
from dsim.config.engine import EngineConfig
from dsim.latency.base import BatchShape
from dsim.serving.policies import AgeWeighted, LeastSlack, make_policy

from helpers import assert_refused, scenario


class PerToken:
    """A step model costing 1 ms per prefill token plus 5 ms a step: prefill times by hand."""

    def step_time(self, s: BatchShape) -> float:
        return 5e-3 + 1e-3 * s.prefill_tokens


def test_least_slack_keys_by_hand():
    pol = LeastSlack(PerToken(), chunk=100)
    # 250 tokens in chunks of 100: 3 steps, 15 ms + 250 ms
    assert pol.prefill_s(250) == pytest.approx(0.265)
    a = R(rid=0, arrival=0.0, prompt_len=250, ttft_slo_ms=1000)      # deadline 1.0, slack key 0.735
    b = R(rid=1, arrival=0.2, prompt_len=50, ttft_slo_ms=600)        # deadline 0.8, key 0.745
    c = R(rid=2, arrival=0.3, prompt_len=400, ttft_slo_ms=600)       # deadline 0.9, key 0.9 - 0.42 = 0.48
    d = R(rid=3, arrival=0.1, prompt_len=10, ttft_slo_ms=None)       # no target: last
    keys = {r.rid: pol.key(r) for r in (a, b, c, d)}
    assert keys[0][0] == pytest.approx(0.735) and keys[2][0] == pytest.approx(0.48)
    assert sorted(keys, key=keys.get) == [2, 0, 1, 3]
    # earliest deadline alone would have said b (0.8) before c (0.9) before a (1.0)


def test_age_weighted_order_by_hand():
    pol = AgeWeighted(weight=2.0)       # one priority level is worth 0.5 s of waiting
    hi_late = R(rid=0, arrival=0.6, priority=0)
    lo_early = R(rid=1, arrival=0.0, priority=1)
    assert pol.key(lo_early) < pol.key(hi_late)          # waited 0.6 s > 0.5 s: overtakes
    hi_soon = R(rid=2, arrival=0.4, priority=0)
    assert pol.key(hi_soon) < pol.key(lo_early)          # only 0.4 s apart: priority still wins


def test_make_policy_maps_every_name():
    assert make_policy(EngineConfig(), None) is None
    for name in ("priority", "edf", "age_weighted"):
        assert make_policy(replace(EngineConfig(), scheduling_policy=name), PerToken()).name == name


def _two_classes(policy, tmp_path=None):
    """Tight and loose classes, arriving together onto a replica that runs 2 at a time."""
    cls = [{"name": "loose", "slo_class": "loose", "type": "poisson", "rate": 100, "num_requests": 30,
            "prompt_tokens": 200, "output_tokens": 20},
           {"name": "tight", "slo_class": "tight", "type": "poisson", "rate": 100, "num_requests": 30,
            "prompt_tokens": 200, "output_tokens": 20}]
    return dsim.run(scenario(latency={"model": "blackbox", "beta": [2000, 0, 0]},
                             engine={"max_num_seqs": 2, "scheduling_policy": policy},
                             slo={"classes": {"tight": {"ttft_ms": 300}, "loose": {"ttft_ms": 5000}}},
                             workload={"type": "mix", "classes": cls}), check_invariants=True)


def test_edf_admits_the_least_slack_and_beats_fcfs_on_the_tight_class():
    fcfs, edf = _two_classes("fcfs"), _two_classes("edf")
    att = {name: res.summary["slo_classes"]["tight"]["slo_attainment"] for name, res in (("fcfs", fcfs), ("edf", edf))}
    assert att["edf"] > att["fcfs"] + 0.2
    # every first admission under EDF took the smallest key among the requests waiting then
    key = edf.instance.policy.key                  # fixed per request (arrival, target, prompt)
    reqs = list(edf.requests)
    for r in reqs:
        waiting = [x for x in reqs if x.arrival <= r.t_scheduled and x.t_scheduled > r.t_scheduled]
        assert all(key(r) <= key(x) for x in waiting), r.rid


def test_class_sections_recomputed_from_the_requests():
    res = _two_classes("edf")
    span = res.summary["throughput"]["duration_s"]
    for name, target in (("tight", 300), ("loose", 5000)):
        rs = [r for r in res.requests if r.slo_class == name]
        good = sum((r.t_first_token - r.arrival) * 1e3 <= target for r in rs)
        c = res.summary["slo_classes"][name]
        assert (c["requests"], c["requests_meeting_slo"], c["slo_ttft_ms"]) == (30, good, target)
        assert c["slo_attainment"] == pytest.approx(good / 30)
        assert c["goodput_requests_per_s"] == pytest.approx(good / span)
    total = res.summary["goodput"]["requests_meeting_slo"]
    assert total == sum(res.summary["slo_classes"][n]["requests_meeting_slo"] for n in ("tight", "loose"))


def test_trace_columns_set_priority_class_and_own_targets(tmp_path):
    p = tmp_path / "t.jsonl"
    rows = [{"arrival_s": 0.0, "prompt_tokens": 100, "output_tokens": 4, "slo_class": "gold", "priority": -1},
            {"arrival_s": 0.1, "prompt_tokens": 100, "output_tokens": 4, "ttft_slo_ms": 1, "tpot_slo_ms": 2},
            {"arrival_s": 0.2, "prompt_tokens": 100, "output_tokens": 4}]
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    res = dsim.run(scenario(workload={"type": "trace", "path": str(p)}, slo={"ttft_ms": 900, "classes": {"gold": {"ttft_ms": 50}}}))
    a, b, c = sorted(res.requests, key=lambda r: r.rid)
    assert (a.priority, a.slo_class, a.ttft_slo_ms, a.tpot_slo_ms) == (-1, "gold", 50, None)
    assert (b.priority, b.slo_class, b.ttft_slo_ms, b.tpot_slo_ms) == (0, "", 1, 2)      # its own targets
    assert (c.ttft_slo_ms, c.tpot_slo_ms) == (900, None)                                # the scenario's
    assert not any(r.slo_class == "gold" for r in (b, c))
    assert set(res.summary["slo_classes"]) == {"gold", "(none)"}
    assert res.summary["slo_classes"]["(none)"]["requests_meeting_slo"] == 1         # b misses 1 ms
    assert list(res.to_pandas()["slo_class"].fillna("")) == ["gold", "", ""]


@pytest.mark.parametrize("setting,key", [
    ("engine.scheduling_policy=edf", "engine.scheduling_policy"),           # no TTFT target anywhere
    ("engine.age_weight=2", "engine.age_weight"),                           # policy is not age_weighted
    ("workload.classes[0].slo_class=platinum", "workload (request"),        # not a class of slo.classes
    ("slo.classes.interactive.ttft_ms=-1", "slo.classes.interactive.ttft_ms"),
])
def test_bad_policy_inputs_are_one_line_exit_2_and_write_nothing(setting, key, tmp_path, capsys):
    if key == "engine.scheduling_policy":          # a scenario without any TTFT target
        assert_refused("priority_classes", ["slo.ttft_ms=null", setting], key, tmp_path, capsys)
    else:
        assert_refused("edf_slo_classes", [setting], key, tmp_path, capsys)
