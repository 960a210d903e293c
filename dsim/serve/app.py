"""The HTTP side of dsim serve: OpenAI-compatible routes over a RealtimeSim (Starlette on uvicorn).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with ``stream``, and
``stream_options.include_usage`` for a last chunk with the usage), ``GET /v1/models``, ``GET /health``,
``GET /metrics``.  Errors are OpenAI's JSON ``{"error": {"message", "type", "param", "code"}}``.

Why Starlette on uvicorn: Starlette is the small, maintained ASGI toolkit FastAPI is built on, and all
this server needs (routes, streaming responses, exception handlers); FastAPI's request models would
answer bad requests with its own 422 format, not OpenAI's errors, so the bodies are checked by hand
here.  uvicorn is the usual ASGI server (vLLM's too); several of its servers share one event loop, and
the simulation runs in that loop, so nothing is shared between threads.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from . import metrics as prom
from .text import chat_text, filler, segments, words


@dataclass
class Limits:
    max_concurrency: int = 256          # requests in flight over all ports; more get 429
    max_prompt_tokens: int = 32768      # longer prompts get 400 (and so does prompt + max_tokens > max_model_len)
    max_body_bytes: int = 1 << 20       # larger bodies get 413
    default_max_tokens: int = 16        # max_tokens when a request gives none (OpenAI's completions default)


class APIError(Exception):
    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param=None, code=None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code


def error_response(status: int, message: str, type_: str = "invalid_request_error", param=None, code=None):
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}},
                        status_code=status)


# the simulation's reject reasons -> HTTP status, error type
_REJECT = {"too_long": (400, "invalid_request_error"), "kv_capacity": (400, "invalid_request_error")}


class Frontend:
    """The state shared by every port: the simulation, the limits, the count of requests in flight."""

    def __init__(self, rt, limits: Limits):
        self.rt = rt
        self.limits = limits
        self.in_flight = 0
        self.models = rt.model_names()
        self.max_model_len = rt.max_model_len()
        self.created = int(time.time())

    # ---- request parsing -------------------------------------------------------------------------
    async def _body(self, request: HTTPRequest) -> dict:
        cap = self.limits.max_body_bytes
        cl = request.headers.get("content-length")
        if cl is not None and cl.isdigit() and int(cl) > cap:
            raise APIError(413, f"request body of {cl} bytes is larger than the limit of {cap} bytes")
        buf = bytearray()
        async for chunk in request.stream():
            buf += chunk
            if len(buf) > cap:
                raise APIError(413, f"request body is larger than the limit of {cap} bytes")
        try:
            body = json.loads(buf)
        except (ValueError, UnicodeDecodeError):
            raise APIError(400, "the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        return body

    def _model(self, body: dict) -> str:
        m = body.get("model")
        if m is None:
            return self.models[0]
        if m not in self.models:
            raise APIError(404, f"The model `{m}` does not exist.", "NotFoundError", "model", "model_not_found")
        return m

    def _tokens(self, body: dict, chat: bool) -> list:
        if chat:
            msgs = body.get("messages")
            if not isinstance(msgs, list) or not msgs or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content", ""), (str, list, type(None))) for m in msgs):
                raise APIError(400, "messages must be a non-empty list of {role, content} objects", param="messages")
            for i, m in enumerate(msgs):
                c = m.get("content")
                if isinstance(c, list) and not all(isinstance(part, dict) and isinstance(part.get("text", ""), str)
                                                   for part in c):
                    raise APIError(400, f"messages[{i}].content must be a string or a list of "
                                   '{"type": "text", "text": string} parts', param="messages")
            return words(chat_text(msgs))
        p = body.get("prompt")
        if isinstance(p, list) and len(p) == 1 and isinstance(p[0], (str, list)):
            p = p[0]                                     # a batch of one
        if isinstance(p, str):
            return words(p)
        if isinstance(p, list) and p and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in p):
            return p                                     # token ids
        raise APIError(400, "prompt must be a string or a list of token ids (one prompt per request)",
                       param="prompt")

    def _int(self, body: dict, key: str, default, lo: int, hi: int):
        v = body.get(key, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise APIError(400, f"{key} must be an integer in [{lo}, {hi}], got {v!r}", param=key)
        return v

    # ---- the completion routes -------------------------------------------------------------------
    async def complete(self, request: HTTPRequest, chat: bool, replica=None):
        body = await self._body(request)
        model = self._model(body)
        toks = self._tokens(body, chat)
        lim = self.limits
        if self._int(body, "n", 1, 1, 1 << 30) != 1:
            raise APIError(400, "n must be 1 (dsim serve simulates one sequence per request)", param="n")
        key = "max_completion_tokens" if chat and body.get("max_completion_tokens") is not None else "max_tokens"
        max_tokens = self._int(body, key, lim.default_max_tokens, 1, 1 << 30)
        priority = self._int(body, "priority", 0, -(1 << 31), 1 << 31)
        slo_class = body.get("slo_class") or ""
        classes = self.rt.scn.slo_classes
        if not isinstance(slo_class, str):
            raise APIError(400, f"slo_class must be a string, got {type(slo_class).__name__}", param="slo_class")
        if slo_class and slo_class not in classes:
            known = ", ".join(sorted(classes)) or "it has none"
            raise APIError(400, f"slo_class must be one of the scenario's slo.classes ({known}), got {slo_class!r}",
                           param="slo_class")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise APIError(400, "stream must be true or false", param="stream")
        so = body.get("stream_options") or {}
        if not isinstance(so, dict):
            raise APIError(400, "stream_options must be an object", param="stream_options")
        usage_chunk = bool(so.get("include_usage", False))
        n_prompt = len(toks)
        if n_prompt == 0:
            raise APIError(400, "the prompt is empty", param="messages" if chat else "prompt")
        if n_prompt > lim.max_prompt_tokens:
            raise APIError(400, f"the prompt has {n_prompt} tokens, more than this server's limit of "
                           f"{lim.max_prompt_tokens}", param="messages" if chat else "prompt",
                           code="context_length_exceeded")
        if n_prompt + max_tokens > self.max_model_len:
            raise APIError(400, f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                           f"requested {n_prompt + max_tokens} tokens ({n_prompt} in the "
                           f"{'messages' if chat else 'prompt'}, {max_tokens} in the completion). Please reduce the "
                           "length of the messages or completion.", param="max_tokens", code="context_length_exceeded")
        if self.in_flight >= lim.max_concurrency:
            raise APIError(429, f"too many requests in flight (the limit is {lim.max_concurrency})",
                           "rate_limit_exceeded", code="rate_limit_exceeded")
        if replica is not None and replica.state != "ready":       # scaled in (or still starting)
            raise APIError(503, f"replica {replica.name} is not serving (it is {replica.state}); send to the fleet's port",
                           "service_unavailable", code="replica_not_ready")
        st = self.rt.submit(n_prompt, max_tokens, segments(toks), replica, priority, slo_class)
        if isinstance(st, str):
            status, kind = _REJECT.get(st, (429, "rate_limit_exceeded"))
            raise APIError(status, f"the simulated server rejected the request ({st})", kind, code=st)
        self.in_flight += 1
        rid = st.req.rid
        ident = f"{'chatcmpl' if chat else 'cmpl'}-dsim-{rid}"
        meta = dict(id=ident, created=int(time.time()), model=model)
        if stream:
            return _Streamed(self, st, self._sse(st, chat, meta, usage_chunk), media_type="text/event-stream",
                             headers={"x-request-id": ident})
        try:
            n = 0
            async for kind, _t, v in self._released(st):
                if kind == "tokens":
                    n += v
                elif kind == "error":
                    status, typ = _REJECT.get(v, (429, "rate_limit_exceeded"))
                    return error_response(status, f"the simulated server rejected the request ({v})", typ, code=v)
        finally:
            self.release(st)
        text = filler(0, n)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                   "finish_reason": "length"} if chat else
                  {"index": 0, "text": text, "logprobs": None, "finish_reason": "length", "stop_reason": None})
        return JSONResponse({**meta, "object": "chat.completion" if chat else "text_completion",
                             "choices": [choice], "usage": _usage(st), "dsim": sim_times(st)},
                            headers={"x-request-id": ident})

    async def _released(self, st):
        """The stream's items, each when the wall clock reaches its simulated time."""
        rt = self.rt
        while True:
            while st.items:
                kind, t, v = st.items.popleft()
                await rt.release_at(t)
                yield kind, t, v
                if kind != "tokens":
                    return
            st.event.clear()
            await st.event.wait()

    async def _sse(self, st, chat: bool, meta: dict, usage_chunk: bool):
        obj = "chat.completion.chunk" if chat else "text_completion"
        n = 0
        max_tokens = st.req.max_tokens
        try:
            async for kind, _t, v in self._released(st):
                if kind == "error":
                    err = {"error": {"message": f"the simulated server rejected the request ({v})",
                                     "type": "invalid_request_error", "param": None, "code": v}}
                    yield f"data: {json.dumps(err)}\n\ndata: [DONE]\n\n"
                    return
                if kind == "done":
                    if usage_chunk:
                        last = {**meta, "object": obj, "choices": [], "usage": _usage(st), "dsim": sim_times(st)}
                        yield f"data: {json.dumps(last)}\n\n"
                    yield "data: [DONE]\n\n"
                    return
                out = []
                if chat and n == 0:         # vLLM sends the role with the first token
                    out.append(_chunk(meta, obj, {"index": 0, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}))
                text = filler(n, v)
                n += v
                fin = "length" if n >= max_tokens else None
                out.append(_chunk(meta, obj, {"index": 0, "delta": {"content": text}, "logprobs": None,
                                              "finish_reason": fin} if chat else
                                  {"index": 0, "text": text, "logprobs": None, "finish_reason": fin,
                                   "stop_reason": None}))
                yield "".join(out)
        finally:
            self.release(st)

    def release(self, st) -> None:
        """st no longer counts against --max-concurrency (once, however its response ended)."""
        if not st.released:
            st.released = True
            self.in_flight -= 1

    # ---- other routes ----------------------------------------------------------------------------
    def models_response(self):
        return JSONResponse({"object": "list", "data": [
            {"id": m, "object": "model", "created": self.created, "owned_by": "dsim", "root": m, "parent": None,
             "max_model_len": self.max_model_len} for m in self.models]})


class _Streamed(StreamingResponse):
    """A streaming response that releases its request's concurrency slot however it ends: a client that
    leaves before the first chunk leaves the generator unstarted (its ``finally`` never runs)."""

    def __init__(self, front: Frontend, st, *args, **kw):
        super().__init__(*args, **kw)
        self.front, self.st = front, st

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.front.release(self.st)


def _chunk(meta: dict, obj: str, choice: dict) -> str:
    return f"data: {json.dumps({**meta, 'object': obj, 'choices': [choice]})}\n\n"


def _usage(st) -> dict:
    r = st.req
    return {"prompt_tokens": r.prompt_len, "completion_tokens": st.sent, "total_tokens": r.prompt_len + st.sent,
            "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}


def sim_times(st) -> dict:
    """The request's simulated timings, in seconds (an extra field beside OpenAI's: clients ignore it):
    arrival (simulated time since the server started), ttft, e2e, queue (queued until first scheduled),
    the replica that served it."""
    r = st.req
    return {"arrival_s": r.arrival, "ttft_s": r.t_first_token - r.arrival, "e2e_s": r.t_completion - r.arrival,
            "queue_s": r.t_scheduled - r.t_queued, "replica": r.replica}


def build_app(front: Frontend, replica=None) -> Starlette:
    """One port: the whole fleet behind the scenario's routers (replica None), or one replica."""
    reg = prom.registry(front.rt, None if replica is None else [replica.name])

    async def completions(request):
        return await front.complete(request, False, replica)

    async def chat(request):
        return await front.complete(request, True, replica)

    async def models(request):
        return front.models_response()

    async def health(request):
        return Response(status_code=200)

    async def scrape(request):
        front.rt.advance()
        return Response(prom.exposition(reg), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def api_error(request, exc: APIError):
        return error_response(exc.status, exc.message, exc.type, exc.param, exc.code)

    async def http_error(request, exc: HTTPException):
        kind = "NotFoundError" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind)

    routes = [Route("/v1/completions", completions, methods=["POST"]),
              Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/health", health, methods=["GET"]),
              Route("/metrics", scrape, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={APIError: api_error, HTTPException: http_error})


def bind(host: str, port: int) -> socket.socket:
    """A listening socket (port 0: any free port); an address in use is the user's error."""
    from ..config.errors import ConfigError
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto IPPROTO_TCP, not 0: asyncio turns Nagle off only on sockets that say they are TCP, and with Nagle
    # a token's chunk after the headers waited for the client's delayed ACK (~20 ms on the first token)
    s = socket.socket(fam, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        s.bind((host, port))
    except socket.gaierror as e:
        s.close()
        raise ConfigError("--host", host, f"an address of this machine ({e.strerror})") from None
    except OSError as e:
        s.close()
        raise ConfigError("--port", port, f"a free port on {host} ({e.strerror})") from None
    s.listen(2048)
    s.setblocking(False)
    return s


class Server:
    """The ports of one dsim serve: the fleet's port, and with ``replica_ports`` one per replica after it
    (port + 1 + i for the i-th replica that takes arrivals, i.e. not a P/D decode replica; with port 0,
    free ports)."""

    def __init__(self, rt, host: str = "127.0.0.1", port: int = 8000, replica_ports: bool = False,
                 limits: Limits | None = None):
        self.rt = rt
        self.front = Frontend(rt, limits or Limits())
        # a decode replica (P/D) takes requests from prefill replicas only: no port of its own
        targets = [None] + ([r for r in rt.replicas() if r.pool.role != "decode"] if replica_ports else [])
        self.sockets, self.apps = [], []
        for i, rep in enumerate(targets):
            self.sockets.append(bind(host, 0 if port == 0 else port + i))
            self.apps.append((rep, build_app(self.front, rep)))
        self.host = host
        self.ports = [s.getsockname()[1] for s in self.sockets]
        self.servers = []
        self.started = None
        self.failure = None             # the simulation's exception, if it stopped with one
        rt.on_failure = self._sim_failed          # raised while a request or a scrape advanced it

    def endpoints(self) -> list:
        """(port, replica name or None for the fleet's port)."""
        return [(p, None if rep is None else rep.name) for p, (rep, _) in zip(self.ports, self.apps)]

    async def serve(self) -> None:
        import uvicorn
        self.rt.start()
        drive = asyncio.get_running_loop().create_task(self.rt.drive())
        drive.add_done_callback(self._drive_ended)
        for sock, (_rep, app) in zip(self.sockets, self.apps):
            cfg = uvicorn.Config(app, log_level="warning", lifespan="off", access_log=False,
                                 timeout_graceful_shutdown=1)
            srv = uvicorn.Server(cfg)
            srv.capture_signals = contextlib.nullcontext      # shutdown() stops every port at once
            self.servers.append(srv)
        try:
            tasks = [asyncio.create_task(srv.serve(sockets=[sock])) for srv, sock in zip(self.servers, self.sockets)]
            while not all(srv.started for srv in self.servers):
                await asyncio.sleep(0.005)
                if any(t.done() for t in tasks):
                    break
            if self.started is not None:
                self.started()
            await asyncio.gather(*tasks)
        finally:
            drive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await drive
        if self.failure is not None:
            raise self.failure

    def _drive_ended(self, task) -> None:
        """The simulation stopped with an error (a bug): stop serving rather than hang every client."""
        if not task.cancelled() and task.exception() is not None:
            self.failure = task.exception()
            self.shutdown()

    def _sim_failed(self, exc) -> None:
        self.failure = exc
        self.shutdown()

    def shutdown(self) -> None:
        for srv in self.servers:
            srv.should_exit = True
