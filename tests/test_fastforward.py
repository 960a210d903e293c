"""Quiet decode stretches replayed in one go give the same run, byte for byte, as stepping one at
a time (dsim.serving.fastforward)."""

import numpy as np
import pytest

from dsim.config.scenario import load_scenario
from dsim.runner import Session, simulate
from dsim.serving.fastforward import FastForward

from helpers import bench_scenario

_stretch_on = FastForward._can_stretch


def _scenario(**extra):
    return load_scenario({**bench_scenario(1500, rate=4), **extra})


def _state(ses) -> tuple:
    led = ses.reqs
    cols = {name: led.col(name).tobytes() for name in ("arrival", "t_scheduled", "t_first_token", "t_completion",
                                                       "t_last_token", "n_out", "num_computed", "state", "energy_j",
                                                       "kv_peak_bytes")}
    log = ses.fleet.replicas()[0].inst.log
    steps = tuple(np.asarray(getattr(log, k)).tobytes() for k in ("dur", "itl_count", "kv_used", "t_end", "running", "waiting",
                                                                  "prefill_tokens", "decode_tokens"))
    inst = ses.fleet.replicas()[0].inst
    return cols, steps, inst.num_steps, inst.busy_time, inst.D, inst.kv.free_count


def _run(make, fast: bool, monkeypatch, advance=None):
    monkeypatch.setattr(FastForward, "_can_stretch", _stretch_on if fast else (lambda self: False))
    if advance is None:
        ses = simulate(make())
    else:
        ses = Session(make())
        for t in advance:
            ses.advance(t)
        ses.end = ses.run_to_end()
    return ses


@pytest.mark.parametrize("case", ["drained", "horizon", "slices"])
def test_stretches_change_nothing(case, monkeypatch):
    if case == "horizon":
        make = lambda: _scenario(horizon_s=200.0, drain=False)      # noqa: E731 (stops mid-stretch)
    else:
        make = lambda: _scenario()                                   # noqa: E731
    advance = (13.37, 100.0, 101.5) if case == "slices" else None
    fast = _run(make, True, monkeypatch, advance)
    slow = _run(make, False, monkeypatch, advance)
    inst = fast.fleet.replicas()[0].inst
    assert inst.ff_steps > 0.5 * inst.num_steps                      # most steps went through stretches
    assert slow.fleet.replicas()[0].inst.ff_steps == 0
    assert _state(fast) == _state(slow)


def test_models_with_state_step_one_at_a_time(monkeypatch):
    """The physics model smooths preemptions per call: its replica never stretches."""
    ses = simulate(_scenario(latency={"model": "physics"}))
    assert ses.fleet.replicas()[0].inst.ff_steps == 0


def test_generated_scenarios_are_the_same_with_and_without_stretches(capsys):
    """A slice of experiments/fastforward_fuzz.py (150 cases there, none different): mutated shipped
    scenarios across the feature space give byte-identical summaries and request timestamps with
    quiet stretches on and off."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    import fastforward_fuzz
    assert fastforward_fuzz.main(["--cases", "12", "--seed", "11"]) == 0
    out = capsys.readouterr().out
    assert "differ 0" in out and " (0 of them with stretches)" not in out, out


def _replicas_state(ses) -> tuple:
    """Every request column and every replica's step series, counters and KV state."""
    led = ses.reqs
    cols = tuple(led.col(name).tobytes() for name in ("arrival", "t_queued", "t_scheduled", "t_first_token",
                                                      "t_completion", "t_last_token", "n_out", "state", "replica",
                                                      "energy_j", "kv_peak_bytes"))
    reps = []
    for rep in ses.fleet.replicas():
        inst, log = rep.inst, rep.inst.log
        reps.append((tuple(np.asarray(getattr(log, k)).tobytes() for k in log.SERIES), inst.num_steps,
                     inst.busy_time, inst.D, inst.ecum, inst.kv.free_count, tuple(inst.kv.free_q.items())))
    return cols, tuple(reps)


@pytest.mark.parametrize("alpha", [False, True])
def test_replicas_run_past_each_other_and_change_nothing(alpha, monkeypatch):
    """Four replicas behind JSQ: a stretch runs past other replicas' quiet stretch ends (and their
    arrival-to-queue delays), and finishing steps end inside it; the run is the one stepping one
    step at a time, byte for byte, and it takes fewer SimPy events than stopping at every event."""
    from helpers import bench_scenario as bench4
    extra = {"latency": {"model": "roofline", "alpha": [300, 0.5, 0]}} if alpha else {}
    make = lambda: load_scenario({**bench4(1200, replicas=4), "seed": 5, **extra})    # noqa: E731
    fast = _run(make, True, monkeypatch)
    monkeypatch.setattr(FastForward, "_can_stretch", _stretch_on)
    monkeypatch.setattr("dsim.serving.fastforward._horizon", lambda queue, me, past: (queue[0][0],) * 2)
    every = simulate(make())                       # stretches stop at every event
    slow = _run(make, False, monkeypatch)
    assert sum(r.inst.ff_steps for r in fast.fleet.replicas()) > 0.5 * sum(r.inst.num_steps
                                                                          for r in fast.fleet.replicas())
    assert _replicas_state(fast) == _replicas_state(slow) == _replicas_state(every)
    assert next(fast.sim.env._eid) < next(every.sim.env._eid)


@pytest.mark.parametrize("replicas,advance", [(4, None), (1, None), (4, (7.77, 20.0))])
def test_stretches_run_past_arrivals_and_change_nothing(replicas, advance, monkeypatch):
    """Behind a counts-only router (JSQ), an arrival reads a replica's queue counts and enqueues no
    sooner than alpha's a0 after it: stretches step past arrivals up to that bound (finishing steps
    past one become tails).  Byte for byte the run with stretches stopping at every arrival, and at
    every event (slices too); fewer SimPy events."""
    from helpers import bench_scenario as bench
    from dsim.cluster.fleet import Fleet
    make = lambda: load_scenario({**bench(900, replicas=replicas), "seed": 7})    # noqa: E731
    past = _run(make, True, monkeypatch, advance)
    assert all(r.inst._d_past > 0 for r in past.fleet.replicas())
    monkeypatch.setattr(Fleet, "arrival_reads", lambda self: 2)
    stop = _run(make, True, monkeypatch, advance)
    assert all(r.inst._d_past == 0 for r in stop.fleet.replicas())
    slow = _run(make, False, monkeypatch, advance)
    assert _replicas_state(past) == _replicas_state(stop) == _replicas_state(slow)
    assert next(past.sim.env._eid) < 0.95 * next(stop.sim.env._eid)


def test_routers_that_read_more_than_counts_stop_stretches_at_arrivals():
    """least_kv reads the KV use a stretch has already moved on: no stepping past arrivals."""
    from helpers import bench_scenario as bench
    doc = bench(200, replicas=2)
    ses = simulate(load_scenario({**doc, "cluster": {**doc["cluster"], "router": "least_kv"}}))
    assert ses.fleet.arrival_reads() == 2
    assert all(r.inst._d_past == 0 and r.inst.ff_steps > 0 for r in ses.fleet.replicas())


def _folded_state(ses) -> tuple:
    """A replica's step log with its folded chunks and spilled segments: totals, peaks, plot points."""
    log = ses.fleet.replicas()[0].inst.log
    whole = tuple(np.concatenate(parts).tobytes() for parts in zip(*log.chunks(*log.WHOLE)))
    plots = tuple(tuple(a.tobytes() for a in log.series(k)) for k in ("running", "waiting", "depth", "kv"))
    return whole, plots, log.steps, log.token_totals(), log.peak_running(), log.peak_waiting(), log._n_spilled


def test_stretches_fold_and_spill_the_step_log_where_stepping_does(monkeypatch):
    """A stretch writes the constant columns once per run of steps (StepLog.quiet_rows): with chunks
    of 97 steps (folds inside stretches) and spilling past 400, the folded totals, peaks, plot points
    and spilled series are those of stepping one at a time."""
    from dsim.serving import steplog
    monkeypatch.setattr(steplog, "CHUNK", 97)
    monkeypatch.setattr(steplog, "SPILL_STEPS", 400)
    fast = _run(lambda: _scenario(), True, monkeypatch)
    slow = _run(lambda: _scenario(), False, monkeypatch)
    log = fast.fleet.replicas()[0].inst.log
    assert log._n_spilled > 0 and log.steps > 20 * 97
    assert _folded_state(fast) == _folded_state(slow)
    assert _state(fast) == _state(slow)


def test_the_plain_gateway_routes_as_the_general_path():
    """Fleet.arrive's inline path (one cluster, admission always, no reach, no hop) books, routes
    and times requests as the general path does (taken here through a reach filter that allows
    every pool): the same requests (routed times and replicas included) and step series."""
    from helpers import bench_scenario as bench
    make = lambda: load_scenario({**bench(600, replicas=3), "seed": 9})    # noqa: E731
    plain = simulate(make())
    general = Session(make())
    general.fleet.reach = lambda r: None
    general.end = general.run_to_end()
    assert _replicas_state(plain) == _replicas_state(general)
    assert plain.reqs.col("t_routed").tobytes() == general.reqs.col("t_routed").tobytes()
    assert len(set(plain.reqs.col("replica"))) == 3


def _grid(replicas: int, a0_us: float) -> dict:
    """Every step 1/64 s (blackbox b0), arrivals every 1/8 s a replica, entry delay a0: times on a
    dyadic grid, so entries fall due exactly at step ends (a0 = 1/64 s: made when that step began,
    1/128 s: made during it), the same-time case of ``Instance._take_in``."""
    s = bench_scenario(400, replicas=replicas)
    s["latency"] = {"model": "blackbox", "beta": [15625, 0, 0], "alpha": [a0_us, 0, 0]}
    s["workload"] = {**s["workload"], "type": "constant", "rate": 8 * replicas}
    return s


def _snapshot(ses) -> tuple:
    """What a reader sees between slices: every replica's queue (ids in order) and entries still in
    their delay, and every request in flight with its state and queueing time."""
    reps = tuple((tuple(r.rid for r in rep.inst.waiting), rep.inst.in_alpha) for rep in ses.fleet.replicas())
    return reps, tuple(sorted((r.rid, r.state, r.t_queued) for r in ses.fleet.live.values()))


def _counted(make, monkeypatch, general: bool, advance=None):
    """A run on the pending route (or the general path: entries as events), what it showed at each
    slice end, and the SimPy events it processed; pending entries that became events again when
    their replica parked are counted too."""
    import simpy
    from dsim.cluster.fleet import Fleet
    from dsim.serving.instance import Instance
    n = [0, 0, 0]
    step, to_events, after = simpy.Environment.step, Instance._entries_to_events, Instance._after_past_event

    def counting(env):
        n[0] += 1
        step(env)

    def parked(inst):
        n[1] += len(inst._pend)
        to_events(inst)

    def same_time(inst):                 # an own entry event due at a tail's end runs first (_after_past)
        n[2] += 1
        return after(inst)
    seen = []
    with monkeypatch.context() as m:
        m.setattr(simpy.Environment, "step", counting)
        m.setattr(Instance, "_entries_to_events", parked)
        m.setattr(Instance, "_after_past_event", same_time)
        if general:
            m.setattr(Fleet, "entries_unread", lambda self: False)
        monkeypatch.setattr(FastForward, "_can_stretch", _stretch_on)
        ses = Session(make())
        for t in advance or ():
            ses.advance(t)
            seen.append(_snapshot(ses))
        ses.end = ses.run_to_end()
    assert all((r.inst._pend is None) == general for r in ses.fleet.replicas())
    return ses, seen, n


def _mid_entries(doc, k: int = 6) -> tuple:
    """Slice ends just after ``k`` requests' queue entries, spread over the run (a busy replica is
    then mid-step: the entry is pending on the route, due before the stop)."""
    q = simulate(load_scenario(doc)).reqs.col("t_queued")
    q = q[np.isfinite(q)]
    return tuple(float(t) + 1e-4 for t in np.sort(q)[np.linspace(len(q) // 8, len(q) - len(q) // 8, k).astype(int)])


@pytest.mark.parametrize("case", ["one", "four", "four_slices", "one_horizon", "idle_alpha", "grid_made_before",
                                  "grid_made_during", "grid4"])
def test_entries_without_events_change_nothing(case, monkeypatch):
    """Queue entries kept pending and taken in at step ends (Instance._take_in) give the run of entries
    as SimPy events, byte for byte: every request column, every replica's step series, counters and
    KV free queue, the event id counter; what a reader sees at slice ends and a horizon stop just
    after entries fell due; with entries falling due exactly at step ends (both sides of the
    same-time rule), and with replicas parking while entries are pending (they become events
    again); and the route processes fewer SimPy events."""
    advance = None
    if case in ("one", "one_horizon"):
        doc = {**bench_scenario(900), "seed": 4}
        if case == "one_horizon":                             # stops mid-step, an entry due before it
            doc.update(horizon_s=_mid_entries(doc, 1)[0], drain=False)
    elif case in ("four", "four_slices"):
        doc = {**bench_scenario(900, replicas=4), "seed": 7}
        advance = _mid_entries(doc) if case == "four_slices" else None
    elif case == "idle_alpha":                                # light load: replicas park with entries pending;
        doc = {**bench_scenario(500, replicas=2, rate=3,      # a1 > 0: entries fall due out of arrival order
                                output_tokens={"dist": "uniform", "min": 1, "max": 6}), "seed": 2,
               "latency": {"model": "roofline", "alpha": [2000, 40, 0]}}
    else:
        doc = _grid(4 if case == "grid4" else 1, 7812.5 if case == "grid_made_during" else 15625)
        if case == "grid4":                                   # slice ends at entries' due times: still pending
            advance = (3.015625, 7.515625)
    make = lambda: load_scenario(doc)                          # noqa: E731
    route, seen_route, (n_route, parked, after_route) = _counted(make, monkeypatch, False, advance)
    general, seen_general, (n_general, _, after_general) = _counted(make, monkeypatch, True, advance)
    assert _replicas_state(route) == _replicas_state(general)
    for col in ("t_routed", "t_queued"):
        assert route.reqs.col(col).tobytes() == general.reqs.col(col).tobytes()
    assert seen_route == seen_general
    if case.startswith("grid"):
        # the general path makes an event to let an own entry due at a tail's end run first
        # (_after_past; other replicas' stretches stop at it); the route takes such entries in directly
        assert after_route == 0 and (after_general > 0) == (case != "grid_made_during")
    else:                                                     # every other event kept its id
        assert next(route.sim.env._eid) == next(general.sim.env._eid)
    n = route.fleet.arrived
    assert n_route < n_general - 0.5 * n if case != "idle_alpha" else n_route < n_general
    if case == "idle_alpha":
        assert parked > 0
