"""Trace readers, told apart by their columns:

- dsim JSONL/CSV: arrival_s, prompt_tokens, output_tokens[, prefix_group, request_id, priority,
  slo_class, ttft_slo_ms, tpot_slo_ms, tenant, session, segments, draft_id] (priority .. tpot_slo_ms:
  scheduling priority, a class of ``slo.classes``, and this request's own SLO targets; tenant and
  session: the fairness report's tenant (a draft group's cohort) and the conversation id; segments
  (JSONL only): the prompt's content as [[id, tokens], ...], what ``dsim trace generate`` writes;
  draft_id: the draft device (``<group name>-<i>``) that opens the request; empty = none;
  temperature, top_p, domain: the sampling parameters and domain label speculative acceptance is
  read at, docs/specdec.md);
- Azure LLM inference trace 2023 CSV: TIMESTAMP, ContextTokens, GeneratedTokens;
- BurstGPT CSV: Timestamp (s), Model, Request tokens, Response tokens, ... (rows with 0 response
  tokens are failed requests in that trace and are dropped);
- Mooncake JSONL: timestamp (ms), input_length, output_length, hash_ids (one id per block of the
  prompt, equal ids = equal content: they become prefix-cache identity).

Every reader returns rows (arrival_s, prompt, output, prefix_group or -1, request_id, hash_ids or
None, attrs or None) sorted by arrival, attrs being the Request attributes the optional columns
set (priority, slo_class, ttft_slo_ms, tpot_slo_ms, tenant, session, segments, draft_id, sampling), the first arrival
at its own time (Azure: shifted to 0).
"""
from __future__ import annotations

import csv
import io
import json
from datetime import datetime
from pathlib import Path

from ..config.errors import ConfigError
from ..config.files import note_read, read_text
from ..config.limits import MAX_GROUPS, MAX_TOKENS

REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL = ("prefix_group", "request_id", "priority", "slo_class", "ttft_slo_ms", "tpot_slo_ms", "tenant", "session",
            "segments", "draft_id", "temperature", "top_p", "domain")
_SEGMENT_ID = 1 << 62          # segment ids are opaque integers of either sign (negative: a request's answer)


def _int(v, where, name, lo=1, hi=MAX_TOKENS):
    try:
        f = float(v)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.{name}", v, "a number") from None
    if not f.is_integer() or f < lo:
        raise ConfigError(f"{where}.{name}", v, f"an integer >= {lo}")
    if f > hi:                          # 1e30 tokens overflowed the ledger's int64 columns (internal error)
        raise ConfigError(f"{where}.{name}", v, f"an integer <= {hi:.0e}")
    return int(f)


def _row(rec: dict, where: str):
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise ConfigError(f"{where}.{missing[0]}", None, "this column to be present", show_value=False)
    try:
        t = float(rec["arrival_s"])
    except (TypeError, ValueError):
        raise ConfigError(f"{where}.arrival_s", rec["arrival_s"], "a number of seconds") from None
    if not 0 <= t < float("inf"):
        raise ConfigError(f"{where}.arrival_s", rec["arrival_s"], "a finite time >= 0")
    g = rec.get("prefix_group")
    g = -1 if g in (None, "") else _int(g, where, "prefix_group", lo=0, hi=MAX_GROUPS)
    return (t, _int(rec["prompt_tokens"], where, "prompt_tokens"),
            _int(rec["output_tokens"], where, "output_tokens"), g, str(rec.get("request_id") or ""), None,
            _attrs(rec, where))


def _attrs(rec: dict, where: str):
    """The Request attributes the optional columns set, or None when there are none."""
    out = dict(zip(("priority", "slo_class", "ttft_slo_ms", "tpot_slo_ms"), _service(rec, where) or ()))
    tenant = rec.get("tenant")
    if tenant not in (None, ""):
        out["tenant"] = str(tenant)
    session = rec.get("session")
    if session not in (None, ""):
        out["session"] = _int(session, where, "session", lo=0, hi=_SEGMENT_ID)
    draft = rec.get("draft_id")
    if draft not in (None, ""):
        out["draft_id"] = str(draft)
    segs = rec.get("segments")
    if segs not in (None, ""):
        out["segments"] = _segments(segs, int(float(rec["prompt_tokens"])), where)
    samp = sampling(*(rec.get(k) for k in ("temperature", "top_p", "domain")), where)
    if samp is not None:
        out["sampling"] = samp
    return out or None


def sampling(temperature, top_p, domain, where: str):
    """A request's (temperature, top_p, domain) for speculative acceptance (None when all are unset;
    an unset part is None, or "" for the domain): a trace row's columns or a tenant's keys."""
    if all(v in (None, "") for v in (temperature, top_p, domain)):
        return None
    vals = []
    for name, v, lo, hi, lo_open in (("temperature", temperature, 0.0, 100.0, False), ("top_p", top_p, 0.0, 1.0, True)):
        if v in (None, ""):
            vals.append(None)
            continue
        try:
            x = float(v) if not isinstance(v, bool) else None
        except (TypeError, ValueError):
            x = None
        if x is None or not (lo < x <= hi if lo_open else lo <= x <= hi):
            raise ConfigError(f"{where}.{name}", v, f"a number in {'(' if lo_open else '['}{lo:g}, {hi:g}]")
        vals.append(x)
    return (vals[0], vals[1], "" if domain in (None, "") else str(domain))


def _segments(segs, prompt: int, where: str) -> tuple:
    """A prompt's content as ((id, tokens), ...): requests share KV as far as their lists agree."""
    ok = isinstance(segs, list) and segs and all(
        isinstance(s, list) and len(s) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in s)
        and abs(s[0]) < _SEGMENT_ID and 1 <= s[1] <= MAX_TOKENS for s in segs)
    if not ok:
        raise ConfigError(f"{where}.segments", segs, "a list of [id, tokens] pairs of integers (tokens >= 1)")
    if sum(n for _, n in segs) != prompt:
        raise ConfigError(f"{where}.segments", segs, f"segments whose tokens add up to prompt_tokens ({prompt})")
    return tuple((int(i), int(n)) for i, n in segs)


def _service(rec: dict, where: str):
    """(priority, slo_class, ttft_slo_ms, tpot_slo_ms) from the optional columns, or None."""
    vals = [rec.get(k) for k in OPTIONAL[2:6]]
    if all(v in (None, "") for v in vals):
        return None
    prio, cls, ttft, tpot = vals
    prio = 0 if prio in (None, "") else _int(prio, where, "priority", lo=-1_000_000)
    if abs(prio) > 1_000_000:
        raise ConfigError(f"{where}.priority", prio, "an integer in [-1e6, 1e6] (lower is served first)")
    cls = "" if cls is None else str(cls)
    slo = []
    for name, v in (("ttft_slo_ms", ttft), ("tpot_slo_ms", tpot)):
        if v in (None, ""):
            slo.append(None)
            continue
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.{name}", v, "a number of milliseconds") from None
        if not 0 < x < float("inf"):
            raise ConfigError(f"{where}.{name}", v, "a time > 0 ms")
        slo.append(x)
    return (prio, cls, slo[0], slo[1])


def _mooncake(rec: dict, where: str):
    t = rec["timestamp"]
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not t >= 0:
        raise ConfigError(f"{where}.timestamp", t, "a time in milliseconds >= 0")
    ids = rec.get("hash_ids") or []
    if not isinstance(ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0 for h in ids):
        raise ConfigError(f"{where}.hash_ids", ids, "a list of integer block ids >= 0")
    return (t / 1e3, _int(rec.get("input_length"), where, "input_length"),
            _int(rec.get("output_length"), where, "output_length"), -1, "", tuple(ids), None)


_PARSED: dict = {}          # (resolved path, size, mtime_ns) -> rows: the last few traces this process read
_PARSED_MAX = 4


def read_trace(path: Path, shown: str) -> list:
    """Rows (arrival_s, prompt, output, prefix_group or -1, request_id) sorted by arrival (stable);
    Azure timestamps are shifted so the first arrival is at 0.

    A process keeps the last few parsed traces, keyed by the file's size and modification time: a
    plan or sweep runs hundreds of points of one trace in each worker, and parsing the Azure trace's
    58,000 timestamps was most of a 70B probe's set-up (0.38 of 0.65 s).  The rows are tuples and
    every caller gets its own list, so a cached trace is the same input as a re-read one."""
    if not path.is_file():
        raise ConfigError(shown, str(path), "an existing trace file")
    st = path.stat()
    note_read(path)
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _PARSED:
        rows = _parse_trace(path, shown)
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.pop(next(iter(_PARSED)))
        _PARSED[key] = rows
    return list(_PARSED[key])


def _parse_trace(path: Path, shown: str) -> list:
    rows = []
    if path.suffix in (".jsonl", ".json"):
        with io.StringIO(read_text(path, shown)) as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    rec = json.loads(line)
                except (RecursionError, ValueError) as e:
                    if not isinstance(e, json.JSONDecodeError):
                        raise ConfigError(f"{path}:{i}", None, "a JSON object nested less deeply, with ordinary numbers",
                                          show_value=False) from None
                    raise ConfigError(f"{path}:{i}", line.strip()[:60], f"a JSON object ({e.msg})") from None
                if not isinstance(rec, dict):
                    raise ConfigError(f"{path}:{i}", rec, "a JSON object")
                rows.append((_mooncake if "timestamp" in rec and "input_length" in rec else _row)(rec, f"{path}:{i}"))
    else:
        with io.StringIO(read_text(path, shown), newline="") as f:
            reader = csv.DictReader(f)
            cols = reader.fieldnames or []
            if "TIMESTAMP" in cols:
                return _azure(reader, path)
            if "Request tokens" in cols and "Response tokens" in cols:
                return _burstgpt(reader, path)
            for i, rec in enumerate(reader, 2):
                rows.append(_row(rec, f"{path}:{i}"))
    if not rows:
        raise ConfigError(shown, str(path), "a trace with at least one request")
    rows.sort(key=lambda r: r[0])
    return rows


def _azure(reader, path: Path) -> list:
    rows = []
    t0 = None
    for i, rec in enumerate(reader, 2):
        where = f"{path}:{i}"
        ts = rec.get("TIMESTAMP", "")
        try:
            # 7 fractional digits: keep microseconds
            head, _, frac = ts.partition(".")
            dt = datetime.strptime(head, "%Y-%m-%d %H:%M:%S")
            t = dt.timestamp() + (float("0." + frac) if frac else 0.0)
        except ValueError:
            raise ConfigError(f"{where}.TIMESTAMP", ts, "YYYY-MM-DD HH:MM:SS.fffffff") from None
        if t0 is None:
            t0 = t
        rows.append((t - t0, _int(rec.get("ContextTokens"), where, "ContextTokens"),
                     _int(rec.get("GeneratedTokens"), where, "GeneratedTokens"), -1, "", None, None))
    if not rows:
        raise ConfigError(str(path), None, "an Azure trace with at least one row", show_value=False)
    rows.sort(key=lambda r: r[0])
    return rows


def _burstgpt(reader, path: Path) -> list:
    rows = []
    for i, rec in enumerate(reader, 2):
        where = f"{path}:{i}"
        try:
            t = float(rec.get("Timestamp"))
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.Timestamp", rec.get("Timestamp"), "a number of seconds") from None
        if not t >= 0:
            raise ConfigError(f"{where}.Timestamp", rec.get("Timestamp"), "a time >= 0")
        prompt = _int(rec.get("Request tokens"), where, "Request tokens", lo=0)
        out = _int(rec.get("Response tokens"), where, "Response tokens", lo=0)
        if prompt == 0 or out == 0:          # failed or empty requests: nothing was served
            continue
        rows.append((t, prompt, out, -1, "", None, None))
    if not rows:
        raise ConfigError(str(path), None, "a BurstGPT trace with at least one served request", show_value=False)
    rows.sort(key=lambda r: r[0])
    return rows
