"""The declared scenario schema: generated files are current, shipped scenarios validate against the
JSON Schema an editor uses, and bad ones are refused both by it and by load_scenario."""
from __future__ import annotations

import copy
import functools
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.config.files import load_yaml
from dsim.config.schema import reference

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = sorted((ROOT / "scenarios").glob("*.yaml"))
SCHEMA_LINE = "# yaml-language-server: $schema=scenario.schema.json"


@functools.lru_cache(maxsize=None)
def _validator():
    """One JSON Schema validator for the session: jsonschema.validate() checks the schema itself
    and builds a validator on every call (about a second each with today's schema)."""
    schema = reference.json_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def _read(path: Path) -> dict:
    return load_yaml(path.read_text(), str(path))


def test_committed_json_schema_is_current():
    on_disk = (ROOT / "scenarios" / "scenario.schema.json").read_text()
    assert on_disk == reference.json_text(), "stale: run `dsim schema > scenarios/scenario.schema.json`"


def test_committed_reference_is_current():
    on_disk = (ROOT / "docs" / "scenario-reference.md").read_text()
    assert on_disk == reference.markdown(), "stale: run `dsim schema --markdown > docs/scenario-reference.md`"


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.name)
def test_shipped_scenario_names_the_schema_and_validates(path):
    assert path.read_text().splitlines()[0] == SCHEMA_LINE
    _validator().validate(_read(path))


# (key path, value, the path load_scenario's message must start with)
BAD = [
    (("sead",), 1, "sead: unknown key; did you mean 'seed'?"),
    (("seed",), -1, "seed: got -1, expected a number >= 0"),
    (("drain",), "yes", "drain: got 'yes', expected true or false"),
    (("slo", "ttft_ms"), 0, "slo.ttft_ms: got 0, expected a number > 0"),
    (("slo", "tpot"), 5, "slo.tpot: unknown key; did you mean 'tpot_ms'?"),
    (("output", "percentiles"), [50, 101], "output.percentiles[1]: got 101, expected a number <= 100"),
    (("output", "plots"), 1, "output.plots: got 1, expected true or false"),
    (("horizon_s",), "10", "horizon_s: got '10', expected a number"),
]


def _with(data: dict, keys: tuple, value) -> dict:
    data = copy.deepcopy(data)
    node = data
    for k in keys[:-1]:
        node = node.setdefault(k, {})
    node[keys[-1]] = value
    return data


@pytest.mark.parametrize("keys,value,message", BAD, ids=lambda x: ".".join(x) if isinstance(x, tuple) else None)
def test_bad_scenarios_are_refused_by_both(keys, value, message):
    base = _read(ROOT / "scenarios" / "quickstart.yaml")
    bad = _with(base, keys, value)
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(bad)
    with pytest.raises(ConfigError) as e:
        dsim.load_scenario(bad)
    assert str(e.value).startswith(message)


def test_exponent_numbers_load():
    scn = dsim.load_scenario(ROOT / "scenarios" / "quickstart.yaml", ["horizon_s=1e3"])
    assert scn.horizon_s == 1000.0


def test_schema_command_prints_both(capsys):
    from dsim.cli import main
    assert main(["schema"]) == 0
    assert capsys.readouterr().out == reference.json_text()
    assert main(["schema", "--markdown"]) == 0
    assert capsys.readouterr().out == reference.markdown()


def test_import_dsim_does_not_import_the_schema():
    code = ("import sys, dsim; print(any(m in sys.modules for m in "
            "('pydantic', 'msgspec', 'dsim.config.schema.base')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_shared_names_match_the_builders():
    """The schema's lists of routers, band columns and physics coefficient counts (dsim.config.names)
    are the builders' lists: one declaration, checked here."""
    from dsim.config import names
    from dsim.cluster.routers import ROUTERS
    from dsim.latency.physics import ALPHA_NAMES, BETA_NAMES
    assert tuple(ROUTERS) == names.ROUTERS
    assert (len(ALPHA_NAMES), len(BETA_NAMES)) == (names.N_ALPHA, names.N_BETA)
    import csv
    from importlib import resources
    head = next(csv.reader(resources.files("dsim.data").joinpath("validation_errors.csv").open()))
    assert set(names.BAND_COLUMNS) <= set(head)


def test_set_through_a_yaml_alias_changes_one_place(tmp_path):
    """`--set` on a key reached through a YAML alias changed every use of the alias."""
    base = (ROOT / "scenarios" / "quickstart.yaml").read_text()
    doc = load_yaml(base, "q")
    doc["workload"] = {"type": "mix", "classes": [
        {"name": "chat", "type": "poisson", "rate": 2, "num_requests": 5, "prompt_tokens": "LEN", "output_tokens": 5},
        {"name": "batch", "type": "poisson", "rate": 2, "num_requests": 5, "prompt_tokens": "ALIAS",
         "output_tokens": 5}]}
    import yaml
    text = yaml.safe_dump(doc, sort_keys=False).replace("prompt_tokens: LEN", "prompt_tokens: &len {dist: constant, value: 100}")
    text = text.replace("prompt_tokens: ALIAS", "prompt_tokens: *len")
    (tmp_path / "a.yaml").write_text(text)
    scn = dsim.load_scenario(tmp_path / "a.yaml", ["workload.classes[0].prompt_tokens.value=1500"])
    classes = scn.raw["workload"]["classes"]
    assert (classes[0]["prompt_tokens"]["value"], classes[1]["prompt_tokens"]["value"]) == (1500, 100)


def test_numpy_booleans_are_booleans():
    import numpy as np
    data = _read(ROOT / "scenarios" / "quickstart.yaml")
    assert dsim.load_scenario({**data, "drain": np.False_}).drain is False


# values both the loader and an editor's schema accept, as YAML 1.1 writes them
GOOD = [
    (("slo",), None),                              # `slo:` with nothing under it
    (("engine",), None),
    (("speculation",), {"mode": False}),           # `mode: off` reads as false
]


@pytest.mark.parametrize("keys,value", GOOD, ids=lambda x: ".".join(x) if isinstance(x, tuple) else None)
def test_empty_sections_and_yaml_off_are_accepted_by_both(keys, value):
    ok = _with(_read(ROOT / "scenarios" / "quickstart.yaml"), keys, value)
    _validator().validate(ok)
    dsim.load_scenario(ok)
    bad = _with(ok, ("speculation",), {"mode": True})           # `on` is not a mode
    with pytest.raises(jsonschema.ValidationError):
        _validator().validate(bad)
    with pytest.raises(ConfigError, match="speculation.mode"):
        dsim.load_scenario(bad)


def test_a_number_as_mapping_key_is_named_as_a_key():
    bad = _with(_read(ROOT / "scenarios" / "quickstart.yaml"), ("slo", "classes"), {1: {"ttft_ms": 100}})
    with pytest.raises(ConfigError) as e:
        dsim.load_scenario(bad)
    assert str(e.value).startswith("slo.classes.1: ")


@pytest.mark.parametrize("router,expected", [(None, "round_robin"), ({}, "round_robin"),
                                             ({"policy": "jsq"}, "jsq"), ("jsq", "jsq")])
def test_router_null_or_without_policy_is_the_default(router, expected):
    data = _read(ROOT / "scenarios" / "quickstart.yaml")
    data["cluster"] = {"pools": [{"name": "p", "replicas": 2}], "router": router}
    scn = dsim.load_scenario(data)
    assert scn.config.cluster.router.policy == expected
    if router != {}:                    # the schema still asks an editor's mapping to name its policy
        _validator().validate(data)
