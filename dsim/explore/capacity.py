"""``dsim capacity``: the largest load a deployment sustains within its SLOs, or the fewest
replicas (any integer resource key) that carry a target load.

A probe is one normal run.  It passes when, over the measurement window (arrivals after the
warm-up share), every SLO percentile is met, the queueing delay does not trend upward, and -- when asked -- the share of requests meeting the SLO stays above a floor.  The
search brackets the answer by doubling/halving from the scenario's own value, then narrows the
bracket (``jobs`` probes per round, in parallel) to a relative tolerance.

A max-load search over a rate first probes the lowest meaningful load: the same workload sent one
request at a time (``workload.max_concurrency=1``: each request leaves when the previous one has
finished, so nothing ever queues and every latency is the unloaded one; its load is the completed
rate, 1 / unloaded E2E).  A lower rate only spaces the same unloaded requests further apart, so
when this probe misses an SLO no load meets it, and the search stops there with "infeasible"
(a ConfigError naming the SLO: exit code 2) instead of halving the rate towards zero.  It assumes what
capacity planning assumes: more load never makes a deployment pass, more replicas never make it
fail.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from ..config.errors import ConfigError
from .backends import run_calls
from .evaluate import resolve, summary_row
from ..metrics.measures import GROWTH_LIMIT, decode_wait_trend, delay_trend, ledger_latencies
from ..metrics.exact import percentiles
from ..metrics.band import get_path, own_latency_pools, validated_models
from .points import as_overrides
from ..metrics.writers import output_folder
from .store import write_atomic

_SLO = re.compile(r"^(?:(mean|median|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el|e2e)_ms|(ttft|tpot|itl|e2el|e2e)_"
                  r"(mean|median|p\d+(?:\.\d+)?)_ms)$")


def parse_slos(specs) -> dict:
    """``["ttft_p99_ms=500", "p99_tpot_ms=50"]`` (either order) or ``{"ttft_p99_ms": 500}`` (the Python
    API, checked the same way) -> {"p99_ttft_ms": 500.0, ...}."""
    if isinstance(specs, dict):
        specs = [f"{k}={float(v)!r}" if isinstance(v, float) else f"{k}={v}" for k, v in specs.items()]
    elif isinstance(specs, str):
        specs = [specs]
    elif not isinstance(specs, (list, tuple)) and specs is not None:
        raise ConfigError("slos", specs, "a mapping {METRIC: MS} or a list of 'METRIC=MS' strings")
    out = {}
    for spec in specs or ():
        key, eq, val = str(spec).partition("=")
        m = _SLO.match(key.strip())
        try:
            bound = float(val)
        except ValueError:
            bound = float("nan")
        if not eq or not m or not 0 < bound < float("inf"):
            raise ConfigError(f"--slo {spec}", None, "METRIC=MS with METRIC like ttft_p99_ms, p99_tpot_ms, "
                              "e2el_p90_ms or mean_itl_ms and a finite bound > 0", show_value=False)
        stat, metric = (m.group(1), m.group(2)) if m.group(1) else (m.group(4), m.group(3))
        out[f"{stat}_{'e2el' if metric == 'e2e' else metric}_ms"] = bound
    if not out:
        raise ConfigError("--slo", None, "at least one SLO, e.g. --slo ttft_p99_ms=500", show_value=False)
    return out


def _stat(values, stat: str):
    if not len(values):
        return None
    if stat == "mean":
        return float(np.mean(values))
    q = 50.0 if stat == "median" else float(stat[1:])
    return float(percentiles(values, q))


def probe(source, overrides, slos: dict, warmup: float, min_goodput: float | None, early_stop: bool = False) -> dict:
    """Run one load point and judge it (plain data in and out: runs in worker processes).  With
    ``early_stop`` the run stops as soon as a percentile SLO is certainly missed (dsim.explore.early_stop):
    the row then says so (``early_stopped``) and fails, without the full run's metrics."""
    from ..runner import run
    try:
        scn = resolve(source, overrides)
        if early_stop:
            from .early_stop import run_watched
            res, stop = run_watched(scn, slos, warmup)
            if stop is not None:
                return {"status": "ok", "error": "", **stop, "pass": False,
                        "reasons": [f"stopped early at {stop['stopped_at_s']:.1f} s: {stop['stop_reason']}"]}
        else:
            res = run(scn, None, plots=False)
    except ConfigError as e:
        return {"status": "error", "error": str(e), "pass": False, "reasons": [str(e)]}
    led = res.requests                      # columns, in request id order: no request is rebuilt
    arrival = led.col("arrival")
    arr = np.sort(arrival)
    row = {"status": "ok", "error": "", **summary_row(res.summary)}
    if arr.size < 2:
        return {**row, "pass": False, "reasons": ["fewer than 2 requests"]}
    t0, t1 = float(arr[0]), float(arr[-1])
    tw = t0 + warmup * (t1 - t0)
    win = (tw <= arrival) & (arrival <= t1)
    finished = led.present("t_completion")
    lat = ledger_latencies(led, win & finished)
    vals = {"ttft": lat["ttft_ms"], "tpot": lat["tpot_ms"], "e2el": lat["e2e_ms"]}
    reasons = []
    for key, bound in slos.items():
        stat, metric = key[:-3].split("_", 1)
        v = row.get(key) if metric == "itl" else _stat(vals[metric], stat)
        row[f"window_{key}"] = v
        if v is None or v > bound:
            reasons.append(f"{key} {'n/a' if v is None else f'{v:.1f}'} > {bound:g}")
    offered = (arr.size - 1) / (t1 - t0) if t1 > t0 else math.inf
    end = max(float(led.col("t_completion")[finished].max()) if finished.any() else t1, t1)
    # the window's queueing delays, rejected requests left out, an unscheduled one waiting until the end
    kept = win & (led.col("reject_reason") == led.code_of(""))
    sched = np.where(led.present("t_scheduled"), led.col("t_scheduled"), end)
    growth = delay_trend(arrival[kept], sched[kept] - arrival[kept])
    row.update(offered_rate=offered, queue_delay_trend=growth)
    if growth > GROWTH_LIMIT:
        reasons.append(f"queueing delay grows {growth * 1e3:.0f} ms per s of arrivals (> {GROWTH_LIMIT * 1e3:.0f})")
    # P/D: a saturated decode pool queues requests after their KV arrives, which the wait for the first
    # scheduling (a prefill replica's) never sees; its growth shows in the time spent in the decode pool
    handed = win & finished & led.present("t_kv_ready")
    if handed.sum() >= 4:
        dgrowth = decode_wait_trend(arrival[handed], led.col("t_completion")[handed] - led.col("t_kv_ready")[handed],
                                    led.col("n_out")[handed])
        row["decode_wait_trend"] = dgrowth
        if dgrowth > GROWTH_LIMIT:
            reasons.append(f"decode queue grows {dgrowth * 1e3:.0f} ms per s of arrivals (> {GROWTH_LIMIT * 1e3:.0f})")
    rejected = row.get("requests_rejected", 0)
    if rejected:
        reasons.append(f"{rejected} requests rejected")
    if min_goodput is not None:
        share = row.get("goodput_fraction")
        if share is None or share < min_goodput:
            reasons.append(f"goodput share {share if share is None else f'{share:.3f}'} < {min_goodput}")
    row["pass"] = not reasons
    row["reasons"] = reasons
    return row


probe.dsim_point = True         # called as (scenario source, overrides, ...): may travel packed (backends)


class _Search:
    def __init__(self, source, overrides, vary, slos, warmup, min_goodput, jobs, backend, address, integer):
        self.args = (source, list(overrides), vary, slos, warmup, min_goodput)
        self.jobs, self.backend, self.address, self.integer = jobs, backend, address, integer
        self.probes: dict = {}
        self.floor: dict | None = None       # the one-request-at-a-time probe (max-load rate searches)

    def run_floor(self) -> dict:
        """Probe the lowest meaningful load: the workload one request at a time."""
        source, ovs, vary, slos, warmup, ming = self.args
        calls = [(source, ovs + ["workload.max_concurrency=1"], slos, warmup, ming)]
        self.floor = list(run_calls(probe, calls, 1, self.backend, self.address))[0]
        return self.floor

    def run(self, values) -> None:
        source, ovs, vary, slos, warmup, ming = self.args
        new = [v for v in dict.fromkeys(values) if v not in self.probes]
        calls = [(source, ovs + as_overrides([(vary, v)]), slos, warmup, ming) for v in new]
        for v, row in zip(new, list(run_calls(probe, calls, self.jobs, self.backend, self.address))):
            self.probes[v] = {"value": v, **row}

    def ok(self, v) -> bool:
        return self.probes[v]["pass"]


def band_scales(row: dict) -> dict | None:
    """Step-time factors at the optimistic and pessimistic ends of a probe's error band: the real step
    is (1 + lo) to (1 + hi) times the simulated one (TPOT p50 band, dsim.metrics.band)."""
    lo, hi = row.get("band_tpot_p50_lo"), row.get("band_tpot_p50_hi")
    if lo is None or hi is None:
        return None
    return {"optimistic": 1 + lo, "pessimistic": 1 + hi}


def scale_overrides(scn, factor: float) -> list:
    """--set lines that multiply every step of every pool of ``scn`` (a Scenario) by ``factor``, on top
    of a scale already set: the top-level latency section, and each pool that declares its own."""
    def one(path):
        cur = get_path(scn.raw, path + ".scale")
        return f"{path}.scale={float(cur if cur is not None else 1.0) * factor:.6g}"
    return [one("latency")] + [one(p + ".latency") for p in own_latency_pools(scn)]


def _search(s: _Search, v0, minimize: bool, tol: float, max_probes: int):
    return _search_min(s, int(v0), max_probes) if minimize else _search_max(s, float(v0), tol, max_probes)


def _band_ends(src, ovs, vary, slos, warmup, min_goodput, jobs, backend, address, integer, minimize, answer,
               at: dict, scn, tol: float, max_probes: int) -> dict:
    """The same search with every step scaled to the optimistic and the pessimistic end of the band."""
    scales = band_scales(at)
    if scales is None:
        return {"available": False, "why": "the answer's run has no validated error band"}
    out = {"available": True, "validated": bool(at.get("band_validated")),
           "step_scale": {k: round(v, 6) for k, v in scales.items()},
           "basis": "TPOT p50 error band of the run at the central answer; every step scaled (latency.scale)"}
    for end, sc in scales.items():
        s = _Search(src, ovs + scale_overrides(scn, sc), vary, slos, warmup, min_goodput, jobs, backend, address,
                    integer)
        v0 = answer if minimize else answer / sc        # a slower step carries less load
        got = _search(s, v0, minimize, tol, max_probes)
        out[end] = {"value": got, "probes": len(s.probes)}
    # reported as searched; a band that does not straddle dsim's own value (every error one way) or a
    # search noisier than its tolerance shows up here instead of being hidden by a clamp
    o, p = out["optimistic"]["value"], out["pessimistic"]["value"]
    if None not in (o, p):
        out["ordered"] = (o <= answer <= p) if minimize else (o >= answer >= p)
        if not out["ordered"]:
            out["note"] = ("dsim's own answer lies outside its band: the validated errors all point one way"
                           if (scales["optimistic"] - 1) * (scales["pessimistic"] - 1) > 0 else
                           "the ends cross the central answer within the search tolerance")
    return out


def _model_spread(src, ovs, vary, slos, warmup, min_goodput, jobs, backend, address, integer, minimize, answer,
                  base, tol: float, max_probes: int) -> dict:
    """The central search again under every other credible latency model, with its shipped defaults."""
    own = (base.raw.get("latency") or {}).get("model", "roofline")
    models = validated_models(base)
    out = {"scenario_model": own, "validated_models": models, "answers": {own: answer}}
    for m in models:
        if m == own:
            continue
        swap = [f"latency={{model: {m}}}"] + [f"{p}.latency={{model: {m}}}" for p in own_latency_pools(base)]
        s = _Search(src, ovs + swap, vary, slos, warmup, min_goodput, jobs, backend, address, integer)
        out["answers"][m] = _search(s, answer, minimize, tol, max_probes)
        errs = [p["error"] for p in s.probes.values() if p.get("status") == "error"]
        if errs:
            out.setdefault("errors", {})[m] = errs[0]
    vals = [v for v in out["answers"].values() if v is not None]
    out["min"], out["max"] = (min(vals), max(vals)) if vals else (None, None)
    return out


def _seed_spread(src, ovs, vary, slos, warmup, min_goodput, jobs, backend, address, integer, minimize, answer,
                 seeds: int, seed0: int, tol: float, max_probes: int) -> dict:
    """The central search repeated with seeds seed0+1 .. seed0+seeds-1 (the answer's own seed is seed0)."""
    vals = [answer]
    for k in range(1, seeds):
        s = _Search(src, ovs + [f"seed={seed0 + k}"], vary, slos, warmup, min_goodput, jobs, backend, address,
                    integer)
        vals.append(_search(s, answer, minimize, tol, max_probes))
    ok = [v for v in vals if v is not None]
    return {"seeds": [seed0 + k for k in range(seeds)], "values": vals,
            "min": min(ok) if ok else None, "median": float(np.median(ok)) if ok else None,
            "max": max(ok) if ok else None}


def capacity(scenario, slos, *, vary: str = "workload.rate", target_rate: float | None = None, overrides=(),
             tolerance: float = 0.02, warmup: float = 0.1, min_goodput: float | None = None, jobs: int = 1,
             backend: str = "joblib", address: str | None = None, out=None, max_probes: int = 40,
             band: bool = True, seeds: int = 1, compare_models: bool = False) -> dict:
    """Find the largest ``vary`` (a load: default workload.rate) that passes, or with
    ``target_rate`` the smallest integer ``vary`` (e.g. ``cluster.pools[0].replicas``) that carries
    that workload.rate.  With ``band``, the same search at the optimistic and pessimistic ends of
    the answer's error band; with ``seeds`` > 1, the spread of the central answer across seeds; with
    ``compare_models``, the answer of every other latency model validated on this deployment.
    Returns the capacity record written to ``out/capacity.json``."""
    from ..config.fields import check_number
    from ..config.limits import MAX_JOBS
    slos = parse_slos(slos)
    jobs = check_number(jobs, "--jobs", lo=1, hi=MAX_JOBS, integer=True)
    max_probes = check_number(max_probes, "max_probes", lo=1, hi=10_000, integer=True)
    warmup = check_number(warmup, "--warmup", lo=0)
    tolerance = check_number(tolerance, "--tolerance", lo=0, lo_open=True)
    if not 0 <= warmup < 1:
        raise ConfigError("--warmup", warmup, "a share in [0, 1)")
    if isinstance(seeds, bool) or not isinstance(seeds, int) or not 1 <= seeds <= 100:
        raise ConfigError("--seeds", seeds, "an integer in [1, 100]")
    if not 0 < tolerance < 1:
        raise ConfigError("--tolerance", tolerance, "a share in (0, 1)")
    if min_goodput is not None and not 0 < min_goodput <= 1:
        raise ConfigError("--min-goodput", min_goodput, "a share in (0, 1] of requests meeting the SLOs")
    if target_rate is not None and not 0 < target_rate < float("inf"):
        raise ConfigError("--target-rate", target_rate, "a finite rate > 0 (requests per second)")
    ovs = list(overrides) + ([f"workload.rate={target_rate}"] if target_rate is not None else [])
    base = resolve(scenario, ovs)
    # the card appears whole at the end; an unwritable --out fails now, not after the probes
    with output_folder(out) as ao:
        return _capacity(scenario, base, ovs, slos, vary, target_rate, tolerance, warmup, min_goodput, jobs,
                         backend, address, ao, max_probes, band, seeds, compare_models)


def _capacity(scenario, base, ovs, slos, vary, target_rate, tolerance, warmup, min_goodput, jobs, backend,
              address, ao, max_probes, band=True, seeds=1, compare_models=False) -> dict:
    v0 = get_path(base.raw, vary)
    minimize = target_rate is not None
    if not isinstance(v0, (int, float)) or isinstance(v0, bool) or v0 <= 0:
        raise ConfigError(f"--vary {vary}", v0, "a key the scenario sets to a number > 0 "
                          + ("(an integer resource, e.g. cluster.pools[0].replicas)" if minimize
                             else "(a load, e.g. workload.rate)"), show_value=False)
    integer = minimize or isinstance(v0, int) and not vary.endswith("rate")
    src = scenario if isinstance(scenario, dict) else str(scenario)
    s = _Search(src, ovs, vary, slos, warmup, min_goodput, jobs, backend, address, integer)
    if not minimize and vary.endswith("rate"):
        floor = s.run_floor()
        if floor["status"] == "error":
            # the scenario itself cannot run (the model does not fit, ...): every probe would fail the
            # same way, so the search stops at once with that error (exit 2, no card)
            path, _, rest = floor["error"].partition(": ")
            raise ConfigError(path, None, rest, show_value=False)
        if floor["status"] == "ok" and not floor["pass"]:
            rec = _record(base, s, None, vary, slos, minimize, target_rate, warmup, min_goodput, tolerance)
            if ao is not None:
                _write(rec, ao.tmp, base, plot=False)
                ao.commit()                      # the card stays: it says why nothing fits
            raise ConfigError(f"--slo {','.join(slos)}", None, infeasible_line(floor, slos), show_value=False)
    answer = _search(s, v0, minimize, tolerance, max_probes)
    rec = _record(base, s, answer, vary, slos, minimize, target_rate, warmup, min_goodput, tolerance)
    common = (src, ovs, vary, slos, warmup, min_goodput, jobs, backend, address, integer, minimize, answer)
    if band and answer is not None:
        rec["band"] = _band_ends(*common, s.probes[answer], base, tolerance, max_probes)
    if compare_models and answer is not None:
        rec["model_spread"] = _model_spread(*common, base, tolerance, max_probes)
    if seeds > 1 and answer is not None:
        rec["seed_spread"] = _seed_spread(*common, seeds, base.seed, tolerance, max_probes)
    if ao is not None:
        _write(rec, ao.tmp, base)                # committed when capacity()'s block ends
    return rec


def infeasible_line(floor: dict, slos: dict) -> str:
    """'infeasible: even at X req/s (one request at a time), p99_ttft_ms = Y > 0.001'."""
    rate = floor.get("request_throughput") or floor.get("offered_rate") or 0.0
    missed = [f"{k} = {floor[f'window_{k}']:.4g} > {b:g}" for k, b in slos.items()
              if floor.get(f"window_{k}") is not None and floor[f"window_{k}"] > b]
    why = ", ".join(missed) or "; ".join(floor.get("reasons", []))
    return f"infeasible: even at {rate:.4g} req/s (one request at a time), {why}"


def _split(s: _Search, values) -> tuple:
    """Probe ``values``; in ascending order, (the largest passing before the first failure, that failure)."""
    values = sorted(values)
    s.run(values)
    ok = None
    for v in values:
        if not s.ok(v):
            return ok, v
        ok = v
    return ok, None


def _search_max(s: _Search, v0: float, tol: float, max_probes: int):
    lo, hi = _split(s, [v0])
    v = v0
    while (lo is None or hi is None) and len(s.probes) < max_probes:
        step = 2.0 if hi is None else 0.5                   # double while passing, halve while failing
        batch = [v * step ** (i + 1) for i in range(s.jobs)]
        ok, fail = _split(s, batch)
        lo = ok if ok is not None else lo
        hi = fail if fail is not None else hi
        v = batch[-1]
    if lo is None or hi is None:
        return lo
    while (hi - lo) / lo > tol and len(s.probes) < max_probes:
        ok, fail = _split(s, [lo + (hi - lo) * (i + 1) / (s.jobs + 1) for i in range(s.jobs)])
        lo = ok if ok is not None else lo
        hi = fail if fail is not None else hi
    return lo


def _search_min(s: _Search, v0: int, max_probes: int):
    s.run([v0])
    lo, hi = (None, v0) if s.ok(v0) else (v0, None)      # lo: largest failing, hi: smallest passing
    v = v0
    while (lo is None or hi is None) and len(s.probes) < max_probes:
        if hi is None:
            v *= 2
        elif v > 1:
            v = max(1, v // 2)
        else:
            return hi                                       # even 1 passes
        s.run([v])
        if s.ok(v):
            hi = v
        else:
            lo = v
    if hi is None:
        return None
    while lo is not None and hi - lo > 1 and len(s.probes) < max_probes:
        batch = sorted({lo + (hi - lo) * (i + 1) // (s.jobs + 1) for i in range(s.jobs)} - {lo, hi})
        s.run(batch)
        for b in batch:
            if s.ok(b):
                hi = b
                break
            lo = b
    return hi


def _record(base, s, answer, vary, slos, minimize, target_rate, warmup, min_goodput, tol) -> dict:
    probes = [s.probes[v] for v in sorted(s.probes)]
    keep = ("value", "pass", "reasons", "status", "error", "offered_rate", "queue_delay_trend",
            "request_throughput", "request_goodput", "output_throughput", "goodput_fraction",
            "scheduler_busy_fraction", "scheduler_preemptions", "scheduler_mean_batch_tokens", "kv_cache_peak_usage",
            "efficiency_gpus", "efficiency_usd_per_hour", "efficiency_output_tokens_per_s_per_gpu",
            "efficiency_goodput_per_gpu_s", "mean_queue_ms", "p99_queue_ms")
    rows = [{k: p[k] for k in keep if k in p} | {k: p[k] for k in p if k.startswith("window_") or k in slos}
            for p in probes]
    rec = {"scenario": base.name, "overrides": list(base.overrides), "vary": vary, "slos": slos, "warmup": warmup, "min_goodput": min_goodput,
           "tolerance": tol, "criteria": {"queue_delay_trend_limit": f"{GROWTH_LIMIT * 1e3:.0f} ms per s of arrivals",
                                          "window": f"arrivals after the first {warmup:.0%} of the arrival span"},
           "probes": rows}
    if s.floor is not None:
        rec["floor_probe"] = {k: s.floor[k] for k in keep if k in s.floor} | {
            k: s.floor[k] for k in s.floor if k.startswith("window_") or k in slos}
        if not s.floor["pass"] and s.floor["status"] == "ok":
            rec["infeasible"] = infeasible_line(s.floor, slos)
    at = s.probes.get(answer) if answer is not None else None
    if minimize:
        rec.update(mode="min_resource", target_rate=target_rate, min_value=answer)
        if vary.endswith("replicas"):
            rec["min_replicas"] = answer
    else:
        rec.update(mode="max_load", max_value=answer)
        if vary.endswith("rate"):
            rec["max_rate"] = answer
    rec["at_answer"] = None if at is None else {k: v for k, v in at.items() if k not in ("status", "error")}
    return rec


def answer_line(rec: dict) -> str:
    slo = ", ".join(f"{k} <= {v:g}" for k, v in rec["slos"].items())
    at = rec.get("at_answer") or {}
    if rec["mode"] == "max_load":
        v = rec["max_value"]
        if rec.get("infeasible"):
            return f"{rec['scenario']}: {rec['infeasible']}"
        if v is None and not rec["probes"]:
            return f"{rec['scenario']}: no load probed"
        if v is None:
            return f"{rec['scenario']}: no load passes ({slo}) down to {rec['probes'][0]['value']:g}"
        tail = f"; {at['efficiency_gpus']:.0f} GPUs" if at.get("efficiency_gpus") else ""
        return (f"{rec['scenario']}: max {rec['vary']} = {v:.4g} within {slo} "
                f"(goodput {at.get('request_goodput', at.get('request_throughput', 0)):.3g} req/s{tail})"
                + range_words(rec, "{:.4g}"))
    v = rec["min_value"]
    if v is None:
        return f"{rec['scenario']}: no {rec['vary']} up to {rec['probes'][-1]['value']} carries {rec['target_rate']:g} req/s ({slo})"
    what = "provision" if rec["vary"].endswith("replicas") else f"min {rec['vary']} ="
    unit = " replicas" if rec["vary"].endswith("replicas") else ""
    return (f"{rec['scenario']}: {what} {v}{unit} for {rec['target_rate']:g} req/s within {slo}"
            + range_words(rec, "{}"))


def range_words(rec: dict, fmt: str) -> str:
    """'; 80 % band: 4 if dsim is optimistic, 6 if pessimistic (outside the validated range)'."""
    out = ""
    b = rec.get("band") or {}
    if b.get("available"):
        def f(end):
            v = b[end]["value"]
            return "none" if v is None else fmt.format(v)
        out += (f"; at the ends of dsim's 80 % error band: {f('optimistic')} if the real engine is as fast as the "
                f"band allows, {f('pessimistic')} if as slow" + ("" if b["validated"] else
                                                                   " (outside the validated range)")
                + (f" ({b['note']})" if b.get("note") else ""))
    elif b:
        out += f"; no error band ({b['why']})"
    ms = rec.get("model_spread")
    if ms:
        errs = ms.get("errors", {})
        others = [f"{m} {'n/a (cannot model this deployment)' if m in errs and v is None else 'none' if v is None else fmt.format(v)}"
                  for m, v in ms["answers"].items() if m != ms["scenario_model"]]
        out += ("; other latency models validated on this GPU (wider bands of their own): " + ", ".join(others)
                if others else
                "; no other latency model is validated on this deployment")
    sp = rec.get("seed_spread")
    if sp and sp["min"] is not None:
        out += f"; across {len(sp['seeds'])} seeds {fmt.format(sp['min'])}-{fmt.format(sp['max'])}"
    return out


def _write(rec: dict, out: Path, base, plot: bool = True) -> None:
    import json

    from .plots import capacity_plot
    write_atomic(out / "capacity.json", json.dumps(rec, indent=2, sort_keys=True, default=str) + "\n")
    answer = rec.get("max_value", rec.get("min_value"))
    from ..metrics.plots import run_title
    title = f"{run_title(base.name, base.overrides)}: {base.model.name} on {base.device.name}"
    if plot:
        capacity_plot(rec["probes"], answer, rec["slos"], out / "capacity.png", title=title,
                      xlabel=rec["vary"])
    write_atomic(out / "capacity.md", card(rec, title))
    from ..report import write as write_html       # reads capacity.json and capacity.md, as `dsim report` does
    write_html(out, "capacity")


def card(rec: dict, title: str) -> str:
    at = rec.get("at_answer") or {}
    lines = [f"# Capacity card: {title}", "", f"**{answer_line(rec)}**", "",
             f"Searched `{rec['vary']}`; a probe passes when, over {rec['criteria']['window']}, every SLO "
             f"holds, the queueing delay grows by less than {rec['criteria']['queue_delay_trend_limit']}, "
             "no request is "
             "rejected" + (f" and at least {rec['min_goodput']:.0%} of requests meet the SLO" if rec['min_goodput']
                           else "") + ".", ""]
    if at:
        def f(k, fmt="{:.3g}"):
            v = at.get(k)
            return "n/a" if v is None else fmt.format(v)
        lines += ["| at the answer | value |", "|---|---|",
                  f"| SLO goodput (req/s) | {f('request_goodput')} |",
                  f"| completed (req/s) / output tok/s | {f('request_throughput')} / {f('output_throughput', '{:.0f}')} |",
                  f"| GPU busy share | {f('scheduler_busy_fraction', '{:.1%}')} |",
                  f"| mean tokens per step (prefill + decode mixed) | {f('scheduler_mean_batch_tokens', '{:.0f}')} |",
                  f"| preemptions | {f('scheduler_preemptions', '{:.0f}')} |",
                  f"| peak KV usage | {f('kv_cache_peak_usage', '{:.1%}')} |",
                  f"| GPUs / $ per hour | {f('efficiency_gpus', '{:.0f}')} / {f('efficiency_usd_per_hour', '{:.2f}')} |",
                  f"| output tok/s per GPU | {f('efficiency_output_tokens_per_s_per_gpu', '{:.0f}')} |", ""]
    slos = list(rec["slos"])
    lines += ["| " + rec["vary"] + " | pass | completed req/s | goodput req/s | " + " | ".join(slos)
              + " | why not |", "|" + "---|" * (5 + len(slos))]
    for p in rec["probes"]:
        cells = [f"{p['value']:.4g}" if isinstance(p["value"], float) else str(p["value"]),
                 "yes" if p["pass"] else "no", f"{p.get('request_throughput', float('nan')):.3g}",
                 f"{p.get('request_goodput', float('nan')):.3g}"]
        cells += ["n/a" if p.get(f"window_{k}") is None else f"{p[f'window_{k}']:.1f}" for k in slos]
        cells.append("; ".join(p.get("reasons", [])))
        lines.append("| " + " | ".join(cells) + " |")
    fl = rec.get("floor_probe")
    if fl:
        lines += ["", f"Lowest load probed first (one request at a time): {fl.get('request_throughput', float('nan')):.3g} "
                  f"req/s, {'passes' if fl['pass'] else 'fails: ' + '; '.join(fl.get('reasons', []))}."]
    if not rec.get("infeasible"):
        lines += ["", "![capacity](capacity.png)"]
    lines += [""]
    return "\n".join(lines)
