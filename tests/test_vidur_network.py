"""vidur's network_device per target and node-aware all-reduce rows (issue 43 items 11 and 12)."""
import math
from pathlib import Path

import pytest

import dsim
from dsim.config.errors import ConfigError, MissingAssetError
from dsim.config.hardware import load_device
from dsim.config.model import load_model
from dsim.latency import vidur as V

from helpers import scenario

H100 = load_device("H100-SXM")
L7 = load_model("meta-llama/Llama-2-7b-hf")
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "profiling" / "vidur"


def test_network_device_picks_the_all_reduce_profile():
    dgx = V.VidurModel(L7, H100, 2, max_tokens=512)
    pair = V.VidurModel(L7, H100, 2, max_tokens=512, network_device="h100_pairwise_nvlink")
    assert pair.network_profile.endswith("h100_pairwise_nvlink/all_reduce.csv")
    assert dgx.network_profile.endswith("h100_dgx/all_reduce.csv")
    # the two steps differ by exactly two all-reduces a layer of each profile (same operators otherwise)
    ar_d = V.trained(dgx.profile, dgx.network_profile, 2)["allreduce"]
    ar_p = V.trained(pair.profile, pair.network_profile, 2)["allreduce"]
    n = 256
    nbytes = n * L7.hidden_size * 2
    want = 2 * L7.num_layers * (ar_p.predict(nbytes)[0] - ar_d.predict(nbytes)[0]) * 1e-3
    assert math.isclose(pair.linear_time(n) - dgx.linear_time(n), want, rel_tol=1e-6, abs_tol=1e-12)
    assert want != 0


def test_unknown_network_device_is_a_missing_asset_and_can_fall_back():
    with pytest.raises(MissingAssetError, match=r"latency.network_device: got 'h100_ib', expected a VIDUR network "
                                                r"profile under .*h100_dgx, h100_pairwise_nvlink"):
        V.VidurModel(L7, H100, 2, max_tokens=64, network_device="h100_ib")
    res = dsim.run(scenario(model="meta-llama/Llama-2-7b-hf", engine={"tensor_parallel_size": 2},
                            latency={"model": "vidur", "network_device": "h100_ib", "fallback": ["roofline"]}))
    assert res.summary["latency_tiers"]["default"]["used"] == "roofline"
    res = dsim.run(scenario(model="meta-llama/Llama-2-7b-hf", engine={"tensor_parallel_size": 2},
                            latency={"model": "vidur", "network_device": "h100_pairwise_nvlink"}))
    assert res.manifest["latency"]["network_device"] == "h100_pairwise_nvlink"


@pytest.mark.skipif(not (SHARED / "network" / "a100_dgx").is_dir(), reason="needs ../shared VIDUR profiles (A100)")
def test_a_tp_group_across_nodes_reads_the_multi_node_rows(monkeypatch, tmp_path):
    monkeypatch.setenv("DSIM_VIDUR_DATA", str(SHARED))
    monkeypatch.setenv("DSIM_CACHE_DIR", str(tmp_path))
    a100 = {"name": "A100-80GB", "peak_tflops_bf16": 312, "hbm_gb_s": 2039, "memory_gib": 79.15,
            "interconnect_gb_s": 300, "interconnect_latency_us": 10}
    one = V.VidurModel(L7, load_device(a100), 4, max_tokens=256)
    two = V.VidurModel(L7, load_device({**a100, "gpus_per_node": 2, "internode_gb_s": 25}), 4, max_tokens=256)
    assert one.comm == "profiled all_reduce" and two.comm == "profiled all_reduce (2 GPUs per node)"
    assert two.linear_time(256) > one.linear_time(256)       # the NCCL sweep across two nodes is slower
