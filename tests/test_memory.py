"""Memory held by a finished simulation, per request (tracemalloc, not wall time).

Before the typed step log and the release of finished requests' block hashes, the bench workload
kept 3.1 KB per request (measured at 39f6e11); it keeps ~0.9 KB now (the request object and ~7
step-log rows).  This is a regression bound, not yet the O(requests in flight) issue 17 asks for."""
import gc
import json
import tracemalloc

from dsim.bench import BENCH_SCENARIO
from dsim.config.scenario import load_scenario
from dsim.runner import simulate


def _held_per_request(n: int) -> float:
    scn = json.loads(json.dumps(BENCH_SCENARIO))
    scn["workload"]["num_requests"] = n
    s = load_scenario(scn)
    gc.collect()
    tracemalloc.start()
    try:
        ses = simulate(s)
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(ses.reqs) == n
    return held / n


def test_finished_requests_hold_under_1200_bytes_each():
    assert _held_per_request(8000) < 1200
