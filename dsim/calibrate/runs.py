"""What a real run is to co-simulation (``RealRun``: the scenario that replays it and its stages'
measurements) and the helpers every reader of a run format shares (dsim.calibrate.realrun reads
vLLM's and inference-perf's formats, dsim.calibrate.capture reads ``dsim observe``'s)."""
from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from ..config.errors import ConfigError
from ..config.files import check_expansion, read_text, read_yaml
from ..metrics.exact import percentiles

QUANTS = ("mean", "p50", "p90", "p95", "p99")
METRICS = ("ttft", "tpot", "itl", "e2e")
COALESCED = 0.25      # an ITL median below this share of its mean: chunks were read together


@dataclass
class Stage:
    """One slice of a run compared on its own: a constant-rate load stage, or the whole run."""
    name: str
    t0: float                       # arrival window [t0, t1) in the replayed workload's seconds
    t1: float
    real: dict                      # metric -> {mean, p50, p90, p95, p99 (ms), count}
    samples: dict = field(default_factory=dict)   # metric -> per-request values (ms) when known
    throughput: dict = field(default_factory=dict)  # requests_per_s, output_tokens_per_s (real)
    rate: float | None = None       # offered req/s
    failures: int = 0
    overloaded: bool = False
    itl_not_compared: dict | None = None    # the source's ITL (p50, mean, per-token time) when it times messages
    held_out: bool = False          # compared, but left out of every fitting loss (dsim cosim --holdout)


@dataclass
class RealRun:
    name: str
    source: str                     # inference-perf | llmservingsim | vllm-bench | generic
    path: str
    scenario: dict                  # replays the run (workload may point at ``trace_rows``)
    stages: list
    trace_rows: list | None = None  # exact arrivals: [{arrival_s, prompt_tokens, output_tokens, request_id}]
    notes: list = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    @property
    def overloaded(self) -> bool:
        return any(s.overloaded for s in self.stages)

    @property
    def model(self) -> str:
        return str(self.scenario.get("model"))

    @property
    def hardware(self) -> str:
        return str(self.scenario.get("hardware"))

    def shortened(self, seconds: float) -> "RealRun":
        """A copy whose regenerated load stages last at most ``seconds`` each (same rates, same real
        aggregates): constant-rate stages reach steady state quickly, and fits simulate it many times."""
        wl = self.scenario["workload"]
        if wl.get("type") != "staged":
            return self
        run = copy.deepcopy(self)
        t0 = 0.0
        by_t0 = {s.t0: s for s in run.stages}
        old_t0 = 0.0
        for st in run.scenario["workload"]["stages"]:
            d = min(st["duration_s"], seconds)
            s = by_t0.get(old_t0)
            if s is not None:
                s.t0, s.t1 = t0, t0 + d
            old_t0 += st["duration_s"]
            st["duration_s"] = d
            t0 += d
        return run


def quantiles(values) -> dict:
    """The comparison quantiles of a sample (ms); {} when empty."""
    a = np.asarray(values, dtype=float)
    if a.size == 0:
        return {"count": 0}
    out = {"count": int(a.size), "mean": float(a.mean())}
    for q, v in zip(QUANTS[1:], percentiles(a, [50, 90, 95, 99])):
        out[q] = float(v)
    return out


def jsonl_records(p: Path, what: str = "request") -> list:
    """[(``file:line``, object)] of a JSONL file, read bounded (bad bytes and a non-object line name
    the file and line)."""
    out = []
    for i, line in enumerate(read_text(p).split("\n"), 1):
        if line.strip():
            where = f"{p}:{i}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise ConfigError(where, line.strip()[:60], f"a JSON object ({e.msg})") from None
            if not isinstance(rec, dict):
                raise ConfigError(where, type(rec).__name__, f"a JSON object, one {what} a line")
            out.append((where, rec))
    return out


def trace_stage(rows: list, ttft, tpot, e2e, itl, name="all") -> Stage:
    t_last = max(r["arrival_s"] for r in rows)
    samples = {"ttft": ttft, "tpot": tpot, "e2e": e2e}
    if itl is not None:
        samples["itl"] = itl
    return Stage(name, 0.0, math.inf, {m: quantiles(v) for m, v in samples.items()}, samples,
                 rate=len(rows) / t_last if t_last > 0 else None)


def set_throughput(st: Stage, rows, start, end) -> None:
    span = max(end) - min(start)
    if span > 0:
        st.throughput = {"requests_per_s": len(rows) / span,
                         "output_tokens_per_s": sum(r["output_tokens"] for r in rows) / span}


def yaml_mapping(f: Path) -> dict:
    """A run folder's YAML file as a mapping, read like every user file (a regular file, bounded,
    UTF-8, aliases bounded): a FIFO here used to block, /dev/zero to exhaust memory, a folder or a
    list to be an internal error, undecodable bytes to be an error naming no file."""
    text = read_text(f)
    try:
        doc = read_yaml(text)
    except yaml.YAMLError as e:
        raise ConfigError(str(f), None, f"valid YAML ({e})", show_value=False) from None
    check_expansion(doc, str(f))
    doc = {} if doc is None else doc
    if not isinstance(doc, dict):
        raise ConfigError(str(f), type(doc).__name__, "a mapping")
    return doc
