"""Command line: ``dsim run | validate | bench``.  User mistakes print one line and exit 2."""
from __future__ import annotations

import argparse
import json
import sys
import time

_T0 = time.perf_counter()


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dsim", description="Discrete-event simulator of LLM inference serving")
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run one scenario and write its report")
    r.add_argument("scenario")
    r.add_argument("--out", default=None, help="output folder (default: results/<scenario name>)")
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set engine.max_num_seqs=128 (repeatable)")
    r.add_argument("--check-invariants", action="store_true", help="check invariants after every step")
    r.add_argument("--quiet", action="store_true", help="no progress bar, no summary on stdout")
    r.add_argument("--no-plots", action="store_true")
    v = sub.add_parser("validate", help="check a scenario without running it")
    v.add_argument("scenario")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    b = sub.add_parser("bench", help="simulated requests per wall-second on the fixed benchmark")
    b.add_argument("--requests", type=int, default=None)
    return p


class _ArgError(Exception):
    pass


def main(argv=None) -> int:
    from .config.errors import ConfigError
    parser = _parser()

    def _err(msg):
        raise _ArgError(msg)
    parser.error = _err  # one-line usage errors, exit 2
    try:
        args = parser.parse_args(argv)
        if args.cmd == "bench":
            from .bench import bench
            print(json.dumps(bench(args.requests, _T0)))
            return 0
        from .config.scenario import load_scenario
        if args.cmd == "validate":
            from .runner import prepare
            scn = load_scenario(args.scenario, args.overrides)
            _, reqs, _, _, blocks, _ = prepare(scn)
            print(f"ok: {scn.name} ({scn.model.name} on {scn.device.name}, {blocks} KV blocks, "
                  f"{len(reqs)} requests)")
            return 0
        from .runner import run
        scn = load_scenario(args.scenario, args.overrides, args.seed)
        out = args.out or f"results/{scn.name}"
        res = run(scn, out, check_invariants=args.check_invariants, progress=not args.quiet,
                  plots=False if args.no_plots else None)
        if not args.quiet:
            s = res.summary
            lat = s["latency_ms"]
            print(f"{scn.name}: {s['requests']['completed']}/{s['requests']['submitted']} requests completed, "
                  f"{s['throughput']['requests_per_s']:.2f} req/s, {s['throughput']['output_tokens_per_s']:.0f} tok/s")
            for k in ("ttft", "tpot", "e2e"):
                if lat[k].get("count"):
                    print(f"  {k.upper():5s} ms  mean {lat[k]['mean']:9.2f}  p50 {lat[k]['p50']:9.2f}  "
                          f"p99 {lat[k]['p99']:9.2f}")
            print(f"report: {res.out_dir}")
        return 0
    except (ConfigError, _ArgError) as e:
        print(f"dsim: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("dsim: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
