"""Micro-benchmark of the network layer: transfers per wall-second on an uncontended link.

    python experiments/network_bench.py [--transfers 200000]

One sender sends back to back (each transfer starts when the previous one has arrived), so the
link never carries two flows; a second figure has 8 senders sharing the link (max-min sharing at
every start and finish).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import simpy

sys.path.append(str(Path(__file__).resolve().parents[1]))    # an installed dsim wins over the checkout

from dsim.config.schema.base import parse  # noqa: E402
from dsim.config.schema.network import NetworkConfig  # noqa: E402
from dsim.network.build import build_network  # noqa: E402

LINK = {"links": [{"src": "a", "dst": "b", "rtt_ms": 0.1, "bw_mbps": 100_000}], "serialization_overhead_us": 5}


def bench(n: int, senders: int) -> dict:
    env = simpy.Environment()
    net = build_network(parse(NetworkConfig, LINK, "network"), env, np.random.default_rng(0))
    per = n // senders

    def sender():
        for _ in range(per):
            yield net.send("a", "b", 4096)
    for _ in range(senders):
        env.process(sender())
    t0 = time.perf_counter()
    env.run()
    wall = time.perf_counter() - t0
    return {"senders": senders, "transfers": per * senders, "wall_s": round(wall, 3),
            "transfers_per_wall_s": round(per * senders / wall), "simulated_s": round(env.now, 4)}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--transfers", type=int, default=200_000)
    a = ap.parse_args(argv)
    for s in (1, 8):
        print(json.dumps(bench(a.transfers, s)))


if __name__ == "__main__":
    main()
