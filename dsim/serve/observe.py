"""``dsim observe URL --scenario S``: drive a live OpenAI-compatible server with a dsim workload and
capture what it did, in the folder ``dsim cosim`` and ``dsim calibrate`` read (``dsim.metrics.capture``).

Why: dsim's readers take runs someone else captured; a user with a server of their own needs the
same load a dsim run of S would offer, timed per chunk at the client, with the workload kept so the
replay is exact.  The workload is drawn as ``dsim run`` draws it (same builders, same seed); each
request is sent at its drawn arrival time (open loop), at most ``max_concurrency`` at once (then a
request waits for a free slot and its clock starts when it is sent, as in ``vllm bench serve
--max-concurrency``), streamed with usage, and every content chunk's arrival is recorded.

HTTP client: aiohttp.  vLLM's own ``vllm bench serve`` and inference-perf use it, so client-side
overheads are those of the tools whose numbers dsim is compared with; it streams a response line by
line (SSE) without extra threads and stays fast with thousands of open streams, where httpx's async
pool is known to lag (encode/httpx#3215).  Imported here only, so ``import dsim`` does not pay.

Stopping: at the end of ``duration_s`` no request is sent any more and the requests in flight are
waited for up to ``grace_s``, then cancelled; Ctrl-C (or SIGTERM) stops sending and cancels the
requests in flight at once.  Cancelled requests are kept, marked ``cancelled``, and not replayed.
"""
from __future__ import annotations

import asyncio
import json
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from ..config.errors import ConfigError
from . import prompts

LATE_S = 0.010                # a request sent this much after its drawn time is counted as late
ERROR_TEXT = 2000             # characters of an error body kept


@dataclass
class Options:
    url: str
    api: str = "completions"              # completions | chat
    model: str | None = None              # the server's model name (default: the first of GET /v1/models)
    max_concurrency: int | None = None
    duration_s: float | None = None
    grace_s: float = 30.0
    timeout_s: float = 600.0              # longest silence within one response before it counts as failed
    vllm_extras: bool = True              # ignore_eos, min_tokens, continuous usage stats (vLLM's extensions)
    text_prompts: bool = False            # completions: send text instead of token ids
    progress: bool = True


@dataclass
class Outcome:
    records: list                          # one dict per request sent (dsim.metrics.capture)
    ended: str                             # completed | duration | interrupted
    model: str
    endpoint: str
    client: str
    started_utc: str
    late: dict = field(default_factory=dict)


def endpoint(url: str, api: str) -> tuple[str, str]:
    """(the completions endpoint, the server's base URL) from what the user typed: a base URL
    (``http://host:8000`` or ``.../v1``) or the endpoint itself."""
    u = url.rstrip("/")
    if not (u.startswith("http://") or u.startswith("https://")):
        raise ConfigError("URL", url, "an http:// or https:// URL of an OpenAI-compatible server")
    if u.endswith("/completions"):
        chat = u.endswith("/chat/completions")
        if chat != (api == "chat"):        # the body follows --api: a chat body to /completions fails every request
            raise ConfigError("--api", api, f"{'chat' if chat else 'completions'} (the URL names the "
                              f"{'chat ' if chat else ''}completions endpoint), or a base URL")
        base = u[:-len("/chat/completions")] if chat else u[:-len("/completions")]
        return u, base[:-3] if base.endswith("/v1") else base
    base = u[:-3] if u.endswith("/v1") else u
    return base + ("/v1/chat/completions" if api == "chat" else "/v1/completions"), base


def request_body(rec: dict, index: int, opts: Options, model: str) -> bytes:
    """The JSON body of one drawn request (``rec``: its workload.jsonl record)."""
    segs = prompts.segments_of(rec, index)
    n_out = int(rec["output_tokens"])
    body: dict = {"model": model, "max_tokens": n_out, "stream": True, "stream_options": {"include_usage": True}}
    if opts.vllm_extras:            # the drawn output length exactly: no early EOS
        body.update(ignore_eos=True, min_tokens=n_out)
        body["stream_options"]["continuous_usage_stats"] = True
    if opts.api == "chat":
        body["messages"] = [{"role": "user", "content": prompts.text(segs)}]
    else:
        body["prompt"] = prompts.text(segs) if opts.text_prompts else prompts.token_ids(segs)
    return json.dumps(body, separators=(",", ":")).encode()


class _Stream:
    """Parses one SSE response as its lines arrive; fills the request's record."""

    def __init__(self, rec: dict, chat: bool):
        self.rec, self.chat = rec, chat
        self.seen = 0                      # completion tokens counted so far
        self.done = False                  # data: [DONE] came

    def line(self, raw: bytes, t: float) -> bool:
        """One line read at time t; False at ``data: [DONE]``."""
        s = raw.strip()
        if not s.startswith(b"data:"):
            return True
        payload = s[5:].strip()
        if payload == b"[DONE]":
            self.done = True
            return False
        try:
            obj = json.loads(payload)
        except ValueError:
            self.rec["error"] = f"unparsable stream line: {payload[:200].decode(errors='replace')}"
            return False
        if not isinstance(obj, dict):
            return True
        if obj.get("error"):
            self.rec["error"] = json.dumps(obj["error"])[:ERROR_TEXT]
            return False
        if isinstance(obj.get("dsim"), dict):      # dsim serve's own simulated timings of this request
            self.rec["server_timing"] = obj["dsim"]
        usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
        choices = obj.get("choices") or []
        if usage:
            for k in ("prompt_tokens", "completion_tokens"):
                if isinstance(usage.get(k), int):
                    self.rec[k] = usage[k]
        if not choices:                   # the closing usage chunk: no content
            return True
        c = choices[0] if isinstance(choices[0], dict) else {}
        piece = (c.get("delta") or {}).get("content") if self.chat else c.get("text")
        if usage and isinstance(usage.get("completion_tokens"), int):
            n = usage["completion_tokens"] - self.seen
        else:
            n = 1 if piece else 0
        if n <= 0 and not piece:
            return True
        self.seen += max(n, 0)
        rec = self.rec
        rec["chunk_s"].append(t)
        rec["chunk_tokens"].append(max(n, 0))
        if rec["first_token_s"] is None and n > 0:
            rec["first_token_s"] = t
        rec["last_token_s"] = t
        return True


async def _one(session, url: str, body: bytes, rec: dict, chat: bool, clock) -> None:
    import aiohttp
    parse = _Stream(rec, chat)
    try:
        rec["sent_s"] = clock()
        async with session.post(url, data=body, headers={"Content-Type": "application/json"}) as resp:
            rec["status"] = resp.status
            if resp.status != 200:
                rec["error"] = (await resp.text(errors="replace"))[:ERROR_TEXT] or resp.reason
                return
            async for raw in resp.content:
                if not parse.line(raw, clock()):
                    break
        if rec["first_token_s"] is None and not rec["error"]:
            rec["error"] = "the stream ended without a token"
        elif not parse.done and not rec["error"]:      # a connection closed mid-stream reads as a clean end
            rec["error"] = "the stream ended before data: [DONE]"
    except asyncio.CancelledError:
        rec["cancelled"] = True
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:   # ValueError: a line too long
        rec["error"] = f"{type(e).__name__}: {e}"[:ERROR_TEXT] or type(e).__name__


async def _server_model(session, base: str, given: str | None) -> str:
    """The model name to send: ``given``, else the first model GET /v1/models lists.  An endpoint that
    cannot be reached at all is an error before anything is sent."""
    import aiohttp
    try:
        async with session.get(base + "/v1/models", timeout=aiohttp.ClientTimeout(total=10)) as resp:
            doc = await resp.json(content_type=None) if resp.status == 200 else None
    except (aiohttp.ClientConnectionError, asyncio.TimeoutError, OSError) as e:
        raise ConfigError("URL", base, f"a reachable OpenAI-compatible server ({type(e).__name__}: {e})") from None
    except (aiohttp.ClientError, ValueError):        # no model list (or not JSON): --model must say it
        doc = None
    if given:
        return given
    try:
        return str(doc["data"][0]["id"])
    except (TypeError, KeyError, IndexError):
        raise ConfigError("--model", None, f"a model name ({base}/v1/models lists none)", show_value=False) from None


def _new_record(i: int, w: dict) -> dict:
    return {"index": i, "request_id": str(w.get("request_id") or i), "scheduled_s": float(w["arrival_s"]),
            "sent_s": None, "first_token_s": None, "last_token_s": None, "chunk_s": [], "chunk_tokens": [],
            "prompt_tokens": None, "completion_tokens": None, "sent_prompt_tokens": int(w["prompt_tokens"]),
            "max_tokens": int(w["output_tokens"]), "status": None, "error": None, "cancelled": False}


async def _drive(workload: list, opts: Options) -> Outcome:
    import aiohttp
    from tqdm import tqdm
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
    url, base = endpoint(opts.url, opts.api)
    cap = opts.max_concurrency
    slots = asyncio.Semaphore(cap) if cap else None
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=opts.timeout_s)
    n_send = sum(1 for w in workload if opts.duration_s is None or w["arrival_s"] < opts.duration_s)
    records, tasks = [], set()
    counts = {"failed": 0, "late": 0}
    ended = "completed"
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=cap or 0), timeout=timeout) as session:
        model = await _server_model(session, base, opts.model)
        bar = tqdm(total=n_send, unit="req", desc="observe", file=sys.stderr, disable=not opts.progress,
                   dynamic_ncols=True, leave=True)
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.perf_counter()

        def clock():
            return time.perf_counter() - t0

        def finished(task, rec):
            tasks.discard(task)
            if slots is not None:
                slots.release()
            if rec["error"] and not rec["cancelled"]:
                counts["failed"] += 1
            bar.update(1)
            bar.set_postfix(in_flight=len(tasks), failed=counts["failed"], late=counts["late"], refresh=False)

        async def wait_stop(seconds):
            """Sleep ``seconds``, or less when Ctrl-C comes."""
            try:
                await asyncio.wait_for(stop.wait(), seconds)
            except asyncio.TimeoutError:
                pass

        for i, w in enumerate(workload):
            at = float(w["arrival_s"])
            if opts.duration_s is not None and at >= opts.duration_s:
                ended = "duration"
                break
            body = request_body(w, i, opts, model)          # built before its time comes
            rec = _new_record(i, w)
            while at - clock() > 0 and not stop.is_set():     # never before its time (a timer may fire early)
                await wait_stop(at - clock())
            if stop.is_set():
                break
            if slots is not None:
                acquire = asyncio.ensure_future(slots.acquire())
                halt = asyncio.ensure_future(stop.wait())
                await asyncio.wait({acquire, halt}, return_when=asyncio.FIRST_COMPLETED)
                halt.cancel()
                if not acquire.done() or stop.is_set():
                    acquire.cancel()
                    if acquire.done() and not acquire.cancelled():
                        slots.release()
                    break
            if stop.is_set() or (opts.duration_s is not None and clock() >= opts.duration_s):
                if slots is not None:
                    slots.release()
                ended = "interrupted" if stop.is_set() else "duration"
                break
            if clock() - at > LATE_S:
                counts["late"] += 1
            records.append(rec)
            task = asyncio.ensure_future(_one(session, url, body, rec, opts.api == "chat", clock))
            tasks.add(task)
            task.add_done_callback(lambda t, r=rec: finished(t, r))
        if stop.is_set():
            ended = "interrupted"
        # the rest: wait for requests in flight (Ctrl-C: none; --duration: until grace_s after it)
        t_end = None if opts.duration_s is None else max(opts.duration_s - clock(), 0.0) + opts.grace_s
        t_end = None if t_end is None else loop.time() + t_end
        while tasks and not stop.is_set():
            left = None if t_end is None else t_end - loop.time()
            if left is not None and left <= 0:
                break
            halt = asyncio.ensure_future(stop.wait())
            await asyncio.wait(set(tasks) | {halt}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            halt.cancel()
        if stop.is_set():
            ended = "interrupted"
        for t in list(tasks):
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    bar.close()
    for r in records:
        if r["sent_s"] is None:              # cancelled before its coroutine ran: never sent
            r["cancelled"] = True
    late = [r["sent_s"] - r["scheduled_s"] for r in records if r["sent_s"] is not None]
    from importlib.metadata import version
    return Outcome(records, ended, model, url, f"aiohttp {version('aiohttp')}", started,
                   {"threshold_ms": LATE_S * 1e3, "count": sum(1 for x in late if x > LATE_S),
                    "max_ms": max(late, default=0.0) * 1e3})


def drive(workload: list, opts: Options) -> Outcome:
    """Send ``workload`` (workload.jsonl records, in arrival order) and return what was captured.
    SIGINT/SIGTERM stop the capture (handled inside, so the caller still writes it); the previous
    handlers are put back afterwards."""
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise ConfigError("dsim observe", None, 'aiohttp (pip install "dsim[observe]")', show_value=False) from None
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return asyncio.run(_drive(workload, opts))
    finally:
        if threading.current_thread() is threading.main_thread():
            for s, h in previous.items():
                signal.signal(s, h)
