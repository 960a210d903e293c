"""The ``dsim observe`` command: draw the scenario's workload, drive the server, write the capture.

The workload is drawn exactly as ``dsim run`` / ``dsim trace generate`` draw it (same builders,
same seed), so the capture's workload.jsonl is that scenario's trace line for line.  The folder is
written atomically (``AtomicOutput``): opened before anything is sent (an unusable ``--out`` fails
first), committed once the capture ended, whether it completed, reached ``--duration`` or was
interrupted; an internal failure leaves nothing.
"""
from __future__ import annotations

import json
import math
import re
import time
from pathlib import Path

import yaml

from ..config.errors import ConfigError
from ..metrics import capture as fmt
from ..metrics.exact import percentiles
from ..metrics.writers import AtomicOutput, to_json
from .observe import Options, drive


def drawn_workload(scn) -> list:
    """The scenario's requests as workload.jsonl records (``dsim trace generate``'s), in arrival order."""
    from ..core.rng import PartitionedRNG
    from ..workload.export import trace_record
    from ..workload.generator import build_workload
    wl, _ = build_workload(scn.config.workload, PartitionedRNG(scn.seed, scn.seeds), scn.base_dir)
    out = [trace_record(r) for r in wl]
    for rec in out:
        if not math.isfinite(rec["arrival_s"]):
            raise ConfigError("workload", None, "arrivals at finite times", show_value=False)
    return out


def capture_doc(out, opts: Options, scn, n_drawn: int, cap) -> dict:
    """capture.json: what was captured, how, and how it ended."""
    from .._version import __version__
    recs = out.records
    ok = sum(1 for r in recs if fmt.succeeded(r))
    cancelled = sum(1 for r in recs if r["cancelled"])
    return {"format": fmt.FORMAT, "version": fmt.VERSION, "dsim_version": __version__, "url": opts.url,
            "endpoint": out.endpoint, "api": opts.api, "model": out.model,
            "prompt": "text" if opts.api == "chat" or opts.text_prompts else "token_ids",
            "vllm_extras": opts.vllm_extras, "client": out.client, "started_utc": out.started_utc,
            "scenario": scn.name, "seed": scn.seed, "max_concurrency": cap, "duration_s": opts.duration_s,
            "grace_s": opts.grace_s if opts.duration_s is not None else None, "ended": out.ended,
            "requests": {"drawn": n_drawn, "sent": len(recs), "succeeded": ok,
                         "failed": len(recs) - ok - cancelled, "cancelled": cancelled,
                         "not_sent": n_drawn - len(recs)},
            "late": out.late}


def write_capture(ao: AtomicOutput, out, opts: Options, scn, workload: list, cap) -> dict:
    doc = capture_doc(out, opts, scn, len(workload), cap)
    ao.write_text(fmt.CAPTURE, to_json(doc))
    ao.write_text(fmt.SCENARIO, "# the resolved scenario dsim observe drew the workload from\n"
                  + yaml.safe_dump(scn.raw, sort_keys=False))
    ao.write_text(fmt.WORKLOAD, "".join(json.dumps(w, separators=(",", ":")) + "\n" for w in workload))
    ao.write_text(fmt.REQUESTS, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in out.records))
    return doc


def summary_lines(doc: dict, records: list) -> list:
    n = doc["requests"]
    lines = [f"observe {doc['endpoint']} ({doc['model']}): {n['sent']} of {n['drawn']} requests sent, "
             f"{n['succeeded']} succeeded, {n['failed']} failed, {n['cancelled']} cancelled ({doc['ended']}); "
             f"{doc['late']['count']} sent more than {doc['late']['threshold_ms']:.0f} ms late "
             f"(max {doc['late']['max_ms']:.1f} ms)"]
    lat = [fmt.client_latencies(r) for r in records if fmt.succeeded(r)]
    for m in ("ttft", "tpot", "e2e"):
        v = [x[m] for x in lat if x[m] is not None]
        if v:
            p50, p90, p99 = percentiles(v, [50, 90, 99])
            lines.append(f"  {m.upper():4s} p50 {p50:9.1f} ms   p90 {p90:9.1f} ms   p99 {p99:9.1f} ms")
    errors = {}
    for r in records:
        if r["error"] and not r["cancelled"]:
            key = f"HTTP {r['status']}" if r["status"] not in (None, 200) else r["error"].split(":")[0]
            errors[key] = errors.get(key, 0) + 1
    if errors:
        lines.append("  errors: " + ", ".join(f"{k} x{v}" for k, v in sorted(errors.items())))
    return lines


def default_out(scn) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", scn.name).lstrip(".") or "scenario"
    return f"results/capture-{safe}-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"


def observe_cli(args) -> int:
    """``dsim observe``: exit 0 when the capture completed, 130 when Ctrl-C cut it short (the capture
    is written either way)."""
    from ..config.limits import MAX_CONCURRENCY, MAX_TIME_S, check_flag
    from ..config.scenario import load_scenario
    from ..log import quiet
    from ..shipped import resolve
    if args.api not in ("completions", "chat"):
        raise ConfigError("--api", args.api, "completions or chat")
    if args.max_concurrency is not None:
        check_flag("--max-concurrency", args.max_concurrency, 1, MAX_CONCURRENCY)
    for flag, v, lo in (("--duration", args.duration, 1e-3), ("--grace", args.grace, 0.0),
                        ("--timeout", args.timeout, 1e-3)):
        if v is not None:
            check_flag(flag, v, lo, MAX_TIME_S)
    scn = load_scenario(resolve(args.scenario), args.overrides, args.seed)
    workload = drawn_workload(scn)
    cap = args.max_concurrency or scn.config.workload.max_concurrency
    opts = Options(args.url, args.api, args.model, cap, args.duration, args.grace, args.timeout,
                   not args.no_vllm_extras, args.text_prompts, progress=not quiet())
    from .observe import endpoint
    endpoint(opts.url, opts.api)                     # a malformed URL fails before the folder is opened
    with AtomicOutput(Path(args.out or default_out(scn))) as ao:
        out = drive(workload, opts)
        doc = write_capture(ao, out, opts, scn, workload, cap)
    print("\n".join(summary_lines(doc, out.records)))
    print(f"capture: {ao.out}  (replay: dsim cosim {ao.out} --scenario {ao.out / fmt.SCENARIO}; "
          f"fit: dsim calibrate {ao.out})")
    return 130 if out.ended == "interrupted" else 0
