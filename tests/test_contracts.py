"""Seed 004's request contracts: the ROUTED state and route time (BC-7/BC-8), and BC-14's bound on
pending events, which a leak of events breaks."""
import pytest

import dsim
from dsim.config.scenario import load_scenario
from dsim.core.invariant import InvariantError
from dsim.core.request import ROUTED, STATE_NAMES
from dsim.runner import Session

from helpers import scenario


def test_a_request_is_routed_before_it_is_queued():
    # alpha delays queue entry by 5 ms: in between the request is ROUTED to its replica
    scn = load_scenario(scenario(latency={"model": "blackbox", "beta": [1000, 0, 0], "alpha": [5000, 0, 0]},
                                 workload={"type": "constant", "rate": 1, "num_requests": 2,
                                           "prompt_tokens": 100, "output_tokens": 4}))
    ses = Session(scn, check_invariants=True)
    ses.advance(0.002)
    r = ses.fleet.live[0]                 # arrived, not finished
    assert r.state == ROUTED and STATE_NAMES[r.state] == "routed"
    assert r.t_routed == r.arrival == 0.0 and r.t_queued is None
    ses.advance(0.006)
    assert r.state != ROUTED and r.t_queued == pytest.approx(0.005)
    ses.run_to_end()                      # BC-8 with the route time is checked at the end
    for r in ses.reqs:
        assert r.arrival <= r.t_routed <= r.t_queued <= r.t_scheduled <= r.t_first_token <= r.t_completion


def test_route_ms_column():
    res = dsim.run(scenario())
    df = res.to_pandas()
    assert (df["route_ms"] == 0).all()      # no network before the gateway, no router latency modelled
    assert len(df) == 10


def test_bc14_catches_leaked_events():
    scn = load_scenario(scenario(workload={"type": "poisson", "rate": 10, "num_requests": 20,
                                           "prompt_tokens": 100, "output_tokens": 4}))
    ses = Session(scn, check_invariants=True)
    ses.run_to_end()                      # the bound holds on a normal run
    ses = Session(scn, check_invariants=True)
    for _ in range(500):                  # far-future events nobody owns: a leak
        ses.sim.env.timeout(1e6)
    with pytest.raises(InvariantError, match="BC-14"):
        ses.run_to_end()


def test_an_arrival_at_a_step_end_joins_the_next_step(tmp_path):
    # steps of exactly 1 ms; r2 arrives at t = 1 ms, the instant the first step ends.  Its arrival
    # timer was created after the step's (at r1's arrival, 0.5 ms), so creation order alone would
    # run the step end first and start step 2 without it; arrivals go first (same-time order:
    # arrival < route < step < completion), so step 2 admits r1 and r2 together
    from helpers import trace_file
    p = trace_file(tmp_path, [(0.0, 100, 4), (0.0005, 100, 4), (0.001, 100, 4)])
    res = dsim.run(scenario(latency={"model": "blackbox", "beta": [1000, 0, 0], "alpha": [0, 0, 0]},
                            workload={"type": "trace", "path": str(p)}), check_invariants=True)
    r = sorted(res.requests, key=lambda r: r.rid)
    assert r[1].t_scheduled == r[2].t_scheduled == 0.001
