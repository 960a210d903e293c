"""A run's ``kv_events.jsonl`` (vLLM's KV cache events, as its subscriber writes them) read back
into the prefix cache's life, and compared with the same events of dsim's replay of the run.

What the events say, and so what is measured: ``BlockStored`` is a full block entering the prefix
cache (it has a content hash), ``BlockRemoved`` is a cached block taken for other content (an
eviction), ``AllBlocksCleared`` empties the cache.  The blocks *resident* in the cache at a moment
are those stored and not yet removed: blocks in use by a request and free blocks whose content can
still be hit.  vLLM emits nothing when a request frees a block or for a partly filled block, so the
events cannot give the blocks allocated to requests; the resident count is what both sides share.

Per storage medium (GPU; CPU when an offloading connector publishes its tier): blocks stored and
removed, clears, the peak resident count (after every event), its time-weighted mean over the
file's span (each batch's count holds until the next batch's ``ts``), and oddities a consistent
stream has none of (a hash stored while resident, a removal of a hash not resident: a file that
starts mid-run has the latter).  Format: dsim.metrics.kv_events.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..config.errors import ConfigError
from ..metrics.kv_events import CLEARED, MEDIUM_GPU, REMOVED, STORED

FILE = "kv_events.jsonl"
# compared between a real run and its replay: (name, what it is)
COMPARED = (("peak_resident_blocks", "peak blocks resident in the prefix cache"),
            ("mean_resident_blocks", "time-weighted mean blocks resident"),
            ("stores_per_request", "blocks stored per request"),
            ("evictions", "cached blocks removed (evicted)"),
            ("evictions_per_request", "blocks evicted per request"))


@dataclass
class Medium:
    """The cache of one storage medium, replayed event by event."""
    resident: set = field(default_factory=set)
    stored: int = 0              # blocks stored (new hashes)
    removed: int = 0             # blocks removed
    cleared: int = 0             # AllBlocksCleared events
    stored_again: int = 0        # a hash stored while resident (not counted in ``stored``)
    removed_unknown: int = 0     # a removal of a hash that is not resident
    peak: int = 0
    area: float = 0.0            # integral of the resident count over time (block-seconds)

    def stats(self, span: float, n_requests: int | None) -> dict:
        per = (lambda v: v / n_requests) if n_requests else (lambda v: None)
        return {"stored_blocks": self.stored, "removed_blocks": self.removed, "evictions": self.removed,
                "cleared": self.cleared, "peak_resident_blocks": self.peak,
                "mean_resident_blocks": self.area / span if span > 0 else float(len(self.resident)),
                "final_resident_blocks": len(self.resident), "stores_per_request": per(self.stored),
                "evictions_per_request": per(self.removed), "stored_again": self.stored_again,
                "removed_unknown": self.removed_unknown}


class Replay:
    """Feed batches (``add``) in file order; ``stats`` summarises them."""

    def __init__(self):
        self.media: dict = {}
        self.batches = 0
        self.t0 = self.t_last = None
        self.out_of_order = 0        # batches whose ts is before the previous one's (no time credited)
        self.other: dict = {}        # event types not about the prefix cache (transfers, ...): counts
        self.block_size = None

    def _medium(self, m) -> Medium:
        m = MEDIUM_GPU if m is None else str(m).upper()
        got = self.media.get(m)
        if got is None:
            got = self.media[m] = Medium()
        return got

    def add(self, ts: float, events: list, where: str = "batch") -> None:
        if self.t_last is not None:
            dt = ts - self.t_last
            if dt < 0:
                self.out_of_order += 1
                dt = 0.0
            for med in self.media.values():
                med.area += len(med.resident) * dt
        if self.t0 is None:
            self.t0 = ts
        self.t_last = max(ts, self.t_last) if self.t_last is not None else ts
        self.batches += 1
        for j, ev in enumerate(events):
            kind, hashes, medium, bs = _event(ev, f"{where}: events[{j}]")
            if kind == STORED:
                if bs is not None:
                    self.block_size = bs
                med = self._medium(medium)
                for h in hashes:
                    if h in med.resident:
                        med.stored_again += 1
                    else:
                        med.resident.add(h)
                        med.stored += 1
                        if len(med.resident) > med.peak:
                            med.peak = len(med.resident)
            elif kind == REMOVED:
                med = self._medium(medium)
                for h in hashes:
                    if h in med.resident:
                        med.resident.discard(h)
                        med.removed += 1
                    else:
                        med.removed_unknown += 1
            elif kind == CLEARED:
                for med in self.media.values() or [self._medium(None)]:
                    med.resident.clear()
                    med.cleared += 1
            else:
                self.other[kind] = self.other.get(kind, 0) + 1

    def stats(self, n_requests: int | None = None) -> dict:
        span = (self.t_last - self.t0) if self.batches else 0.0
        return {"batches": self.batches, "span_s": span, "block_size": self.block_size,
                "out_of_order_batches": self.out_of_order, "other_events": dict(sorted(self.other.items())),
                "requests": n_requests,
                "media": {m: med.stats(span, n_requests) for m, med in sorted(self.media.items())}}


def _hashes(v, where: str) -> list:
    if not isinstance(v, list):
        raise ConfigError(f"{where}.block_hashes", v, "a list of block hashes")
    return [tuple(h) if isinstance(h, list) else h for h in v]


def _event(ev, where: str):
    """(kind, hashes, medium, block_size) of one event, array_like (tag first) or an object ("type")."""
    if isinstance(ev, list) and ev and isinstance(ev[0], str):
        kind = ev[0]
        if kind == STORED:
            if len(ev) < 5:
                raise ConfigError(where, None, "BlockStored as [tag, block_hashes, parent_block_hash, token_ids, "
                                  "block_size, lora_id, medium, ...]", show_value=False)
            return kind, _hashes(ev[1], where), ev[6] if len(ev) > 6 else None, ev[4]
        if kind == REMOVED:
            if len(ev) < 2:
                raise ConfigError(where, None, "BlockRemoved as [tag, block_hashes, medium]", show_value=False)
            return kind, _hashes(ev[1], where), ev[2] if len(ev) > 2 else None, None
        return kind, (), None, None
    if isinstance(ev, dict) and isinstance(ev.get("type"), str):
        kind = ev["type"]
        if kind in (STORED, REMOVED):
            return kind, _hashes(ev.get("block_hashes"), where), ev.get("medium"), ev.get("block_size")
        return kind, (), None, None
    raise ConfigError(where, str(ev)[:60], "a KV event: [\"BlockStored\", ...] or {\"type\": \"BlockStored\", ...}")


def _batch(rec, where: str):
    """(ts, events) of one line: [ts, events, ...] (array_like) or {"ts", "events", ...}."""
    if isinstance(rec, list) and len(rec) >= 2:
        ts, events = rec[0], rec[1]
    elif isinstance(rec, dict) and "ts" in rec:
        ts, events = rec["ts"], rec.get("events")
    else:
        raise ConfigError(where, str(rec)[:60],
                          "a KV event batch: [ts, events, ...] or {\"ts\": ..., \"events\": [...]}")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts):
        raise ConfigError(f"{where}: ts", ts, "a finite number (seconds)")
    if not isinstance(events, list):
        raise ConfigError(f"{where}: events", events, "a list of events")
    return float(ts), events


def read_kv_events(path, n_requests: int | None = None) -> dict:
    """Stats (``Replay.stats``) of a kv_events.jsonl file, streamed line by line (real files run to
    hundreds of MB)."""
    from ..config.files import note_read
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(p), None, "a kv_events.jsonl file", show_value=False)
    note_read(p)
    rp = Replay()
    try:
        with open(p, encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                where = f"{p}:{i}"
                try:
                    rec = json.loads(line)
                except (RecursionError, ValueError) as e:
                    if not isinstance(e, json.JSONDecodeError):        # nesting past Python's stack
                        raise ConfigError(where, None, "a JSON event batch nested less deeply",
                                          show_value=False) from None
                    raise ConfigError(where, line.strip()[:60], f"a JSON event batch ({e.msg})") from None
                rp.add(*_batch(rec, where), where)
    except UnicodeDecodeError:
        raise ConfigError(str(p), None, "UTF-8 text (JSON lines)", show_value=False) from None
    if not rp.batches:
        raise ConfigError(str(p), None, "at least one event batch (the file is empty)", show_value=False)
    return rp.stats(n_requests)


def replay_log(kvs, n_requests: int | None = None) -> dict:
    """The same stats of dsim pools' event logs (dsim.metrics.kv_events.RecordedKVCache), read
    through the batches the file would hold; several replicas' logs merge in time order as one
    cache whose hashes are told apart by replica."""
    from ..metrics.kv_events import batches
    kvs = list(kvs)
    if not kvs:
        raise ValueError("no KV event log (run with output.kv_events)")
    if len(kvs) == 1:
        log = kvs[0].log
    else:
        tagged = [(t, k, (i, h), None if par is None else (i, par)) for i, kv in enumerate(kvs)
                  for t, k, h, par in kv.log]
        log = sorted(tagged, key=lambda e: e[0])          # stable: each replica's order is kept
    rp = Replay()
    for b in batches(log, kvs[0].block_size):
        rp.add(b[0], b[1])
    return rp.stats(n_requests)


def compare_kv(real: dict, sim: dict, medium: str = MEDIUM_GPU) -> dict:
    """Real vs simulated prefix-cache figures of one medium: {name: {real, sim, error}}, error =
    sim / real - 1 (None when real is 0 or a side lacks the figure)."""
    r = real["media"].get(medium, {})
    s = sim["media"].get(medium, {})
    out = {}
    for name, what in COMPARED:
        a, b = r.get(name), s.get(name, 0 if name in ("evictions",) else None)
        out[name] = {"what": what, "real": a, "sim": b,
                     "error": (b / a - 1) if a and b is not None else None}
    return out


def events_file(run) -> Path | None:
    """The run folder's kv_events.jsonl, if it has one (a file run: one beside it)."""
    p = Path(run.path)
    f = (p if p.is_dir() else p.parent) / FILE
    return f if f.is_file() else None


def real_requests(run) -> int | None:
    """How many requests the real run sent: its rows, or its stages' successes and failures."""
    if run.trace_rows is not None:
        return len(run.trace_rows)
    n = [st.real.get("e2e", {}).get("count") for st in run.stages]
    return sum(n) + sum(st.failures for st in run.stages) if n and None not in n else None


def cosim_kv(run, res, path: Path) -> dict:
    """The ``kv_cache`` section of a cosim report: the real file's prefix-cache figures beside the
    same figures of the replay's own events (its pools recorded them: output.kv_events)."""
    real = read_kv_events(path, real_requests(run))
    kvs = [kv for _, kv in res.kv_logs]
    sim = replay_log(kvs, res.summary["requests"]["submitted"])
    return {"file": str(path), "medium": MEDIUM_GPU, "sim_capacity_blocks": sum(kv.total for kv in kvs),
            "real": real, "sim": sim, "compared": compare_kv(real, sim),
            "note": "resident = stored and not yet removed: blocks in use plus free blocks whose content can "
                    "still be hit (vLLM's events do not tell allocated blocks); dsim hashes only blocks that "
                    "can be shared, so with unique prompts its stores fall short of vLLM's"}


def kv_lines(name: str, kv: dict) -> list:
    """The cosim printout of a kv_cache section."""
    def f(v):
        return "n/a" if v is None else (f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}")
    cells = []
    for key, c in kv["compared"].items():
        err = "" if c["error"] is None else f" ({c['error']:+.0%})"
        cells.append(f"{key} real {f(c['real'])} sim {f(c['sim'])}{err}")
    return [f"{name} KV cache ({kv['medium']}, from {FILE}; sim capacity {kv['sim_capacity_blocks']:,} blocks): "
            + "; ".join(cells)]
