"""The declared ``speculation`` section (dsim.config.schema.speculation): shipped scenarios parse into
typed values, bad keys give dsim's path-qualified messages, the JSON Schema documents every key, and
the schema's defaults are the ones the runtime objects use."""
import inspect
from pathlib import Path

import pytest

from dsim.config.schema.jsonschema import described_schema
import yaml

from dsim.config.errors import ConfigError
from dsim.config.scenario import load_scenario
from dsim.config.schema.base import parse
from dsim.config.schema.scenario import ScenarioConfig
from dsim.config.schema import speculation as S
from dsim.config.schema import speculation_gamma as SG
from dsim.specdec import gamma as G

SCN = Path(__file__).resolve().parents[1] / "scenarios"
GROUP = {"name": "p", "profile": "phone-flagship", "rtt_ms": 10, "bw_mbps": 10}
TWO = [{"name": "a", "drafter": "meta-llama/Llama-3.2-1B"}, {"name": "b", "drafter": "meta-llama/Llama-3.1-8B"}]


def shipped(name):
    return parse(S.SpeculationConfig, yaml.safe_load((SCN / f"{name}.yaml").read_text())["speculation"],
                 "speculation")


def refused(section) -> str:
    with pytest.raises(ConfigError) as e:
        parse(S.SpeculationConfig, section, "speculation")
    return str(e.value)


def test_shipped_hybrid_scenario_parses_into_typed_values():
    c = shipped("hybrid_rtt")
    assert c.mode == "hybrid" and c.drafter == S.DEFAULT_DRAFTER and c.fused_drafter is None
    assert isinstance(c.acceptance, S.CurveAcceptance) and c.acceptance.curves is None
    assert isinstance(c.gamma, SG.StaticGamma) and c.gamma.k == 4
    assert (c.mode_switch.policy, c.mode_switch.max_rtt_ms, c.mode_switch.max_verify_queue) == ("rtt_load", 60, 64)
    assert c.kv_admission.max_kv_utilization_pct == 85
    assert (c.cold_start.load_s, c.cold_start.warm_retention_s, c.cold_start.initially_warm) == (None, 30, False)
    assert c.partial_verification.mode == "all" and c.token_bytes == 4.0 and c.verify_order == "fcfs"
    g = c.drafts[0]
    assert (g.name, g.profile, g.count, g.rtt_ms, g.bw_mbps, g.closed_loop) == ("laptop", "laptop-rtx4060", 60, 15, 100,
                                                                                  True)
    assert (g.think_time.dist, g.think_time.mean_s, g.think_time.sigma) == ("exponential", 3.0, 1.0)
    assert g.rtt_schedule == [(20.0, 150.0), (40.0, 15.0)] and g.available is None


def test_shipped_portfolio_and_policies():
    p = shipped("drafter_portfolio").portfolio
    assert isinstance(p, S.PromptTokensPortfolio) and p.prompt_tokens == [1024] and p.escalate_below == 0.45
    assert isinstance(p.drafters[1].acceptance, S.GeometricAcceptance) and p.drafters[1].acceptance.geometric == 0.8
    assert isinstance(shipped("mobile_cloud_distributed").gamma, SG.AcceptanceBackoffGamma)
    assert shipped("datacenter_fused").gamma.threshold == 0.6
    t = shipped("tree_drafts").tree
    assert (t.topk, t.tokens, t.sibling_acceptance) == (4, 16, 0.48)
    assert isinstance(shipped("trained_gamma_head").gamma, SG.LatencyHeadGamma)


def test_load_scenario_hands_the_typed_section_to_the_builder():
    scn = load_scenario(str(SCN / "hybrid_rtt.yaml"))
    assert isinstance(scn.config.speculation, S.SpeculationConfig)
    spec = scn.spec
    assert spec.switch == {"policy": "rtt_load", "max_rtt_ms": 60, "max_verify_queue": 64, "max_link_utilization": None,
                           "link_window_s": 1.0, "min_fused_dwell_s": 0.0}
    assert spec.cold == {"load_s": None, "warm_retention_s": 30, "initially_warm": False}
    assert spec.kv_spill_pct == 85 and spec.groups[0].think == ("exponential", 3.0, 1.0)
    assert spec.groups[0].profile.kind == "laptop" and spec.policy_params == {"k": 4}


def test_yaml_bare_off_is_mode_off():
    assert parse(S.SpeculationConfig, yaml.safe_load("mode: off"), "speculation").mode == "off"


@pytest.mark.parametrize("section,message", [
    ({"gamma": {"policy": "pid", "kq": 1}},
     "speculation.gamma.kq: unknown key (known keys here: k0, k_max, k_min, kd, ki, kp, policy, target_queue)"),
    ({"gamma": {"policy": "nope"}}, "speculation.gamma.policy: got 'nope', expected one of static, "
     "acceptance_backoff, specpp, latency_head, backpressure, pid, bandit"),
    ({"gamma": {"policy": "bandit", "k_min": 9}}, "speculation.gamma.k_min: got 9, expected a number <= k_max (8)"),
    ({"gamma": {"policy": "specpp", "threshold": 1}}, "speculation.gamma.threshold: got 1, expected a number in (0, 1)"),
    ({"gamma": {"policy": "latency_head", "weights": [1, float("nan")]}},
     "speculation.gamma.weights[1]: got nan, expected a finite number"),
    ({"mode": "on"}, "speculation.mode: got 'on', expected one of off, fused, distributed, hybrid"),
    ({"acceptance": {"geometric": 0.5, "curve": "x"}},
     "speculation.acceptance: got ['curve', 'geometric'], expected one of curve, geometric or bundle"),
    ({"acceptance": {"geometric": 0.5, "curves": "x"}},
     "speculation.acceptance.curves: unknown key (known keys here: geometric)"),
    ({"mode_switch": {"policy": "gamma_policy"}},
     "speculation.mode_switch.policy: got 'gamma_policy', expected rtt_load unless gamma.policy is latency_head"),
    ({"mode": "distributed"}, "speculation.drafts: draft devices: mode distributed drafts on them"),
    ({"drafts": []}, "speculation.drafts: got [], expected a non-empty list of draft device groups"),
    ({"drafts": [GROUP, GROUP]}, "speculation.drafts[1].name: got 'p', expected a name used by one group only"),
    ({"drafts": [dict(GROUP, profile=5)]},
     "speculation.drafts[0].profile: got 5, expected a draft device profile name or a mapping"),
    ({"drafts": [dict(GROUP, profile={"kind": "phone"})]}, "speculation.drafts[0].profile.peak_tflops: this key to be set"),
    ({"drafts": [dict(GROUP, rtt_schedule=[[1, float("inf")]])]},
     "speculation.drafts[0].rtt_schedule[0]: got [1, inf], expected [t_s, rtt_ms]"),
    ({"drafts": [dict(GROUP, available=[[2, 1]])]},
     "speculation.drafts[0].available[0]: got [2, 1], expected [start_s, end_s] with end after start"),
    ({"drafts": [dict(GROUP, max_wait_ms=5)]},
     "speculation.drafts[0].max_wait_ms: got 5, expected 0 unless max_batch > 1 (nothing to wait for)"),
    ({"drafts": [dict(GROUP, max_batch=4)], "tree": {}}, "speculation.drafts[0].max_batch: got 4, expected 1 with "
     "tree drafts (batched drafting is modelled for one drafter's chains only)"),
    ({"portfolio": {"drafters": TWO, "prompt_tokens": [100, 50]}}, "speculation.portfolio.prompt_tokens: got [100, 50], "
     "expected 1 ascending positive token counts (one boundary between each pair of drafters)"),
    ({"portfolio": {"drafters": [TWO[0], {"name": "b"}], "prompt_tokens": [10]}},
     "speculation.portfolio.drafters[1].drafter: this key to be set"),
    ({"portfolio": {"drafters": TWO, "prompt_tokens": [10], "k": 3}},
     "speculation.portfolio.k: unknown key (known keys here: choose, drafters, escalate_below, prompt_tokens)"),
    ({"portfolio": {"drafters": TWO, "choose": "random"}},
     "speculation.portfolio.choose: got 'random', expected one of prompt_tokens, acceptance"),
    ({"portfolio": {"drafters": TWO, "choose": "acceptance"}}, "speculation.portfolio.min_tokens_per_step: this key to be set"),
])
def test_bad_keys_are_refused_with_the_key_path(section, message):
    assert refused(section) == message


def test_named_profiles_are_validated_by_the_inline_model(monkeypatch):
    """A profile file's entry goes through the same schema model as an inline profile."""
    from dsim.specdec import devices
    good = {"kind": "phone", "peak_tflops": 1, "mem_gb_s": 10, "memory_gb": 8, "power_w": 5}
    monkeypatch.setattr(devices, "_profiles", lambda: {"mine": good, "bad": dict(good, throttle_factor=0)})
    assert devices.load_draft_profile("mine", "p") == devices.load_draft_profile(dict(good, name="mine"), "p")
    with pytest.raises(ConfigError, match=r"^p\[bad\]\.throttle_factor: got 0, expected a number > 0$"):
        devices.load_draft_profile("bad", "p")
    inline = parse(S.InlineDraftProfile, dict(good, name="mine"), "p")
    assert devices.load_draft_profile(inline, "p") == devices.load_draft_profile("mine", "p")


@pytest.mark.parametrize("member,cls", [(SG.StaticGamma, G.StaticGamma), (SG.AcceptanceBackoffGamma, G.AcceptanceBackoff),
                                        (SG.SpecPPGamma, G.SpecPP), (SG.LatencyHeadGamma, G.LatencyHead),
                                        (SG.BackpressureGamma, G.Backpressure), (SG.PIDGamma, G.PIDGamma),
                                        (SG.BanditGamma, G.BanditGamma)])
def test_gamma_schema_defaults_are_the_policies_own(member, cls):
    """Only written keys reach a policy, so the documented defaults must be the constructor's."""
    sig = inspect.signature(cls.__init__).parameters
    for name, f in member.model_fields.items():
        if name == "policy" or f.default is None:      # None: resolved from the head file
            continue
        assert name in sig and sig[name].default == f.default, (cls.__name__, name)


def test_json_schema_documents_every_key():
    js = described_schema(ScenarioConfig)
    defs = js["$defs"]
    top = defs["SpeculationConfig"]["properties"]
    for key in ("mode", "drafter", "acceptance", "gamma", "mode_switch", "drafts", "tree", "portfolio", "verify_order"):
        assert top[key].get("description"), key
    assert top["mode"]["anyOf"][0]["enum"] == list(S.MODES)
    assert top["mode"]["anyOf"][1]["const"] is False              # YAML 1.1's bare `off`, as editors read it
    for name in ("SpeculationConfig", "DraftGroup", "InlineDraftProfile", "LatencyHeadGamma", "PIDGamma",
                 "PromptTokensPortfolio", "AcceptancePortfolio", "CurveAcceptance", "ModeSwitch", "TreeDrafts"):
        for key, prop in defs[name]["properties"].items():
            assert prop.get("description"), (name, key)
    assert defs["DraftGroup"]["required"] == ["profile"]       # rtt_ms / bw_mbps: else the profile's default_link
    assert defs["InlineDraftProfile"]["properties"]["kind"]["enum"] == list(S.KINDS)
