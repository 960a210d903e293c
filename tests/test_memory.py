"""Memory of a long run (tracemalloc and object counts, not wall time).

A run holds Request objects only for the requests in flight: a generated workload makes each one
at its arrival and the fleet drops it into the columnar ledger when it finishes.  What grows with
the requests ever seen is columns: ~100 bytes a request in the ledger and 16 bytes a step in the
step log (~7 steps a request on the bench workload), and past 2^17 requests or 2^18 steps those go
to a spill file (tests/test_spill.py).  Before issue 17's work the bench workload
kept 3.6 KB a request (112 MB at 20k requests), then ~0.9 KB (the objects plus 40 bytes a step)."""
import gc
import tracemalloc

from dsim.config.scenario import load_scenario
from dsim.core.request import Request
from dsim.runner import Session, simulate
from dsim.serving import steplog

from helpers import bench_scenario


def _bench(n: int, **workload):
    return load_scenario(bench_scenario(n, **workload))


def _requests_alive() -> int:
    """Request objects still reachable (garbage in reference cycles is collected first)."""
    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is Request)


def test_request_objects_alive_are_the_ones_in_flight():
    gc.collect()
    base = _requests_alive()                  # other tests' results the process still holds
    ses = Session(_bench(3000))
    fleet = ses.fleet
    seen = 0
    for k in range(1, 16):                    # 150 s at 20 req/s, in 10 s slices
        ses.advance(10.0 * k)
        in_flight = fleet.arrived - fleet.n_completed - fleet.n_rejected
        assert len(fleet.live) == in_flight
        # the in-flight ones, plus the next one the arrival process holds before sending it and the
        # last finished one a replica's loop variable still names (and, rarely, a one-token
        # request still in the last step's list of prefills)
        assert _requests_alive() - base <= in_flight + 3
        seen = max(seen, fleet.n_completed)
    assert seen > 2000 and fleet.ledger.n == fleet.n_completed


def test_a_long_run_keeps_the_requests_in_flight_and_about_100_bytes_a_request():
    """10^5 requests (short answers at a high rate, so it runs in seconds): Request objects stay
    within the requests in flight at every sample, the ledger's columns take < 110 bytes a request
    and the step log's running/waiting series stay within one chunk."""
    gc.collect()
    base = _requests_alive()
    n = 100_000
    ses = Session(_bench(n, rate=100, output_tokens={"dist": "normal", "mean": 32, "std": 10, "min": 1, "max": 64}))
    fleet = ses.fleet
    for t in (250.0, 500.0, 750.0):
        ses.advance(t)
        in_flight = fleet.arrived - fleet.n_completed - fleet.n_rejected
        assert fleet.n_completed > t * 90 and in_flight < 200      # a steady state, not a growing queue
        assert _requests_alive() - base <= in_flight + 3
    ses.run_to_end()
    led = ses.reqs
    assert len(led) == n == fleet.n_completed
    assert led.nbytes < 110 * n, led.nbytes / n
    inst = fleet.replicas()[0].inst
    log = inst.log
    assert log.steps > steplog.CHUNK and len(log.running) < steplog.CHUNK      # chunks were folded
    # the folded totals are still exact: no prefix cache and no preemption, so every prompt token
    # is prefilled once and every later token decoded once
    assert inst.num_preemptions == 0
    assert log.total_tokens() == int(led.col("prompt_len").sum() + (led.col("max_tokens") - 1).sum())
    ses.run_to_end()                                  # again: the ledger is sealed once, nothing changes
    assert ses.reqs is led and len(led) == n


def test_memory_held_per_request_is_columns_not_objects():
    """What stays after the simulation is bounded per request by the columns.  Short answers at a
    high rate keep it fast under tracemalloc (which slows the run ~10x); 10^5 and 10^6 requests of
    the bench workload are measured by experiments/bench_all.py (peak RSS)."""
    n = 10_000
    scn = _bench(n, rate=400, output_tokens={"dist": "normal", "mean": 32, "std": 10, "min": 1, "max": 64})
    gc.collect()
    tracemalloc.start()
    try:
        ses = simulate(scn)
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    steps = ses.fleet.replicas()[0].inst.num_steps
    assert len(ses.reqs) == n and steps > 0
    # ledger (~100 B) + workload arrays (16 B) + step log (16 B a step) + a fixed part (imports, tables)
    bound = 150 * n + 16 * steps + 2_500_000
    assert held < bound, (held / n, bound / n)
    # the peak while simulating adds the requests in flight and one folded chunk of the step log
    assert peak < held + 8_000_000, (peak - held) / 1e6
