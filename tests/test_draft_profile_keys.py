"""Draft device profiles' lut_ids, kv_cache_limit_mb, max_parallel_tokens and default_link (issue 43
item 8, seed 002 section 5.1): each key changes what a draft device does."""
from __future__ import annotations

import copy
import csv
from dataclasses import replace

import pytest
import simpy

from dsim.config.errors import ConfigError
from dsim.config.model import load_model
from dsim.config.scenario import load_scenario
from dsim.latency.base import BatchShape
from dsim.specdec.config import DraftGroup
from dsim.specdec.devices import DRAFT_LUT_DIR, DraftDevice, DraftLut, load_draft_profile

L2_7B = "meta-llama/Llama-2-7b-hf"


def device(profile, max_batch=1, drafter=L2_7B):
    grp = DraftGroup("g", profile, 1, 10.0, 100.0, None, False, ("constant", 0, 0), [], [], max_batch, 0.0)
    env = simpy.Environment()
    return env, DraftDevice(env, "g-0", grp, load_model(drafter))


def test_lut_ids_time_the_drafter_from_the_table_where_it_has_rows():
    prof = load_draft_profile("edge-a40", "p")
    env, dev = device(prof)
    assert isinstance(dev.step, DraftLut)
    with open(DRAFT_LUT_DIR / "llama-2-7b_a40_tp1.csv") as f:     # the table's own row, read here
        row = next(r for r in csv.DictReader(f) if r["phase"] == "draft_decode" and r["microbatch"] == "1"
                   and r["context_len"] == "512")
    assert dev.token_time(511) == pytest.approx(float(row["latency_ms"]) / 1e3 + prof.step_overhead_ms / 1e3)
    # a drafter the table does not cover keeps the roofline; so does the same profile without the id
    _, other = device(prof, drafter="meta-llama/Llama-3.2-1B")
    assert not isinstance(other.step, DraftLut)
    _, plain = device(replace(prof, lut_ids=()))
    assert not isinstance(plain.step, DraftLut)
    assert plain.token_time(511) != pytest.approx(dev.token_time(511), rel=0.02)


def test_an_unknown_lut_id_is_refused():
    bad = {"kind": "edge", "peak_tflops": 100, "mem_gb_s": 500, "memory_gb": 24, "power_w": 100,
           "lut_ids": ["llama-2-7b_a40_tp1", "nope"]}
    with pytest.raises(ConfigError, match=r"^p.lut_ids\[1\]: got 'nope'"):
        load_draft_profile(bad, "p")


def _batches(prof, jobs=8, ctx=1000, k=4, max_batch=8):
    env, dev = device(prof, max_batch=max_batch)
    done = []
    for _ in range(jobs):
        dev.submit(k, ctx, lambda: done.append(env.now))
    env.run()
    assert len(done) == jobs
    return dev


def test_kv_cache_limit_bounds_a_draft_batch():
    prof = load_draft_profile("edge-a10", "p")
    assert _batches(prof).largest_batch == 8
    per_round_mb = (1000 + 4) * load_model(L2_7B).kv_bytes_per_token / 1e6     # 3 rounds fit, a 4th does not
    assert _batches(replace(prof, kv_cache_limit_mb=3.5 * per_round_mb)).largest_batch == 3
    # a round larger than the whole cache still drafts (alone)
    assert _batches(replace(prof, kv_cache_limit_mb=0.5 * per_round_mb)).largest_batch == 1


def test_max_parallel_tokens_caps_a_batch_and_splits_a_wide_tree_level():
    prof = load_draft_profile("edge-a10", "p")
    assert _batches(replace(prof, max_parallel_tokens=2)).largest_batch == 2
    capped = replace(prof, max_parallel_tokens=2)
    times = {}
    for name, p in (("free", prof), ("capped", capped)):
        env, dev = device(p)
        dev.submit(3, 100, lambda: None, steps=[1, 4, 4])
        env.run()
        times[name] = dev.busy_s
    step = prof.step_model(load_model(L2_7B)).step_time

    def t(n, level):
        return step(BatchShape(decode_tokens=n, decode_ctx_sum=n * (100 + level + 1), num_sampled=n, running=1))
    assert times["free"] == pytest.approx(t(1, 0) + t(4, 1) + t(4, 2))
    assert times["capped"] == pytest.approx(t(1, 0) + 2 * t(2, 1) + 2 * t(2, 2))     # by hand: 4 = 2 + 2


SCN = {"model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM", "workload": {"type": "poisson", "rate": 5, "num_requests": 4,
                                                         "prompt_tokens": 50, "output_tokens": 8},
       "speculation": {"mode": "distributed", "drafts": [{"profile": "phone-flagship"}]}}


def test_default_link_gives_the_group_its_link_unless_the_group_sets_one():
    g = load_scenario(SCN).spec.groups[0]
    assert (g.rtt_ms, g.bw_mbps) == (25.0, 150.0)          # phone-flagship: default_link 5g
    d = copy.deepcopy(SCN)
    d["speculation"]["drafts"][0]["rtt_ms"] = 70
    g = load_scenario(d).spec.groups[0]
    assert (g.rtt_ms, g.bw_mbps) == (70.0, 150.0)
    d["speculation"]["drafts"][0]["profile"] = {"kind": "phone", "peak_tflops": 2, "mem_gb_s": 50, "memory_gb": 8,
                                                "power_w": 5, "default_link": {"rtt_ms": 33, "bw_mbps": 12}}
    g = load_scenario(d).spec.groups[0]
    assert (g.rtt_ms, g.bw_mbps) == (70.0, 12.0)


def test_a_group_without_a_link_needs_a_default_link():
    d = copy.deepcopy(SCN)
    d["speculation"]["drafts"][0]["profile"] = {"kind": "phone", "peak_tflops": 2, "mem_gb_s": 50, "memory_gb": 8,
                                                "power_w": 5}
    with pytest.raises(ConfigError, match=r"^speculation.drafts\[0\].rtt_ms: .*has no default_link"):
        load_scenario(d)
    d["speculation"]["drafts"][0]["profile"]["default_link"] = "carrier-pigeon"
    with pytest.raises(ConfigError, match=r"^speculation.drafts\[0\].profile.default_link: got 'carrier-pigeon'"):
        load_scenario(d)
