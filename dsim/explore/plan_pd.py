"""``dsim plan`` over prefill/decode disaggregation and mixed GPU types.

A P/D deployment has two pools sized independently: prefill replicas (one GPU type, one TP) turn
prompts into KV caches, decode replicas (maybe another GPU type and TP) generate the tokens, and
every request's KV moves between them once.  A candidate is therefore (prefill GPU, prefill TP,
prefill replicas, decode GPU, decode TP, decode replicas) within a GPU budget and/or a dollar budget
(GPU-hour prices of the device profiles).  Same two stages as the single-pool planner (plan.py),
for the same reason -- most of the grid is hopeless and a run costs about a second:

1. **Screen**, per candidate, from the latency model alone:
   * prefill pool: one replica prefills at most ``max_num_batched_tokens`` per step, so its
     throughput is that budget over the step time of a full prefill batch; the offered prompt
     tokens/s (rate x the mean prompt tokens an ideal prefix cache leaves to compute) must stay
     below replicas x that throughput;
   * decode pool: the single-pool screen's decode fixed point per replica (B = rate per replica x
     output tokens x step time), with no prefill in the step;
   * KV transfer: latency + prompt KV bytes / bandwidth per request, which the request waits
     between its first and second token (so it is added to the TPOT estimate, amortised).
   A candidate is pruned, with its reason, when a pool is overloaded or an estimate (all of them
   lower bounds: no queueing) already misses an SLO.
2. **Simulate** the survivors: per family (GPU types and TPs) the cheapest kept candidate, then the
   next cheapest per round until one passes (plan.py's probe judges: SLO percentiles after the
   warm-up, no growing queue, no rejections), in parallel on the --jobs/--backend of the run.

The best passing candidate has the most SLO goodput per GPU-second (per dollar when the budget is
in dollars); best.yaml is the scenario with the two pools and the disaggregation section.
"""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from ..config.errors import ConfigError
from ..config.scenario import load_scenario, read_scenario_file
from ..metrics.writers import output_folder
from .backends import run_calls
from .capacity import parse_slos, probe
from .every_seed import SEED_COLS, on_every_seed
from .pd_space import PDSpace, base_cluster, load_pd_space
from .screen_pd import screen_grid
from .plan import _workload_stats, absolute_paths, paths_relative_to, plan_slo_section, summary_json, why_not_best, _fmt
from .screen_check import CHECK_COLS, DEFAULT_SAMPLE, check_md, check_phrase, check_screen
from .store import table_csv, write_atomic

def plan_pd(scenario, space, *, gpus: int | None = None, budget_usd_per_hour: float | None = None, slos,
            overrides=(), min_goodput: float | None = None, warmup: float = 0.1, rounds: int = 4, top: int = 10,
            jobs: int = 1, backend: str = "joblib", address: str | None = None, out=None,
            screen_check: int = DEFAULT_SAMPLE, seeds: int = 1) -> dict:
    """Screen every P/D candidate of ``space`` within ``gpus`` GPUs and/or ``budget_usd_per_hour``,
    simulate the survivors, return {"best", "top", "rows", "candidates", "pruned", ...} (also written to
    ``out``: best.yaml, top.csv, candidates.csv, plan.md, plan.json, deploy/).  ``screen_check`` N: simulate up
    to N pruned candidates and report how many would have passed (dsim.explore.screen_check).  ``seeds`` K > 1:
    the top candidates are simulated with K - 1 more seeds and one that fails any seed is not chosen
    (dsim.explore.every_seed)."""
    from ..config.fields import check_number
    from ..config.limits import MAX_GPUS, MAX_JOBS, MAX_TOP
    slos = parse_slos(slos)
    if gpus is None and budget_usd_per_hour is None:
        raise ConfigError("--gpus", None, "a GPU budget (--gpus N) or a dollar budget (--budget-usd-per-hour X)",
                          show_value=False)
    if gpus is not None:
        gpus = check_number(gpus, "--gpus", lo=1, hi=MAX_GPUS, integer=True)
    if budget_usd_per_hour is not None:
        budget_usd_per_hour = check_number(budget_usd_per_hour, "--budget-usd-per-hour", lo=1e-9, hi=1e9)
    top = check_number(top, "--top", lo=1, hi=MAX_TOP, integer=True)
    rounds = check_number(rounds, "--rounds", lo=1, hi=MAX_TOP, integer=True)
    jobs = check_number(jobs, "--jobs", lo=1, hi=MAX_JOBS, integer=True)
    screen_check = check_number(screen_check, "--screen-check", lo=0, hi=MAX_TOP, integer=True)
    seeds = check_number(seeds, "--seeds", lo=1, hi=100, integer=True)
    sp = space if isinstance(space, PDSpace) else load_pd_space(space)
    src = scenario if isinstance(scenario, dict) else str(scenario)
    with output_folder(out) as ao:
        res, base = _plan_pd(src, sp, gpus, budget_usd_per_hour, slos, list(overrides), min_goodput, warmup,
                             rounds, top, jobs, backend, address, screen_check, seeds)
        res["overrides"] = list(overrides)
        if ao is not None:
            _write(res, ao.tmp, base)
    return res


def screen_space(src, sp: PDSpace, gpus, usd, slos: dict, user: list) -> tuple:
    """Stage 1 alone: (every screened candidate, the base scenario, the overrides every candidate runs
    with, the workload's mean rate and lengths).  ``slos`` parsed (capacity.parse_slos)."""
    where = "<scenario>" if isinstance(src, dict) else src
    doc = read_scenario_file(src) if not isinstance(src, dict) else src
    bc = base_cluster(doc, where)
    base = load_scenario(src, user)
    # goodput counts against the plan's SLOs (the slo section best.yaml carries), so the ranking, and a
    # re-run of best.yaml, judge every request by the same targets
    user = user + ["slo=" + json.dumps(plan_slo_section(base.raw.get("slo"), slos), sort_keys=True)]
    w = _workload_stats(base)
    return screen_grid(src, sp, bc, user, w, slos, gpus, usd, base.device.name), base, user, w


def _plan_pd(src, sp, gpus, usd, slos, user, min_goodput, warmup, rounds, top, jobs, backend, address, n_check=0,
             seeds=1):
    cands, base, user, w = screen_space(src, sp, gpus, usd, slos, user)
    keys = sp.keys()
    _simulate(src, user, cands, keys, slos, warmup, min_goodput, rounds, jobs, backend, address, usd is not None)
    chk = check_screen(cands, n_check, base.seed, lambda c: user + [c["_ov"]], src, slos, warmup, min_goodput, jobs,
                       backend, address)
    sims = [c for c in cands if "pass" in c]
    rank = "goodput_per_usd" if usd is not None else "efficiency_goodput_per_gpu_s"
    ok = sorted((c for c in sims if c["pass"]), key=lambda c: (-(c.get(rank) or 0), c["gpus"], _order(c, keys)))
    if seeds > 1:
        ok = on_every_seed(ok, top, seeds, lambda c: user + [c["_ov"]], src, slos, warmup, min_goodput, jobs, backend,
                           address, base.seed)
    why_not_best(ok[:top], rank, "good req/$" if usd is not None else "good req/GPU-s")
    res = {"scenario": base.name, "gpus_budget": gpus, "usd_budget": usd, "slos": slos, "seeds": seeds,
           "workload": w, "keys": keys,
           "rank_by": rank, "candidates": len(cands), "pruned": sum(1 for c in cands if c["screen"] == "pruned"),
           "simulated": len(sims), "passed": len(ok),
           "early_stopped": sum(1 for c in sims if c.get("early_stopped")), "screen_check": chk, "rows": cands, "top": ok[:top], "best": ok[0] if ok else None}
    if res["best"] is not None:
        best = load_scenario(src, user + [res["best"]["_ov"]])
        res["best_scenario"] = absolute_paths(best.raw, best.base_dir)
    return res, base


def _order(c: dict, keys) -> tuple:
    """A total, deterministic order of candidates (ties of the ranking are broken by it)."""
    return tuple(str(c[k]) for k in keys)


# the columns that size a candidate rather than name its family
SIZE_KEYS = ("prefill_replicas", "decode_replicas", "gpus", "usd_per_hour")


def _simulate(src, user, cands, keys, slos, warmup, min_goodput, rounds, jobs, backend, address, by_usd) -> None:
    """Per family (GPU types, TPs and knobs): the cheapest kept candidate first (fewest GPUs, or dollars), then
    the next cheapest per round until one passes: more hardware of the same family only lowers goodput per GPU."""
    fams: dict = {}
    for c in cands:
        if c["screen"] == "kept":
            fams.setdefault(tuple(c[k] for k in keys if k not in SIZE_KEYS), []).append(c)
    cost = (lambda c: (c["usd_per_hour"], c["gpus"], _order(c, keys))) if by_usd else \
        (lambda c: (c["gpus"], _order(c, keys)))
    pending = {k: sorted(v, key=cost) for k, v in sorted(fams.items(), key=lambda kv: str(kv[0]))}
    for _ in range(rounds):
        batch = [(k, rows[0]) for k, rows in pending.items() if rows]
        if not batch:
            break
        calls = [(src, user + [c["_ov"]], slos, warmup, min_goodput, True) for _, c in batch]
        for (k, c), row in zip(batch, list(run_calls(probe, calls, jobs, backend, address))):
            c.update({kk: v for kk, v in row.items() if kk != "reasons"})
            c["reasons"] = "; ".join(row.get("reasons", []))
            usd = c.get("efficiency_usd_per_hour")
            good = c.get("goodput_requests_per_s")
            c["goodput_per_usd"] = good * 3600 / usd if usd and good is not None else None
        for k, c in batch:
            pending[k] = [] if c["pass"] else pending[k][1:]


_COLS = ("pass", "reasons", "goodput_requests_per_s", "goodput_fraction", "efficiency_goodput_per_gpu_s",
         "goodput_per_usd", "efficiency_output_tokens_per_s_per_gpu", "efficiency_usd_per_hour", "p99_ttft_ms",
         "p99_tpot_ms", *SEED_COLS, "early_stopped", "stopped_at_s", "why_not_best")
_EST = ("screen", "reason", "est_prefill_tokens_per_s", "est_offered_prefill_tokens_per_s", "est_prefill_util", "est_decode_step_ms",
        "est_decode_batch", "est_kv_transfer_ms", "est_ttft_floor_ms", "est_tpot_ms")


def _write(res: dict, out: Path, base) -> None:
    lead = res["keys"] + list(_EST) + list(_COLS)
    write_atomic(out / "candidates.csv", table_csv([{k: c.get(k) for k in lead + list(CHECK_COLS)}
                                                    for c in res["rows"]], lead))
    write_atomic(out / "plan.json", json.dumps(summary_json(res), indent=1, sort_keys=True) + "\n")
    write_atomic(out / "top.csv", table_csv([{k: c.get(k) for k in lead} for c in res["top"]], lead))
    if res.get("best_scenario") is not None:
        slo = ", ".join(f"{k} <= {v:g}" for k, v in res["slos"].items())
        write_atomic(out / "best.yaml", "# written by dsim plan (prefill/decode): the best configuration found; "
                     f"slo: the plan's targets ({slo}) as per-request goodput targets; file paths relative to this "
                     "folder\n" + yaml.safe_dump(paths_relative_to(res["best_scenario"], out), sort_keys=False))
        from .deploy import deployment_files
        for name, text in deployment_files(load_scenario(res["best_scenario"])).items():
            write_atomic(out / "deploy" / name, text)
    write_atomic(out / "plan.md", plan_md(res, f"{base.name}: {base.model.name}, prefill/decode"))


def plan_line(res: dict) -> str:
    head = (f"{res['candidates']} P/D candidates, {res['pruned']} pruned by the screen, {res['simulated']} simulated"
            + (f" ({res['early_stopped']} stopped early)" if res.get("early_stopped") else "")
            + f", {res['passed']} meet the SLOs")
    b = res["best"]
    if b is None:
        return head + "; none fits the budget" + check_phrase(res.get("screen_check"))
    per = (f"{b.get('goodput_per_usd') or 0:.4g} good req/$" if res["rank_by"] == "goodput_per_usd"
           else f"{b.get('efficiency_goodput_per_gpu_s') or 0:.3g} good req/GPU-s")
    return head + (f"; best: prefill {b['prefill_replicas']} x {b['prefill_hardware']} TP{b['prefill_tp']}{_knobs(b, 'prefill')}"
                   f", decode {b['decode_replicas']} x {b['decode_hardware']} TP{b['decode_tp']}{_knobs(b, 'decode')} "
                   f"({b['gpus']} GPUs"
                   + (f", ${b['usd_per_hour']:.2f}/h" if b.get("usd_per_hour") is not None else "") + f", {per})"
                   + check_phrase(res.get("screen_check")))


def _knobs(c: dict, role: str) -> str:
    """' (max_num_seqs=128)': a role's searched engine knobs of a candidate, or nothing."""
    kv = [f"{k.split('.')[-1]}={v}" for k, v in c.items() if k.startswith(f"{role}.engine.")]
    return f" ({', '.join(kv)})" if kv else ""


def plan_md(res: dict, title: str) -> str:
    budget = " and ".join(x for x in (f"{res['gpus_budget']} GPUs" if res["gpus_budget"] else "",
                                      f"${res['usd_budget']:g}/hour" if res["usd_budget"] else "") if x)
    lines = [f"# Plan: {title}", "", f"**{plan_line(res)}**", "",
             f"Budget {budget}; SLOs " + ", ".join(f"{k} <= {v:g}" for k, v in res["slos"].items())
             + f"; load {res['workload']['rate']:.2f} req/s, mean {res['workload']['prompt']:.0f} prompt / "
             f"{res['workload']['output']:.0f} output tokens; ranked by {res['rank_by']}.", ""]
    if res.get("best_scenario") is not None:
        lines += ["The best configuration as a scenario (`best.yaml`, run it with `dsim run best.yaml`; "
                  "`deploy/` has its vLLM command lines and Kubernetes manifests):", "",
                  "```yaml", yaml.safe_dump(res["best_scenario"], sort_keys=False).rstrip(), "```", ""]
    cols = res["keys"] + [res["rank_by"], "p99_ttft_ms", "p99_tpot_ms", "est_prefill_util", "est_tpot_ms"]
    lines += ["## Top configurations", ""]
    if res.get("seeds", 1) > 1:
        cols += list(SEED_COLS)
        lines += [f"Every configuration below passes on {res['seeds']} seeds (the scenario's, +1, ...); "
                  "`*_max_over_seeds`: the largest p99 over them.", ""]
    cols += ["why_not_best"]
    lines += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(_fmt(c.get(k)) for k in cols) + " |" for c in res["top"]]
    why: dict = {}
    for c in res["rows"]:
        if c["screen"] == "pruned":
            k = c["reason"].split(":")[0].split(" estimate")[0]
            why[k] = why.get(k, 0) + 1
    lines += ["", "## Screen", "", f"{res['pruned']} of {res['candidates']} candidates pruned without a simulation "
              "(estimates from the latency model: prefill pool tokens/s, decode fixed point, KV transfer time).", "",
              "| pruned because | candidates |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(why.items(), key=lambda kv: (-kv[1], kv[0]))]
    lines += check_md(res.get("screen_check"), res["rows"], res["keys"])
    return "\n".join(lines) + "\n"
