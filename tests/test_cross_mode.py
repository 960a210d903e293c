"""Cross-mode sanity (seed 000, "Cross-mode validation"): one workload through the blackbox, roofline
and physics latency models gives medians within the factors documented in docs/latency-models.md
("Cross-mode sanity").  Not a fidelity test: it catches a model that is off by a unit or a term."""
from pathlib import Path

import pytest
import yaml

import dsim

ROOT = Path(__file__).resolve().parents[1]
# max / min of the three models' p50, measured 1.40x (TPOT), 1.42x (E2E) and 3.4x (TTFT) on 2026-11-26 (physics term-by-term defaults)
FACTOR = {"tpot": 1.5, "e2e": 1.5, "ttft": 4.0}


@pytest.fixture(scope="module")
def medians():
    base = yaml.safe_load((ROOT / "scenarios" / "blackbox.yaml").read_text())   # Llama-3.1-8B, H100, 15 req/s
    base["output"] = {"plots": False}
    base["workload"]["num_requests"] = 300
    out = {}
    for lat in (base["latency"], {"model": "roofline"}, {"model": "physics"}):
        res = dsim.run({**base, "latency": lat})
        assert res.summary["requests"]["completed"] == 300
        out[lat["model"]] = {m: res.summary["latency_ms"][m]["p50"] for m in FACTOR}
    return out


@pytest.mark.parametrize("metric", sorted(FACTOR))
def test_three_latency_models_agree_within_the_documented_factor(medians, metric):
    vals = {m: v[metric] for m, v in medians.items()}
    assert min(vals.values()) > 0
    assert max(vals.values()) / min(vals.values()) < FACTOR[metric], vals
