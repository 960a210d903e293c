"""Reader of the capture folder ``dsim observe`` writes (format in ``dsim.metrics.capture``).

The replay is exact: each request that succeeded arrives at its drawn time with the prompt
structure it was sent with (segments, prefix group, session), its prompt length as the server
counted it and its output length as the server produced it; the capture's concurrency cap is the
replay's ``max_concurrency``, so a request that waited for a free slot waits in the simulation too,
and every latency is timed from when the request was sent, as the client measured it.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..config.errors import ConfigError
from ..config.files import parse_json, read_text
from ..config.limits import MAX_TOKENS
from ..metrics import capture as fmt
from .runs import RealRun, jsonl_records, set_throughput, trace_stage, yaml_mapping

_ANSWER = 1 << 60         # segment id of the filler sent for request i's answer: (1 << 60) + i
_EXTRA = 1 << 61          # tokens the server counted beyond the drawn prompt (a chat template): own to request i
DEPLOYMENT = ("model", "hardware", "engine", "cluster")


def _lines(p: Path) -> list:
    if not p.is_file():
        raise ConfigError(str(p), None, "an existing file (a dsim observe capture has it)", show_value=False)
    return jsonl_records(p, "record")


def _segments(w: dict, prompt: int, index: int) -> list | None:
    """The drawn segments as the replay's trace carries them: an earlier answer's filler becomes content
    of its own (the server never saw the generated tokens again, only the filler), and a prompt the
    server counted longer or shorter than drawn gains a tail of its own or loses its last tokens."""
    segs = w.get("segments")
    if not segs:
        return None
    out = [[_ANSWER + (-s - 1) if s < 0 else s, n] for s, n in segs]
    diff = prompt - sum(n for _, n in out)
    if diff > 0:
        out.append([_EXTRA + index, diff])
    while diff < 0:
        cut = min(-diff, out[-1][1])
        out[-1][1] -= cut
        diff += cut
        if out[-1][1] == 0:
            out.pop()
    return out


def _drawn(w: dict, where: str) -> dict:
    """A line of workload.jsonl, checked before the replay reads it: a finite arrival time >= 0,
    token counts in [1, MAX_TOKENS], segments as [[id, tokens >= 0], ...] (an edited or truncated file
    is a ConfigError naming its line, not an internal error)."""
    t = w.get("arrival_s")
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not (t >= 0 and math.isfinite(t)):
        raise ConfigError(f"{where}.arrival_s", t, "a finite time >= 0 (seconds)")
    for key in ("prompt_tokens", "output_tokens"):
        v = w.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
            raise ConfigError(f"{where}.{key}", v, f"an integer in [1, {MAX_TOKENS:.0e}]")
    segs = w.get("segments")
    if segs is not None and not (isinstance(segs, list) and all(
            isinstance(g, list) and len(g) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in g)
            and g[1] >= 0 for g in segs)):
        raise ConfigError(f"{where}.segments", segs, "a list of [segment id, tokens >= 0] pairs")
    return w


def _int_or(rec: dict, key: str, default: int, where: str) -> int:
    v = rec.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_TOKENS:
        raise ConfigError(f"{where}.{key}", v, f"null or an integer in [1, {MAX_TOKENS:.0e}]")
    return v


def _times(rec: dict, where: str) -> None:
    """A succeeded request's clock readings: numbers, in order."""
    keys = ("sent_s", "first_token_s", "last_token_s")
    vals = [rec.get(k) for k in keys]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals) or not (
            vals[0] <= vals[1] <= vals[2]):
        raise ConfigError(where, None, "sent_s <= first_token_s <= last_token_s (seconds)", show_value=False)
    chunks = rec.get("chunk_s")
    if not isinstance(chunks, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in chunks):
        raise ConfigError(f"{where}.chunk_s", chunks, "a list of times (seconds)")


def read_capture(folder: Path, hardware: str | None = None) -> RealRun:
    folder = Path(folder)
    cap_p = folder / fmt.CAPTURE
    cap = parse_json(read_text(cap_p), str(cap_p))
    if not isinstance(cap, dict) or cap.get("format") != fmt.FORMAT:
        raise ConfigError(f"{cap_p}.format", (cap or {}).get("format") if isinstance(cap, dict) else None,
                          f"{fmt.FORMAT!r} (a dsim observe capture)")
    if cap.get("version") != fmt.VERSION:
        raise ConfigError(f"{cap_p}.version", cap.get("version"), f"{fmt.VERSION} (this dsim reads that version)")
    scn_src = yaml_mapping(folder / fmt.SCENARIO)
    drawn = [_drawn(w, where) for where, w in _lines(folder / fmt.WORKLOAD)]
    sent = _lines(folder / fmt.REQUESTS)
    ok = []
    for where, r in sent:
        i = r.get("index")
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(drawn):
            raise ConfigError(f"{where}.index", i, f"a line number of {fmt.WORKLOAD} (0 .. {len(drawn) - 1})")
        if fmt.succeeded(r):
            _times(r, where)
            ok.append((where, r))
    if not ok:
        raise ConfigError(str(folder / fmt.REQUESTS), None, "at least one request that succeeded", show_value=False)
    ok.sort(key=lambda x: (drawn[x[1]["index"]]["arrival_s"], x[1]["index"]))
    rows, ttft, tpot, e2e, itl, each_tpot = [], [], [], [], [], []
    times = {"arrival_s": [], "first_s": [], "last_s": [], "prompt": [], "output": []}
    for where, r in ok:
        i = r["index"]
        w = drawn[i]
        prompt = _int_or(r, "prompt_tokens", int(w["prompt_tokens"]), where)
        n_out = fmt.output_tokens(r)
        row = {"arrival_s": float(w["arrival_s"]), "prompt_tokens": prompt, "output_tokens": n_out,
               "request_id": str(r.get("request_id") or i)}
        segs = _segments(w, prompt, i)
        if segs is not None:
            row["segments"] = segs
        for k in ("prefix_group", "session", "tenant"):
            if w.get(k) is not None:
                row[k] = w[k]
        rows.append(row)
        lat = fmt.client_latencies(r)
        ttft.append(lat["ttft"])
        e2e.append(lat["e2e"])
        each_tpot.append(lat["tpot"])
        if lat["tpot"] is not None:
            tpot.append(lat["tpot"])
        itl += lat["itl"]
        for k, v in (("arrival_s", r["sent_s"]), ("first_s", r["first_token_s"]), ("last_s", r["last_token_s"]),
                     ("prompt", prompt), ("output", n_out)):
            times[k].append(v)
    st = trace_stage(rows, ttft, tpot, e2e, itl)
    n = cap.get("requests") or {}
    st.failures = sum(1 for _, r in sent if not fmt.succeeded(r) and not r.get("cancelled"))
    st.overloaded = st.failures > 0.01 * len(sent)
    set_throughput(st, rows, times["arrival_s"], times["last_s"])
    scn = {k: scn_src[k] for k in DEPLOYMENT if scn_src.get(k) is not None}
    scn["name"] = folder.name
    if hardware:
        scn["hardware"] = hardware
    conc = cap.get("max_concurrency")
    scn["workload"] = {"type": "trace", **({"max_concurrency": conc} if conc else {})}
    notes = [f"dsim observe capture of {cap.get('endpoint')} ({cap.get('model')}, {cap.get('api')} API, "
             f"{cap.get('client')}), ended: {cap.get('ended')}; scenario {cap.get('scenario')} seed {cap.get('seed')}",
             f"arrivals: the drawn times, replayed exactly ({len(rows)} requests that succeeded"
             + (f"; {st.failures} failed and {n.get('cancelled', 0)} cancelled are not replayed" if st.failures or
                n.get("cancelled") else "") + ")"
             + (f"; at most {conc} in flight, each timed from when it was sent" if conc else ""),
             "TTFT, TPOT, ITL and E2E measured at the client (send to content chunk), streaming and HTTP included"]
    late = cap.get("late") or {}
    if late.get("count"):
        notes.append(f"{late['count']} requests were sent more than {late.get('threshold_ms')} ms after their drawn "
                     f"time (max {late.get('max_ms', 0):.1f} ms): the client could not keep up, or a slot was busy")
    if cap.get("prompt") == "text":
        notes.append("prompts sent as text: the server's prompt token counts (chat template included) are replayed")
    if any(s < 0 for w in drawn for s, _ in (w.get("segments") or ())):
        notes.append("multi-turn history: earlier answers were sent as filler, not as the generated tokens, so the "
                     "replay does not let a follow-up hit its previous answer's KV")
    return RealRun(folder.name, "dsim-observe", str(folder), scn, [st], rows, notes,
                   {"token_times": times, "clock": "client", "capture": cap,
                    "per_request": {"ttft": ttft, "tpot": each_tpot, "e2e": e2e}})
