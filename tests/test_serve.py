"""dsim serve: the OpenAI-compatible server over a wall-clock-driven simulation (docs/observe-serve.md).

Each test starts the server in-process on 127.0.0.1 (free ports, uvicorn in a thread) and talks to
it over real sockets with httpx."""
from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("prometheus_client")

from dsim.serve.app import Limits, Server  # noqa: E402
from dsim.serve.realtime import build  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "scenarios" / "quickstart.yaml")     # one Llama-3.1-8B replica on an H100
SMALL = ["engine.max_num_seqs=4"]                              # ... that runs at most 4 requests at once


class Running:
    def __init__(self, overrides=(), speed=1.0, replica_ports=False, limits=None, scenario=QUICKSTART):
        self.rt = build(scenario, list(overrides), speed)
        self.server = Server(self.rt, "127.0.0.1", 0, replica_ports, limits)
        ready = threading.Event()
        self.server.started = ready.set
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_until_complete, args=(self.server.serve(),), daemon=True)
        self.thread.start()
        assert ready.wait(20), "the server did not start"
        self.url = f"http://127.0.0.1:{self.server.ports[0]}"
        self.client = httpx.Client(base_url=self.url, timeout=30)

    def close(self):
        self.client.close()
        self.loop.call_soon_threadsafe(self.server.shutdown)
        self.thread.join(10)

    def metrics(self, port=None) -> dict:
        """/metrics as {name: value} of the unlabelled-by-us series (one replica) or summed."""
        url = f"http://127.0.0.1:{port}/metrics" if port else "/metrics"
        text = (_CLIENT.get(url) if port else self.client.get(url)).text
        out: dict = {}
        for line in text.splitlines():
            if line.startswith("#") or not line:
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            out[name] = out.get(name, 0.0) + float(value)
        return out


@pytest.fixture
def server(request):
    s = Running(*getattr(request, "param", ((), 1.0)))
    yield s
    s.close()


# made once (a new client costs ~0.1 s: its TLS context), without Nagle (a body's last segment would wait
# for the server's delayed ACK)
_CLIENT = httpx.Client(timeout=60, transport=httpx.HTTPTransport(
    socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]))


def stream_ttft(url: str, body: dict) -> tuple[float, list, dict]:
    """Client-side TTFT of a streaming request, every chunk and the usage chunk."""
    t0 = time.perf_counter()
    ttft, chunks, usage = None, [], None
    with _CLIENT.stream("POST", url, json={**body, "stream": True, "stream_options": {"include_usage": True}}) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            obj = json.loads(data)
            if obj.get("usage"):
                usage = obj
            if obj["choices"]:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                chunks.append(obj)
    return ttft, chunks, usage


def until(read, ok, timeout=5.0):
    """read() until ok(value) (the requests of a thread pool take a moment to arrive)."""
    end = time.monotonic() + timeout
    while True:
        v = read()
        if ok(v) or time.monotonic() > end:
            return v
        time.sleep(0.01)


def test_completion_and_stream_shapes(server):
    c = server.client
    assert c.get("/health").status_code == 200
    models = c.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["meta-llama/Llama-3.1-8B"]
    r = c.post("/v1/completions", json={"model": "meta-llama/Llama-3.1-8B", "prompt": "one two three", "max_tokens": 7})
    assert r.status_code == 200
    body = r.json()
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 7, "total_tokens": 10,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    assert len(body["choices"][0]["text"].split()) == 7 and body["choices"][0]["finish_reason"] == "length"
    r = c.post("/v1/completions", json={"prompt": [1, 2, 3, 4, 5], "max_tokens": 2})
    assert r.json()["usage"]["prompt_tokens"] == 5
    ttft, chunks, usage = stream_ttft(server.url + "/v1/chat/completions",
                                      {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 5})
    text = "".join(ch["choices"][0]["delta"].get("content", "") for ch in chunks)
    assert len(text.split()) == 5
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage["usage"]["completion_tokens"] == 5 and usage["choices"] == []
    assert 0 < usage["dsim"]["ttft_s"] < usage["dsim"]["e2e_s"] and usage["dsim"]["replica"] == "replica0"


def test_tokens_come_at_the_simulated_times(server):
    """The client's TTFT and end-to-end time are the simulation's, give or take the HTTP path."""
    rt = server.rt
    prompt = " ".join(f"w{i}" for i in range(1500))     # a prefill long enough to measure (~tens of ms)
    stream_ttft(server.url + "/v1/completions", {"prompt": "warm up the connection", "max_tokens": 2})
    for _ in range(5):
        t0 = time.perf_counter()
        ttft, chunks, usage = stream_ttft(server.url + "/v1/completions", {"prompt": f"{_} {prompt}", "max_tokens": 40})
        e2e = time.perf_counter() - t0
        rid = int(chunks[0]["id"].rsplit("-", 1)[1])
        arrival, first, done = rt.recent[rid]
        # never before the simulation says, and not much after it (a loaded machine delays the client)
        assert (first - arrival) - 0.002 <= ttft <= (first - arrival) + 0.1
        assert (done - arrival) - 0.002 <= e2e <= (done - arrival) + 0.1
        assert len(chunks) == 40                             # one chunk per decode step


@pytest.mark.parametrize("server", [((), 4.0)], indirect=True)
def test_speed_runs_the_clock_faster(server):
    """--speed 4: four simulated seconds per wall second, so the client waits a quarter of the latency."""
    stream_ttft(server.url + "/v1/completions", {"prompt": "warm up", "max_tokens": 2})
    t0 = time.perf_counter()
    _, chunks, usage = stream_ttft(server.url + "/v1/completions", {"prompt": "a b c", "max_tokens": 300})
    wall = time.perf_counter() - t0
    sim = usage["dsim"]["e2e_s"]
    assert sim > 1.5 and len(chunks) == 300
    assert sim / 4 - 0.002 <= wall <= sim / 4 + 0.1


@pytest.mark.parametrize("server", [(SMALL, 1.0)], indirect=True)
def test_metrics_match_the_simulation_at_a_quiet_moment(server):
    """10 requests on a replica that runs 4: once all arrived and admitted, /metrics shows 4 running and
    6 waiting, the KV cache in use; after they finish, 0 and 0 and 10 successes."""
    c = server.client
    body = {"prompt": "a b c d e f g h", "max_tokens": 100}
    with ThreadPoolExecutor(10) as pool:
        futs = [pool.submit(c.post, "/v1/completions", json=body) for _ in range(10)]
        # all arrived and the first 4 admitted (they decode for ~0.65 s): a quiet moment, nothing changes
        # but counters (right after the arrivals, async scheduling may hold some back for a step)
        m = until(server.metrics, lambda m: (m["vllm:num_requests_running"], m["vllm:num_requests_waiting"]) == (4, 6))
        assert m["vllm:num_requests_running"] == 4
        assert m["vllm:num_requests_waiting"] == 6
        assert 0 < m["vllm:gpu_cache_usage_perc"] < 1
        inst = server.rt.replicas()[0].inst
        assert (len(inst.running), len(inst.waiting)) == (4, 6)
        assert all(f.result().status_code == 200 for f in futs)
    m = server.metrics()
    assert m["vllm:num_requests_running"] == 0 and m["vllm:num_requests_waiting"] == 0
    assert m["vllm:request_success_total"] == 10
    assert m["vllm:generation_tokens_total"] == 1000
    assert m["vllm:time_to_first_token_seconds_count"] == 10


@pytest.mark.parametrize("server", [(SMALL, 1.0)], indirect=True)
def test_burst_beyond_capacity_queues(server):
    """A burst of 12 on a replica that runs 4: 8 waiting in /metrics, and the queued requests' TTFT is
    longer than a lone request's."""
    url = server.url + "/v1/completions"
    body = {"prompt": "the quick brown fox jumps over the lazy dog", "max_tokens": 100}
    single, _, usage = stream_ttft(url, body)
    with ThreadPoolExecutor(12) as pool:
        futs = [pool.submit(stream_ttft, url, body) for _ in range(12)]
        # once all arrived (the first batch runs ~0.65 s; with async scheduling a request that arrives
        # mid-step waits a step, so right after an arrival fewer than 4 may run)
        m = until(server.metrics, lambda m: m["vllm:num_requests_running"] + m["vllm:num_requests_waiting"] == 12)
        res = [f.result() for f in futs]
    assert m["vllm:num_requests_waiting"] == 8
    assert m["vllm:num_requests_running"] == 4
    # the last 4 waited for two batches of 100 decode steps (~0.65 s each): in the simulation and at the client
    sim = sorted(u["dsim"]["ttft_s"] for _, _, u in res)
    assert sim[-1] > usage["dsim"]["ttft_s"] + 0.5
    # a client never sees a token before its simulated time, so the wait shows at the client too
    assert max(t for t, _, _ in res) > usage["dsim"]["ttft_s"] + 0.5
    assert single >= usage["dsim"]["ttft_s"] - 0.002


def test_prefix_cache_hits_reach_usage_and_metrics(server):
    prompt = " ".join(f"sys{i}" for i in range(300))
    c = server.client
    first = c.post("/v1/completions", json={"prompt": prompt + " first question", "max_tokens": 2}).json()
    second = c.post("/v1/completions", json={"prompt": prompt + " second question", "max_tokens": 2}).json()
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 288      # 300 shared tokens, 16-token blocks
    assert server.metrics()["vllm:prefix_cache_hits_total"] >= 288


def test_malformed_requests_get_4xx_and_the_server_keeps_serving():
    s = Running(SMALL, 1.0, limits=Limits(max_concurrency=2, max_prompt_tokens=1000, max_body_bytes=20_000))
    try:
        c = s.client
        good = {"prompt": "hello", "max_tokens": 2}
        cases = [
            (dict(content=b"{not json"), 400),
            (dict(content=b"[1, 2]"), 400),
            (dict(json={"max_tokens": 3}), 400),                                  # no prompt
            (dict(json={"prompt": "x", "max_tokens": 0}), 400),
            (dict(json={"prompt": "x", "max_tokens": "ten"}), 400),
            (dict(json={"prompt": 5}), 400),
            (dict(json={"prompt": [1, -2]}), 400),
            (dict(json={"prompt": "x", "n": 2}), 400),
            (dict(json={"prompt": "x", "stream": "yes"}), 400),
            (dict(json={"prompt": "x", "model": "no-such-model"}), 404),
            (dict(json={"prompt": "x", "slo_class": "gold"}), 400),                # quickstart has no slo.classes
            (dict(json={"prompt": "x", "slo_class": ["a"]}), 400),                 # not a string (was a 500)
            (dict(json={"prompt": " ".join(["w"] * 1001)}), 400),                  # over --max-prompt-tokens
            (dict(json={"prompt": "x", "max_tokens": 9000}), 400),                 # over max_model_len
            (dict(content=b"x" * 30_000), 413),
        ]
        for kw, status in cases:
            r = c.post("/v1/completions", headers={"content-type": "application/json"}, **kw)
            assert r.status_code == status, (kw, r.text)
            err = r.json()["error"]
            assert set(err) == {"message", "type", "param", "code"} and err["message"]
            assert c.post("/v1/completions", json=good).status_code == 200
        r = c.post("/v1/chat/completions", json={"messages": "hi"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "messages"          # was a 500
        assert c.get("/v1/completions").status_code == 405
        assert c.get("/nowhere").json()["error"]["type"] == "NotFoundError"
        # the concurrency cap: two long requests in flight, the third gets 429
        with ThreadPoolExecutor(2) as pool:
            futs = [pool.submit(c.post, "/v1/completions", json={"prompt": "x", "max_tokens": 100}) for _ in range(2)]
            until(s.metrics, lambda m: m["vllm:num_requests_running"] == 2)
            r = c.post("/v1/completions", json=good)
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_exceeded"
            assert all(f.result().status_code == 200 for f in futs)
        assert c.post("/v1/completions", json=good).status_code == 200
        # clients that leave mid-stream or before the first token give their slots back
        for n_lines in (0, 2, 0, 3):
            with c.stream("POST", "/v1/completions", json={**good, "max_tokens": 100, "stream": True}) as r:
                assert r.status_code == 200
                for i, _ in enumerate(r.iter_lines()):
                    if i >= n_lines:
                        break
        assert until(lambda: s.server.front.in_flight, lambda n: n == 0) == 0
        assert c.post("/v1/completions", json=good).status_code == 200
        assert until(s.metrics, lambda m: m["vllm:num_requests_running"] == 0)["vllm:num_requests_running"] == 0
    finally:
        s.close()


def test_one_port_per_replica(tmp_path):
    scn = tmp_path / "two.yaml"
    scn.write_text("name: two\nmodel: meta-llama/Llama-3.1-8B\nhardware: H100-SXM\n"
                   "engine: {max_num_seqs: 8}\nlatency: {model: roofline}\n"
                   "cluster: {router: {policy: round_robin}, pools: [{name: h100, replicas: 2}]}\n"
                   "workload: {type: poisson, rate: 1, num_requests: 1}\n")
    s = Running(scenario=str(scn), replica_ports=True)
    try:
        (p0, fleet), (p1, a), (p2, b) = s.server.endpoints()
        assert fleet is None and {a, b} == {r.name for r in s.rt.replicas()}
        body = {"prompt": "x y z", "max_tokens": 100}
        with ThreadPoolExecutor(3) as pool:
            futs = [pool.submit(_CLIENT.post, f"http://127.0.0.1:{p1}/v1/completions", json=body)
                    for _ in range(3)]
            until(lambda: s.metrics(p1), lambda m: m["vllm:num_requests_running"] == 3)
            assert s.metrics(p1)["vllm:num_requests_running"] == 3      # all on replica a
            assert s.metrics(p2)["vllm:num_requests_running"] == 0
            assert s.metrics()["vllm:num_requests_running"] == 3         # the fleet's port sees both
            assert all(f.result().status_code == 200 for f in futs)
        # a replica the autoscaler took out (retired) no longer takes requests on its port
        rep_b = next(r for r in s.rt.replicas() if r.name == b)
        rep_b.state = "retired"
        r = _CLIENT.post(f"http://127.0.0.1:{p2}/v1/completions", json=body)
        assert r.status_code == 503 and r.json()["error"]["code"] == "replica_not_ready"
        rep_b.state = "ready"
    finally:
        s.close()


def test_cli_errors_and_lazy_imports():
    bad = subprocess.run([sys.executable, "-m", "dsim.cli", "serve", "no_such_scenario.yaml"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("dsim: error:")
    bad = subprocess.run([sys.executable, "-m", "dsim.cli", "serve", "quickstart", "--set", "engine.max_num_seqs=0"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "max_num_seqs" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "dsim.cli", "serve", "quickstart", "--port", "70000"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--port" in bad.stderr
    web = "('starlette', 'uvicorn', 'prometheus_client')"
    mods = subprocess.run([sys.executable, "-c", "import dsim, dsim.cli, dsim.runner, sys; "
                           f"print(sorted(m for m in {web} if m in sys.modules))"], capture_output=True, text=True)
    assert mods.stdout.strip() == "[]"


def test_a_simulation_error_while_advancing_stops_the_server():
    """An exception raised while a request or a scrape advanced the simulation used to become one
    HTTP 500 while the server went on serving a simulation that had lost the failing event."""
    rt = build(QUICKSTART)
    server = Server(rt, "127.0.0.1", 0, False, Limits())
    rt.start()
    rt.env.timeout(0.0)                      # an event due now

    def boom():
        raise RuntimeError("a bug")
    rt.env.step = boom
    with pytest.raises(RuntimeError, match="a bug"):
        rt.advance()
    assert isinstance(server.failure, RuntimeError)            # the server was told: it stops serving
    with pytest.raises(RuntimeError, match="a bug"):
        rt.advance()                                           # and nothing runs the simulation on
    for s in server.sockets:
        s.close()
