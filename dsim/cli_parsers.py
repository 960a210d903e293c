"""The command line's parsers: one argparse tree for every ``dsim`` subcommand, built only as far as the
running subcommand needs (a whole tree costs as much as a one-request run's simulation), kept apart
from the commands themselves so dsim/cli.py holds what each command does."""
from __future__ import annotations

import argparse


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    """Usage errors of every (sub)command become one line and exit 2, like other input errors."""

    def error(self, message):
        raise _ArgError(message)


class _Sink:
    """Takes the calls that would build a subcommand this process does not run (see _Only)."""

    def __getattr__(self, name):
        return lambda *a, **k: _Sink()


class _Only:
    """The subcommands action of the root parser, building only the parser of ``name``: building
    every subcommand's parser (29 with the nested ones) is ~70 M instructions, ~7 % of a short
    command's start-up.  The other add_parser calls go to a _Sink; ``found``: ``name`` was one."""

    def __init__(self, sub, name: str):
        self.sub, self.name, self.found = sub, name, False

    def add_parser(self, name, **kwargs):
        if name != self.name:
            return _Sink()
        self.found = True
        return self.sub.add_parser(name, **kwargs)


_EXPLORE = ("sweep", "capacity", "plan", "baseline", "compare")     # dsim.explore.cli's commands


def _command_word(argv) -> str | None:
    """The subcommand of ``argv`` when nothing before it can change how the root parser reads it (only
    -v/-q before it; no -h, --version or an option taking a value): else None (build every parser)."""
    for a in argv:
        if not a.startswith("-"):
            return a
        if not (a in ("--verbose", "--quiet") or (len(a) > 1 and a[1] != "-" and set(a[1:]) <= {"v", "q"})):
            return None
    return None


def _parser(argv=None) -> argparse.ArgumentParser:
    """The ``dsim`` parser; given ``argv``, only its subcommand's parser is built (the same parse:
    the root parser and that subcommand's are built by the same calls, and another command's parser
    never takes part in parsing ``argv``); with an unknown command word, every parser."""
    word = _command_word(argv) if argv is not None else None
    if word is not None:
        p = _parser_of(word)
        if p is not None:
            return p
    return _parser_of(None)


def _parser_of(word: str | None) -> argparse.ArgumentParser | None:
    from ._version import __version__
    from .log import LEVELS
    p = _Parser(prog="dsim", description="Discrete-event simulator of LLM inference serving",
                epilog="Results go to stdout and the output folder; progress, warnings and errors to stderr.")
    p.add_argument("--version", action="version", version=f"dsim {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more diagnostics on stderr (-v: debug)")
    p.add_argument("-q", "--quiet", dest="log_quiet", action="count", default=0,
                   help="fewer diagnostics: -q warnings and errors only (no progress bars, Ray/Dask quiet), "
                   "-qq errors only")
    p.add_argument("--log-level", choices=LEVELS, default=None, help="diagnostics level (overrides -v/-q)")
    sub = p.add_subparsers(dest="cmd", metavar="COMMAND", parser_class=_Parser)
    if word is not None:
        sub = only = _Only(sub, word)
    r = sub.add_parser("run", help="run one scenario and write its report")
    r.add_argument("scenario", help="scenario file (YAML or JSON), or a shipped scenario's name (quickstart, ...)")
    r.add_argument("--out", default=None, help="output folder (default: results/<scenario name>-<8 hex digits "
                   "of the resolved scenario's hash>, so runs with different --set never overwrite each other)")
    r.add_argument("--seed", type=int, default=None, help="master seed (replaces the scenario's seed:)")
    r.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key, e.g. --set engine.max_num_seqs=128 (repeatable)")
    r.add_argument("--check-invariants", action="store_true", help="check invariants after every step")
    r.add_argument("--quiet", action="store_true", help="no progress bar, no summary on stdout")
    r.add_argument("--no-plots", action="store_true", help="do not write plots/*.png (faster)")
    r.add_argument("--resolve", action="store_true",
                   help="print the scenario after --set/--seed as YAML and the output folder; do not run")
    r.add_argument("--emit-vllm-traces", action="store_true",
                   help="also write vllm_traces.otlp.jsonl: vLLM's journey, step and request-snapshot streams")
    r.add_argument("--export", nargs=2, default=None, metavar=("FORMAT", "FILE"),
                   help="also write the run as FORMAT to FILE; vllm-bench: the JSON of `vllm bench serve "
                   "--save-result --save-detailed` (dsim cosim reads it back)")
    r.add_argument("--compare-models", action="store_true",
                   help="also run under every other latency model validated on this GPU; their latencies go "
                   "in summary.json model_spread and on the console")
    r.add_argument("--trace-step-rate", type=float, default=1.0, help="share of steps traced (default 1)")
    r.add_argument("--trace-rich-rate", type=float, default=1.0,
                   help="share of traced steps with per-request snapshots (default 1)")
    v = sub.add_parser("validate", help="check a scenario without running it")
    v.add_argument("scenario", help="scenario file (YAML or JSON), or a shipped scenario's name")
    v.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key before checking it (repeatable)")
    sc = sub.add_parser("schema", help="print the scenario's JSON Schema (for editors) or its key reference")
    sc.add_argument("--markdown", action="store_true", help="the key reference as Markdown "
                    "(docs/scenario-reference.md) instead of JSON Schema")
    e = sub.add_parser("examples", help="copy the shipped scenarios (and the data they read) into a new folder")
    e.add_argument("dir", nargs="?", default=None, metavar="DIR", help="a new or empty folder (default: "
                   "./dsim-examples)")
    b = sub.add_parser("bench", help="simulated requests per wall-second on the fixed benchmark")
    b.add_argument("--requests", type=int, default=None, help="requests to simulate (default 20,000)")
    b.add_argument("--replicas", type=int, default=1, help="replicas behind a router (load 20 req/s each)")
    b.add_argument("--router", default="jsq", help="router for --replicas > 1 (default jsq)")
    b.add_argument("--rate", type=float, default=None, help="arrival rate in req/s (default 20 per replica)")
    b.add_argument("--scenario", default=None, help="bench this scenario file instead of the fixed workload "
                   "(plots off; --requests and --rate override its workload)")
    b.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a key of --scenario (repeatable)")
    lut = sub.add_parser("lut", help="latency lookup tables: check one, or build one from a latency model")
    ls = lut.add_subparsers(dest="lut_cmd", required=True)
    lc = ls.add_parser("check", help="validate rows; flag non-monotone rows and drift against a previous version")
    lc.add_argument("file", help="LUT CSV to check")
    lc.add_argument("--previous", default=None, help="the previous version of this LUT, for drift detection")
    lc.add_argument("--tolerance", type=float, default=0.05, help="drift that is flagged (default 0.05 = 5%%)")
    lc.add_argument("--model", default=None, help="the model the table is for: rows of any other are findings "
                    "(default: the file's most common model)")
    lb = ls.add_parser("build", help="tabulate a latency model (default: vidur) into a LUT CSV")
    lb.add_argument("--model", required=True, help="catalogue name or path to a HF config.json")
    lb.add_argument("--hardware", required=True, help="device profile name")
    lb.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    lb.add_argument("--latency", default="vidur", help="latency model to tabulate")
    lb.add_argument("--set", dest="overrides", action="append", default=[], metavar="latency.KEY=VALUE",
                    help="a latency-model parameter (repeatable)")
    lb.add_argument("--contexts", default=None, help="comma-separated context_len bins (log-spaced)")
    lb.add_argument("--microbatches", default=None, help="comma-separated microbatch bins")
    lb.add_argument("--split-attention", action="store_true",
                    help="also write cost_nonatt_ms / cost_attn_ms (latency.selective_batching reads them)")
    lb.add_argument("--tail-correlation", choices=("correlated", "independent", "none"), default="correlated",
                    help="latency_p95_ms from the vidur profiles' per-shape kernel noise, the operators' deviations "
                         "summed (correlated, the default: upper bound) or root-sum-squared (independent: lower "
                         "bound); none: no p95 column (latency.tail: true reads it)")
    lb.add_argument("--out", required=True, help="CSV file to write")
    c = sub.add_parser("cosim", help="replay a real vLLM run and report sim vs real per metric and quantile")
    c.add_argument("real", help="inference-perf folder, meta.json+requests.jsonl folder, vllm bench JSON, or CSV/JSONL")
    c.add_argument("--scenario", default=None, help="base scenario (latency model, hardware, ...); the run's "
                   "model, engine and workload take precedence")
    c.add_argument("--out", default=None, help="output folder (default: results/cosim-<run name>-<8 hex digits of a "
                   "hash of the run's files, --scenario, --set and the options>, so replays never overwrite each other)")
    c.add_argument("--seed", type=int, default=None, help="seed of the replay (default 42)")
    c.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a replay scenario key, e.g. --set latency.model=vidur (repeatable)")
    c.add_argument("--hardware", default=None, help="device profile when the run does not name its GPU")
    c.add_argument("--model", default=None, help="model when the file does not name it (vllm bench, CSV)")
    c.add_argument("--columns", default=None, metavar="FIELD=COL,...",
                   help="generic CSV/JSONL mapping, e.g. arrival_s=t,prompt_tokens=in,output_tokens=out,ttft_s=ttft,e2e_s=lat")
    c.add_argument("--time-unit", type=float, default=1.0, help="seconds per time unit of a generic file (1e-3 for ms)")
    c.add_argument("--no-plots", action="store_true", help="do not write plots/cdf.png")
    c.add_argument("--holdout", type=float, default=None, metavar="FRACTION",
                   help="80/20 replay (seed 000 Iteration 10): calibrate on the requests arriving before the last "
                   "FRACTION of the run (e.g. 0.2), replay it all, report KS < 0.15 and median error < 20 %% on "
                   "the rest")
    c.add_argument("--latency-model", default=None, choices=("roofline", "unified5", "physics", "blackbox"),
                   help="with --holdout: the latency model to calibrate (default roofline)")
    c.add_argument("--max-evals", type=int, default=None, help="with --holdout: stage-2 simulations (default 40)")
    c.add_argument("--jobs", type=int, default=None, help="with --holdout: runs simulated in parallel (default 1)")
    rp = sub.add_parser("report", help="rebuild report.html of an output folder (run, sweep, capacity, plan, cosim, "
                        "calibrate)")
    rp.add_argument("folder", help="an output folder of dsim run/sweep/capacity/plan/cosim/calibrate")
    pl = sub.add_parser("plot", help="redraw a run report's plots (latency_cdf.png, timeline.png) from its files")
    pl.add_argument("folder", help="an output folder of dsim run (with or without --no-plots)")
    pl.add_argument("--out", default=None, help="a new (or empty) folder for the PNGs (default: FOLDER/plots)")
    _trace_parser(sub)
    _serve_parser(sub)
    _observe_parser(sub)
    _fit_parser(sub)
    _calibrate_parser(sub)
    if word is None or word in _EXPLORE:
        from .explore.cli import add_compare_parsers, add_parsers, add_plan_parser
        add_parsers(sub)
        add_plan_parser(sub)
        add_compare_parsers(sub)
    if word is not None and not only.found:
        return None
    return p


def _trace_parser(sub) -> None:
    pf = sub.add_parser("profile", help="measure each pool's TTFT by input length and ITL by concurrency and context "
                        "on one replica (the tables of the interpolating planner, docs/planner.md)")
    pf.add_argument("scenario", help="scenario file (YAML or JSON), or a shipped scenario's name")
    pf.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override a scenario key first (repeatable)")
    pf.add_argument("--out", default=None, help="write the tables to this JSON file (default: print them)")
    t = sub.add_parser("trace", help="workload traces: export a scenario's generated workload as a JSONL trace")
    ts = t.add_subparsers(dest="trace_cmd", required=True)
    g = ts.add_parser("generate", help="write every request of the scenario's workload (drawn with its seed) as "
                      "the JSONL trace dsim run replays: workload {type: trace, path: FILE} runs the same requests")
    g.add_argument("scenario", help="scenario file (YAML or JSON), or a shipped scenario's name")
    g.add_argument("--out", required=True, help="JSONL file to write (replaced atomically)")
    g.add_argument("--seed", type=int, default=None, help="master seed (replaces the scenario's seed:)")
    g.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key before generating (repeatable)")


def _serve_parser(sub) -> None:
    s = sub.add_parser("serve", help="an OpenAI-compatible stand-in for vLLM: tokens at the times a real-time "
                       "simulation of the scenario gives, vLLM's /metrics (docs/observe-serve.md)")
    s.add_argument("scenario", help="scenario file (YAML or JSON), or a shipped scenario's name; its workload is "
                   "ignored (requests come from HTTP clients)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    s.add_argument("--port", type=int, default=8000, help="port of the fleet (default 8000; 0: any free port)")
    s.add_argument("--replica-ports", action="store_true",
                   help="also one port per replica (port+1, port+2, ...), each one replica without the router")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key (repeatable)")
    s.add_argument("--speed", type=float, default=1.0,
                   help="simulated seconds per wall second (default 1: real time; 2: latencies halved)")
    s.add_argument("--max-concurrency", type=int, default=256,
                   help="requests in flight over all ports; more get 429 (default 256)")
    s.add_argument("--max-prompt-tokens", type=int, default=32768,
                   help="longer prompts get 400 (default 32768; prompt + max_tokens must also fit max_model_len)")
    s.add_argument("--max-body-bytes", type=int, default=1 << 20, help="larger bodies get 413 (default 1 MiB)")
    s.add_argument("--default-max-tokens", type=int, default=16,
                   help="output tokens of a request without max_tokens (default 16, as OpenAI's completions)")


def _observe_parser(sub) -> None:
    o = sub.add_parser("observe", help="drive a live OpenAI-compatible server with a scenario's workload and capture "
                       "per-chunk timings in the folder dsim cosim / dsim calibrate read (pip install dsim[observe])")
    o.add_argument("url", help="the server (http://HOST:PORT, .../v1, or the completions endpoint itself)")
    o.add_argument("--scenario", required=True, help="scenario whose workload is sent (drawn with its seed, as "
                   "dsim run draws it), or a shipped scenario's name")
    o.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario key first (repeatable)")
    o.add_argument("--seed", type=int, default=None, help="master seed (replaces the scenario's seed:)")
    o.add_argument("--out", default=None, help="capture folder (default: results/capture-<scenario>-<UTC time>)")
    o.add_argument("--api", default="completions", choices=("completions", "chat"),
                   help="completions (prompt as token ids: exact counts; default) or chat (text prompts)")
    o.add_argument("--model", default=None, help="model name sent to the server (default: the first of GET /v1/models)")
    o.add_argument("--max-concurrency", type=int, default=None,
                   help="requests in flight at most (default: the workload's max_concurrency, else unbounded)")
    o.add_argument("--duration", type=float, default=None, help="send no request after this many seconds")
    o.add_argument("--grace", type=float, default=30.0, help="with --duration: seconds to wait for requests in "
                   "flight before cancelling them (default 30)")
    o.add_argument("--timeout", type=float, default=600.0, help="seconds of silence in one response before it "
                   "counts as failed (default 600)")
    o.add_argument("--text-prompts", action="store_true", help="completions: send text instead of token ids")
    o.add_argument("--no-vllm-extras", action="store_true", help="do not send vLLM's ignore_eos, min_tokens and "
                   "continuous usage stats (servers that refuse unknown fields)")


def _calibrate_parser(sub) -> None:
    k = sub.add_parser("calibrate", help="fit a deployment's latency model from its real runs and write a "
                       "calibrated scenario + report")
    k.add_argument("real", nargs="+", help="real runs: inference-perf folders, meta.json+requests.jsonl folders, "
                   "vllm bench JSON, or CSV/JSONL with --columns")
    k.add_argument("--out", default=None, help="folder for calibrated.yaml, report.md, report.json (default: "
                   "results/calibrate-<first run's name>-<8 hex digits of a hash of the runs, --scenario, --set "
                   "and the options>)")
    k.add_argument("--scenario", default=None, help="base scenario: what the runs do not record (GPU, engine "
                   "settings, vllm_version); the runs' own settings take precedence")
    k.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a replay scenario key, e.g. --set hardware=A100-80GB (repeatable)")
    k.add_argument("--columns", default=None, metavar="FIELD=COL,...",
                   help="generic CSV/JSONL mapping, as for dsim cosim")
    k.add_argument("--time-unit", type=float, default=1.0, help="seconds per time unit of a generic file")
    k.add_argument("--hardware", default=None, help="device profile when the runs do not name their GPU")
    k.add_argument("--model", default=None, help="model when the runs do not name it")
    k.add_argument("--latency-model", default="roofline", choices=("roofline", "unified5", "physics", "blackbox"),
                   help="latency model to fit (default roofline; blackbox: BLIS's b0 + b1 x prefill + b2 x decode "
                   "tokens and a0, by Bayesian optimisation unless --optimizer says otherwise)")
    k.add_argument("--max-evals", type=int, default=40, help="stage-2 simulations (default 40)")
    k.add_argument("--jobs", type=int, default=1, help="runs simulated in parallel by joblib (default 1)")
    k.add_argument("--seed", type=int, default=42, help="seed of the replays (default 42)")
    k.add_argument("--allow-nonphysical", action="store_true",
                   help="write a fit even when it is faster than the hardware allows (flagged in the report)")
    k.add_argument("--no-loro", action="store_true", help="skip the leave-one-run-out refits")
    k.add_argument("--optimizer", default=None,
                   choices=("nelder-mead", "differential-evolution", "dual-annealing", "bayesian"),
                   help="stage-2 optimiser (default nelder-mead, bayesian for blackbox; the others search each "
                   "parameter's whole range within --max-evals simulations, seeded by --seed; bayesian: optuna's "
                   "TPE, pip install 'dsim[calibrate]')")
    k.add_argument("--evaluate", action="store_true",
                   help="add seed 003's system-level report: E2E MAPE < 15 %%, TTFT worst < 100 %%, saturation "
                   "cliff within 20 %% of the real one (staged runs with an overloaded stage)")
    k.add_argument("--cliff-penalty", type=float, default=0.0, metavar="WEIGHT",
                   help="add to stage 2's loss WEIGHT x how far (log ratio) each staged run's simulated saturation "
                   "cliff lies outside its real failure-onset bracket widened by 20 %% (0, the default: off; each "
                   "stage-2 evaluation then bisects the cliff of every run with an overloaded stage)")


def _fit_parser(sub) -> None:
    f = sub.add_parser("fit", help="fit latency-model coefficients from real runs or vLLM traces")
    f.add_argument("runs", nargs="+", help="OTLP trace files (stage 1, step level) and/or real runs "
                   "(stage 2: Nelder-Mead with dsim in the loop)")
    f.add_argument("--model", default="unified5", choices=("unified5", "physics"), help="latency model to fit")
    f.add_argument("--out", required=True, help="coefficients YAML to write")
    f.add_argument("--scenario", default=None, help="scenario the traces were recorded with (model, hardware, engine)")
    f.add_argument("--max-evals", type=int, default=60, help="stage-2 simulator evaluations (default 60)")
    f.add_argument("--jobs", type=int, default=1, help="runs simulated in parallel by joblib (default 1)")
    f.add_argument("--residual", default=None, metavar="OUT.json",
                   help="physics only: also fit a gradient-boosted correction of log(real / physics) step time on "
                   "the traces (validated leave one trace file out) and write it here; use it with latency.residual")
    _add_specdec(sub)
    a = sub.add_parser("acceptance", help="speculative-decoding acceptance bundles: train one from profiling "
                       "logs, or evaluate one on held-out logs")
    asub = a.add_subparsers(dest="acc_cmd", required=True)
    at = asub.add_parser("train", help="fit a per-position acceptance classifier on profiling logs (JSONL)")
    at.add_argument("logs", nargs="+", help="profiling logs (JSONL, one verification round a line)")
    at.add_argument("--out", required=True, help="bundle to write (.joblib)")
    at.add_argument("--estimator", default="gbdt", choices=("gbdt", "rf"),
                    help="gradient-boosted trees or a random forest (default gbdt)")
    at.add_argument("--max-depth", type=int, default=3, help="tree depth (default 3)")
    at.add_argument("--meta", action="append", default=[], metavar="KEY=VALUE", help="metadata kept in the bundle")
    ae = asub.add_parser("evaluate", help="accuracy, precision, recall, F1 (positive class = accepted, threshold "
                         "0.5), Brier, ECE and accepted-count MAE on held-out logs")
    ae.add_argument("bundle", help="bundle written by dsim acceptance train")
    ae.add_argument("logs", nargs="+", help="held-out profiling logs (JSONL)")
    ae.add_argument("--json", default=None, help="also write the metrics to this JSON file")


def _add_specdec(sub) -> None:
    sd = sub.add_parser("specdec", help="speculative decoding: oracle labels and a trained latency head")
    ssub = sd.add_subparsers(dest="sd_cmd", required=True)
    o = ssub.add_parser("oracle", help="label each conversation with its best (mode, gamma) from common-action "
                        "counterfactual runs (docs/gamma-head.md)")
    o.add_argument("scenario", help="a scenario with speculation.drafts")
    o.add_argument("--out", required=True, help="folder for oracle.csv and oracle.json")
    o.add_argument("--rtt", default="1", help="RTT multipliers, comma-separated (default 1)")
    o.add_argument("--load", default="1", help="arrival-rate multipliers, comma-separated (default 1)")
    o.add_argument("--modes", default="fused,distributed", help="modes the labels choose among")
    o.add_argument("--gammas", default="2,3,4,6,8", help="candidate gammas (default 2,3,4,6,8)")
    o.add_argument("--warmup", type=float, default=0.1, help="share of the arrival span left unlabelled")
    o.add_argument("--jobs", type=int, default=1, help="conditions simulated in parallel (joblib)")
    t = ssub.add_parser("train-head", help="fit linear and SiLU-MLP latency heads on oracle labels (Huber loss, "
                        "held-out conditions) and write the best as a head YAML")
    t.add_argument("oracle", help="folder written by dsim specdec oracle")
    t.add_argument("--out", required=True, help="head YAML to write (gamma: {policy: latency_head, head: FILE})")
    t.add_argument("--hidden", default="0,8,16", help="hidden units to try, 0 = linear (default 0,8,16)")
    t.add_argument("--seed", type=int, default=0, help="initialisation seed")
    t.add_argument("--residual", action="store_true", help="wrap each hidden layer in the design's residual "
                   "block y = x + Linear(SiLU(Linear(x))) (seed 002 6.4.1)")
