"""``dsim plan``: the deployment that serves a scenario's load within its SLOs on the fewest GPUs.

Candidates are every (TP, replicas, knob values) of a search space within a GPU budget.  Two
stages, because most of a large space is hopeless and a discrete-event run costs seconds:

1. **Screen** (milliseconds per candidate, from the latency model alone): a steady-state fixed
   point per replica -- decode batch B = (rate per replica) x (output tokens) x (step time), with
   the prompt tokens arriving per step prefilled in the same step -- gives the step time, hence
   a TPOT estimate; a lone prefill gives a TTFT floor.  A candidate is pruned when the model does
   not fit, the fixed point does not exist (batch past ``max_num_seqs``, the token budget or the
   KV cache: overloaded), or an estimate already misses an SLO.
2. **Simulate** the survivors: per knob family (TP and knobs), the fewest replicas the screen
   kept, then one more replica per round until a run passes (the capacity probe's test: SLO
   percentiles after warm-up, no growing queueing delay, no rejections), in parallel on the backend.

Ranked by SLO goodput per GPU-second; Pareto fronts of output tokens/s per GPU vs per user
(the usual serving trade-off) and goodput vs $/hour over every simulated candidate.
"""
from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..config.errors import ConfigError
from ..config.scenario import load_scenario, read_scenario_file
from ..latency.base import BatchShape, LatencyContext
from ..latency.registry import build_latency
from .backends import run_calls
from .capacity import band_scales, scale_overrides, parse_slos, probe
from .pareto import pareto_front
from .deploy import gpus_per_replica
from .every_seed import SEED_COLS, on_every_seed
from .screen_check import CHECK_COLS, DEFAULT_SAMPLE, check_md, check_phrase, check_screen
from .points import as_overrides
from ..metrics.writers import output_folder
from .store import table_csv, write_atomic

TP_KEY = "cluster.pools[0].engine.tensor_parallel_size"
REPLICAS_KEY = "cluster.pools[0].replicas"


@dataclass
class Space:
    tp: list
    replicas: list | None          # None = every count the budget allows
    knobs: list                    # [(scenario key, [values])]

    def families(self):
        keys = [k for k, _ in self.knobs]
        for tp in self.tp:
            for combo in itertools.product(*(v for _, v in self.knobs)):
                yield tp, tuple(zip(keys, combo))


def load_space(source) -> Space:
    """A SPACE.yaml (or mapping): ``tensor_parallel_size: [..]``, ``replicas: auto | [..]`` and any
    scenario keys with candidate values (``engine.max_num_seqs: [64, 256]``, ``cluster.router: [..]``)."""
    where = str(source) if not isinstance(source, dict) else "<space>"
    data = read_scenario_file(source) if not isinstance(source, dict) else dict(source)
    tp = data.pop("tensor_parallel_size", None)
    reps = data.pop("replicas", "auto")
    tp = [1] if tp is None else tp
    for key, vals in (("tensor_parallel_size", tp), ("replicas", None if reps == "auto" else reps)):
        if vals is not None and (not isinstance(vals, list) or not vals or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in vals)):
            raise ConfigError(f"{where}: {key}", vals, "a list of integers >= 1" + (" or auto" if key == "replicas"
                                                                                    else ""))
    knobs = []
    for k, v in data.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"{where}: {k}", v, "a non-empty list of candidate values")
        knobs.append((str(k), v))
    from ..config.schema.keys import check_key
    for k, _ in knobs:                      # a misspelt knob fails before any candidate is screened
        check_key(k, f"{where}:")
    return Space(sorted(set(tp)), None if reps == "auto" else sorted(set(reps)), knobs)


def _pool_overrides(scenario, where: str) -> list[str]:
    """Overrides that make the scenario one pool of identical replicas (what the planner sizes).
    The scenario itself stays a path, so every relative path in it resolves as the file says."""
    doc = read_scenario_file(scenario) if not isinstance(scenario, dict) else scenario
    cl = doc.get("cluster")
    if cl is None:
        return ["cluster=" + json.dumps({"router": "jsq", "pools": [{"name": "main", "replicas": 1}]})]
    if not isinstance(cl, dict) or len(cl.get("pools") or []) != 1 or cl.get("disaggregation"):
        raise ConfigError(f"{where}: cluster", None, "no cluster section or one pool of identical replicas "
                          "(the planner sizes that pool)", show_value=False)
    return []


def _workload_stats(scn) -> dict:
    from ..core.simulation import Simulation
    from ..metrics.console import offered_load
    from ..workload.generator import build_requests
    reqs, _ = build_requests(scn.config.workload, Simulation(scn.seed, scn.seeds).rng, scn.base_dir)
    w = offered_load(reqs)
    n = max(1, len(reqs))
    return {"rate": w["rate"], "prompt": sum(r.prompt_len for r in reqs) / n,
            "output": sum(r.max_tokens for r in reqs) / n}


def schedulers_per_replica(engine) -> int:
    """Schedulers one replica runs, each with its own batch: PP virtual engines (1/PP of the KV each,
    dsim.serving.pipeline) or DP ranks (dsim.serving.dataparallel); the screens split a replica's load
    over them (one engine carrying it all pruned DP=4 candidates that pass)."""
    return engine.pipeline_parallel_size * engine.data_parallel_size


def _step(step, prefill: int, decode: int, ctx: float, mean_prompt: float) -> float:
    nre = max(1, math.ceil(prefill / max(mean_prompt, 1))) if prefill else 0
    return step(BatchShape(prefill_tokens=prefill, num_prefill=nre,
                           prefill_attn_pairs=int(prefill * (mean_prompt + 1) / 2),
                           decode_tokens=decode, decode_ctx_sum=int(decode * ctx),
                           num_sampled=decode + nre, running=decode + nre))


def screen_family(scn, w: dict, replicas: list, slos: dict) -> list[dict]:
    """Screen one knob family at each replica count: estimates and a verdict per count."""
    pool = scn.fleet.pools[0]
    eng = pool.engine
    try:
        kv = eng.kv_blocks(pool.model, pool.device)
    except ConfigError as e:
        return [{"replicas": r, "screen": "pruned", "reason": f"does not fit: {e}", "_unfit": True} for r in replicas]
    step_model = build_latency(pool.latency, LatencyContext(pool.model, pool.device, eng, kv,
                                                            base_dir=scn.base_dir))[0]
    step = step_model.step_time
    ranks = schedulers_per_replica(eng)
    kv_tokens = kv // eng.pipeline_parallel_size * eng.block_size           # one scheduler's share
    P, O = w["prompt"], w["output"]
    ctx = P + O / 2
    ttft_floor = _step(step, min(int(P), eng.max_num_batched_tokens), 0, 0, P)
    out = []
    for r in replicas:
        lam = w["rate"] / (r * ranks)                # req/s one scheduler carries
        t = _step(step, 0, 1, ctx, P)
        verdict, reason = "kept", ""
        for _ in range(60):
            b = math.ceil(lam * O * t)
            c = math.ceil(lam * P * t)
            if b > eng.max_num_seqs or b + c > eng.max_num_batched_tokens or b * (P + O) > kv_tokens or t > 60:
                verdict, reason = "pruned", (f"overloaded: {lam:.2f} req/s per "
                                             + ("replica" if ranks == 1 else "scheduler") + f" needs a batch of {b} "
                                             f"decodes + {c} prefill tokens per {t * 1e3:.1f} ms step")
                break
            t2 = _step(step, c, max(b, 1), ctx, P)
            if abs(t2 - t) <= 1e-4 * t:
                t = t2
                break
            t = t2
        row = {"replicas": r, "screen": verdict, "reason": reason, "est_tpot_ms": t * 1e3,
               "est_ttft_floor_ms": ttft_floor * 1e3, "est_batch": math.ceil(lam * O * t)}
        if verdict == "kept":
            for key, bound in slos.items():
                metric = key.split("_")[1]
                est = {"tpot": t, "itl": t, "ttft": ttft_floor, "e2el": ttft_floor + (O - 1) * t}[metric] * 1e3
                if est > bound:
                    row.update(screen="pruned", reason=f"{key} estimate {est:.1f} > {bound:g}")
                    break
        out.append(row)
    return out


def plan(scenario, space, *, gpus: int, slos, overrides=(), min_goodput: float | None = None, warmup: float = 0.1,
         rounds: int = 4, top: int = 10, jobs: int = 1, backend: str = "joblib", address: str | None = None,
         out=None, band: bool = True, conservative: bool = False, seeds: int = 1,
         screen_check: int = DEFAULT_SAMPLE) -> dict:
    """Screen every candidate of ``space`` within ``gpus`` GPUs, simulate the survivors, and return
    {"best", "top", "candidates", "pareto", ...} (also written to ``out``).

    Each configuration in the top list is simulated again at the pessimistic end of its error band
    (every step scaled, dsim.metrics.band) and marked when it meets the SLOs only if dsim is right or
    optimistic; ``conservative`` makes that the pass rule for every candidate.  With ``seeds`` K > 1
    the top configurations are simulated with K - 1 more seeds: a configuration must pass on every
    seed to be chosen, and the spread of its p99 TTFT/TPOT over the seeds is reported."""
    from ..config.fields import check_number
    from ..config.limits import MAX_GPUS, MAX_JOBS, MAX_TOP
    slos = parse_slos(slos)
    gpus = check_number(gpus, "--gpus", lo=1, hi=MAX_GPUS, integer=True)
    top = check_number(top, "--top", lo=1, hi=MAX_TOP, integer=True)
    rounds = check_number(rounds, "--rounds", lo=1, hi=MAX_TOP, integer=True)
    jobs = check_number(jobs, "--jobs", lo=1, hi=MAX_JOBS, integer=True)
    seeds = check_number(seeds, "--seeds", lo=1, hi=100, integer=True)
    screen_check = check_number(screen_check, "--screen-check", lo=0, hi=MAX_TOP, integer=True)
    sp = space if isinstance(space, Space) else load_space(space)
    src = scenario if isinstance(scenario, dict) else str(scenario)
    user = list(overrides)
    overrides = _pool_overrides(src, str(scenario) if not isinstance(scenario, dict) else "<scenario>") \
        + list(overrides)
    # the report appears whole at the end (an interrupted search left best.yaml, top.csv, ... of an
    # unfinished run); an unwritable --out fails now, not after the simulations
    with output_folder(out) as ao:
        res, base = _plan(src, sp, gpus, slos, overrides, min_goodput, warmup, rounds, top, jobs, backend, address,
                          band, conservative, seeds, screen_check)
        res["overrides"] = user                      # --set as given (titles say what was run)
        if ao is not None:
            _write(res, ao.tmp, base)
    return res


def _plan(src, sp, gpus, slos, overrides, min_goodput, warmup, rounds, top, jobs, backend, address,
          band=True, conservative=False, seeds=1, n_check=0) -> tuple:
    base = load_scenario(src, overrides)
    w = _workload_stats(base)
    cands = []
    for tp, knobs in sp.families():
        ovs = list(overrides) + as_overrides([(TP_KEY, tp)] + list(knobs))
        fam = {"tensor_parallel_size": tp, **dict(knobs)}
        bad = None
        try:
            scn = load_scenario(src, ovs)
            per = gpus_per_replica(scn.fleet.pools[0].engine)
        except ConfigError as e:
            scn, per, bad = None, tp, e
        reps = [r for r in (sp.replicas or range(1, gpus // per + 1)) if r * per <= gpus]
        if not reps:
            continue
        if bad is None:
            try:
                rows = screen_family(scn, w, reps, slos)
            except ConfigError as e:
                bad = e
        if bad is not None:
            rows = [{"replicas": r, "screen": "pruned", "reason": str(bad), "_unfit": True} for r in reps]
        for row in rows:
            cands.append({**fam, **row, "gpus": per * row["replicas"], "_ovs": ovs})
    judge = (src, slos, warmup, min_goodput, jobs, backend, address, base)
    _simulate(src, cands, slos, warmup, min_goodput, rounds, jobs, backend, address, judge if conservative else None)
    chk = check_screen(cands, n_check, base.seed, lambda c: c["_ovs"] + [f"{REPLICAS_KEY}={c['replicas']}"], src,
                       slos, warmup, min_goodput, jobs, backend, address)
    sims = [c for c in cands if "pass" in c]
    ok = sorted((c for c in sims if c["pass"]), key=lambda c: (-c.get("efficiency_goodput_per_gpu_s", 0), c["gpus"]))
    if seeds > 1:
        ok = on_every_seed(ok, top, seeds, lambda c: c["_ovs"] + [f"{REPLICAS_KEY}={c['replicas']}"], src, slos,
                           warmup, min_goodput, jobs, backend, address, base.seed)
    if band and not conservative:
        _pessimistic(ok[:top], *judge)
    why_not_best(ok[:top], "efficiency_goodput_per_gpu_s", "good req/GPU-s")
    # Pareto fronts over the configurations that meet the SLOs only (a faster one that misses them is no option)
    for i in pareto_front(ok, [("efficiency_output_tokens_per_s_per_gpu", "max"),
                               ("efficiency_output_tokens_per_s_per_user", "max")]):
        ok[i]["front_tokens"] = True
    for i in pareto_front(ok, [("request_goodput", "max"), ("efficiency_usd_per_hour", "min")]):
        ok[i]["front_cost"] = True
    keys = ["tensor_parallel_size"] + [k for k, _ in sp.knobs] + ["replicas", "gpus"]
    res = {"scenario": base.name, "gpus_budget": gpus, "slos": slos, "seeds": seeds, "conservative": conservative,
           "workload": w,
           "candidates": len(cands),
           "pruned": sum(1 for c in cands if c["screen"] == "pruned"), "simulated": len(sims),
           "passed": len(ok), "early_stopped": sum(1 for c in sims if c.get("early_stopped")), "screen_check": chk,
           "keys": keys, "rows": cands, "top": ok[:top], "best": ok[0] if ok else None}
    if res["best"] is not None:
        best = load_scenario(src, res["best"]["_ovs"] + [f"{REPLICAS_KEY}={res['best']['replicas']}"])
        res["best_scenario"] = absolute_paths(best.raw, best.base_dir)
        res["best_scenario"]["slo"] = plan_slo_section(best.raw.get("slo"), slos)
    return res, base


# keys whose values are files, relative to the scenario's folder
_PATH_KEYS = (("workload", "path"), ("workload", "prompt_tokens", "path"), ("workload", "output_tokens", "path"),
              ("workload", "classes", "*", "path"), ("latency", "path"), ("latency", "coefficients"),
              ("model", "config"), ("hardware", "profile"),
              ("cluster", "pools", "*", "model", "config"), ("cluster", "pools", "*", "latency", "path"),
              ("cluster", "pools", "*", "latency", "coefficients"),
              ("speculation", "acceptance", "bundle"), ("speculation", "acceptance", "curves"),
              ("speculation", "drafter", "config"), ("speculation", "fused_drafter", "config"))


def absolute_paths(raw: dict, base_dir) -> dict:
    """The scenario with its file paths made absolute, so it can be saved in another folder
    (``*`` in a key path: every item of a list)."""
    if base_dir is None:
        import copy
        return copy.deepcopy(raw)
    return _map_paths(raw, lambda v: v if Path(v).is_absolute() else str(Path(base_dir) / v))


def paths_relative_to(raw: dict, folder) -> dict:
    """The scenario with its file paths written relative to ``folder`` (where it is saved): the
    report folder carries no path of the machine that wrote it, and works wherever the tree moves."""
    import os
    return _map_paths(raw, lambda v: os.path.relpath(v, Path(folder).resolve()) if Path(v).is_absolute() else v)


def _map_paths(raw: dict, fn) -> dict:
    """A copy of ``raw`` with ``fn`` applied to every file-path value (``_PATH_KEYS``)."""
    import copy
    doc = copy.deepcopy(raw)

    def walk(node, keys):
        if not keys:
            return
        k, rest = keys[0], keys[1:]
        if k == "*":
            for item in node if isinstance(node, list) else ():
                walk(item, rest)
            return
        if not isinstance(node, dict):
            return
        if not rest:
            v = node.get(k)
            if isinstance(v, str):
                node[k] = fn(v)
            return
        walk(node.get(k), rest)

    for keys in _PATH_KEYS:
        walk(doc, keys)
    return doc


def plan_slo_section(base_slo, slos: dict) -> dict:
    """best.yaml's ``slo``: the plan's --slo bounds as the per-request TTFT/TPOT targets goodput counts
    against (the base scenario's own targets judged `dsim run best.yaml` by other numbers; with two
    statistics of one metric, the tighter bound); its other keys (classes, tvt_ms) are kept."""
    out = dict(base_slo) if isinstance(base_slo, dict) else {}
    bounds: dict = {}
    for key, bound in slos.items():
        metric = key[:-3].split("_", 1)[1]           # "p99_ttft_ms" -> "ttft"
        if metric in ("ttft", "tpot"):
            bounds[metric] = min(bound, bounds.get(metric, bound))
    out.update({f"{m}_ms": b for m, b in bounds.items()})
    return out


def why_not_best(top: list, key: str, label: str) -> None:
    """Set ``why_not_best`` on each row of ``top`` (best first, ranked by ``key`` descending, then fewer
    GPUs): what it lost on -- its score against the best's, else its GPU count -- so a reader of the top
    table sees whether a runner-up is a near tie worth weighing or far behind."""
    if not top:
        return
    b = top[0]
    b["why_not_best"] = ""
    for c in top[1:]:
        v, bv = c.get(key) or 0.0, b.get(key) or 0.0
        if v < bv:
            why = f"{label} {v:.4g} vs {bv:.4g} ({(v / bv - 1) * 100:+.1f} %)"
        elif c["gpus"] > b["gpus"]:
            why = (f"the same {label} on " if c.get(key) is not None else "") + f"more GPUs ({c['gpus']} vs {b['gpus']})"
        else:
            why = "a tie with the best (same score and GPUs; listed after it in a fixed order)"
        c["why_not_best"] = why + ("" if c.get("pessimistic_pass") is not False or b.get("pessimistic_pass") is False
                                   else "; also misses the SLOs at the pessimistic end of its band")


def _pessimistic(cands, src, slos, warmup, min_goodput, jobs, backend, address, scn) -> None:
    """Simulate passing ``cands`` again at the pessimistic end of their error band; mark them
    (``pessimistic_pass``: True, False, or None when the run had no band)."""
    todo = [(c, band_scales(c)) for c in cands]
    todo = [(c, sc["pessimistic"]) for c, sc in todo if sc is not None]
    for c in cands:
        c["pessimistic_pass"] = None
    # stopped once certain to fail (dsim.explore.early_stop): only pass/fail and the reasons are read
    calls = [(src, c["_ovs"] + [f"{REPLICAS_KEY}={c['replicas']}"] + scale_overrides(scn, f), slos, warmup,
              min_goodput, True) for c, f in todo]
    for (c, f), row in zip(todo, list(run_calls(probe, calls, jobs, backend, address))):
        c["pessimistic_pass"] = bool(row["pass"])
        c["pessimistic_step_scale"] = round(f, 6)
        if not row["pass"]:
            c["pessimistic_reasons"] = "; ".join(row.get("reasons", []))


def _simulate(src, cands, slos, warmup, min_goodput, rounds, jobs, backend, address, judge=None) -> None:
    """Per family: the fewest kept replicas, then one more per round until a run passes (with ``judge``,
    until it also passes at the pessimistic end of its error band)."""
    fams: dict = {}
    for c in cands:
        fams.setdefault(json.dumps(c["_ovs"]), []).append(c)
    pending = {}
    for key, rows in fams.items():
        kept = sorted((c for c in rows if c["screen"] == "kept"), key=lambda c: c["replicas"])
        if kept:
            pending[key] = [c for c in sorted(rows, key=lambda c: c["replicas"]) if c["replicas"] >= kept[0]["replicas"]]
    for _ in range(rounds):
        batch = [(k, rows[0]) for k, rows in pending.items() if rows]
        if not batch:
            break
        calls = [(src, c["_ovs"] + [f"{REPLICAS_KEY}={c['replicas']}"], slos, warmup, min_goodput, True)
                 for _, c in batch]
        for (k, c), row in zip(batch, list(run_calls(probe, calls, jobs, backend, address))):
            c.update({kk: v for kk, v in row.items() if kk not in ("status",)})
            c["reasons"] = "; ".join(row.get("reasons", []))
        if judge is not None:
            passed = [c for _, c in batch if c["pass"]]
            _pessimistic(passed, *judge)
            for c in passed:
                if c["pessimistic_pass"] is False:
                    c["pass"] = False
                    c["reasons"] = ("meets the SLOs only if dsim is right or optimistic; at the pessimistic end "
                                    f"(every step x{c['pessimistic_step_scale']:.3g}): {c['pessimistic_reasons']}")
                elif c["pessimistic_pass"] is None:      # no band: the pessimistic end cannot be checked
                    c["pass"] = False
                    c["reasons"] = "no error band for this configuration: --conservative cannot check it"
        for k, c in batch:
            pending[k] = [] if c["pass"] else pending[k][1:]


_COLS = ("pass", "reasons", "request_goodput", "goodput_fraction", "efficiency_goodput_per_gpu_s",
         "efficiency_output_tokens_per_s_per_gpu", "efficiency_output_tokens_per_s_per_user",
         "efficiency_usd_per_hour", "p99_ttft_ms", "p99_tpot_ms", "front_tokens", "front_cost", "band_validated",
         "pessimistic_pass", "pessimistic_step_scale", *SEED_COLS, "early_stopped", "stopped_at_s", "why_not_best")


def _write(res: dict, out: Path, base) -> None:
    keys = res["keys"]
    lead = keys + ["screen", "reason", "est_tpot_ms", "est_ttft_floor_ms", "est_batch"] + list(_COLS)
    slim = [{k: c.get(k) for k in lead + [f"window_{s}" for s in res["slos"]] + list(CHECK_COLS)} for c in res["rows"]]
    write_atomic(out / "candidates.csv", table_csv(slim, lead))
    write_atomic(out / "plan.json", json.dumps(summary_json(res), indent=1, sort_keys=True) + "\n")
    write_atomic(out / "top.csv", table_csv([{k: c.get(k) for k in lead} for c in res["top"]], lead))
    sims = [{k: c.get(k) for k in keys + list(_COLS)} for c in res["rows"] if "pass" in c]
    write_atomic(out / "pareto.csv", table_csv(sims, keys + list(_COLS)))
    if res.get("best_scenario") is not None:
        slo = ", ".join(f"{k} <= {v:g}" for k, v in res["slos"].items())
        write_atomic(out / "best.yaml", "# written by dsim plan: the best configuration found; slo: the plan's "
                     f"targets ({slo}) as per-request goodput targets; file paths relative to this folder\n"
                     + yaml.safe_dump(paths_relative_to(res["best_scenario"], out), sort_keys=False))
        from .deploy import deployment_files
        best = load_scenario(res["best_scenario"])
        for name, text in deployment_files(best).items():
            write_atomic(out / "deploy" / name, text)
    from ..metrics.plots import run_title
    title = f"{run_title(base.name, res.get('overrides'))}: {base.model.name} on {base.device.name}"
    _pareto_plot(res, out / "pareto.png", title)
    write_atomic(out / "plan.md", plan_md(res, title))
    from ..report import write as write_html       # reads plan.md and candidates.csv, as `dsim report` does
    write_html(out, "plan")


def plan_line(res: dict) -> str:
    b = res["best"]
    head = (f"{res['candidates']} candidates, {res['pruned']} pruned by the screen, {res['simulated']} simulated"
            + (f" ({res['early_stopped']} stopped early)" if res.get("early_stopped") else "")
            + f", {res['passed']} meet the SLOs")
    if b is None:
        return head + "; none fits the budget" + check_phrase(res.get("screen_check"))
    knobs = ", ".join(f"{k}={b[k]}" for k in res["keys"] if k not in ("gpus",))
    line = head + f"; best: {knobs} ({b['gpus']} GPUs, {b.get('efficiency_goodput_per_gpu_s', 0):.3g} good req/GPU-s)"
    if res.get("conservative"):
        return line + "; planned at the pessimistic end of the error band" + check_phrase(res.get("screen_check"))
    marked = [c for c in res["top"] if c.get("pessimistic_pass") is False]
    if marked:
        line += (f"; {len(marked)} of the top {len(res['top'])} (best included)" if b.get("pessimistic_pass") is False
                 else f"; {len(marked)} of the top {len(res['top'])}") + \
            " meet the SLOs only if dsim is right or optimistic (see --conservative)"
    return line + check_phrase(res.get("screen_check"))


def summary_json(res: dict) -> dict:
    """plan.json: the plan's counts, its screen check and the best row, as data (no private keys)."""
    pub = (lambda c: None if c is None else {k: v for k, v in c.items() if not k.startswith("_")})
    keep = ("scenario", "gpus_budget", "usd_budget", "slos", "seeds", "rank_by", "conservative", "workload", "candidates",
            "pruned", "simulated", "passed", "early_stopped", "screen_check", "overrides")
    return {**{k: res[k] for k in keep if k in res}, "best": pub(res.get("best"))}


def plan_md(res: dict, title: str) -> str:
    lines = [f"# Plan: {title}", "", f"**{plan_line(res)}**", "",
             f"Budget {res['gpus_budget']} GPUs; SLOs " + ", ".join(f"{k} <= {v:g}" for k, v in res["slos"].items())
             + f"; load {res['workload']['rate']:.2f} req/s, mean {res['workload']['prompt']:.0f} prompt / "
             f"{res['workload']['output']:.0f} output tokens.", ""]
    if res.get("best_scenario") is not None:
        lines += ["The best configuration as a scenario (`best.yaml`, run it with `dsim run best.yaml`):", "",
                  "```yaml", yaml.safe_dump(res["best_scenario"], sort_keys=False).rstrip(), "```", ""]
    cols = res["keys"] + ["efficiency_goodput_per_gpu_s", "p99_ttft_ms", "p99_tpot_ms", "efficiency_usd_per_hour",
                          "pessimistic_pass", "why_not_best"]
    lines += ["## Top configurations", ""]
    lines += (["Planned at the pessimistic end of dsim's error band (`--conservative`): every configuration below "
               "meets the SLOs even if the real engine is as slow as the band allows.", ""] if res.get("conservative")
              else ["`pessimistic_pass`: the configuration simulated again with every step as slow as the pessimistic "
                    "end of its 80 % error band; `False` means it meets the SLOs only if dsim is right or "
                    "optimistic (plan with `--conservative` to exclude such configurations).", ""])
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for c in res["top"]:
        lines.append("| " + " | ".join(_fmt(c.get(k)) for k in cols) + " |")
    why: dict = {}
    for c in res["rows"]:
        if c["screen"] == "pruned":
            k = c["reason"].split(":")[0].split(" estimate")[0]
            why[k] = why.get(k, 0) + 1
    lines += ["", "## Screen", "", "| pruned because | candidates |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(why.items(), key=lambda kv: -kv[1])]
    lines += check_md(res.get("screen_check"), res["rows"], res["keys"])
    lines += ["", "![pareto](pareto.png)", ""]
    return "\n".join(lines)


def _fmt(v):
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def front_labels(keys, front) -> dict:
    """(x, y) -> label of the Pareto points: "TP2 x3" and the other knobs, and how many other
    configurations share the point (they gave the same numbers)."""
    at: dict = {}
    for c in front:
        xy = (c["efficiency_output_tokens_per_s_per_user"], c["efficiency_output_tokens_per_s_per_gpu"])
        at.setdefault(xy, []).append(c)
    out = {}
    for xy, cs in at.items():
        c = cs[0]
        knobs = [f"{k.split('.')[-1]}={c[k]}" for k in keys if k not in ("tensor_parallel_size", "replicas", "gpus")
                 and k in c]
        out[xy] = f"TP{c['tensor_parallel_size']} x{c['replicas']}" + ("\n" + ", ".join(knobs) if knobs else "") \
            + (f"\n(+{len(cs) - 1} more with the same numbers)" if len(cs) > 1 else "")
    return out


def _pareto_plot(res: dict, path: Path, title: str) -> None:
    from .plots import _mpl
    sims = [c for c in res["rows"] if "pass" in c and c.get("efficiency_output_tokens_per_s_per_user")]
    if not sims:
        return
    plt = _mpl()
    fig, ax = plt.subplots(figsize=(6, 4.2))
    for ok, mk, lab in ((True, "o", "meets SLOs"), (False, "x", "misses")):
        pts = [c for c in sims if c["pass"] is ok]
        ax.scatter([c["efficiency_output_tokens_per_s_per_user"] for c in pts],
                   [c["efficiency_output_tokens_per_s_per_gpu"] for c in pts], marker=mk, s=18, alpha=0.7, label=lab)
    front = sorted((c for c in sims if c.get("front_tokens")), key=lambda c: c["efficiency_output_tokens_per_s_per_user"])
    ax.plot([c["efficiency_output_tokens_per_s_per_user"] for c in front],
            [c["efficiency_output_tokens_per_s_per_gpu"] for c in front], "k--", lw=1, label="Pareto front")
    for xy, label in front_labels(res["keys"], front).items():
        ax.annotate(label, xy, textcoords="offset points", xytext=(4, 4), fontsize=6)
    ax.margins(x=0.12, y=0.18)          # room for the labels inside the axes
    ax.set_xlabel("output tokens/s per user (1000 / mean TPOT ms)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
