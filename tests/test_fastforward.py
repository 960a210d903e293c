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
    monkeypatch.setattr("dsim.serving.fastforward._horizon", lambda queue, me: queue[0][0])
    every = simulate(make())                       # stretches stop at every event
    slow = _run(make, False, monkeypatch)
    assert sum(r.inst.ff_steps for r in fast.fleet.replicas()) > 0.5 * sum(r.inst.num_steps
                                                                          for r in fast.fleet.replicas())
    assert _replicas_state(fast) == _replicas_state(slow) == _replicas_state(every)
    assert next(fast.sim.env._eid) < next(every.sim.env._eid)
