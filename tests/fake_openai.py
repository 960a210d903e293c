"""A tiny OpenAI-compatible streaming server for testing ``dsim observe`` (standard library only).

Each completion streams one token a chunk: the first after ``ttft_s``, the next ones ``itl_s``
apart, then a usage chunk and ``[DONE]``.  A request whose ``max_tokens`` is in ``fail_500`` or
``fail_400`` gets that status instead; one in ``cut`` gets two tokens, then the connection is closed.  Every request received is kept (arrival time on the
server's clock, parsed body, when each content chunk was written), so a test can check what the client
sent, when, how many at once, and how far its timings are from the server's.
"""
from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHAT_TEMPLATE_TOKENS = 5          # tokens a chat prompt counts beyond its words


class FakeServer:
    def __init__(self, ttft_s=0.05, itl_s=0.02, fail_500=(), fail_400=(), cut=(), model="fake-model"):
        self.ttft_s, self.itl_s = ttft_s, itl_s
        self.fail_500, self.fail_400, self.cut = set(fail_500), set(fail_400), set(cut)
        self.model = model
        self.received: list = []           # (server time, path, body, [server time each content chunk was written])
        self.in_flight = 0
        self.peak = 0
        self.lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self):
        fake = self

        class H(BaseHTTPRequestHandler):
            disable_nagle_algorithm = True      # else a chunk can wait for the client's delayed ACK (40-200 ms)

            def log_message(self, *a):
                pass

            def _json(self, code, doc):
                b = json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(b)))
                self.end_headers()
                self.wfile.write(b)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json(200, {"object": "list", "data": [{"id": fake.model, "object": "model"}]})
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self):
                t = time.perf_counter()
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                writes = []
                with fake.lock:
                    fake.received.append((t, self.path, body, writes))
                chat = self.path == "/v1/chat/completions"
                n = int(body["max_tokens"])
                if n in fake.fail_500:
                    return self._json(500, {"error": {"message": "boom", "code": 500}})
                if n in fake.fail_400:
                    return self._json(400, {"error": {"message": "prompt too long", "code": 400}})
                if chat:
                    prompt = len(body["messages"][0]["content"].split()) + CHAT_TEMPLATE_TOKENS
                else:
                    p = body["prompt"]
                    prompt = len(p) if isinstance(p, list) else len(p.split())
                cont = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
                with fake.lock:
                    fake.in_flight += 1
                    fake.peak = max(fake.peak, fake.in_flight)
                counted = [True]

                def done():            # before the last bytes: a client that saw them may send its next request
                    if counted[0]:
                        counted[0] = False
                        with fake.lock:
                            fake.in_flight -= 1
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    if chat:            # vLLM's first chat chunk: the role, no content
                        self._send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
                    time.sleep(fake.ttft_s)
                    for k in range(n):
                        if k:
                            time.sleep(fake.itl_s)
                        c = {"index": 0, "delta": {"content": f" w{k}"}} if chat else {"index": 0, "text": f" w{k}"}
                        doc = {"choices": [c]}
                        if cont:
                            doc["usage"] = {"prompt_tokens": prompt, "completion_tokens": k + 1}
                        if n in fake.cut and k == 2:        # the server dies mid-stream
                            done()
                            self.wfile.flush()
                            self.connection.shutdown(socket.SHUT_RDWR)
                            return
                        writes.append(time.perf_counter())
                        self._send(doc)
                    done()
                    self._send({"choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                                                         "total_tokens": prompt + n}})
                    self.wfile.write(b"data: [DONE]\n\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    done()

            def _send(self, doc):
                self.wfile.write(b"data: " + json.dumps(doc).encode() + b"\n\n")
                self.wfile.flush()

        return H
