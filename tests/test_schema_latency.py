"""The declared ``latency`` section (dsim.config.schema.latency): shipped scenarios parse into the
kind's typed model, bad values name their key path, the JSON Schema documents every key, and the
schema agrees with the builders it feeds (dsim.latency.registry)."""
from pathlib import Path

import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.config.generations import HostCosts
from dsim.config.hardware import load_device
from dsim.config.engine import load_engine
from dsim.config.model import load_model
from dsim.config.schema.latency import (KINDS, BlackboxLatency, CalibratedTpsLatency, HostOverrides, LatencyField,
                                        LutLatency, LutSelect, PhysicsLatency, RooflineLatency, Unified5Latency,
                                        VidurLatency, parse_latency)
from dsim.latency.base import LatencyContext
from dsim.latency.calibrated_tps import CalibratedTPSModel
from dsim.latency.lut import KEY_FIELDS
from dsim.latency.physics import N_ALPHA, N_BETA
from dsim.latency.registry import MODELS, build_latency
from dsim.latency.roofline import RooflineModel
from dsim.latency.vidur import VidurModel
from helpers import scenario

ROOT = Path(__file__).resolve().parents[1]


def test_shipped_scenarios_parse_into_their_kind():
    lut = dsim.load_scenario(ROOT / "scenarios" / "lut.yaml").config.latency
    assert isinstance(lut, LutLatency)
    assert lut.path == "../luts/llama-2-7b_h100_tp1.csv" and lut.select.tensor_parallel == 1
    assert lut.decode_phase == "fused_decode" and lut.tail is False and lut.fanout_k == 1 and lut.scale == 1.0
    bb = dsim.load_scenario(ROOT / "scenarios" / "blackbox.yaml").config.latency
    assert isinstance(bb, BlackboxLatency) and bb.beta == [6000, 0.05, 20] and bb.alpha == [1500, 0.1, 10]
    u5 = dsim.load_scenario(ROOT / "scenarios" / "unified5.yaml").config.latency
    assert isinstance(u5, Unified5Latency) and u5.given("beta") and not u5.given("coefficients")
    assert u5.alpha == [19615, 1850, 1.71]


def test_absent_section_is_none_and_builds_the_default_roofline():
    raw = scenario()
    del raw["latency"]
    scn = dsim.load_scenario(raw)
    assert scn.config.latency is None and scn.fleet.pools[0].latency is None
    ctx = LatencyContext(load_model("meta-llama/Llama-3.1-8B"), load_device("H100-SXM"), load_engine({}), 1000)
    _, _, none = build_latency(None, ctx)
    _, _, explicit = build_latency(parse_latency({"model": "roofline"}), ctx)
    assert none == explicit and none["model"] == "roofline"
    with pytest.raises(TypeError, match="parse_latency"):
        build_latency({"model": "roofline"}, ctx)


def test_a_calibrated_section_parses():
    """What dsim calibrate writes: fitted coefficients, host costs, fitted_on, held-out errors."""
    lat = parse_latency({"model": "roofline", "compute_efficiency": 0.93, "memory_efficiency": 0.88, "overlap": 1.0,
                         "alpha": [1800.0, 0.2, 12.0], "host": {"step_us": 410.5, "per_seq_us": 6.1},
                         "fitted_on": "H100-SXM", "held_out_errors": {"ttft_p50_err": [-0.02, 0.05],
                                                                      "tpot_p50_err": [0.01, 0]}})
    assert lat.host.step_us == 410.5 and lat.host.per_prefill_us is None
    assert lat.held_out_errors == {"ttft_p50_err": [-0.02, 0.05], "tpot_p50_err": [0.01, 0.0]}
    phys = parse_latency({"model": "physics", "beta": [0.5] * N_BETA, "alpha": [1.0] * N_ALPHA})
    assert isinstance(phys, PhysicsLatency) and phys.coefficients is None and phys.cpu_offload_blocks is None


@pytest.mark.parametrize("lat,msg", [
    ({"model": "magic"}, "latency.model: got 'magic', expected one of roofline, blackbox, unified5, physics, lut, "
                         "vidur, calibrated_tps"),
    ({"model": "blackbox"}, "latency.beta: this key to be set"),
    ({"model": "blackbox", "beta": [1, 2]}, "latency.beta: got [1, 2], expected a list of 3 numbers (microseconds)"),
    ({"model": "blackbox", "beta": [1, -2, 3]}, "latency.beta[1]: got -2, expected a number >= 0"),
    ({"model": "physics", "alpha": [1] * 10}, f"latency.alpha: got {[1] * 10}, expected a list of 11 numbers "
                                              "(see ALPHA_NAMES)"),
    ({"compute_efficency": 0.9}, "latency.compute_efficency: unknown key; did you mean 'compute_efficiency'?"),
    ({"compute_efficiency": 0}, "latency.compute_efficiency: got 0, expected a number > 0"),
    ({"overlap": 1.5}, "latency.overlap: got 1.5, expected a number <= 1"),
    ({"scale": 0}, "latency.scale: got 0, expected a number > 0"),
    ({"host": {"step_us": -1}}, "latency.host.step_us: got -1, expected a number >= 0"),
    ({"host": {"cudagraph_decode_only": "yes"}},
     "latency.host.cudagraph_decode_only: got 'yes', expected true or false"),
    ({"held_out_errors": {"bogus_err": [0.1]}}, "latency.held_out_errors.bogus_err: got 'bogus_err', expected one of"),
    ({"held_out_errors": {"ttft_p50_err": [-1.0]}},
     "latency.held_out_errors.ttft_p50_err[0]: got -1.0, expected a finite relative error > -1"),
    ({"model": "lut"}, "latency.path: this key to be set"),
    ({"model": "lut", "path": "x.csv", "decode_phase": "prefill"},
     "latency.decode_phase: got 'prefill', expected one of fused_decode, draft_decode, verify"),
    ({"model": "lut", "path": "x.csv", "select": {"tp": 1}}, "latency.select.tp: unknown key"),
    ({"model": "vidur", "tp_comm": "nccl"}, "latency.tp_comm: got 'nccl', expected one of profile, roofline"),
    ({"model": "calibrated_tps", "base_decode_tps": 0}, "latency.base_decode_tps: got 0, expected a number > 0"),
    ({"model": "blackbox", "beta": [1, 2, 3], "overlap": 1}, "latency.overlap: unknown key"),
    ("roofline", "latency: got 'roofline', expected a mapping"),
])
def test_bad_values_name_their_key(lat, msg):
    with pytest.raises(ConfigError) as e:
        dsim.load_scenario(scenario(latency=lat))
    assert str(e.value).startswith(msg)


def test_a_pools_own_section_is_parsed_under_its_path():
    cluster = {"pools": [{"name": "a", "replicas": 1, "latency": {"model": "blackbox", "beta": [1, 2]}}]}
    with pytest.raises(ConfigError, match=r"^cluster.pools\[0\].latency.beta: got \[1, 2\]"):
        dsim.load_scenario(scenario(cluster=cluster))
    cluster["pools"][0]["latency"] = {"model": "blackbox", "beta": [1, 2, 3]}
    scn = dsim.load_scenario(scenario(cluster=cluster, latency={"model": "roofline", "overlap": 0.5}))
    assert isinstance(scn.config.latency, RooflineLatency)
    assert isinstance(scn.fleet.pools[0].latency, BlackboxLatency)      # replaces the shared one whole


def test_json_schema_documents_every_key():
    from dsim.config.schema.jsonschema import described_schema
    from dsim.config.schema.scenario import ScenarioConfig
    js = described_schema(ScenarioConfig)
    defs = js["$defs"]
    assert {d["properties"]["model"].get("const") for n, d in defs.items() if n.endswith("Latency")} == set(KINDS)
    for name, model in {**{m.__name__: m for m in KINDS.values()}, "HostOverrides": HostOverrides,
                        "LutSelect": LutSelect}.items():
        props = defs[name]["properties"]
        assert set(props) == set(model.model_fields), name
        for key, p in props.items():
            assert p.get("description"), (name, key)
    assert defs["BlackboxLatency"]["required"] == ["model", "beta"]
    assert defs["PhysicsLatency"]["properties"]["beta"]["anyOf"][0]["minItems"] == N_BETA


def test_schema_agrees_with_the_builders():
    assert set(KINDS) == set(MODELS)
    assert set(HostOverrides.model_fields) == set(HostCosts.__dataclass_fields__)
    assert tuple(LutSelect.model_fields) == KEY_FIELDS
    for model, defaults in ((RooflineLatency, RooflineModel.DEFAULTS), (VidurLatency, VidurModel.DEFAULTS),
                            (CalibratedTpsLatency, CalibratedTPSModel.DEFAULTS)):
        assert {k: model.model_fields[k].default for k in defaults} == defaults
