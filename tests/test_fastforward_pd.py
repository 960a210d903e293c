"""Decode replicas of a P/D cluster stretch past what cannot read or change them
(dsim.serving.fastforward._horizon_pd, Fleet.decode_past, Fleet.fabric_actors): the run is the one
stepping one step at a time, byte for byte, with and without a network."""
from pathlib import Path

import numpy as np
import pytest

from dsim.cluster.fleet import Fleet
from dsim.config.scenario import load_scenario
from dsim.runner import simulate
from dsim.serving import fastforward
from dsim.serving.fastforward import FastForward

ROOT = Path(__file__).resolve().parents[1]
_stretch_on = FastForward._can_stretch
CASES = {"network": ("pd_network.yaml", 400), "direct": ("pd_disagg.yaml", 300)}


def _make(case: str):
    name, n = CASES[case]
    return lambda: load_scenario(ROOT / "scenarios" / name, [f"workload.num_requests={n}", "output.plots=false"])


def _state(ses) -> tuple:
    """Every request column (handoff and KV arrival times included), every replica's step series,
    counters and KV free queue, and the fabric's books."""
    led = ses.reqs
    cols = tuple(led.col(name).tobytes() for name in (
        "arrival", "t_queued", "t_scheduled", "t_first_token", "t_completion", "t_last_token", "n_out", "state",
        "replica", "prefill_replica", "t_handoff", "t_kv_ready", "energy_j", "kv_peak_bytes"))
    reps = []
    for rep in ses.fleet.replicas():
        inst, log = rep.inst, rep.inst.log
        reps.append((tuple(np.asarray(getattr(log, k)).tobytes() for k in log.SERIES), inst.num_steps,
                     inst.busy_time, inst.D, inst.ecum, inst.kv.free_count, tuple(inst.kv.free_q.items()),
                     inst.handed_off, inst.n_completed))
    net = ses.fleet.network
    links = () if net is None else tuple(sorted((str(k), lk.bytes, lk.busy_s, tuple(sorted(lk.bins.items())))
                                                for k, lk in net.links.items()))
    return cols, tuple(reps), links


def _run(make, monkeypatch, stretch: bool = True, every: bool = False):
    monkeypatch.setattr(FastForward, "_can_stretch", _stretch_on if stretch else (lambda self: False))
    if every:                          # stretches stop at the next event, whatever it is
        monkeypatch.setattr(fastforward, "_horizon_pd", lambda queue, me, past: queue[0][0])
    ses = simulate(make())
    monkeypatch.undo()
    return ses


def _decoders(ses) -> list:
    return [r.inst for r in ses.fleet.replicas() if r.pool.role == "decode"]


@pytest.mark.parametrize("case", ["network", "direct"])
def test_pd_decode_stretches_change_nothing(case, monkeypatch):
    """Past arrivals (up to a0), enqueues into busy prefill replicas, the other decode replica's
    events and (with a network) past the fabric's actors: the same requests, step series, counters,
    KV free queues and link books as stepping one at a time and as stretches stopping at every
    event; fewer SimPy events than the latter."""
    make = _make(case)
    fast = _run(make, monkeypatch)
    every = _run(make, monkeypatch, every=True)
    slow = _run(make, monkeypatch, stretch=False)
    assert all(i._pd > 0 and i.ff_steps > 0.3 * i.num_steps for i in _decoders(fast))
    assert _state(fast) == _state(slow) == _state(every)
    assert next(fast.sim.env._eid) < 0.97 * next(every.sim.env._eid)


def test_a_bound_past_a0_is_caught(monkeypatch):
    """The comparison above can fail: a decode replica told that arrivals enqueue 0.1 s later than
    they can (so a prefill step started after its stretch began may hand off, and read its KV use,
    before the cut) gives a different run."""
    make = _make("network")
    slow = _run(make, monkeypatch, stretch=False)
    bound = Fleet.decode_past
    monkeypatch.setattr(Fleet, "decode_past", lambda self: bound(self) + 0.1)
    wrong = simulate(make())
    monkeypatch.undo()
    assert _state(wrong) != _state(slow)


def test_decode_replicas_stop_at_every_event_outside_the_plain_p_d_gateway():
    """An admission policy (it may read any replica) or no P/D: no bound; a0 = 0: stretches stop at
    arrivals (bound 0)."""
    scn = ROOT / "scenarios" / "pd_disagg.yaml"
    base = ["workload.num_requests=30", "output.plots=false"]
    ses = simulate(load_scenario(scn, base + ["cluster.admission.policy=queue_cap",
                                              "cluster.admission.max_waiting=100000"]))
    assert ses.fleet.decode_past() is None and all(i._pd is None for i in _decoders(ses))
    ses = simulate(load_scenario(scn, base + ["latency.alpha=[0, 0, 0]"]))
    assert ses.fleet.decode_past() == 0.0
    ses = simulate(load_scenario(scn, base))
    assert ses.fleet.decode_past() > 0 and all(i._pd == ses.fleet.decode_past() for i in _decoders(ses))


def test_kv_transfers_as_callbacks_equal_the_event_path(monkeypatch):
    """The KV transfer's life without a Timeout for the serialization overhead (a Wake with the same
    heap key) and without an arrival event of its own (``then``: the flow is the event): the same
    run, SimPy event count included, as the general path (a Timeout whose callback begins the flow,
    a done event the handoff appends its callback to)."""
    from dsim.cluster.fleet import NetworkTransfer
    from dsim.network.fabric import Network
    make = _make("network")
    fast = simulate(make())
    send = Network.send

    def general_send(self, src, dst, nbytes, record=True, then=None):
        ov, begun = self.overhead_s, []
        self.overhead_s, self._begin = 0.0, begun.append      # send begins at once: catch the flow
        try:
            ev = send(self, src, dst, nbytes, record, None)
        finally:
            self.overhead_s = ov
            del self._begin
        t = self.env.timeout(ov)
        t.callbacks.append(lambda _e, f=begun[0]: self._begin(f))
        if then is not None:
            ev.callbacks.append(then)
        return ev

    monkeypatch.setattr(Network, "send", general_send)
    monkeypatch.setattr(NetworkTransfer, "send", lambda self, s, d, n, sp="", dp="", streams=1, then=None:
                        self.net.send(self.node(s, sp), self.node(d, dp), n, True, then))
    general = simulate(make())
    assert fast.fleet.network.count > 300 and fast.fleet.network.overhead_s > 0
    assert _state(fast) == _state(general)
    assert next(fast.sim.env._eid) == next(general.sim.env._eid)
