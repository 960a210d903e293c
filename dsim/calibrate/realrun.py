"""Readers that turn a real vLLM run into what co-simulation needs: the scenario that replays it
(model, hardware, engine settings, workload) and what was measured, per stage.

Formats (``load_real`` picks one from the path's contents):
  * inference-perf output folder: ``exp-config.yaml`` + ``profile.yaml`` + ``results/stage_N_lifecycle_metrics.json``
    (aggregates only; arrivals are regenerated from the load stages with the seed; the client's
    resolved ``results/config.yaml``, when present, says what was really sent);
  * a ``dsim observe`` capture: ``capture.json`` + ``scenario.yaml`` + ``workload.jsonl`` + ``requests.jsonl``
    (client-side per-chunk times; arrivals and prompt structure replayed exactly: ``capture.py``);
  * LLMServingSim-style folder: ``meta.json`` + ``requests.jsonl`` with engine timestamps per request
    (queued, scheduled, first token, last token): arrivals are replayed exactly;
  * the JSON saved by ``vllm bench serve --save-result --save-detailed`` (input_lens, output_lens,
    ttfts, itls): arrivals regenerated from request_rate / burstiness with the seed;
  * a generic per-request CSV or JSONL with a column mapping (``columns=``).
All latencies are kept in milliseconds.
"""
from __future__ import annotations

import csv
import math
from pathlib import Path

from ..config.errors import ConfigError
from ..config.files import parse_json, read_text
from ..config.limits import MAX_TOKENS
from .benchjson import bench_requests
from .runs import COALESCED, RealRun, Stage, jsonl_records, set_throughput, trace_stage, yaml_mapping

# substrings of torch's device name -> our device profile
DEVICE_NAMES = (("H100", "H100-SXM"), ("A100-SXM4-40GB", "A100-40GB"), ("A100", "A100-80GB"), ("L40S", "L40S"),
                ("A40", "A40"), ("4090", "RTX4090"), ("PRO 6000", "RTXPRO6000"), ("RTXPRO6000", "RTXPRO6000"))


def device_for(name: str | None, fallback: str | None = None) -> str | None:
    for key, dev in DEVICE_NAMES:
        if name and key in name:
            return dev
    return fallback


def _read_json(p: Path, where: str):
    if not Path(p).is_file():
        raise ConfigError(where, str(p), "an existing file")
    return parse_json(read_text(p), str(p))


def _num(rec: dict, key: str, where: str) -> float:
    v = rec.get(key)
    if isinstance(v, bool):
        raise ConfigError(f"{where}.{key}", v, "a number")
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.{key}", v, "a number") from None
    if not math.isfinite(f):
        raise ConfigError(f"{where}.{key}", v, "a finite number")
    return f


def _engine(kw: dict, keys=("tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                            "enable_prefix_caching", "enable_chunked_prefill", "num_gpu_blocks", "block_size")) -> dict:
    return {k: kw[k] for k in keys if kw.get(k) is not None}


# ---- LLMServingSim-style: meta.json + requests.jsonl ----------------------------------------------
def read_llmservingsim(folder: Path, hardware: str | None = None) -> RealRun:
    folder = Path(folder)
    meta = _read_json(folder / "meta.json", str(folder))
    if not isinstance(meta, dict):
        raise ConfigError(str(folder / "meta.json"), type(meta).__name__, "a JSON object")
    for k in ("engine_kwargs", "kv_cache", "hardware"):
        if not isinstance(meta.get(k) or {}, dict):
            raise ConfigError(f"{folder / 'meta.json'}.{k}", meta[k], "a mapping")
    kw = dict(meta.get("engine_kwargs") or {})
    kv = meta.get("kv_cache") or {}
    for k in ("num_gpu_blocks", "block_size", "enable_prefix_caching"):
        if kv.get(k) is not None:
            kw[k] = kv[k]
    if kw.get("max_model_len") is None:
        kw["max_model_len"] = 32768
    dev = hardware or device_for((meta.get("hardware") or {}).get("device_name")) or device_for(folder.name)
    # no GPU named: the base scenario or --set hardware=... must say it (replay_scenario checks)
    p = folder / "requests.jsonl"
    if not p.is_file():
        raise ConfigError(str(folder), "requests.jsonl", "a folder with requests.jsonl")
    raw = jsonl_records(p)
    if not raw:
        raise ConfigError(str(p), None, "at least one request", show_value=False)
    q0 = min(_num(r, "queued_ts", w) for w, r in raw)
    rows, ttft, tpot, e2e, start, end, each_tpot = [], [], [], [], [], [], []
    for w, r in raw:
        q, f1, last = (_num(r, k, w) for k in ("queued_ts", "first_token_ts", "last_token_ts"))
        n_out = int(_num(r, "output_toks", w))
        for key, v in (("input_toks", _num(r, "input_toks", w)), ("output_toks", n_out)):
            if not v >= 1 or v != int(v):
                raise ConfigError(f"{w}.{key}", r.get(key), "an integer >= 1 (tokens)")
            if v > MAX_TOKENS:
                raise ConfigError(f"{w}.{key}", r.get(key), f"at most {MAX_TOKENS:.0e} tokens")
        if not q <= f1 <= last:
            raise ConfigError(w, None, "queued_ts <= first_token_ts <= last_token_ts", show_value=False)
        rows.append({"arrival_s": q - q0, "prompt_tokens": int(_num(r, "input_toks", w)), "output_tokens": n_out,
                     "request_id": str(r.get("request_id", ""))})
        ttft.append((f1 - q) * 1e3)
        e2e.append((last - q) * 1e3)
        each_tpot.append((last - f1) * 1e3 / (n_out - 1) if n_out > 1 else None)
        if n_out > 1:
            tpot.append(each_tpot[-1])
        start.append(q)
        end.append(last)
    st = trace_stage(rows, ttft, tpot, e2e, None)
    set_throughput(st, rows, start, end)
    dp = int(kw.get("data_parallel_size") or 1)
    scn = {"name": folder.name, "model": meta.get("model") or kw.get("model"), "hardware": dev,
           "engine": _engine(kw), "workload": {"type": "trace"}}
    notes = ["arrivals: each request's engine queue time (queued_ts), replayed exactly; "
             "TTFT and E2E are measured from it, as the simulator measures from arrival"]
    if dp > 1:
        ep = bool(kw.get("enable_expert_parallel"))
        scn["cluster"] = {"router": "least_outstanding",
                          "pools": [{"name": "dp", "replicas": dp,
                                     "engine": {"enable_expert_parallel": False}}]}
        notes.append(f"data_parallel_size={dp} modelled as {dp} replicas behind a least-outstanding router"
                     + (" (expert parallelism across DP ranks is not modelled: each replica holds all experts)"
                        if ep else ""))
    times = {"arrival_s": [_num(r, "queued_ts", w) for w, r in raw],
             "first_s": [_num(r, "first_token_ts", w) for w, r in raw],
             "last_s": [_num(r, "last_token_ts", w) for w, r in raw],
             "prompt": [x["prompt_tokens"] for x in rows], "output": [x["output_tokens"] for x in rows]}
    if meta.get("vllm_version"):
        scn["engine"]["vllm_version"] = str(meta["vllm_version"])
    return RealRun(folder.name, "llmservingsim", str(folder), scn, [st], rows, notes,
                   {"vllm_version": meta.get("vllm_version"), "device_name": (meta.get("hardware") or {}).get("device_name"),
                    "token_times": times, "clock": "engine",
                    "per_request": {"ttft": ttft, "tpot": each_tpot, "e2e": e2e}})


# ---- inference-perf output folder --------------------------------------------------------------------
def read_inference_perf(folder: Path, hardware: str | None = None) -> RealRun:
    """Staged constant-rate loads over a shared-prefix dataset; aggregates per stage only.

    The shared files carry no hardware name: the data README says H100 SXM, the default here."""
    folder = Path(folder)
    for name in ("exp-config.yaml", "profile.yaml"):
        if not (folder / name).exists():
            raise ConfigError(str(folder), name, "an inference-perf folder with this file")
    exp = yaml_mapping(folder / "exp-config.yaml")
    prof = yaml_mapping(folder / "profile.yaml")
    client, client_file = _iperf_client_config(folder, prof)
    data = client.get("data") or {}
    sp = data.get("shared_prefix")
    if data.get("type") != "shared_prefix" or not isinstance(sp, dict):
        raise ConfigError(f"{folder}/{client_file}.data.type", data.get("type"), "shared_prefix (the only dataset kind read)")
    load = client.get("load") or {}
    stages_cfg = load.get("stages") or []
    if not stages_cfg:
        raise ConfigError(f"{folder}/{client_file}.load.stages", None, "at least one stage", show_value=False)
    ew = f"{folder}/exp-config.yaml"
    engine = {"tensor_parallel_size": _count(exp, "tensor_parallelism", 1, ew),
              "max_num_seqs": _count(exp, "max_num_seqs", 256, ew),
              "max_num_batched_tokens": _count(exp, "max_num_batched_tokens", 2048, ew),
              "max_model_len": _count(exp, "max_model_len", 4096, ew)}
    out_len = _count(sp, "output_len", None, f"{folder}/{client_file}.data.shared_prefix")
    prefix, how = _iperf_prompts(sp, f"{folder}/{client_file}.data.shared_prefix")
    workload = {
        "type": "staged", "stage_arrivals": "constant" if load.get("type", "constant") == "constant" else "poisson",
        "stages": [{"rate": float(s["rate"]), "duration_s": float(s["duration"])} for s in stages_cfg],
        "shared_prefix": prefix, "prompt_tokens": int(sp["question_len"]), "output_tokens": out_len}
    scn = {"name": folder.name, "model": exp.get("model") or (prof.get("server") or {}).get("model_name"),
           "hardware": hardware or "H100-SXM", "engine": engine, "workload": workload}
    stages, t0 = [], 0.0
    for i, s in enumerate(stages_cfg):
        t1 = t0 + float(s["duration"])
        f = folder / "results" / f"stage_{i}_lifecycle_metrics.json"
        if f.is_file():
            stages.append(_iperf_stage(_read_json(f, str(f)), f, f"stage {i} ({s['rate']} req/s)", t0, t1,
                                       float(s["rate"]), out_len))
        t0 = t1
    if not stages:
        raise ConfigError(f"{folder}/results", None, "stage_N_lifecycle_metrics.json files", show_value=False)
    notes = [f"client config: {client_file}" + (" (inference-perf's resolved configuration, as the run used it)"
                                                if client_file != "profile.yaml" else
                                                " (no results/config.yaml: the profile as written)"),
             "prompts: " + how,
             "arrivals regenerated from the load stages (no per-request data); compared per stage",
             "TPOT derived as (E2E - TTFT) / (output_len - 1) at the mean and median: inference-perf's own "
             "time_per_output_token counts streamed chunks, not tokens",
             "ITL left out where inference-perf's median gap is under "
             f"{COALESCED:.0%} of its mean: it times SSE messages as they are read, and gaps of microseconds "
             "(a token's text split over messages, or messages read together) make it measure message framing, "
             "not engine steps: " + ("; ".join(
                 f"{st.name} p50 {x['p50']:.3f} ms, mean {x['mean']:.2f} ms vs {x['per_token']:.2f} ms per token "
                 f"({x['per_token'] / x['mean']:.1f} messages per token)"
                 for st in stages if (x := st.itl_not_compared)) or "none here"),
             ]
    return RealRun(folder.name, "inference-perf", str(folder), scn, stages, None, notes,
                   {"app": exp.get("app"), "client_config": client_file})


def _iperf_client_config(folder: Path, prof: dict) -> tuple[dict, str]:
    """The client configuration the run really used: inference-perf writes its resolved config to
    results/config.yaml; a release may ignore keys of profile.yaml, so the resolved one wins."""
    f = folder / "results" / "config.yaml"
    if not f.exists():
        return prof, "profile.yaml"
    return yaml_mapping(f), "results/config.yaml"


def _count(d: dict, key: str, default, where: str) -> int:
    """An integer >= 1 of a run's YAML ('abc', NaN or 1.5 was an internal error in int())."""
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v != int(v) or v < 1 \
            or v > MAX_TOKENS:
        raise ConfigError(f"{where}.{key}", v, f"an integer in [1, {MAX_TOKENS:.0e}]")
    return int(v)


def _iperf_prompts(sp: dict, where: str) -> tuple[dict, str]:
    """The shared-prefix workload as the client built it, and a sentence saying how.

    Two generations of inference-perf's generator: the resolved config of the older one carries
    ``num_groups`` x ``num_prompts_per_group`` and builds that many full prompts (system prompt +
    question) once, then sends prompt n mod pool size for request n, so after the first pass every
    prompt is a prefix-cache hit; profiles written for the newer one name ``num_unique_system_prompts``
    / ``num_users_per_system_prompt`` (and multi-turn), each request a fresh question on its group's
    system prompt."""
    def count(key):
        try:
            v = int(sp[key])
        except (KeyError, TypeError, ValueError):
            raise ConfigError(f"{where}.{key}", sp.get(key), "a positive integer") from None
        if v < 1:
            raise ConfigError(f"{where}.{key}", v, "a positive integer")
        return v
    sys_len = count("system_prompt_len")
    if "num_groups" in sp:
        g, p = count("num_groups"), count("num_prompts_per_group")
        multi = bool(sp.get("enable_multi_turn_chat", False))
        if multi:
            raise ConfigError(f"{where}.enable_multi_turn_chat", True,
                              "false (multi-turn sessions of the pooled generator are not modelled)")
        return ({"num_groups": g, "users_per_group": p, "system_prompt_len": sys_len, "question_pool": True,
                 "order": "cycle"},
                f"a pool of {g} x {p} = {g * p} fixed prompts ({sys_len}-token system prompt + "
                f"{int(sp['question_len'])}-token question) re-sent in order: request n sends prompt n mod {g * p}, "
                "so the prefix cache hits the whole prompt after its first use")
    g, u = count("num_unique_system_prompts"), count("num_users_per_system_prompt")
    return ({"num_groups": g, "users_per_group": u, "system_prompt_len": sys_len, "multi_turn": False},
            f"{g} system prompts of {sys_len} tokens x {u} users, each request a new "
            f"{int(sp['question_len'])}-token question (multi-turn history is not replayed)")


def _iperf_stage(d: dict, f: Path, name: str, t0: float, t1: float, rate: float, out_len: int) -> Stage:
    try:
        succ = d["successes"]
        lat = succ["latency"]
    except (KeyError, TypeError):
        raise ConfigError(f"{f}.successes.latency", None, "inference-perf lifecycle metrics", show_value=False) from None

    def q(key):
        L = lat.get(key) or {}
        out = {"count": int(succ.get("count", 0))}
        for ours, theirs in (("mean", "mean"), ("p50", "median"), ("p90", "p90"), ("p95", "p95"), ("p99", "p99")):
            if theirs in L:
                out[ours] = float(L[theirs]) * 1e3
        return out
    real = {"ttft": q("time_to_first_token"), "e2e": q("request_latency"), "itl": q("inter_token_latency")}
    itl = real.pop("itl")
    if out_len > 1:
        real["tpot"] = {"count": real["e2e"]["count"],
                        **{k: (real["e2e"][k] - real["ttft"][k]) / (out_len - 1) for k in ("mean", "p50")
                           if k in real["e2e"] and k in real["ttft"]}}
    if itl.get("p50") is not None and itl.get("mean") and itl["p50"] >= COALESCED * itl["mean"]:
        real["itl"] = itl
    else:
        # inference-perf times SSE messages as they are read; when a token's text comes in more than one
        # message, or messages arrive in one read, the gaps between them are microseconds: its ITL then
        # measures the server's message framing, not engine steps, and is left out of the comparison.
        dropped_itl = {"p50": itl.get("p50"), "mean": itl.get("mean"),
                       "per_token": real.get("tpot", {}).get("mean")}
    fails = int((d.get("failures") or {}).get("count", 0) or 0)
    thr = succ.get("throughput") or {}
    n = real["e2e"]["count"] + fails
    # overloaded: requests failed (timeouts) or the server completed clearly less than was offered
    over = fails > 0.01 * max(n, 1) or (thr.get("requests_per_sec", rate) < 0.9 * rate)
    return Stage(name, t0, t1, real, {}, {"requests_per_s": thr.get("requests_per_sec"),
                                          "output_tokens_per_s": thr.get("output_tokens_per_sec")},
                 rate, fails, over, None if "itl" in real else dropped_itl)


# ---- vllm bench serve --save-result --save-detailed -------------------------------------------------
def read_vllm_bench(p: Path, model: str | None = None, hardware: str | None = None, engine: dict | None = None) -> RealRun:
    """Per-request lengths, TTFTs and ITLs (seconds in the file); arrivals are not saved, so they are
    regenerated: Poisson at request_rate (gamma with shape ``burstiness`` when it is not 1), all at
    t=0 for an infinite rate."""
    p = Path(p)
    d = _read_json(p, str(p))
    req = bench_requests(d, p)
    rate = d.get("request_rate", "inf")
    if rate in ("inf", None) or (isinstance(rate, float) and math.isinf(rate) and rate > 0):
        rate = math.inf
    else:
        try:
            rate = float(rate)
        except (TypeError, ValueError):
            raise ConfigError(f"{p}.request_rate", rate, 'a rate > 0 or "inf"') from None
        if not rate > 0:
            raise ConfigError(f"{p}.request_rate", rate, 'a rate > 0 or "inf" (all requests at once)')
    burst = req["burstiness"]
    ttft, e2e, tpot, itl, each_tpot = [], [], [], [], []
    for r in req["rows"]:
        g = [x * 1e3 for x in r["itls"]]
        itl += g
        ttft.append(r["ttft"] * 1e3)
        e2e.append(r["ttft"] * 1e3 + sum(g))
        each_tpot.append(sum(g) / (r["output"] - 1) if r["output"] > 1 else None)
        if r["output"] > 1:
            tpot.append(each_tpot[-1])
    starts = req.get("starts")
    lens = [{"arrival_s": 0.0 if starts is None else starts[i], "prompt_tokens": r["input"],
             "output_tokens": r["output"], "request_id": str(i)} for i, r in zip(req["ok"], req["rows"])]
    cap = d.get("max_concurrency")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ConfigError(f"{p}.max_concurrency", cap, "null or an integer >= 1")
    if starts is not None:                   # dsim's export (dsim run --export vllm-bench) saves them
        notes = ["arrivals replayed exactly from the file's start_times"]
    else:
        notes = ["arrivals regenerated from request_rate" + (f" (gamma, burstiness {burst})" if burst != 1
                 else " (Poisson)") + " with the scenario's seed: vllm bench saves lengths, not send times"]
    if cap:
        notes.append(f"closed loop: at most {cap} requests in flight (--max-concurrency), each timed from when "
                     "it is sent")
    name = p.stem
    m = model or d.get("model_id")
    if m is not None and not isinstance(m, str):
        raise ConfigError(f"{p}.model_id", m, "the model's name (text)")
    scn = {"name": name, "model": m, "hardware": hardware, "engine": dict(engine or {}),
           "workload": {"type": "trace", **({"max_concurrency": cap} if cap else {})}}
    st = trace_stage(lens, ttft, tpot, e2e, itl)
    st.rate = None if math.isinf(rate) else rate
    if req["duration"] > 0:
        st.throughput = {"requests_per_s": len(lens) / req["duration"],
                         "output_tokens_per_s": sum(r["output_tokens"] for r in lens) / req["duration"]}
    return RealRun(name, "vllm-bench", str(p), scn, [st], lens, notes,
                   {"backend": d.get("backend"), "per_request": {"ttft": ttft, "tpot": each_tpot, "e2e": e2e},
                    **({"regenerate": {"rate": rate, "burstiness": burst}} if starts is None else {})})


# ---- generic per-request CSV / JSONL -----------------------------------------------------------------
GENERIC_FIELDS = ("arrival_s", "prompt_tokens", "output_tokens", "ttft_s", "e2e_s", "first_token_s", "last_token_s")


def read_generic(p: Path, columns: dict, model: str | None = None, hardware: str | None = None,
                 engine: dict | None = None, time_unit: float = 1.0) -> RealRun:
    """One request a row.  ``columns`` maps our fields to the file's column names: arrival_s,
    prompt_tokens, output_tokens are required; then either ttft_s and e2e_s (durations) or
    first_token_s and last_token_s (timestamps on the arrival clock).  ``time_unit`` converts the
    file's time unit to seconds (1e-3 for milliseconds)."""
    p = Path(p)
    check_time_unit(time_unit)
    unknown = set(columns) - set(GENERIC_FIELDS)
    if unknown:
        k = sorted(unknown)[0]
        raise ConfigError(f"columns.{k}", columns[k], f"one of {', '.join(GENERIC_FIELDS)}")
    for k in ("arrival_s", "prompt_tokens", "output_tokens"):
        if k not in columns:
            raise ConfigError(f"columns.{k}", None, "a column name for this field", show_value=False)
    durations = "ttft_s" in columns and "e2e_s" in columns
    if not durations and not ("first_token_s" in columns and "last_token_s" in columns):
        raise ConfigError("columns", sorted(columns), "ttft_s + e2e_s, or first_token_s + last_token_s")
    if not p.is_file():
        raise ConfigError(str(p), None, "an existing file", show_value=False)
    recs = []
    if p.suffix in (".jsonl", ".json"):
        recs = jsonl_records(p)
    else:
        with p.open(newline="") as f:
            recs = [(f"{p}:{i}", r) for i, r in enumerate(csv.DictReader(f), 2)]
    if not recs:
        raise ConfigError(str(p), None, "at least one request", show_value=False)
    vals = []
    for w, r in recs:
        for ours, theirs in columns.items():
            if theirs not in r:
                raise ConfigError(f"{w}.{theirs}", None, f"column {theirs!r} (mapped from {ours})", show_value=False)
        g = {k: _num(r, c, w) for k, c in columns.items()}
        for k in ("prompt_tokens", "output_tokens"):     # named here, not in the replay's temp trace
            if not g[k] >= 1 or g[k] != int(g[k]):
                raise ConfigError(f"{w}.{columns[k]}", r.get(columns[k]), f"an integer >= 1 ({k})")
        vals.append((w, g))
    t0 = min(g["arrival_s"] for _, g in vals)
    rows, ttft, tpot, e2e, each_tpot = [], [], [], [], []
    times = {"arrival_s": [], "first_s": [], "last_s": [], "prompt": [], "output": []}
    for w, g in vals:
        a = (g["arrival_s"] - t0) * time_unit
        if durations:
            tf, te = g["ttft_s"] * time_unit, g["e2e_s"] * time_unit
        else:
            tf, te = (g["first_token_s"] - g["arrival_s"]) * time_unit, (g["last_token_s"] - g["arrival_s"]) * time_unit
        if not 0 <= tf <= te:
            raise ConfigError(w, None, "0 <= TTFT <= E2E", show_value=False)
        n_out = int(g["output_tokens"])
        rows.append({"arrival_s": a, "prompt_tokens": int(g["prompt_tokens"]), "output_tokens": n_out,
                     "request_id": w.rsplit(":", 1)[-1]})
        ttft.append(tf * 1e3)
        e2e.append(te * 1e3)
        each_tpot.append((te - tf) * 1e3 / (n_out - 1) if n_out > 1 else None)
        if n_out > 1:
            tpot.append(each_tpot[-1])
        for k, v in (("arrival_s", a), ("first_s", a + tf), ("last_s", a + te), ("prompt", int(g["prompt_tokens"])),
                     ("output", n_out)):
            times[k].append(v)
    scn = {"name": p.stem, "model": model, "hardware": hardware, "engine": dict(engine or {}),
           "workload": {"type": "trace"}}
    return RealRun(p.stem, "generic", str(p), scn, [trace_stage(rows, ttft, tpot, e2e, None)], rows,
                   ["arrivals replayed exactly from the file"],
                   {"token_times": times, "per_request": {"ttft": ttft, "tpot": each_tpot, "e2e": e2e}})


def check_time_unit(time_unit) -> None:
    """--time-unit scales every time of a generic file: 0 made every latency 0 ("MAPE n/a" everywhere)."""
    if isinstance(time_unit, bool) or not isinstance(time_unit, (int, float)) or not (
            math.isfinite(time_unit) and time_unit > 0):
        raise ConfigError("--time-unit", time_unit, "a finite number > 0 (seconds per time unit of the file)")


def load_real(path, **opts) -> RealRun:
    """Read a real run, recognising its format from what the path holds."""
    p = Path(path)
    check_time_unit(opts.get("time_unit", 1.0))
    if p.is_dir():
        if (p / "profile.yaml").is_file():
            return read_inference_perf(p, opts.get("hardware"))
        if (p / "capture.json").is_file():              # dsim observe (dsim.metrics.capture)
            from .capture import read_capture
            return read_capture(p, opts.get("hardware"))
        if (p / "meta.json").is_file():
            return read_llmservingsim(p, opts.get("hardware"))
        raise ConfigError(str(p), None, "an inference-perf folder (profile.yaml), a dsim observe capture "
                          "(capture.json) or a meta.json + requests.jsonl folder",
                          show_value=False)
    if not p.is_file():
        raise ConfigError(str(p), None, "an existing run folder or file", show_value=False)
    if opts.get("columns"):
        return read_generic(p, opts["columns"], opts.get("model"), opts.get("hardware"), opts.get("engine"),
                            opts.get("time_unit", 1.0))
    if p.suffix == ".json":
        return read_vllm_bench(p, opts.get("model"), opts.get("hardware"), opts.get("engine"))
    raise ConfigError(str(p), None, "a vllm bench JSON, or a CSV/JSONL with a column mapping", show_value=False)
