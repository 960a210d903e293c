"""Command-line front ends of the explore layer: ``dsim sweep``, ``dsim capacity``, ``dsim baseline`` and
``dsim compare`` (``dsim plan``: add_plan_parser)."""
from __future__ import annotations

import sys

from .backends import BACKENDS


def add_parsers(sub) -> None:
    w = sub.add_parser("sweep", help="run a grid (or random sample) of scenario overrides into one table")
    w.add_argument("scenario", help="scenario file (any scenario, including a calibrated.yaml)")
    w.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                   help="values of one key; several --grid make the cartesian product (repeatable)")
    w.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every point (repeatable)")
    w.add_argument("--random", type=int, default=0, metavar="N", help="draw N random points from the --range keys")
    w.add_argument("--range", dest="ranges", action="append", default=[], metavar="KEY=LO:HI",
                   help="range to draw from (integers when LO and HI are integers; repeatable)")
    w.add_argument("--seeds", type=int, default=1, help="seeds per point (the scenario's seed, +1, ...; default 1)")
    _exec_args(w)
    w.add_argument("--out", required=True, help="folder: results.csv, points/, sweep.yaml, plots/ (rerun = resume)")
    w.add_argument("--plot", default=None, metavar="METRIC", help="metric to plot (a results.csv column)")
    w.add_argument("--x", default=None, metavar="KEY", help="x axis of the plot (default: the first --grid key)")
    w.add_argument("--hue", default=None, metavar="KEY", help="one line per value of this key (default: the second)")
    w.add_argument("--quiet", action="store_true", help="no progress bar")

    c = sub.add_parser("capacity", help="max load within SLOs, or min replicas for a target load")
    c.add_argument("scenario", help="scenario file (any scenario, including a calibrated.yaml)")
    c.add_argument("--slo", action="append", default=[], metavar="METRIC=MS", required=True,
                   help="e.g. ttft_p99_ms=500, tpot_p99_ms=50, e2el_p90_ms=3000 (repeatable)")
    c.add_argument("--vary", default=None, metavar="KEY",
                   help="key to search: default workload.rate; with --target-rate an integer resource such as "
                   "cluster.pools[0].replicas")
    c.add_argument("--target-rate", type=float, default=None, metavar="R",
                   help="find the smallest --vary that carries R req/s (sets workload.rate=R)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every probe (repeatable)")
    c.add_argument("--tolerance", type=float, default=0.02, help="relative width of the final bracket (0.02)")
    c.add_argument("--warmup", type=float, default=0.1, help="share of the arrival span left out of the SLO "
                   "window (0.1)")
    c.add_argument("--min-goodput", type=float, default=None, metavar="SHARE",
                   help="also require this share of requests to meet every SLO (e.g. 0.99)")
    c.add_argument("--seeds", type=int, default=1, metavar="K",
                   help="repeat the central search with K seeds and report their spread (default 1)")
    c.add_argument("--no-band", dest="band", action="store_false",
                   help="skip the searches at the ends of the error band (3x fewer simulations)")
    c.add_argument("--compare-models", action="store_true",
                   help="also answer with every other latency model validated on this deployment (their spread)")
    _exec_args(c)
    c.add_argument("--out", required=True, help="folder: capacity.json, capacity.md, capacity.png")
    c.add_argument("--quiet", action="store_true", help="no progress bar")


def add_compare_parsers(sub) -> None:
    b = sub.add_parser("baseline", help="run a scenario with K seeds and store each headline metric's mean and "
                       "seed-to-seed spread (for dsim compare)")
    b.add_argument("scenario", help="scenario file, or a shipped scenario's name (quickstart, ...)")
    b.add_argument("--seeds", type=int, default=3, metavar="K",
                   help="seeds: the scenario's seed, +1, ... (default 3, at least 2)")
    b.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key (repeatable; recorded in the baseline)")
    b.add_argument("--jobs", type=int, default=1, help="seeds simulated in parallel (default 1)")
    b.add_argument("--out", required=True, metavar="FILE.json", help="baseline file to write")
    c = sub.add_parser("compare", help="which headline metrics moved from A to B beyond the seed spread; exit 1 "
                       "when one did (for CI)",
                       epilog="A and B: a run's output folder, its summary.json, or a baseline file. A metric moved "
                       "when |B - A| exceeds the seed spread of the baseline side(s) (max of the min-max range and "
                       "3 std) or --tolerance x |A|. Exit 0: nothing moved; 1: something moved; 2: bad input.")
    c.add_argument("a", metavar="A", help="the reference: baseline file, run folder or summary.json")
    c.add_argument("b", metavar="B", help="the candidate: run folder, summary.json or baseline file")
    c.add_argument("--tolerance", type=float, default=None, metavar="REL",
                   help="relative change that always counts as within (0.05 = 5 %%); required when neither side "
                   "is a baseline")
    c.add_argument("--moved", action="store_true", help="list only the metrics that moved")
    c.add_argument("--json", action="store_true", help="print the comparison as JSON instead of a table")


def run_baseline(args) -> int:
    import shlex

    from ..shipped import resolve
    from .baseline import check_out, make_baseline, write_baseline
    _check_flags(args)                          # --jobs; --seeds is checked by make_baseline
    check_out(args.out)
    cmd = " ".join(["dsim baseline", shlex.quote(args.scenario), f"--seeds {args.seeds}"]
                   + [f"--set {shlex.quote(o)}" for o in args.overrides] + [f"--out {shlex.quote(args.out)}"])
    doc = make_baseline(resolve(args.scenario), args.seeds, args.overrides, jobs=args.jobs, command=cmd,
                        source=args.scenario)
    write_baseline(doc, args.out)
    print(f"{doc['scenario']['name']}: {len(doc['metrics'])} metrics over seeds {doc['seeds']} -> {args.out}")
    return 0


def run_compare(args) -> int:
    import json

    from .baseline import compare, load_side, table
    res = compare(load_side(args.a), load_side(args.b), args.tolerance)
    if res["a"].get("name") != res["b"].get("name"):
        print(f"dsim compare: note: different scenarios ({res['a'].get('name')} vs {res['b'].get('name')})",
              file=sys.stderr)
    print(json.dumps(res, indent=1, sort_keys=True) if args.json else table(res, args.moved))
    return 1 if res["moved"] else 0


def _exec_args(p) -> None:
    p.add_argument("--jobs", type=int, default=1, help="simulations in parallel (default 1)")
    p.add_argument("--backend", default="joblib", choices=BACKENDS,
                   help="joblib (this machine), dask or ray (local cluster, or --address)")
    p.add_argument("--address", default=None, help="scheduler address of an existing Dask or Ray cluster")


def _check_flags(args, **bounds) -> None:
    """Every numeric flag in range before anything is written (a flag is a key like any other)."""
    from ..config.errors import ConfigError
    from ..config.limits import MAX_JOBS
    bounds.setdefault("jobs", (1, MAX_JOBS))
    for name, (lo, hi) in bounds.items():
        v = getattr(args, name, None)
        if v is not None and not lo <= v <= hi:
            raise ConfigError(f"--{name.replace('_', '-')}", v, f"an integer in [{lo}, {hi}]")


def run_sweep(args) -> int:
    from ..config.limits import MAX_SEEDS
    from .sweep import sweep
    _check_flags(args, seeds=(1, MAX_SEEDS))
    from ..log import quiet
    rows = sweep(args.scenario, args.grid, overrides=args.overrides, random=args.random, ranges=args.ranges,
                 seeds=args.seeds, jobs=args.jobs, backend=args.backend, address=args.address, out=args.out,
                 progress=not (args.quiet or quiet()), plot=args.plot, x=args.x, hue=args.hue)
    st = rows.stats
    bad = sum(1 for r in rows if r.get("status") != "ok")
    print(f"{st['points']} rows ({st['computed']} computed, {st['reused']} already in {args.out})"
          + (f", {bad} failed (see the error column)" if bad else "") + f"; table: {args.out}/results.csv")
    return _all_failed("sweep", "point", len(rows), bad, rows)


def _all_failed(cmd: str, what: str, n: int, bad: int, rows) -> int:
    """Exit code 1 when every point failed (no answer at all), else 0; the most frequent error (the
    first of them on a tie) on stderr: a capacity search that failed everywhere probed ever smaller
    loads, and its last probes' errors are about those loads, not the cause."""
    if n == 0 or bad < n:
        return 0
    from collections import Counter
    errors = Counter(r.get("error") for r in rows if r.get("error"))
    top = errors.most_common(1)[0][0] if errors else ""
    print(f"dsim {cmd}: every {what} failed ({n}); " + (f"the first: {top}" if len(errors) == 1 else
          f"the most frequent error ({errors[top]} of them): {top}"), file=sys.stderr)
    return 1


def _plan_failed(res: dict) -> int:
    """``dsim plan``'s exit code: 1 when no candidate was judged -- each either could not be built (the model
    does not fit, the engine refuses the combination: pruned as unfit) or its simulation failed -- or when
    every simulated one failed, or when the budget admits no candidate at all; else 0 (a plan in which
    nothing meets the SLOs is an answer)."""
    rows = res["rows"]
    if not rows:                                          # the GPU or dollar budget admits no deployment
        print("dsim plan: no candidate fits the budget (--gpus / --budget-usd-per-hour): nothing to judge",
              file=sys.stderr)
        return 1
    sims = [c for c in rows if "pass" in c]               # a simulation that failed has its error in "error"
    failed = [{"error": c["reason"]} if c.get("_unfit") else c for c in rows if c.get("_unfit") or c.get("error")]
    judged = [c for c in rows if (c["screen"] == "pruned" and not c.get("_unfit")) or ("pass" in c and
                                                                                        not c.get("error"))]
    if rows and not judged:
        return _all_failed("plan", "candidate", len(rows), len(rows), failed)
    return _all_failed("plan", "simulated candidate", len(sims), sum(1 for c in sims if c.get("error")), sims)


def run_capacity(args) -> int:
    from .capacity import answer_line, capacity
    _check_flags(args, seeds=(1, 100))
    if args.target_rate is not None and args.vary is None:
        from ..config.errors import ConfigError
        raise ConfigError("--target-rate", args.target_rate, "--vary KEY, the resource to minimise "
                          "(e.g. cluster.pools[0].replicas)", show_value=False)
    from ..log import quiet
    from .backends import progress
    with progress("probe", not (args.quiet or quiet())):
        rec = capacity(args.scenario, args.slo, vary=args.vary or "workload.rate", target_rate=args.target_rate,
                       overrides=args.overrides, tolerance=args.tolerance, warmup=args.warmup,
                       min_goodput=args.min_goodput, jobs=args.jobs, backend=args.backend, address=args.address,
                       out=args.out, band=args.band, seeds=args.seeds, compare_models=args.compare_models)
    print(answer_line(rec))
    print(f"{len(rec['probes'])} probes; card: {args.out}/capacity.md")
    probes = list(rec["probes"])
    return _all_failed("capacity", "probe", len(probes), sum(1 for r in probes if r.get("status") == "error"), probes)


def add_plan_parser(sub) -> None:
    p = sub.add_parser("plan", help="the deployment (TP, replicas, engine knobs, router) that meets the SLOs on "
                       "the fewest GPUs, with Pareto fronts")
    p.add_argument("scenario", help="scenario whose workload and model are planned for (one pool or no cluster)")
    p.add_argument("--gpus", type=int, default=None, help="GPU budget (candidates use at most this many; "
                   "required unless a P/D space has --budget-usd-per-hour)")
    p.add_argument("--budget-usd-per-hour", type=float, default=None, metavar="X",
                   help="P/D spaces: dollar budget (GPU-hour prices of the device profiles); the best is then "
                   "the most SLO goodput per dollar")
    p.add_argument("--space", required=True, help="SPACE.yaml: tensor_parallel_size, replicas (auto), and "
                   "scenario keys with candidate values; or a disaggregated: section (prefill/decode pools, "
                   "GPU types; docs/explore.md)")
    p.add_argument("--slo", action="append", default=[], metavar="METRIC=MS", required=True,
                   help="e.g. ttft_p99_ms=500 (repeatable)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override applied to every candidate (repeatable)")
    p.add_argument("--min-goodput", type=float, default=None, metavar="SHARE",
                   help="also require this share of requests to meet every SLO")
    p.add_argument("--rounds", type=int, default=4, help="extra replicas tried per family after the screen's "
                   "smallest (default 4)")
    p.add_argument("--top", type=int, default=10, help="rows in top.csv (default 10)")
    p.add_argument("--conservative", action="store_true",
                   help="a configuration passes only if it also meets the SLOs at the pessimistic end of its "
                   "error band (every step as slow as the band allows)")
    p.add_argument("--no-band", dest="band", action="store_false",
                   help="do not re-simulate the top configurations at the pessimistic end of their band")
    p.add_argument("--seeds", type=int, default=1, metavar="K",
                   help="simulate the top configurations with K seeds; the chosen one must pass on every "
                   "seed (default 1)")
    p.add_argument("--screen-check", type=int, default=None, metavar="N",
                   help="simulate up to N candidates the screen pruned (a seeded sample) and report how many "
                   "would have met the SLOs (default 8; 0: off)")
    _exec_args(p)
    p.add_argument("--out", required=True, help="folder: plan.md, plan.json, best.yaml, top.csv, pareto.csv, "
                   "candidates.csv")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run_plan(args) -> int:
    from ..config.limits import MAX_GPUS, MAX_TOP
    from .plan import plan, plan_line
    from .pd_space import is_pd_space
    _check_flags(args, gpus=(1, MAX_GPUS), top=(1, MAX_TOP), rounds=(1, MAX_TOP), seeds=(1, 100),
                 screen_check=(0, MAX_TOP))
    from ..log import quiet
    from .backends import progress
    if is_pd_space(args.space):
        return _run_plan_pd(args)
    from ..config.errors import ConfigError
    if args.gpus is None:
        raise ConfigError("--gpus", None, "a GPU budget, e.g. --gpus 8", show_value=False)
    if args.budget_usd_per_hour is not None:
        raise ConfigError("--budget-usd-per-hour", args.budget_usd_per_hour,
                          "no dollar budget with a single-pool space (P/D spaces only)")
    with progress("simulation", not (args.quiet or quiet())):
        res = plan(args.scenario, args.space, gpus=args.gpus, slos=args.slo, overrides=args.overrides,
                   min_goodput=args.min_goodput, rounds=args.rounds, top=args.top, jobs=args.jobs,
                   backend=args.backend, address=args.address, out=args.out, band=args.band,
                   conservative=args.conservative, seeds=args.seeds, **_check_kw(args))
    print(plan_line(res))
    print(f"report: {args.out}/plan.md" + (f"; best scenario: {args.out}/best.yaml" if res["best"] else ""))
    return _plan_failed(res)


def _check_kw(args) -> dict:
    """--screen-check when given (the planners' own default, screen_check.DEFAULT_SAMPLE, otherwise)."""
    return {} if args.screen_check is None else {"screen_check": args.screen_check}


def _run_plan_pd(args) -> int:
    """``dsim plan`` with a P/D space (a ``disaggregated:`` section): plan_pd.py."""
    from ..config.errors import ConfigError
    from ..log import quiet
    from .backends import progress
    from .plan_pd import plan_line, plan_pd
    if args.conservative:
        raise ConfigError("--conservative", None, "not with a P/D space (single-pool plans only, for now)",
                          show_value=False)
    with progress("simulation", not (args.quiet or quiet())):
        res = plan_pd(args.scenario, args.space, gpus=args.gpus, budget_usd_per_hour=args.budget_usd_per_hour,
                      slos=args.slo, overrides=args.overrides, min_goodput=args.min_goodput, rounds=args.rounds,
                      top=args.top, jobs=args.jobs, backend=args.backend, address=args.address, out=args.out,
                      seeds=args.seeds, **_check_kw(args))
    print(plan_line(res))
    print(f"report: {args.out}/plan.md" + (f"; best scenario: {args.out}/best.yaml" if res["best"] else ""))
    return _plan_failed(res)
