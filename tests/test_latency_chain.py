"""latency.fallback (issue 43 item 10): a tier without data for a pool passes it to the next, and
the tier used is reported per pool (summary.json latency_tiers, the console, a warning)."""
import hashlib
from pathlib import Path

import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.config.schema.latency import parse_latency
from dsim.metrics.console import summary_lines

from helpers import scenario

ROOT = Path(__file__).resolve().parents[1]
LUT7 = str(ROOT / "luts" / "llama-2-7b_h100_tp1.csv")
L7 = "meta-llama/Llama-2-7b-hf"


def _digest(res) -> str:
    rows = [(r.rid, r.t_first_token, r.t_completion) for r in res.requests]
    return hashlib.sha256(repr(rows).encode()).hexdigest()


def test_missing_lut_reports_the_fallback_tier(tmp_path):
    lat = {"model": "lut", "path": str(tmp_path / "missing.csv"), "fallback": ["roofline"]}
    res = dsim.run(scenario(model=L7, latency=lat))
    t = res.summary["latency_tiers"]["default"]
    assert (t["chain"], t["tier"], t["used"]) == (["lut", "roofline"], 1, "roofline")
    assert t["skipped"][0]["model"] == "lut" and "missing.csv" in t["skipped"][0]["reason"]
    assert any(w.startswith("pool default: latency lut has no data") and "fell back to roofline" in w
               for w in res.summary["warnings"])
    assert "  latency: pool default ran roofline (tier 2 of lut -> roofline)" in summary_lines("x", res.summary)
    # the run is the roofline's, step for step
    assert _digest(res) == _digest(dsim.run(scenario(model=L7, latency={"model": "roofline"})))


def test_first_tier_with_data_is_used_per_pool(tmp_path, monkeypatch):
    """vidur without profiles -> the LUT where it has the pool's rows (H100), the roofline where not (A100)."""
    monkeypatch.setenv("DSIM_VIDUR_DATA", str(tmp_path))           # no profiles at all
    lat = {"model": "vidur", "fallback": [{"model": "lut", "path": LUT7}, "roofline"]}
    s = scenario(model=L7, latency=lat,
                 cluster={"router": "round_robin",
                          "pools": [{"name": "h100", "hardware": "H100-SXM", "replicas": 1},
                                    {"name": "a100", "hardware": "A100-80GB", "replicas": 1}]})
    res = dsim.run(s)
    tiers = res.summary["latency_tiers"]
    assert (tiers["h100"]["used"], tiers["h100"]["tier"]) == ("lut", 1)
    assert (tiers["a100"]["used"], tiers["a100"]["tier"]) == ("roofline", 2)
    assert [x["model"] for x in tiers["a100"]["skipped"]] == ["vidur", "lut"]
    assert "A100-80GB" in tiers["a100"]["skipped"][1]["reason"]
    assert res.summary["pools"]["h100"]["completed"] > 0
    # the H100 pool alone runs exactly as a plain LUT run
    one = scenario(model=L7, latency=lat)
    plain = scenario(model=L7, latency={"model": "lut", "path": LUT7})
    assert _digest(dsim.run(one)) == _digest(dsim.run(plain))


def test_tiers_take_the_head_sections_scale_and_host(tmp_path):
    lat = {"model": "lut", "path": str(tmp_path / "missing.csv"), "scale": 2.0, "host": {"step_us": 500},
           "fallback": ["roofline", {"model": "roofline", "scale": 3.0}]}
    res = dsim.run(scenario(model=L7, latency=lat))
    want = dsim.run(scenario(model=L7, latency={"model": "roofline", "scale": 2.0, "host": {"step_us": 500}}))
    assert _digest(res) == _digest(want)
    assert res.manifest["latency"]["scale"] == 2.0 and res.manifest["latency"]["host_us"]["step_us"] == 500


def test_every_tier_missing_is_one_config_error(tmp_path):
    lat = {"model": "lut", "path": str(tmp_path / "a.csv"), "fallback": [{"model": "lut", "path": str(tmp_path / "b.csv")}]}
    with pytest.raises(ConfigError, match=r"latency.fallback: a tier with data .*a.csv.*b.csv"):
        dsim.run(scenario(model=L7, latency=lat))


def test_without_a_chain_a_missing_asset_is_still_an_error(tmp_path):
    with pytest.raises(ConfigError, match="latency.path: got .*an existing regular file"):
        dsim.run(scenario(model=L7, latency={"model": "lut", "path": str(tmp_path / "missing.csv")}))
    res = dsim.run(scenario(model=L7, latency={"model": "roofline"}))
    assert "latency_tiers" not in res.summary


def test_fallback_entries_are_validated():
    with pytest.raises(ConfigError, match=r"latency.fallback\[0\].model: got 'nope'"):
        parse_latency({"model": "vidur", "fallback": ["nope"]})
    with pytest.raises(ConfigError, match=r"latency.fallback\[0\].fallback: no chain inside"):
        parse_latency({"model": "vidur", "fallback": [{"model": "roofline", "fallback": ["roofline"]}]})
    with pytest.raises(ConfigError, match=r"latency.fallback\[1\].path"):
        parse_latency({"model": "vidur", "fallback": ["roofline", {"model": "lut"}]})
