"""Scenario -> simulation -> Result: the one path every front end (CLI, Python, sweeps) uses."""
from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from ._version import __version__
from .config.errors import ConfigError
from .config.files import recording_reads
from .config.scenario import Scenario, load_scenario
from .cluster.controllers import build_controllers
from .cluster.fleet import Fleet
from .core.request import PENDING
from .arrival_feed import ArrivalFeed
from .core.simulation import Simulation
from .metrics.provenance import data_file_hashes, software_versions
from .latency.credibility import outside_design, validation_rows
from .metrics import band
from .metrics import plots as plots_mod
from .metrics.conversations import conversations_csv
from .metrics.ledger import RequestLedger
from .metrics.measures import request_latencies
from .metrics.summary import summarize
from .metrics.writers import COLUMNS, AtomicOutput, output_folder, request_rows, to_json, write_requests_csv
from .serving.instance import Instance
from .workload.generator import build_workload
from .core.invariant import check


@dataclass
class Result:
    """A finished run.  ``requests`` is the run's ``RequestLedger``: every request in id order, as
    ``Request`` objects rebuilt on access (``for r in res.requests``, ``res.requests[i]``) or as
    numpy columns (``res.requests.col("t_first_token")``)."""
    scenario: Scenario
    requests: "RequestLedger"
    summary: dict
    _manifest: object = field(repr=False)      # the manifest, or the function that builds it on first read
    instance: Instance = field(repr=False)     # the first replica (the only one without cluster:)
    fleet: Fleet = field(default=None, repr=False)
    out_dir: Path | None = None
    recorders: list = field(default_factory=list, repr=False)
    kv_logs: list = field(default_factory=list, repr=False)   # (replica, RecordedKVCache) with output.kv_events

    @property
    def manifest(self) -> dict:
        """Provenance (manifest.json): versions, data file hashes, the resolved scenario."""
        m = self._manifest
        if callable(m):
            m = self._manifest = m()
        return m

    def write_vllm_traces(self, path) -> None:
        """The run as vLLM's journey, step and snapshot tracing streams (OTLP JSON lines)."""
        if not self.recorders:
            raise ValueError("run with vllm_traces=True to record the tracing streams")
        from .metrics.vllm_traces import write_otlp
        pool_of = {rep.inst: rep.pool for rep in self.fleet.replicas()}
        reps = []
        for inst, rec in self.recorders:
            spec = pool_of[inst].spec          # each pool its own model, GPU and TP
            reps.append((inst.name, {"dsim.model": spec.model.name, "dsim.hardware": spec.device.name,
                                     "dsim.tensor_parallel_size": inst.engine.tensor_parallel_size},
                         rec, inst.token_overhead))
        write_otlp(Path(path), reps, self.requests)

    def latencies(self) -> dict:
        """Per completed request, in ms: lists ``ttft_ms``, ``tpot_ms`` (requests with > 1 token),
        ``e2e_ms``, ``queue_ms``."""
        return {k: v.tolist() for k, v in request_latencies(self.requests).items()}

    @property
    def metrics(self) -> dict:
        """Headline numbers under `vllm bench serve`'s names (``mean_ttft_ms``, ``p99_e2el_ms``, ...)."""
        return self.summary["metrics"]

    def to_pandas(self):
        """One row per request with requests.csv's columns (missing values are NaN); needs pandas."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Result.to_pandas needs pandas: pip install 'dsim[pandas]'") from None
        return pd.DataFrame([dict(zip(COLUMNS, row)) for row in request_rows(self.requests, raw=True)],
                            columns=list(COLUMNS))


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


def _check_kv_fits(workload, fleet) -> None:
    """Refuse, before simulating, a run in which no replica can take even the smallest request (its
    KV does not fit, or it is longer than max_model_len): every request would be rejected and the
    run would exit 0 having served nothing."""
    small = workload.smallest()
    if small is None:
        return
    p, o = small
    first = None
    for pool in fleet.pools.values():
        e = pool.engine
        blocks = pool.kv_blocks // e.pipeline_parallel_size
        need = -(-(p + o - 1) // e.block_size)
        if need <= blocks and p + o <= e.max_model_len:
            return
        first = first or (pool, blocks, need)
    pool, blocks, need = first
    e = pool.engine
    path = f"{pool.spec.path}.engine" if pool.spec.path else "engine"
    what = f"the workload's smallest request ({p} prompt + {o} output tokens)"
    if p + o > e.max_model_len:
        raise ConfigError(f"{path}.max_model_len", e.max_model_len, f"room for at least one request: {what} is "
                          "longer; no request could ever be served")
    key = "num_gpu_blocks" if e.num_gpu_blocks is not None else "gpu_memory_utilization"
    raise ConfigError(f"{path}.{key}", e.num_gpu_blocks if key == "num_gpu_blocks" else e.gpu_memory_utilization,
                      f"room for at least one request: {what} needs {need} KV blocks of {e.block_size} tokens, "
                      f"a replica has {blocks}; no request could ever be served")


class Session:
    """A built simulation: requests, fleet, controllers and the arrival process, ready to run.

    ``run_to_end`` is what ``dsim run`` does; ``advance(t)`` lets the stepping API
    (``dsim.ClusterEnv``) run it in slices.  While it runs, ``fleet.live`` holds the requests in
    flight (rid -> Request) and ``reqs`` is the workload; after ``run_to_end``, ``reqs`` is the
    fleet's sealed ``RequestLedger`` of every request (docs/memory.md).
    """

    def __init__(self, scn: Scenario, check_invariants: bool = False, progress: bool = False, controllers=(),
                 vllm_traces: dict | None = None, keep_steps: bool = False):
        with recording_reads() as read:       # traces, LUTs, coefficient files: hashed in the manifest
            self._build(scn, check_invariants, progress, controllers, vllm_traces, keep_steps)
        self.data_files = frozenset(read) | scn.data_files

    @staticmethod
    def simulate_scenario(scn: Scenario, **kw) -> "Session":
        """``simulate`` for the layers below the runner that run scenarios of their own (the
        interpolating planner's profiles), handed to them with the session."""
        return simulate(scn, **kw)

    def _build(self, scn, check_invariants, progress, controllers, vllm_traces, keep_steps) -> None:
        self.scn = scn
        self.sim = sim = Simulation(scn.seed, scn.seeds)
        self.recorders: list = []          # (instance, StepRecorder) when emitting vLLM traces
        self.workload, wdesc = build_workload(scn.config.workload, sim.rng, scn.base_dir)
        self.workload.apply_slo_targets(scn.slo_classes, scn.slo_ttft_ms, scn.slo_tpot_ms)
        # the requests: during the run, the workload (a list with speculation, whose runtime binds
        # every conversation up front); after it, the fleet's ledger of every request
        self.reqs = self.workload
        self._cursor = 0                   # index of the first request the arrival process has not sent
        if (any(p.engine.scheduling_policy == "edf" for p in scn.fleet.pools)
                and not self.workload.has_ttft_targets()):
            raise ConfigError("engine.scheduling_policy", "edf", "a TTFT target to order by: slo.ttft_ms, "
                              "slo.classes.*.ttft_ms or a ttft_slo_ms trace column")
        self.network = None
        if scn.config.network is not None:
            from .network.build import build_network
            self.network = build_network(scn.config.network, sim.env, sim.rng.stream("network"))
        self.fleet = Fleet(sim, scn, check_invariants, network=self.network,
                           tracer_factory=self._recorder_factory(vllm_traces), keep_steps=keep_steps)
        self.kv_logs: list = []            # (replica name, its recording KV pool) with output.kv_events
        if getattr(getattr(scn.config, "output", None), "kv_events", False):
            self._record_kv_events()
        self.spec = None
        conn = scn.spec.connectivity if scn.spec is not None else None
        if conn is not None and conn.uplinks:     # auto-topology: the generated gateway -> cluster -> replica links
            self.network = self.fleet.network = conn.network(sim.env, sim.rng.stream("network"))
            for rep in self.fleet.replicas():
                conn.attach(self.network, rep)
            self.fleet.replica_hooks.append(lambda rep: conn.attach(self.network, rep))
        if scn.spec is not None:
            if vllm_traces is not None:
                raise ConfigError("speculation", None, "no --emit-vllm-traces (speculative steps are not traced)",
                                  show_value=False)
            from .specdec.runtime import SpecRuntime
            self.reqs = list(self.workload)
            self.spec = SpecRuntime(sim, self.fleet, self.network, scn.spec, self.reqs, scn.horizon_s,
                                    scn.slo_tpot_ms, scn.slo_tvt_ms)
            if conn is not None:
                conn.install(self.spec, self.fleet)
            if scn.config.output.repro_log:
                self.spec.start_log()
        elif scn.config.output.repro_log:
            raise ConfigError("output.repro_log", True, "false without a speculation section (the log holds "
                              "acceptance outcomes and mode decisions)")
        _check_kv_fits(self.workload, self.fleet)
        self._cut = False                  # a planner's forecast child stops the real arrivals
        self.controllers = build_controllers(scn.fleet.controllers, self.fleet, self) + list(controllers)
        self.fleet.extra_actors += len(self.controllers) + (len(self.spec.devices) if self.spec is not None else 0)
        if self.network is not None:
            # the fabric's timer and outage processes: actors for BC-14's bound, but not readers of the
            # replicas' same-time order (Instance.alone): their events are never skipped by a stretch
            self.fleet.fabric_actors = 1 + len(self.network.outages)
            self.fleet.extra_actors += self.fleet.fabric_actors
        self.action_log: list = []
        for c in self.controllers:
            from .cluster.control import run_controller      # most runs have no controller
            own = getattr(c, "run", None)      # a process of its own (the planner), else the observe/act loop
            sim.process(own(self.action_log) if callable(own) else run_controller(self.fleet, c, self.action_log))
        self.progress = _Progress(len(self.reqs), progress)
        first = next(iter(self.fleet.pools.values()))
        self.desc = dict(workload=wdesc, latency=first.latency_desc, kv_blocks=first.kv_blocks)
        self.max_concurrency = wdesc.get("max_concurrency")
        if self.max_concurrency is not None:
            if self.spec is not None:
                raise ConfigError("workload.max_concurrency", self.max_concurrency,
                                  "no concurrency cap with speculation (its clients are open-loop)",
                                  show_value=False)
            self.in_flight = 0
            self.peak_in_flight = 0
            self._slot = None
            self.fleet.done_hooks.append(self._release)
        if self.spec is None:
            ArrivalFeed(self).start()

    def _recorder_factory(self, opts):
        if opts is None:
            return None
        from .metrics.vllm_traces import StepRecorder

        def make(inst):
            rec = StepRecorder(opts.get("step_rate", 1.0), opts.get("rich_rate", 1.0),
                               self.sim.rng.stream(f"trace.{inst.name}"))
            self.recorders.append((inst, rec))
            if inst.tier is not None:
                inst.tier.events = rec.kv_events = []
            return rec
        return make

    def _record_kv_events(self) -> None:
        """Every replica's KV pool, present and future, logs its prefix-cache events (kv_events.jsonl)."""
        from .metrics.kv_events import record

        def rec(rep):
            self.kv_logs.append((rep.inst.name, record(rep.inst)))
        for rep in self.fleet.replicas():
            rec(rep)
        self.fleet.replica_hooks.append(rec)

    def _release(self, r) -> None:
        """A request finished: a closed-loop client slot is free again."""
        self.in_flight -= 1
        if self._slot is not None and not self._slot.triggered:
            self._slot.succeed()

    @property
    def sent(self) -> int:
        """Requests the arrival process has sent so far (the workload's first ``sent``)."""
        return self._cursor

    def cut_arrivals(self) -> None:
        """Send no more of the workload (a forecast replays its own arrivals instead)."""
        self._cut = True

    def advance(self, until: float) -> None:
        self.sim.run(until=until)

    def run_to_end(self) -> float:
        scn, sim = self.scn, self.sim
        horizon = scn.horizon_s
        if horizon is not None and not scn.drain:
            if horizon > sim.now:
                sim.run(until=horizon)
            end = horizon
        else:
            sim.run()
            end = sim.now if horizon is None else max(horizon, sim.now)
        self.progress.tick(self.fleet.n_completed)
        self.progress.close()
        _final_invariants(self.fleet, horizon, scn.drain)
        self._seal()
        return end

    def _seal(self) -> None:
        """Record the requests still in flight and those never sent, then read the ledger in id order
        (once: running a finished session to its end again changes nothing)."""
        ledger = self.fleet.ledger
        if ledger.sealed:
            return
        for rep in self.fleet.replicas():
            rep.inst.settle_metrics()
        for r in self.fleet.live.values():
            ledger.add(r)
        if self.spec is not None:
            pending = (r for r in self.reqs if r.state == PENDING)
        else:
            pending = self.workload.tail(self._cursor)
        for r in pending:
            ledger.add(r)
        self.reqs = ledger.seal()


def prepare(scn: Scenario) -> Session:
    """Build everything a run needs (validates workload, latency and cluster sections too)."""
    return Session(scn)


def simulate(scn: Scenario, check_invariants: bool = False, progress: bool = False, controllers=(),
             vllm_traces: dict | None = None, keep_steps: bool = False):
    """Run the simulation; return the finished Session."""
    ses = Session(scn, check_invariants, progress, controllers, vllm_traces, keep_steps)
    ses.end = ses.run_to_end()
    return ses


def _final_invariants(fleet: Fleet, horizon, drain) -> None:
    """Conservation (queued + running + in transfer + completed + rejected = arrived) and after a
    drained run: no work left, no KV block leaked (causality and pool isolation are checked as each
    request finishes, ``Fleet._finish``)."""
    fleet.check_conservation()
    if horizon is None or drain:
        for rep in fleet.replicas():
            inst = rep.inst
            check(not inst.running and not inst.waiting and not inst.transferring and not inst.swapped,
                  "work left after a drained run")
            check(inst.kv.free_count == inst.kv.total, "KV blocks leaked")
            inst.kv.check(inst.held_blocks())
    # (stopped at the horizon mid-iteration, blocks of the step in flight are already allocated:
    # conservation is checked at every step end with --check-invariants instead)


def run(scenario, out_dir=None, *, overrides=None, seed=None, check_invariants: bool = False,
        progress: bool = False, plots: bool | None = None, controllers=(), vllm_traces=None,
        keep_steps: bool = False, compare_models: bool = False) -> Result:
    """Run a scenario and return its Result; write the report to ``out_dir`` when given.

    scenario: a YAML/JSON path, a mapping with the same keys, or a loaded ``dsim.load_scenario(...)``.
    overrides: ``["workload.rate=40", "engine.max_num_seqs=64"]``, as ``dsim run --set``.
    seed: replaces the scenario's seed.
    check_invariants: check scheduler/KV invariants after every step (slow; for debugging).
    progress: a progress meter on stderr (only when it is a terminal).
    plots: write plots/*.png (default: the scenario's ``output.plots``).
    controllers: extra ``dsim.Controller`` objects run alongside the scenario's own.
    vllm_traces: True or {step_rate, rich_rate} to record vLLM's tracing streams
    (written as ``vllm_traces.otlp.jsonl`` in the report; ``Result.write_vllm_traces(path)``).
    keep_steps: keep every step of every series in the replicas' step logs (``inst.log``), not
    only what summary.json needs (``dsim.serving.steplog``); on with ``output.timeline``.
    compare_models: also run the scenario under every other latency model validated on its GPU and
    put their headline latencies in summary.json's ``model_spread`` (the models disagree: see it).
    """
    if out_dir is not None and not isinstance(out_dir, (str, os.PathLike)):
        raise ConfigError("out_dir", out_dir, "a folder path (str or pathlib.Path) or None")
    scn = scenario if isinstance(scenario, Scenario) else load_scenario(scenario, overrides, seed)
    controllers, traces = check_run_args(controllers, vllm_traces, check_invariants=check_invariants,
                                         progress=progress, plots=plots, keep_steps=keep_steps,
                                         compare_models=compare_models)
    # open the output first: an unwritable --out fails before the simulation, not after it
    with output_folder(out_dir) as ao:
        spread = model_spread(scn) if compare_models else None
        ses = simulate(scn, check_invariants, progress, controllers, traces, keep_steps)
        return finish(ses, out_dir, plots, ao, spread)


def model_spread(scn: Scenario) -> dict:
    """The scenario under every other latency model validated on its GPU (shipped defaults): their
    TTFT p50, TPOT p50 and E2E mean, to set beside the scenario's own model's answer."""
    own = (scn.raw.get("latency") or {}).get("model", "roofline")
    models = band.validated_models(scn)
    out = {"scenario_model": own, "validated_models": models, "models": {}}
    src = scn.source if scn.base_dir is not None else scn.raw
    for m in models:
        if m == own:
            continue
        swap = [f"latency={{model: {m}}}"] + [f"{p}.latency={{model: {m}}}" for p in band.own_latency_pools(scn)]
        try:
            other = load_scenario(src, list(scn.overrides) + swap, scn.seed)
            lat = finish(simulate(other)).summary["latency_ms"]
        except ConfigError as e:                      # a model that cannot run this deployment
            out["models"][m] = {"error": str(e)}
            continue
        out["models"][m] = {"ttft_p50_ms": lat["ttft"].get("p50"), "tpot_p50_ms": lat["tpot"].get("p50"),
                            "e2e_mean_ms": lat["e2e"].get("mean")}
    return out


def check_run_args(controllers, vllm_traces, **flags) -> tuple:
    """The Python API's arguments checked before the run starts, with the CLI's kind of message
    (a controller without ``act`` failed inside SimPy once the run was under way); returns the
    controllers as a list and the trace options."""
    for name, v in flags.items():
        if not isinstance(v, bool) and not (v is None and name == "plots"):
            raise ConfigError(name, v, "True or False" + (" or None" if name == "plots" else ""))
    if controllers is None or (type(controllers) in (list, tuple) and not controllers):
        controllers = []                      # (dsim.cluster.control imported only when there are some)
    else:
        from .cluster.control import check_controllers
        controllers = check_controllers(controllers)
    if vllm_traces is None or vllm_traces is False:
        return controllers, None
    if vllm_traces is True:
        return controllers, {}
    if not isinstance(vllm_traces, dict):
        raise ConfigError("vllm_traces", vllm_traces, "True, False or {step_rate, rich_rate}")
    for k, v in vllm_traces.items():
        if k not in ("step_rate", "rich_rate"):
            raise ConfigError(f"vllm_traces.{k}", None, "unknown key (known keys here: rich_rate, step_rate)",
                              show_value=False)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ConfigError(f"vllm_traces.{k}", v, "a share in (0, 1]")
    return controllers, dict(vllm_traces)


def default_out_dir(scn: Scenario) -> str:
    """results/<name>-<hash>: one folder per resolved scenario, so different overrides never collide
    and re-running the same scenario replaces its own report."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", scn.name).lstrip(".") or "scenario"   # no path traversal via name
    return f"results/{safe}-{scn.digest[:8]}"


def inputs_out_dir(kind: str, name: str, inputs, settings: dict) -> str:
    """results/<kind>-<name>-<hash> for commands that read files (cosim, calibrate): the hash covers
    the inputs' bytes (a file, or every file of a folder), the base scenario, the overrides and
    every option that changes the answer, so a calibrated replay never replaces the zero-shot one."""
    import hashlib
    import json
    h = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode())
    for p in map(Path, inputs):
        files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
        for f in files:
            h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode() + b"\0")
            with open(f, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", name).lstrip(".") or "run"
    return f"results/{kind}-{safe}-{h.hexdigest()[:8]}"


def _manifest(ses: Session) -> dict:
    """The run's provenance: versions (with the git commit of an editable install, two git
    processes), data file hashes and the resolved scenario."""
    import platform
    scn, desc, fleet = ses.scn, ses.desc, ses.fleet
    m = scn.model
    manifest = {
        "dsim_version": __version__,
        "scenario": scn.name,
        "scenario_source": scn.source,
        "scenario_sha256": scn.digest,
        "seed": scn.seed,
        "model": {"name": m.name, "source": m.source, "total_params": m.total_params,
                  "active_params": m.active_params, "kv_bytes_per_token": m.kv_bytes_per_token,
                  **({"quantization": m.quant.scheme, "quant_method": m.quant.method, "weight_bytes": m.weight_bytes,
                      "compute_dtype": m.compute_dtype} if m.quant else {})},
        "hardware": scn.device.name,
        "engine": scn.engine.__dict__,
        "kv_blocks": desc["kv_blocks"],
        "latency": desc["latency"],
        "workload": desc["workload"],
        "python": platform.python_version(),
        "versions": software_versions(),
        "overrides": list(scn.overrides),
        "data_files": data_file_hashes(ses.data_files),
        "resolved_scenario": scn.raw,
    }
    if scn.spec is not None:
        manifest["speculation"] = {"mode": scn.spec.mode, "drafter": scn.spec.drafter.name,
                                   "acceptance": scn.spec.acceptance_desc, "gamma_policy": scn.spec.policy}
    if scn.policy_bundle is not None:
        manifest["policy_bundle"] = scn.policy_bundle
    if scn.fleet.declared:
        manifest["pools"] = {p.name: {"cluster": p.cluster.name, "role": p.role, "model": p.spec.model.name,
                                      "hardware": p.spec.device.name, "engine": p.spec.engine.__dict__,
                                      "replicas": p.spec.replicas, "kv_blocks": p.kv_blocks,
                                      "latency": p.latency_desc}
                             for p in fleet.pools.values()}
    return manifest


def finish(ses: Session, out_dir=None, plots: bool | None = None, ao: AtomicOutput | None = None,
           spread: dict | None = None) -> Result:
    """Summarise a finished session into a Result (and write the report when out_dir is set)."""
    scn, reqs, desc, fleet = ses.scn, ses.reqs, ses.desc, ses.fleet
    summary = summarize(scn, fleet, reqs, ses.end, ses.action_log)
    for c in ses.controllers:
        if callable(getattr(c, "report", None)):
            summary["planner"] = c.report(reqs)
    lat_warn = sorted({p.latency_desc["warning"] for p in fleet.pools.values()
                       if isinstance(p.latency_desc, dict) and p.latency_desc.get("warning")})
    speculating = ses.spec is not None and ses.spec.cfg.mode != "off"
    lat_warn += sorted({w for p in fleet.pools.values() if isinstance(p.latency_desc, dict)
                        for w in outside_design(p.latency_desc.get("model"), speculation=speculating,
                                                pipeline=p.engine.pipeline_parallel_size,
                                                expert_parallel=p.engine.enable_expert_parallel)})
    tiers = {p.name: p.latency_desc["provider"] for p in fleet.pools.values()
             if isinstance(p.latency_desc, dict) and "provider" in p.latency_desc}
    if tiers:           # latency.fallback: the tier each pool runs on (dsim.latency.registry)
        summary["latency_tiers"] = tiers
        lat_warn += [f"pool {name}: {fleet.pools[name].latency_desc['fallback_warning']}" for name in sorted(tiers)
                     if "fallback_warning" in fleet.pools[name].latency_desc]
    if lat_warn:
        summary["warnings"] = summary.get("warnings", []) + lat_warn
    deps = band.deployments(scn, fleet, summary)
    band.annotate(summary, *band.run_band(deps, validation_rows()), deps)
    if spread is not None:
        summary["model_spread"] = spread
    if ses.spec is not None:
        from .metrics.speculation import spec_summary
        summary["speculation"] = spec_summary(ses.spec, reqs, ses.end, {"ttft_ms": scn.slo_ttft_ms,
                                                                       "tpot_ms": scn.slo_tpot_ms,
                                                                       "tvt_ms": scn.slo_tvt_ms})
        if ses.spec.cfg.connectivity is not None:
            summary["speculation"]["topology"] = ses.spec.cfg.connectivity.describe()
    # the manifest is built when first read (write_report reads it at once): a run that writes
    # nothing, such as `dsim bench` or a sweep's point, does not ask git or hash data files
    res = Result(scn, reqs, summary, partial(_manifest, ses), fleet.replicas()[0].inst, fleet,
                 recorders=ses.recorders, kv_logs=ses.kv_logs)
    if out_dir is not None:
        res.out_dir = write_report(res, Path(out_dir), scn.plots if plots is None else plots, ao)
    return res


def write_report(res: Result, out: Path, plots: bool, ao: AtomicOutput | None = None) -> Path:
    """Write the run's report into ``ao`` (or a new AtomicOutput for ``out``) and commit it."""
    with ao if ao is not None else AtomicOutput(out) as ao:
        ao.write_text("summary.json", to_json(res.summary))
        ao.write_text("manifest.json", to_json(res.manifest))
        with open(ao.path("requests.csv"), "w", newline="") as f:
            write_requests_csv(res.requests, f)
        conv = conversations_csv(res.requests)
        if conv is not None:                  # a workload with sessions: one row per conversation
            ao.write_text("conversations.csv", conv)
        reps = res.fleet.replicas()
        if res.recorders:
            res.write_vllm_traces(ao.path("vllm_traces.otlp.jsonl"))
        if res.kv_logs:
            from .metrics.kv_events import write_jsonl
            one = len(res.kv_logs) == 1
            for name, kv in res.kv_logs:
                with open(ao.path("kv_events.jsonl" if one else f"kv_events/{name}.jsonl"), "w", encoding="utf-8") as f:
                    write_jsonl(f, kv.log, kv.block_size)
        rt = res.fleet.speculation
        if rt is not None and rt.log is not None and rt.log.lines is not None:
            ao.write_text("repro_log.jsonl", rt.log.text({"scenario": res.scenario.name, "seed": res.scenario.seed,
                                                        "seeds": res.scenario.seeds}))
        if res.scenario.timeline:
            from .metrics.timeline import chrome_trace
            ao.write_text("timeline.json", chrome_trace([r.inst for r in reps]))
        from .metrics.timeline import series_csv
        # written with or without plots: `dsim plot DIR` redraws the plots from it
        ao.write_text("timeline.csv", series_csv([r.inst for r in reps]))
        if plots:
            from .report.replot import draw_run_plots, manifest_title   # reads the files above, as `dsim plot` does
            draw_run_plots(ao.tmp, ao.path("plots"))
            if res.fleet.network is not None:
                plots_mod.network_timeline(res.fleet.network, ao.path("plots/network.png"),
                                           title=manifest_title(res.manifest))
            from .report import write as write_html      # reads the files above, as `dsim report` does
            write_html(ao.tmp, "run")
    return ao.out
