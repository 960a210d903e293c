"""The declared ``workload`` section: shipped scenarios parse into typed models, bad inputs are
one path-qualified message (checked at load, before anything is built), the JSON Schema describes
every key."""
import math
import pickle
from pathlib import Path

import pytest

from dsim.config.schema.jsonschema import described_schema

import dsim
from dsim.config.errors import ConfigError
from dsim.config.schema.scenario import ScenarioConfig
from dsim.config.schema.workload import (TENANTS, TYPES, GammaWorkload, LognormalLength, MixWorkload, NormalLength,
                                         StagedWorkload, TraceWorkload, UniformLength, parse_workload)
from dsim.core.rng import PartitionedRNG
from dsim.workload.generator import build_requests

SCN = Path(__file__).resolve().parents[1] / "scenarios"


def test_shipped_scenarios_parse_into_typed_sections():
    g = dsim.load_scenario(SCN / "gamma_bursty.yaml").config.workload
    assert isinstance(g, GammaWorkload) and (g.rate, g.cv, g.num_requests, g.duration_s) == (8, 3.0, 800, None)
    assert isinstance(g.prompt_tokens, LognormalLength) and (g.prompt_tokens.min, g.prompt_tokens.max) == (8, 4000)
    assert isinstance(g.output_tokens, UniformLength) and g.output_tokens.bounds == (32, 512)

    s = dsim.load_scenario(SCN / "staged_shared_prefix.yaml").config.workload
    assert isinstance(s, StagedWorkload) and s.stage_arrivals == "constant"
    assert [(st.rate, st.duration_s) for st in s.stages] == [(6, 30), (12, 30)]
    assert (s.prompt_tokens, s.output_tokens) == (447, 248)
    sp = s.shared_prefix
    assert (sp.num_groups, sp.users_per_group, sp.multi_turn, sp.question_pool, sp.order) == (9, 5, True, False,
                                                                                              "random")

    m = dsim.load_scenario(SCN / "priority_classes.yaml").config.workload
    assert isinstance(m, MixWorkload) and [(c.name, c.priority, c.slo_class, c.type) for c in m.classes] == [
        ("chat", 0, None, "poisson"), ("batch", 1, None, "poisson")]
    assert isinstance(m.classes[0], TENANTS["poisson"]) and isinstance(m.classes[0].prompt_tokens, NormalLength)
    assert pickle.loads(pickle.dumps(m)) == m                      # tenant models are importable classes

    t = dsim.load_scenario(SCN / "trace_jsonl.yaml").config.workload
    assert isinstance(t, TraceWorkload) and (t.path, t.prefix_tokens, t.start_s, t.hash_block_tokens) == (
        "data/sample_trace.jsonl", 48, 0.0, 512)

    c = dsim.load_scenario(SCN / "closed_loop.yaml").config.workload
    assert math.isinf(c.rate) and c.max_concurrency == 32          # `rate: inf` (a YAML 1.1 string)


def test_a_typed_section_and_its_mapping_build_the_same_requests():
    raw = {"type": "constant", "rate": 4, "num_requests": 30, "prompt_tokens": {"dist": "uniform", "min": 5, "max": 50},
           "output_tokens": 7, "shared_prefix": {"num_groups": 2, "system_prompt_len": 16}}
    a, da = build_requests(raw, PartitionedRNG(3), None)
    b, db = build_requests(parse_workload(raw), PartitionedRNG(3), None)
    assert da == db and [(r.arrival, r.prompt_len, r.max_tokens, r.segments) for r in a] == [
        (r.arrival, r.prompt_len, r.max_tokens, r.segments) for r in b]


POISSON = {"type": "poisson", "rate": 2, "num_requests": 5, "prompt_tokens": 10, "output_tokens": 2}


@pytest.mark.parametrize("workload, message", [
    ({**POISSON, "rtae": 3}, "workload.rtae: unknown key; did you mean 'rate'?"),
    ({**POISSON, "type": "zipf"}, "workload.type: got 'zipf', expected one of poisson, gamma, constant, burst, ramp, "
                                  "staged, trace, mix"),
    ({**POISSON, "rate": 0}, "workload.rate: got 0, expected a number >= 1e-09"),
    ({**POISSON, "num_requests": None}, "workload.num_requests: num_requests or duration_s to bound the poisson "
                                        "arrivals"),
    ({**POISSON, "prompt_tokens": 0}, "workload.prompt_tokens: got 0, expected an integer in [1, 1e+08]"),
    ({**POISSON, "output_tokens": {"dist": "uniform", "low": 9, "high": 3}},
     "workload.output_tokens.high: got 3, expected a number >= 9"),
    ({**POISSON, "output_tokens": {"dist": "normal", "mean": 9}}, "workload.output_tokens.std: this key to be set"),
    ({**POISSON, "type": "gamma"}, "workload.cv: this key to be set"),
    ({**POISSON, "shared_prefix": {"num_groups": 2, "system_prompt_len": 8, "order": "cycle"}},
     "workload.shared_prefix.order: got 'cycle', expected random unless question_pool is true"),
    ({"type": "staged", "stages": [{"rate": 1, "duration_s": 2}, {"rate": 1}], "prompt_tokens": 1, "output_tokens": 1},
     "workload.stages[1].duration_s: this key to be set"),
    ({"type": "trace", "path": "t.jsonl", "rate": 2, "time_scale": 3},
     "workload.rate: either rate or time_scale, not both"),
    ({"type": "mix", "classes": [{**POISSON, "name": "a"}, {"type": "mix", "name": "b"}]},
     "workload.classes[1].type: got 'mix', expected a workload type other than mix"),
    ({"type": "mix", "classes": [{**POISSON, "name": "a"}, {**POISSON, "name": "a"}]},
     "workload.classes[1].name: got 'a', expected a unique tenant name"),
    ({"type": "mix", "classes": [{**POISSON, "name": "a", "priority": 1.5}]},
     "workload.classes[0].priority: got 1.5, expected an integer in [-1e6, 1e6] (lower is served first)"),
    ({"type": "mix", "num_requests": 5, "classes": [{**POISSON, "name": "a"}]},
     "workload.num_requests: unknown key (known keys here: classes, max_concurrency, type)"),
])
def test_bad_workloads_are_refused_at_load_with_the_path(workload, message):
    with pytest.raises(ConfigError) as e:
        dsim.load_scenario({"model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM", "workload": workload})
    assert str(e.value).startswith(message), str(e.value)


def test_json_schema_describes_every_key():
    js = described_schema(ScenarioConfig)
    refs = {r["$ref"].rsplit("/", 1)[1] for r in js["properties"]["workload"]["anyOf"]}
    assert refs == {m.__name__ for m in TYPES.values()}
    for name in list(refs) + [m.__name__ for m in TENANTS.values()] + ["SharedPrefix", "Stage", "UniformLength"]:
        props = js["$defs"][name]["properties"]
        assert props and all(p.get("description") for p in props.values()), name
    poisson = js["$defs"]["PoissonWorkload"]
    assert set(poisson["required"]) == {"type", "rate", "prompt_tokens", "output_tokens"}
    assert poisson["properties"]["rate"]["anyOf"][1] == {"const": "inf"}
    assert {"name", "priority", "slo_class", "path"} <= set(js["$defs"]["TraceTenant"]["properties"])
