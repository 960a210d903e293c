"""The declared model, hardware and engine sections: typed at the door, same messages, a JSON Schema."""
from pathlib import Path

import pytest

from dsim.config.schema.jsonschema import described_schema

from dsim import load_scenario
from dsim.config import hardware as hw
from dsim.config.engine import load_engine
from dsim.config.errors import ConfigError
from dsim.config.hardware import device_names, load_device
from dsim.config.schema.base import merged, parse
from dsim.config.schema.engine import EngineSection, OffloadSection
from dsim.config.schema.hardware import HardwareSection
from dsim.config.schema.model import ModelSection
from dsim.config.schema.scenario import parse_scenario
from helpers import scenario

SCN = Path(__file__).resolve().parent.parent / "scenarios"


def test_shipped_scenarios_parse_into_typed_sections():
    cfg = load_scenario(str(SCN / "kv_offload_cpu.yaml")).config
    assert cfg.model == "meta-llama/Llama-3.1-8B" and cfg.hardware == "L40S"
    assert isinstance(cfg.engine, EngineSection) and isinstance(cfg.engine.kv_offload, OffloadSection)
    assert (cfg.engine.max_num_seqs, cfg.engine.kv_offload.cpu_gb, cfg.engine.kv_offload.policy) == (64, 200,
                                                                                                     "write_through")
    assert cfg.engine.executor is None and cfg.engine.given("max_num_seqs") and not cfg.engine.given("executor")
    s = load_scenario(str(SCN / "older_vllm_a100.yaml"))
    assert s.config.engine.vllm_version == "0.1.7" and s.config.engine.enable_chunked_prefill is None
    # the generation's defaults are resolved by load_engine: V0 whole-prompt prefill, Ray, no CUDA graphs
    assert not s.engine.enable_chunked_prefill and s.engine.max_num_batched_tokens == 4096
    assert s.engine.enforce_eager and s.engine.executor == "uniproc"


def test_inline_model_and_hardware_are_sections(tmp_path):
    cfg = parse_scenario(scenario(model={"config": "x/config.json", "name": "mine"},
                                  hardware={"name": "gpu", "peak_tflops_bf16": 100, "hbm_gb_s": 1000, "memory_gb": 24}))
    assert cfg.model == ModelSection(config="x/config.json", name="mine")
    assert isinstance(cfg.hardware, HardwareSection) and cfg.hardware.memory_gb == 24
    d = load_device(cfg.hardware)
    assert (d.name, d.memory_bytes, d.tdp_w, d.pcie_efficiency) == ("gpu", 24e9, 700, 0.75)


@pytest.mark.parametrize("over,msg", [
    ({"engine": {"max_num_seq": 8}}, "engine.max_num_seq: unknown key; did you mean 'max_num_seqs'?"),
    ({"engine": {"kv_offload": {"cpu_gb": 0}}}, "engine.kv_offload.cpu_gb: got 0, expected a number > 0"),
    ({"engine": {"kv_offload": {}}}, "engine.kv_offload.cpu_gb: this key to be set"),
    ({"engine": {"vllm_version": "latest"}},
     "engine.vllm_version: got 'latest', expected a vLLM version such as \"0.6.3\" or \"0.15.1\""),
    ({"engine": {"vllm_version": [0, 6]}},
     "engine.vllm_version: got [0, 6], expected a vLLM version string such as \"0.6.3\""),
    ({"engine": {"executor": "threads"}}, "engine.executor: got 'threads', expected one of ray, mp, uniproc"),
    ({"engine": 5}, "engine: got 5, expected a mapping"),
    ({"model": 5}, "model: got 5, expected a catalogue model name or {config: path/to/config.json}"),
    ({"model": {"name": "m"}}, "model.config: this key to be set"),
    ({"model": {"config": "c.json", "nme": "m"}}, "model.nme: unknown key; did you mean 'name'?"),
    ({"hardware": ["H100-SXM"]}, "hardware: got ['H100-SXM'], expected a device profile name or a mapping"),
    ({"hardware": {"peak_tflops_bf16": 100, "hbm_gb_s": 0, "memory_gb": 24}},
     "hardware.hbm_gb_s: got 0, expected a number > 0"),
    ({"hardware": {"peak_tflops_bf16": 100, "hbm_gb_s": 1000, "memory_gb": 24, "memory_gib": 24}},
     "hardware.memory_gib: device memory: memory_gib (GiB, as CUDA reports it) or memory_gb (1e9 bytes), exactly one"),
])
def test_bad_values_name_their_path(over, msg):
    with pytest.raises(ConfigError) as e:
        parse_scenario(scenario(**over))
    assert str(e.value).startswith(msg)


@pytest.mark.parametrize("eng,msg", [
    ({"tensor_parallel_size": 2, "executor": "uniproc"}, "engine.executor: got 'uniproc', expected ray or mp"),
    ({"num_gpu_blocks": 5, "num_gpu_blocks_override": 6}, "engine.num_gpu_blocks_override: got 6, expected only one"),
    ({"age_weight": 2}, "engine.age_weight: got 2, expected only with scheduling_policy: age_weighted"),
    ({"enable_prefix_caching": False, "kv_offload": {"cpu_gb": 1}}, "engine.kv_offload: enable_prefix_caching: true"),
    ({"vllm_version": "0.4.0", "max_model_len": 8192, "max_num_batched_tokens": 4096},
     "engine.max_num_batched_tokens: got 4096, expected >= max_model_len (8192)"),
])
def test_rules_between_keys_are_load_engines(eng, msg):
    parse(EngineSection, eng, "engine")                 # each key is valid alone
    with pytest.raises(ConfigError) as e:
        load_engine(parse(EngineSection, eng, "engine"))
    assert str(e.value).startswith(msg)


def test_a_pools_engine_is_checked_in_combination_with_the_shared_one():
    shared, own = parse(EngineSection, {"age_weight": 2}, "engine"), parse(
        EngineSection, {"scheduling_policy": "age_weighted"}, "engine")
    e = load_engine(merged(shared, own), "cluster.pools[0].engine")
    assert (e.scheduling_policy, e.age_weight) == ("age_weighted", 2)
    s = load_scenario(scenario(engine={"age_weight": 2, "tensor_parallel_size": 2},
                               cluster={"pools": [{"name": "a", "engine": {"scheduling_policy": "age_weighted"}}]}))
    e = s.fleet.pools[0].engine
    assert (e.age_weight, e.tensor_parallel_size, e.max_num_seqs, e.executor) == (2, 2, 256, "mp")
    with pytest.raises(ConfigError, match=r"^cluster\.pools\[0\]\.engine\.age_weight: got 2"):
        load_scenario(scenario(engine={"age_weight": 2}, cluster={"pools": [{"name": "a"}]}))


def test_profile_files_are_checked_by_the_hardware_section(tmp_path, monkeypatch):
    for name in device_names():                          # every shipped profile is a valid HardwareSection
        parse(HardwareSection, hw._profiles()[name], f"hardware[{name}]")
    (tmp_path / "mine.yaml").write_text("MY-GPU: {peak_tflops_bf16: 100, hbm_gb_s: 1000, memory_gib: 40, tdp: 300}\n"
                                        "OK-GPU: {peak_tflops_bf16: 100, hbm_gb_s: 1000, memory_gib: 40}\n")
    monkeypatch.setattr(hw, "PROFILE_DIRS", hw.PROFILE_DIRS + [tmp_path])
    hw._profiles.cache_clear()
    try:
        assert load_device("OK-GPU").memory_bytes == 40 * 2 ** 30
        with pytest.raises(ConfigError, match=r"^hardware\[MY-GPU\]\.tdp: unknown key; did you mean 'tdp_w'\?"):
            load_device("MY-GPU")
    finally:
        hw._profiles.cache_clear()


def test_json_schema_describes_every_key():
    for model in (EngineSection, OffloadSection, HardwareSection, ModelSection):
        js = described_schema(model)
        for key, prop in js["properties"].items():
            assert prop.get("description"), f"{model.__name__}.{key}: no description"
    props = described_schema(EngineSection)["properties"]
    assert (props["max_num_seqs"]["default"], props["max_num_seqs"]["minimum"]) == (256, 1)
    assert "None: 2048 with chunked prefill" in props["max_num_batched_tokens"]["description"]
    assert set(described_schema(HardwareSection)["required"]) == {"peak_tflops_bf16", "hbm_gb_s"}
    from dsim.config.schema.scenario import ScenarioConfig
    top = described_schema(ScenarioConfig)
    assert "EngineSection" in str(top["properties"]["engine"])
    named = top["properties"]["hardware"]["anyOf"][0]["oneOf"]
    assert named[0]["description"].startswith("A device profile") and named[1]["$ref"].endswith("HardwareSection")


def test_lut_build_model_flag_takes_a_config_json(tmp_path):
    """--model is a catalogue name or a config.json path, as its help says (the path was refused)."""
    from dsim.cli import main
    from dsim.config.model import CATALOG_DIR
    out = tmp_path / "l.csv"
    args = ["lut", "build", "--hardware", "H100-SXM", "--latency", "roofline", "--contexts", "128",
            "--microbatches", "1", "--out", str(out), "--model"]
    assert main(args + [str(CATALOG_DIR / "llama-3.1-8b-instruct.json")]) == 0 and out.exists()
    assert main(args + [str(tmp_path / "none.json")]) == 2
