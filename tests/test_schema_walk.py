"""The schema's own machinery (dsim.config.schema.walk on msgspec structs): what pydantic used to
give the sections and the builders rely on."""
from __future__ import annotations

import copy
import pickle

import pytest

from dsim.config.errors import ConfigError
from dsim.config.schema.base import ValidationError, merged, parse
from dsim.config.schema.cluster import DisaggregationConfig, PoolConfig
from dsim.config.schema.engine import EngineSection
from dsim.config.schema.workload import TENANTS, MixWorkload, parse_workload


def test_a_section_built_in_code_is_validated_and_remembers_its_keys():
    d = DisaggregationConfig(decode_router={"policy": "least_kv"})
    assert d.decode_router.policy == "least_kv" and d.given("decode_router") and not d.given("kv_transfer")
    assert d.to_dict() == {"decode_router": {"policy": "least_kv"}}
    with pytest.raises(ConfigError, match=r"^max_num_seqs: got 0, expected"):
        EngineSection(max_num_seqs=0)
    with pytest.raises(ValidationError, match="max_num_seqz"):       # unknown keys too, with did-you-mean
        EngineSection(max_num_seqz=3)


def test_sections_are_frozen_and_pickle_without_losing_the_given_keys():
    e = parse(EngineSection, {"max_num_seqs": 8}, "engine")
    with pytest.raises(AttributeError):
        e.max_num_seqs = 9
    for back in (pickle.loads(pickle.dumps(e)), copy.deepcopy(e)):
        assert back == e and back.to_dict() == {"max_num_seqs": 8} and back.given("max_num_seqs")


def test_paths_follow_the_users_keys_through_lists_tags_and_mappings():
    with pytest.raises(ConfigError) as err:
        parse_workload({"type": "mix", "classes": [{"name": "a", "type": "poisson", "rate": 1, "num_requests": 3,
                                                    "prompt_tokens": {"dist": "uniform", "low": 5, "high": 2},
                                                    "output_tokens": 4}]})
    assert str(err.value) == "workload.classes[0].prompt_tokens.high: got 2, expected a number >= 5"
    with pytest.raises(ConfigError, match=r"^workload\.classes\[0\]\.type: got 'mix'"):
        parse_workload({"type": "mix", "classes": [{"name": "a", "type": "mix"}]})


def test_a_tenant_checks_its_own_keys_first_and_keeps_the_workloads_order():
    """A tenant class is its workload with the tenant keys before the workload's (walk._flatten
    copies the bases msgspec cannot share); the order is the order of checks and of the schema."""
    fields = list(TENANTS["poisson"].model_fields)
    assert fields[:6] == ["name", "priority", "slo_class", "temperature", "top_p", "domain"] and fields[6] == "type"
    assert fields.index("prompt_tokens") < fields.index("burst_factor")
    with pytest.raises(ConfigError, match=r"^workload\.classes\[0\]\.name: got ''"):
        parse_workload({"type": "mix", "classes": [{"name": "", "type": "poisson", "rate": -1}]})
    m = parse_workload({"type": "mix", "classes": [{"name": "a", "type": "poisson", "rate": 1, "num_requests": 3,
                                                    "prompt_tokens": 5, "output_tokens": 4}]})
    assert isinstance(m, MixWorkload) and m.classes[0].prompt_tokens == 5


def test_merged_sections_are_checked_as_a_whole():
    shared = parse(EngineSection, {"max_num_seqs": 8}, "engine")
    own = parse(EngineSection, {"block_size": 32}, "cluster.pools[0].engine")
    both = merged(shared, own)
    assert (both.max_num_seqs, both.block_size) == (8, 32) and both.to_dict() == {"max_num_seqs": 8, "block_size": 32}
    with pytest.raises(ConfigError, match=r"^min_replicas: got 3, expected <= replicas \(2\)"):
        PoolConfig(name="p", replicas=2, min_replicas=3)
