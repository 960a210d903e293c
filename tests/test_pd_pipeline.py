"""Pipeline parallelism on P/D pools (issue 43 item 13): prefill and decode pools of PP virtual
engines, the KV handoff moved in one stream per pipeline stage pair."""
import math

import pytest

import dsim
from dsim.config.errors import ConfigError

from helpers import scenario

KV_LAT_MS, KV_GB_S = 0.2, 10.0


def _pd(pp_prefill, pp_decode, **extra):
    pools = [{"name": "prefill", "role": "prefill", "replicas": 1,
              "engine": {"tensor_parallel_size": 2, "pipeline_parallel_size": pp_prefill}},
             {"name": "decode", "role": "decode", "replicas": 1,
              "engine": {"tensor_parallel_size": 2, "pipeline_parallel_size": pp_decode}}]
    return scenario(model="meta-llama/Llama-3.1-8B", latency={"model": "roofline"},
                    cluster={"router": "least_outstanding", "pools": pools,
                             "disaggregation": {"kv_transfer": {"latency_ms": KV_LAT_MS, "bandwidth_gb_s": KV_GB_S}}},
                    workload={"type": "poisson", "rate": 20, "num_requests": 40, "prompt_tokens": 600,
                              "output_tokens": 16}, **extra)


@pytest.mark.parametrize("pp_prefill,pp_decode,streams", [(2, 2, 2), (2, 1, 1), (4, 2, 2)])
def test_pd_pools_with_pipeline_stages(pp_prefill, pp_decode, streams):
    res = dsim.run(_pd(pp_prefill, pp_decode), check_invariants=True)
    s = res.summary
    assert s["requests"]["completed"] == 40
    kvb = res.scenario.model.kv_bytes_per_token
    pre, dec = set(), set()
    for r in res.requests:
        pre.add(r.prefill_replica)
        dec.add(r.replica.name if hasattr(r.replica, "name") else r.replica)
        # the handoff: latency + the prompt's KV split over min(Pp, Pd) stage streams
        want = KV_LAT_MS / 1e3 + r.prompt_len * kvb / streams / (KV_GB_S * 1e9)
        assert math.isclose(r.t_kv_ready - r.t_handoff, want, rel_tol=1e-9)
    # requests reached several virtual engines of each pool, never a pool of the wrong role
    assert all(n.startswith("prefill-0.ve") for n in pre) and len(pre) > 1
    assert dec == ({f"decode-0.ve{k}" for k in range(pp_decode)} if pp_decode > 1 else {"decode-0"})
    assert s["pools"]["prefill"]["replicas_created"] == pp_prefill and s["pools"]["decode"]["replicas_created"] == pp_decode


def test_dp_ranks_with_a_pd_role_are_still_refused():
    s = _pd(1, 1)
    s["model"] = "Qwen/Qwen3-30B-A3B"
    s["cluster"]["pools"][1]["engine"] = {"data_parallel_size": 2, "enable_expert_parallel": True}
    with pytest.raises(ConfigError, match=r"data_parallel_size: got 2, expected 1 with a P/D role"):
        dsim.run(s)
