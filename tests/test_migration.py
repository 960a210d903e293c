"""Rebalance(migrate=True): running decoders move with their KV.  The move waits for the step end,
the KV crosses the transfer path at latency + bytes / bandwidth, and the request resumes on the
other replica with every computed token intact (no recompute); conservation holds throughout."""
import pytest

from dsim.cluster.control import Rebalance, apply_action
from dsim.config.model import load_model
from dsim.config.scenario import load_scenario
from dsim.runner import Session

from helpers import scenario


def _session(cold_s=0.0, check=True):
    raw = scenario(latency={"model": "blackbox", "beta": [1000, 0, 0], "alpha": [0, 0, 0]},
                   workload={"type": "constant", "rate": 1000, "num_requests": 2, "prompt_tokens": 100,
                             "output_tokens": 60},
                   cluster={"pools": [{"name": "p", "replicas": 1, "cold_start_s": cold_s}]})
    return Session(load_scenario(raw), check_invariants=check)


@pytest.mark.parametrize("check", [True, False])
def test_a_running_request_moves_with_its_kv(check):
    """Without invariant checks p-0 fast-forwards its decode steps (dsim.serving.fastforward): the
    Rebalance lands while a stretch's last step is under way, and the move waits for its end."""
    ses = _session(check=check)
    fleet = ses.fleet
    ses.advance(0.0101)                              # both decoding on p-0 (1 ms steps)
    assert (fleet.replicas()[0].inst.ff_steps > 0) is not check
    fleet.pool("p").add_replica(0.0)                 # ready at once
    ses.advance(0.0201)                              # p-1 ready (no cold start), idle
    a, b = sorted(fleet.live.values(), key=lambda r: r.rid)     # the requests in flight
    out = apply_action(fleet, Rebalance("p", migrate=True))
    assert out["changed"] == 1                       # (2 - 0) // 2
    ses.run_to_end()
    assert (a.replica, b.replica) == ("p-0", "p-1")  # the last admitted moves
    assert fleet.migrations == 1 and not b.preempt_times
    # it left at the step end after 20.1 ms, with prompt + tokens so far in KV, moved at
    # 0.1 ms + bytes / 25 GB/s, then one 1 ms step per remaining token on p-1
    kv = load_model("meta-llama/Llama-3.1-8B", "model", None).kv_bytes_per_token
    t_out = 0.021
    moved = b.prompt_len + round((t_out - b.t_first_token) / 0.001)          # tokens computed into KV
    assert fleet.migrated_bytes == pytest.approx(moved * kv)
    d = 1e-4 + moved * kv / 25e9
    left = b.max_tokens - (moved - b.prompt_len + 1)
    assert b.t_completion == pytest.approx(t_out + d + left * 0.001, abs=1e-9)
    assert a.t_completion < b.t_completion
    s = ses.fleet
    assert s.n_completed == 2 and s.in_transfer == 0
    from dsim.metrics.summary import summarize
    assert summarize(ses.scn, s, ses.reqs)["migrations"] == {"requests": 1, "kv_bytes": moved * kv}


def test_without_migrate_running_requests_stay():
    ses = _session()
    ses.advance(0.0101)
    ses.fleet.pool("p").add_replica(0.0)
    ses.advance(0.0201)
    assert apply_action(ses.fleet, Rebalance("p"))["changed"] == 0
    ses.run_to_end()
    assert {r.replica for r in ses.reqs} == {"p-0"}
