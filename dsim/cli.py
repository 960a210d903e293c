"""Command line: ``dsim run | validate | examples | serve | observe | bench | sweep | capacity | plan | baseline | compare | lut | cosim | report | plot | trace | calibrate | fit | acceptance | specdec``.  User mistakes print one line and exit 2."""
from __future__ import annotations

import json
import sys
import time

_T0 = time.perf_counter()

from .cli_parsers import _EXPLORE, _ArgError, _parser  # noqa: E402  (after _T0: start-up counts it)


def _trace(args) -> int:
    from .config.scenario import load_scenario
    from .shipped import resolve
    from .workload.export import generate_trace
    scn = load_scenario(resolve(args.scenario), args.overrides, args.seed)
    n = generate_trace(scn, args.out)
    print(f"wrote {n} requests to {args.out}; replay: workload: {{type: trace, path: {args.out}}}")
    return 0


def _profile(args) -> int:
    from .cluster.interpolate import profile_scenario
    from .config.scenario import load_scenario
    from .runner import simulate
    from .shipped import resolve
    tables = profile_scenario(load_scenario(resolve(args.scenario), args.overrides), simulate)
    text = json.dumps(tables, indent=1, sort_keys=True) + "\n"
    if args.out is None:
        sys.stdout.write(text)
    else:
        from pathlib import Path
        from .config.errors import ConfigError
        from .metrics.writers import write_atomic
        out = Path(args.out)
        if out.is_dir():
            raise ConfigError("--out", str(out), "a file path (this is a folder)")
        try:
            write_atomic(out, text)
        except OSError as e:
            raise ConfigError("--out", str(out), f"a file that can be written ({e.strerror})") from None
        print(f"wrote the profiles of {len(tables)} pool(s) to {out}")
    return 0


def _num_list(text, flag, cast=float):
    """Comma-separated positive finite numbers (multipliers, gammas, unit counts)."""
    import math

    from .config.errors import ConfigError
    try:
        v = tuple(cast(x) for x in str(text).split(",") if x.strip())
    except (ValueError, OverflowError):
        raise ConfigError(flag, text, "comma-separated numbers") from None
    if not all(math.isfinite(x) and x >= 0 for x in v) or (flag != "--hidden" and not all(x > 0 for x in v)):
        raise ConfigError(flag, text, "comma-separated finite numbers > 0" if flag != "--hidden" else
                          "comma-separated integers >= 0")
    return v


def _specdec(args) -> int:
    if args.sd_cmd == "oracle":
        from .explore.oracle import oracle
        meta = oracle(args.scenario, args.out, rtt_mults=_num_list(args.rtt, "--rtt"),
                      load_mults=_num_list(args.load, "--load"), warmup=args.warmup,
                      modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
                      gammas=_num_list(args.gammas, "--gammas", int), jobs=args.jobs)
        print(f"{meta['rows']} labelled conversations -> {args.out}/oracle.csv; labels: {meta['labels']}")
        return 0
    from .config.errors import ConfigError
    from .specdec.headfit import train_head
    from .config.limits import MAX_SEED, MAX_UNITS, check_flag
    hidden = _num_list(args.hidden, "--hidden", int)
    if not hidden or any(not 0 <= h <= MAX_UNITS for h in hidden):
        raise ConfigError("--hidden", args.hidden, f"hidden-unit counts in [0, {MAX_UNITS}]")
    check_flag("--seed", args.seed, 0, MAX_SEED)
    doc = train_head(args.oracle, args.out, hidden=hidden, seed=args.seed, residual=args.residual)
    ch = doc["report"]["chosen"]
    v = ch["validation"]
    print(f"head: {'linear' if not ch['hidden_units'] else str(ch['hidden_units']) + ' SiLU units'}"
          f"{' in a residual block' if ch.get('residual') else ''}; validation "
          f"({doc['provenance']['split']}): label accuracy {v['label_accuracy']:.3f}, TPOT regret "
          f"{v['regret'] * 100:+.1f} % vs the oracle (best fixed action {v['best_static']}: "
          f"{v['static_regret'][v['best_static']] * 100:+.1f} %), meets SLO {v['meets_slo']:.3f} "
          f"(oracle {v['oracle_meets_slo']:.3f})")
    print(f"written: {args.out}")
    return 0


def _columns(text):
    from .config.errors import ConfigError
    out = {}
    for part in text.split(","):
        k, eq, v = part.partition("=")
        if not eq or not k.strip() or not v.strip():
            raise ConfigError("--columns", text, "FIELD=COLUMN pairs separated by commas")
        out[k.strip()] = v.strip()
    return out


def _cosim(args) -> int:
    from .calibrate.cosim import cosim_cli
    return cosim_cli(args, _columns(args.columns) if args.columns else None)


def _examples(args) -> int:
    from .shipped import DEFAULT_DIR, copy_examples
    dest = args.dir or DEFAULT_DIR
    got = copy_examples(dest)
    print(f"{len(got)} scenarios (and the data they read) -> {dest}/scenarios/; try: cd {dest} && "
          "dsim run scenarios/quickstart.yaml")
    return 0


def _int_list(text, flag, hi):
    from .config.errors import ConfigError
    try:
        v = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(flag, text, "comma-separated positive integers") from None
    if not v or min(v) < 1 or max(v) > hi:
        raise ConfigError(flag, text, f"comma-separated integers in [1, {hi:.0e}]")
    return sorted(set(v))


def _lut(args) -> int:
    from pathlib import Path

    from .latency import lut
    if args.lut_cmd == "check":
        rows = lut.read_lut(args.file)
        prev = lut.read_lut(args.previous) if args.previous else None
        findings = (lut.table_findings(rows, args.file, args.model)
                    + lut.check_rows(rows, prev, args.tolerance, name=args.file))
        for f in findings:
            print(f)
        print(f"{args.file}: {len(rows)} rows, {len(findings)} finding(s)")
        return 1 if findings else 0
    from .config.engine import EngineConfig
    from .config.hardware import load_device
    from .config.model import load_model
    from .config.scenario import apply_overrides
    from .latency.base import LatencyContext
    from .latency.registry import build_latency
    from .config.errors import ConfigError
    from .config.schema.latency import parse_latency
    if args.tp < 1:
        raise ConfigError("--tp", args.tp, "an integer >= 1")
    # --model is a catalogue name or a config.json path (the scenario's {config: path})
    model_arg = args.model
    if model_arg.endswith(".json") or Path(model_arg).is_file():
        from .config.schema.model import ModelSection
        model_arg = ModelSection(config=model_arg)
    model = load_model(model_arg, "--model", Path.cwd())
    device = load_device(args.hardware, "--hardware")
    from .config.limits import MAX_SEQS, MAX_TOKENS
    contexts = _int_list(args.contexts, "--contexts", MAX_TOKENS) if args.contexts else list(lut.CONTEXTS)
    mbs = _int_list(args.microbatches, "--microbatches", MAX_SEQS) if args.microbatches else list(lut.MICROBATCHES)
    engine = EngineConfig(tensor_parallel_size=args.tp, max_num_batched_tokens=max(8192, max(contexts)))
    doc = apply_overrides({"latency": {"model": args.latency}}, args.overrides)
    step, _, desc = build_latency(parse_latency(doc["latency"]), LatencyContext(model, device, engine, 1 << 20))
    # a LUT holds GPU time: the replica that reads it adds its engine's host costs itself
    step = getattr(step, "gpu", step)
    rows = lut.export_rows(step, model, device, args.tp, contexts, mbs,
                           source=f"dsim lut build --latency {args.latency}", split=args.split_attention,
                           tail_correlation=None if args.tail_correlation == "none" else args.tail_correlation)
    out = Path(args.out)
    tmp = out.with_name(out.name + ".tmp")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(lut.rows_to_csv(rows))
        tmp.replace(out)
    except OSError as e:
        if tmp.exists():
            tmp.unlink()
        raise ConfigError("--out", args.out, f"a writable file path ({e.strerror})") from None
    print(f"wrote {len(rows)} rows to {out}")
    return 0


def _acceptance(args) -> int:
    from .config.errors import ConfigError
    from .specdec import bundle as B
    iters = [it for f in args.logs for it in B.read_logs(f)]
    if args.acc_cmd == "train":
        from .config.limits import MAX_DEPTH, check_flag
        check_flag("--max-depth", args.max_depth, 1, MAX_DEPTH)
        meta = {}
        for kv in args.meta:
            k, eq, v = kv.partition("=")
            if not eq or not k:
                raise ConfigError("--meta", kv, "KEY=VALUE")
            meta[k] = v
        try:
            b = B.train(iters, args.estimator, args.max_depth, meta={"logs": [str(f) for f in args.logs], **meta})
        except ValueError as e:
            raise ConfigError(args.logs[0], None, str(e), show_value=False) from None
        B.save_bundle(b, args.out)
        m = b["meta"]
        print(f"wrote {args.out}: {m['estimator']} on {m['iterations']} iterations / {m['positions']} positions "
              f"(acceptance {m['train_acceptance_rate']:.3f})")
        return 0
    res = B.evaluate(B.load_bundle(args.bundle, "bundle"), iters)
    print(json.dumps(res, indent=1))
    if args.json:
        from pathlib import Path
        Path(args.json).write_text(json.dumps(res, indent=1) + "\n")
    return 0


def _logging(args) -> None:
    """-v/-q/--log-level, and a command's own --quiet (run, sweep, capacity, plan) as one -q."""
    from .log import configure, level_of
    quiet = args.log_quiet + (1 if getattr(args, "quiet", False) else 0)
    configure(level_of(args.verbose, quiet, args.log_level))


class _Terminated(KeyboardInterrupt):
    """SIGTERM (kill, timeout, Docker, Slurm), raised where the run is so every writer aborts as on ^C."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def main(argv=None) -> int:
    """The ``dsim`` command; SIGTERM is handled like SIGINT while it runs (no partial output)."""
    import signal
    import threading

    from .core.malloc import hold_mmap_threshold
    hold_mmap_threshold()                 # a long run's peak memory (dsim.core.malloc)
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(argv)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main(argv=None) -> int:
    from .config.errors import ConfigError
    parser = _parser(sys.argv[1:] if argv is None else list(argv))

    def _err(msg):
        raise _ArgError(msg)
    parser.error = _err  # one-line usage errors, exit 2
    try:
        args = parser.parse_args(argv)
        _logging(args)
        import logging
        import platform
        from ._version import __version__
        logging.getLogger("dsim").debug("dsim %s, Python %s, command %s", __version__, platform.python_version(),
                                        args.cmd)
        if args.cmd is None:                  # like a missing required argument: usage on stderr, exit 2
            sys.stderr.write(parser.format_help())
            return 2
        if args.cmd == "examples":
            return _examples(args)
        if args.cmd == "schema":
            from .config.schema import reference
            sys.stdout.write(reference.markdown() if args.markdown else reference.json_text())
            return 0
        if args.cmd in ("run", "validate", "sweep", "capacity", "plan", "serve"):
            from .shipped import resolve
            args.scenario = resolve(args.scenario)
        if args.cmd == "bench":
            from .bench import bench
            from .config.errors import ConfigError as _CE
            from .cluster.routers import check_router_name
            from .config.limits import MAX_REPLICAS, MAX_REQUESTS, check_flag
            check_flag("--replicas", args.replicas, 1, MAX_REPLICAS)
            check_flag("--requests", args.requests, 1, MAX_REQUESTS)
            check_router_name(args.router, "--router")
            if args.rate is not None and not 0 < args.rate <= 1e9:
                raise _CE("--rate", args.rate, "a rate in (0, 1e9] req/s")
            if args.overrides and args.scenario is None:
                raise _CE("--set", None, "--scenario FILE to override", show_value=False)
            print(json.dumps(bench(args.requests, _T0, args.replicas, args.router, args.rate, args.scenario,
                                   args.overrides)))
            return 0
        if args.cmd == "report":
            from .report import rebuild
            print(f"report: {rebuild(args.folder)}")
            return 0
        if args.cmd == "plot":
            from .report.replot import plot_folder
            print("written: " + ", ".join(str(p) for p in plot_folder(args.folder, args.out)))
            return 0
        if args.cmd == "trace":
            return _trace(args)
        if args.cmd == "serve":
            from .serve import serve_cli
            return serve_cli(args)
        if args.cmd == "profile":
            return _profile(args)
        if args.cmd == "observe":
            from .serve.capture import observe_cli
            return observe_cli(args)
        if args.cmd == "lut":
            return _lut(args)
        if args.cmd == "cosim":
            return _cosim(args)
        if args.cmd == "acceptance":
            return _acceptance(args)
        if args.cmd == "specdec":
            return _specdec(args)
        if args.cmd == "fit":
            from .calibrate.fit import fit_cli
            return fit_cli(args)
        if args.cmd in _EXPLORE:
            from .explore import cli as ecli
            return {"sweep": ecli.run_sweep, "capacity": ecli.run_capacity, "plan": ecli.run_plan,
                    "baseline": ecli.run_baseline, "compare": ecli.run_compare}[args.cmd](args)
        if args.cmd == "calibrate":
            from .calibrate.command import calibrate_cli
            return calibrate_cli(args, _columns(args.columns) if args.columns else None)
        from .config.scenario import load_scenario
        if args.cmd == "validate":
            from .runner import prepare
            scn = load_scenario(args.scenario, args.overrides)
            ses = prepare(scn)
            pools = list(ses.fleet.pools.values())
            if scn.fleet.declared:
                what = ", ".join(f"{p.name}: {p.spec.replicas} x {p.spec.model.name} on {p.spec.device.name}"
                                 f" ({p.role}, {p.kv_blocks} KV blocks)" for p in pools)
            else:
                what = f"{scn.model.name} on {scn.device.name}, {pools[0].kv_blocks} KV blocks"
            from .metrics.console import workload_line
            print(f"ok: {scn.name} ({what}, {len(ses.reqs)} requests)")
            print(workload_line(ses.reqs))
            conn = scn.spec.connectivity if scn.spec is not None else None
            if conn is not None:          # auto-topology: the generated draft-to-pool edges
                for e in conn.edges:
                    print(f"edge: {e.group} -> {e.pool} ({e.cluster}): {e.devices} devices, "
                          f"rtt {e.rtt_ms:g} ms, {e.bw_mbps:g} Mbit/s")
            return 0
        from .runner import default_out_dir, run
        scn = load_scenario(args.scenario, args.overrides, args.seed)
        out = args.out or default_out_dir(scn)
        if args.resolve:
            import yaml
            print(yaml.safe_dump(scn.raw, sort_keys=False, default_flow_style=None).rstrip())
            print(f"# report would be written to {out}")
            return 0
        traces = None
        if args.emit_vllm_traces:
            for flag, v in (("--trace-step-rate", args.trace_step_rate), ("--trace-rich-rate", args.trace_rich_rate)):
                if not 0 < v <= 1:
                    raise ConfigError(flag, v, "a share in (0, 1]")
            traces = {"step_rate": args.trace_step_rate, "rich_rate": args.trace_rich_rate}
        from .log import quiet
        if args.export is not None and args.export[0] != "vllm-bench":
            raise ConfigError("--export", args.export[0], "vllm-bench (the only export format)")
        res = run(scn, out, check_invariants=args.check_invariants, progress=not (args.quiet or quiet()),
                  plots=False if args.no_plots else None, vllm_traces=traces,
                  keep_steps=args.export is not None, compare_models=args.compare_models)
        if args.export is not None:
            from .metrics.vllm_bench import write_detailed
            try:
                write_detailed(res, args.export[1])
            except OSError as e:
                raise ConfigError("--export", args.export[1], f"a writable file path ({e.strerror})") from None
        if not args.quiet:
            from .metrics.console import summary_lines
            print("\n".join(summary_lines(scn.name, res.summary)))
            print(f"report: {res.out_dir}")
        return 0
    except (ConfigError, _ArgError) as e:
        print(f"dsim: error: {e}", file=sys.stderr)
        return 2
    except _Terminated:
        print("dsim: terminated", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print("dsim: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:                   # `dsim validate x | head -1`: the reader left, say nothing
        import os
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())   # no second error at exit
        return 141
    except Exception as e:                    # a bug in dsim, not a user error: one line, exit 1
        import os

        from .config.files import input_error
        from .core.spill import SpillError
        if isinstance(e, SpillError):         # the machine's temporary directory, not dsim or the input
            print(f"dsim: error: {e}", file=sys.stderr)
            return 1
        msg = input_error(e)
        if msg is not None and not os.environ.get("DSIM_DEBUG"):   # hostile file content a reader missed
            print(f"dsim: error: {msg}", file=sys.stderr)
            return 2
        if os.environ.get("DSIM_DEBUG"):
            raise
        print(f"dsim: internal error: {type(e).__name__}: {str(e)[:300]} (this is a bug; rerun with "
              "DSIM_DEBUG=1 for the traceback and please report it)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
