"""Scenario -> simulation -> Result: the one path every front end (CLI, Python, sweeps) uses."""
from __future__ import annotations

import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__
from .config.scenario import Scenario, load_scenario
from .core.simulation import Simulation
from .latency.base import LatencyContext
from .latency.registry import build_latency
from .metrics import plots as plots_mod
from .metrics.summary import request_latencies, summarize
from .metrics.writers import AtomicOutput, requests_csv, to_json
from .serving.instance import Instance
from .workload.generator import build_requests


@dataclass
class Result:
    scenario: Scenario
    requests: list
    summary: dict
    manifest: dict
    instance: Instance = field(repr=False)
    out_dir: Path | None = None

    def latencies(self) -> dict:
        return request_latencies(self.requests)


class _Progress:
    """A one-line progress meter on stderr, driven by completions (no simulation events)."""

    def __init__(self, total: int, enabled: bool):
        self.total = total
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()
        self.last = 0.0

    def tick(self, done: int) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if now - self.last < 0.25 and done < self.total:
            return
        self.last = now
        frac = done / max(1, self.total)
        bar = "#" * int(30 * frac)
        sys.stderr.write(f"\r[{bar:<30}] {done}/{self.total} requests  {now - self.t0:5.1f}s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")


def prepare(scn: Scenario):
    """Build everything a run needs (validates the workload and latency sections too)."""
    sim = Simulation(scn.seed)
    reqs, wdesc = build_requests(scn.raw["workload"], sim.rng, scn.base_dir)
    blocks = scn.engine.kv_blocks(scn.model, scn.device)
    ctx = LatencyContext(scn.model, scn.device, scn.engine, blocks, sim.rng.stream("latency"), scn.base_dir)
    step, queueing, ldesc = build_latency(scn.raw.get("latency", {}), ctx)
    return sim, reqs, step, queueing, blocks, dict(workload=wdesc, latency=ldesc, kv_blocks=blocks)


def simulate(scn: Scenario, check_invariants: bool = False, progress: bool = False):
    """Run the simulation; return (requests, instance, description, end time)."""
    sim, reqs, step, queueing, blocks, desc = prepare(scn)
    inst = Instance(sim, scn.engine, step, queueing, blocks, check_invariants=check_invariants)
    horizon = scn.horizon_s
    prog = _Progress(len(reqs), progress)

    def arrivals():
        env = sim.env
        last = None
        for i, r in enumerate(reqs):
            if horizon is not None and r.arrival >= horizon:
                break
            t = r.arrival
            dt = t - env.now
            if dt > 0 and t != last:       # simultaneous arrivals stay simultaneous
                yield env.timeout(dt)
            last = t
            r.arrival = env.now            # the clock's sum may differ from t by 1 ulp
            inst.submit(r)
            if prog.enabled and not i % 256:
                prog.tick(len(inst.completed))

    sim.process(arrivals())
    if horizon is not None and not scn.drain:
        sim.run(until=horizon)
        end = horizon
    else:
        sim.run()
        end = sim.now if horizon is None else max(horizon, sim.now)
    prog.tick(len(inst.completed))
    prog.close()
    _final_invariants(inst, reqs, horizon, scn.drain)
    return reqs, inst, desc, end


def _final_invariants(inst: Instance, reqs, horizon, drain) -> None:
    """Conservation (queued + running + completed + rejected = submitted) and causality (BC-8)."""
    n_wait = len(inst.waiting)
    assert n_wait + len(inst.running) + len(inst.completed) + len(inst.rejected) == inst.submitted, \
        "request conservation violated"
    for r in inst.completed:
        assert r.arrival <= r.t_queued <= r.t_scheduled <= r.t_first_token <= r.t_completion, \
            f"causality violated for request {r.rid}"
        assert r.n_out == r.max_tokens
    if horizon is None or drain:
        assert not inst.running and not inst.waiting, "work left after a drained run"
        assert inst.kv.free_count == inst.kv.total, "KV blocks leaked"
        inst.kv.check(inst.held_blocks())
    # (stopped at the horizon mid-iteration, blocks of the step in flight are already allocated:
    # conservation is checked at every step end with --check-invariants instead)


def run(scenario, out_dir=None, *, overrides=None, seed=None, check_invariants: bool = False,
        progress: bool = False, plots: bool | None = None) -> Result:
    """Run a scenario (path, mapping or Scenario) and optionally write its report to ``out_dir``."""
    scn = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides, seed)
    reqs, inst, desc, end = simulate(scn, check_invariants, progress)
    summary = summarize(scn, inst, reqs)
    m = scn.model
    manifest = {
        "dsim_version": __version__,
        "scenario": scn.name,
        "scenario_source": scn.source,
        "scenario_sha256": scn.digest,
        "seed": scn.seed,
        "model": {"name": m.name, "source": m.source, "total_params": m.total_params,
                  "active_params": m.active_params, "kv_bytes_per_token": m.kv_bytes_per_token},
        "hardware": scn.device.name,
        "engine": scn.engine.__dict__,
        "kv_blocks": desc["kv_blocks"],
        "latency": desc["latency"],
        "workload": desc["workload"],
        "python": platform.python_version(),
    }
    res = Result(scn, reqs, summary, manifest, inst)
    if out_dir is not None:
        res.out_dir = write_report(res, Path(out_dir), scn.plots if plots is None else plots)
    return res


def write_report(res: Result, out: Path, plots: bool) -> Path:
    ao = AtomicOutput(out)
    try:
        ao.write_text("summary.json", to_json(res.summary))
        ao.write_text("manifest.json", to_json(res.manifest))
        ao.write_text("requests.csv", requests_csv(res.requests))
        if res.scenario.timeline:
            from .metrics.timeline import chrome_trace
            ao.write_text("timeline.json", chrome_trace(res.instance))
        if plots:
            plots_mod.latency_cdfs(res.latencies(), ao.path("plots/latency_cdf.png"))
            plots_mod.timeline(res.instance.log, res.instance.kv.total, ao.path("plots/timeline.png"))
    except BaseException:
        ao.abort()
        raise
    return ao.commit()
