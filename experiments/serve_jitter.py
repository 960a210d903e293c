"""dsim serve: how close a client's latencies are to the simulation's, and what the server sustains.

    python experiments/serve_jitter.py [--scenario quickstart] [--rates 10,40,80] [--seconds 10]

Starts ``dsim serve`` in a subprocess (its own process, as a user runs it), then
1. 50 sequential streaming requests (prompts of 20 to 2,000 words, 32 output tokens): per request
   |client TTFT - simulated TTFT| and |client E2E - simulated E2E| (the ``dsim`` field of the last
   chunk gives the simulated ones), median and p99;
2. open-loop Poisson load at each rate for --seconds (streaming, 200-word prompts, 64 tokens): completed
   requests/s, streamed chunks/s, and the same TTFT error at that load.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time

import httpx
import numpy as np


NODELAY = [(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)]    # else a body's last segment waits for a delayed ACK


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def one(client, url, prompt, max_tokens):
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    sim = None
    async with client.stream("POST", url, json={"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                                                "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            await r.aread()
            return None
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = json.loads(line[6:])
            if obj["choices"]:
                chunks += 1
                if ttft is None:
                    ttft = time.perf_counter() - t0
            if "dsim" in obj:
                sim = obj["dsim"]
    e2e = time.perf_counter() - t0
    return ttft, e2e, sim, chunks


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def lag(url):
    """The server's token release lag so far: (count, mean ms, share over 5 ms) from its /metrics."""
    text = httpx.get(url.replace("/v1/completions", "/metrics")).text
    b = {}
    tot = n = 0.0
    for line in text.splitlines():
        if line.startswith("dsim:token_release_lag_seconds_bucket"):
            b[line.split('le="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("dsim:token_release_lag_seconds_sum"):
            tot = float(line.rsplit(" ", 1)[1])
        elif line.startswith("dsim:token_release_lag_seconds_count"):
            n = float(line.rsplit(" ", 1)[1])
    return n, tot, b.get("0.005", 0.0)


def lag_line(url, before):
    n0, s0, u0 = before
    n, s, u = lag(url)
    return (f"server release lag: mean {(s - s0) / max(1, n - n0) * 1e3:.2f} ms, "
            f"{100 * (1 - (u - u0) / max(1, n - n0)):.1f} % of {n - n0:.0f} releases over 5 ms")


def stats(errs):
    a = np.abs(np.array(errs)) * 1e3
    return f"median {np.median(a):.2f} ms, p99 {np.percentile(a, 99):.2f} ms, max {a.max():.2f} ms"


async def sequential(url, n=50):
    rng = random.Random(1)
    before = lag(url)
    async with httpx.AsyncClient(timeout=120, transport=httpx.AsyncHTTPTransport(socket_options=NODELAY)) as c:
        await one(c, url, "warm up", 2)
        dt, de = [], []
        for i in range(n):
            words = rng.randint(20, 2000)
            prompt = f"{i} " + " ".join(f"w{rng.randrange(50000)}" for _ in range(words))
            ttft, e2e, sim, _ = await one(c, url, prompt, 32)
            dt.append(ttft - sim["ttft_s"])
            de.append(e2e - sim["e2e_s"])
    print(f"sequential x{n}: |client TTFT - sim TTFT| {stats(dt)}; mean signed {np.mean(dt) * 1e3:+.2f} ms")
    print(f"               |client E2E - sim E2E|   {stats(de)}; mean signed {np.mean(de) * 1e3:+.2f} ms")
    print("               " + lag_line(url, before))


async def load(url, rate, seconds, pid):
    cpu0 = cpu_s(pid) if pid else 0.0
    before = lag(url)
    rng = random.Random(2)
    limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
    async with httpx.AsyncClient(timeout=300, transport=httpx.AsyncHTTPTransport(socket_options=NODELAY,
                                                                                 limits=limits)) as c:
        tasks = []
        t0 = time.perf_counter()
        t = 0.0
        i = 0
        while t < seconds:
            t += rng.expovariate(rate)
            d = t0 + t - time.perf_counter()
            if d > 0:
                await asyncio.sleep(d)
            prompt = f"{i} " + " ".join(f"w{rng.randrange(50000)}" for _ in range(200))
            tasks.append(asyncio.create_task(one(c, url, prompt, 64)))
            i += 1
        res = await asyncio.gather(*tasks)
        wall = time.perf_counter() - t0
    cpu = cpu_s(pid) - cpu0 if pid else float("nan")
    ok = [r for r in res if r is not None]
    chunks = sum(r[3] for r in ok)
    dt = [r[0] - r[2]["ttft_s"] for r in ok]
    sim_ttft = np.array([r[2]["ttft_s"] for r in ok]) * 1e3
    print(f"rate {rate:g}/s x {seconds:g} s: {len(ok)}/{len(res)} ok, {len(ok) / wall:.1f} req/s completed, "
          f"{chunks / wall:.0f} chunks/s; sim TTFT p50 {np.median(sim_ttft):.1f} ms; "
          f"|client - sim TTFT| {stats(dt)}; server CPU {cpu:.1f} s = {cpu / max(1, len(ok)) * 1e3:.2f} ms per "
          f"request, {cpu / max(1, chunks) * 1e6:.0f} us per chunk; " + lag_line(url, before))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--scenario", default="quickstart")
    ap.add_argument("--rates", default="10,40,80")
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--port", type=int, default=None, help="measure a dsim serve already running on this port")
    ap.add_argument("--pid", type=int, default=None, help="... whose process id is this (for its CPU time)")
    ap.add_argument("--skip-sequential", action="store_true", help="only the load phases (several clients at once)")
    a = ap.parse_args()
    if a.port is not None:
        url = f"http://127.0.0.1:{a.port}/v1/completions"
        if not a.skip_sequential:
            asyncio.run(sequential(url))
        for r in a.rates.split(","):
            asyncio.run(load(url, float(r), a.seconds, a.pid))
        return
    port = free_port()
    cmd = [sys.executable, "-m", "dsim.cli", "serve", a.scenario, "--port", str(port), "--max-concurrency", "5000"]
    for o in a.overrides:
        cmd += ["--set", o]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, env=os.environ)
    try:
        for line in proc.stdout:
            if "^C" in line:
                break
        url = f"http://127.0.0.1:{port}/v1/completions"
        asyncio.run(sequential(url))
        for r in a.rates.split(","):
            asyncio.run(load(url, float(r), a.seconds, proc.pid))
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()
