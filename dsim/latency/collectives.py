"""The cost of one tensor-parallel all-reduce, by algorithm (``engine.all_reduce_algorithm``).

The latency-bandwidth (alpha-beta) model of a collective over p GPUs, n bytes, link bandwidth B
and step latency a:

* ``ring`` (Patarasuk and Yuan, "Bandwidth optimal all-reduce algorithms for clusters of
  workstations", JPDC 2009; Thakur, Rabenseifner and Gropp, IJHPCA 2005): a reduce-scatter then an
  all-gather, each p - 1 steps in which every GPU sends n / p bytes to its neighbour:
  t = 2 (p - 1) a + 2 (p - 1) / p x n / B.
* ``tree`` (the double binary tree of Sanders, Speck and Traeff, "Two-tree algorithms for full
  bandwidth broadcast, reduction and scan", Parallel Computing 2009; NCCL's tree since 2.4): a
  pipelined reduce up and broadcast down two complementary binary trees, each carrying half the
  data; every GPU sends n bytes up and n down, in 2 ceil(log2 p) latency steps:
  t = 2 ceil(log2 p) a + 2 n / B.
  The tree wins when the latency terms dominate (small decode messages, many GPUs); the ring when
  the bytes do (its 2 (p - 1) / p < 2).

Without a choice (None, the default) a collective costs the device profile's fixed latency
(``interconnect_latency_us``: one measured small all-reduce) plus the ring's bandwidth term, as
dsim always charged it.  The step latency a is ``hardware.collective_step_latency_us``, by default
the per-collective latency / 14, so that a ring over one 8-GPU node costs the profile's figure.
A TP group larger than ``hardware.gpus_per_node`` runs on the slower of the node's link and the
per-GPU inter-node link (``DeviceProfile.collective_link``).
"""
from __future__ import annotations

import math

ALGORITHMS = ("ring", "tree")


def all_reduce_terms(device, p: int, algorithm: str | None = None) -> tuple[float, float, float]:
    """(fixed seconds, byte coefficient, bytes/s) of one all-reduce over ``p`` GPUs: it takes
    fixed + coefficient x bytes / bandwidth (0, 0, bandwidth when p is 1)."""
    bw, collective_s, step_s = device.collective_link(p)
    if p <= 1:
        return 0.0, 0.0, bw
    if algorithm is None:
        return collective_s, 2.0 * (p - 1) / p, bw
    if algorithm == "ring":
        return 2 * (p - 1) * step_s, 2.0 * (p - 1) / p, bw
    if algorithm == "tree":
        return 2 * math.ceil(math.log2(p)) * step_s, 2.0, bw
    raise ValueError(f"all-reduce algorithm: got {algorithm!r}, expected one of {ALGORITHMS} or None")


def all_reduce_s(device, p: int, nbytes: float, algorithm: str | None = None) -> float:
    """Seconds of one all-reduce of ``nbytes`` over ``p`` GPUs."""
    fixed, coef, bw = all_reduce_terms(device, p, algorithm)
    return fixed + coef * nbytes / bw
