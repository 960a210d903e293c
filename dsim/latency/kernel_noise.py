"""Per-step kernel noise from VIDUR's operator profiles (seed 002 Appendix A item 7, tail-aware LUTs).

VIDUR times each operator many times at one shape (num_tokens, TP) and keeps min/max/mean/median/
std of those repeats: the std is the run-to-run noise of that kernel at that shape, with no batch
variation or prefill interference in it (the simulator produces those itself).  A step of n tokens
runs every profiled operator of every layer once at n tokens (``add`` twice), the embedding once
and, at TP > 1, two all-reduces per layer; its standard deviation follows from the operators'
under an assumption on how their deviations correlate:

* ``correlated`` (the default): sigma = sum of the operators' std.  The upper bound.  What moves
  a kernel's time between repeats is mostly the GPU's state (SM and memory clocks under power and
  thermal management, the other work on the node), which persists over the few milliseconds of one
  step and so moves all of its kernels the same way;
* ``independent``: sigma = sqrt(sum of the operators' variances).  The lower bound: a fresh draw
  per kernel, which would make a 32-layer step about sqrt(320) = 18 times steadier, relative to
  its mean, than any one of its kernels.

The profiles' timings are whole microseconds (every min and max is a multiple of 1 us), so each
std holds the rounding noise of that 1-us timer, which is no kernel noise; it is taken out with
Sheppard's correction, var - q^2 / 12 (q = 1 us, floored at 0).  Attention and the LM head are
not profiled (the vidur model takes them from the roofline) and add no noise here.
"""
from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

CORRELATIONS = ("correlated", "independent")
TIMER_MS = 1e-3            # resolution of VIDUR's timings: 1 us
SHEPPARD_VAR = TIMER_MS * TIMER_MS / 12.0


class NoiseCurve:
    """std (ms) of one operator by its size: linear between the profiled sizes (the repeats of one
    size averaged in variance), held below the smallest, and in proportion to size above the largest
    (the kernels are throughput-bound there: time, and its spread at a given clock, grow with size)."""

    def __init__(self, sizes, stds):
        var: dict = defaultdict(list)
        for x, s in zip(sizes, stds):
            var[float(x)].append(max(float(s) ** 2 - SHEPPARD_VAR, 0.0))
        self.x = np.array(sorted(var))
        self.s = np.array([math.sqrt(sum(var[x]) / len(var[x])) for x in self.x])

    def __call__(self, n) -> np.ndarray:
        n = np.asarray(n, float)
        out = np.interp(n, self.x, self.s)
        hi = self.x[-1]
        return np.where(n > hi, self.s[-1] * n / hi, out)


def _rows(path: Path) -> list[dict]:
    return list(csv.DictReader(io.StringIO(Path(path).read_text())))


def operator_noise(mlp_csv, tp: int, ops) -> dict:
    """op -> NoiseCurve over num_tokens, from the profile's rows at this TP degree."""
    rows = [r for r in _rows(mlp_csv) if int(r["num_tensor_parallel_workers"]) == tp]
    n = [float(r["num_tokens"]) for r in rows]
    return {op: NoiseCurve(n, [float(r[f"time_stats.{op}.std"]) for r in rows])
            for op in ops if rows and f"time_stats.{op}.std" in rows[0]}


def allreduce_noise(ar_csv, tp: int, per_node: int) -> NoiseCurve | None:
    """NoiseCurve over message bytes of the all-reduce among ``tp`` GPUs, ``per_node`` per node."""
    rows = [r for r in _rows(ar_csv) if int(r["num_workers"]) == tp and int(r["devices_per_node"]) == per_node]
    if not rows:
        return None
    return NoiseCurve([float(r["size"]) for r in rows], [float(r["time_stats.all_reduce.std"]) for r in rows])


def step_sigma_ms(tokens, ops: dict, layer_calls: dict, num_layers: int, allreduce: NoiseCurve | None = None,
                  allreduce_bytes_per_token: float = 0.0, correlation: str = "correlated") -> np.ndarray:
    """std (ms) of a step of ``tokens`` tokens: the embedding once, ``layer_calls[op]`` calls of each
    layer operator per layer, two all-reduces per layer (when ``allreduce`` is given), combined by
    ``correlation`` (see the module docstring)."""
    if correlation not in CORRELATIONS:
        raise ValueError(f"correlation: got {correlation!r}, expected one of {CORRELATIONS}")
    n = np.asarray(tokens, float)
    terms = []        # (std, number of calls per step)
    if "emb" in ops:
        terms.append((ops["emb"](n), 1))
    for op, k in layer_calls.items():
        if op in ops:
            terms.append((ops[op](n), k * num_layers))
    if allreduce is not None:
        terms.append((allreduce(n * allreduce_bytes_per_token), 2 * num_layers))
    if correlation == "correlated":
        return sum(s * c for s, c in terms)
    return np.sqrt(sum(s * s * c for s, c in terms))


def lognormal_p95(mean: float, std: float) -> float:
    """95th percentile of the lognormal with this mean and std (the mean itself when std is 0):
    the value a LUT row's latency_p95_ms holds, from which dsim.latency.lut.lognormal_params
    recovers the same lognormal."""
    from .lut import Z95
    if not (mean > 0 and std > 0):
        return mean
    s2 = math.log1p((std / mean) ** 2)
    return math.exp(math.log(mean) - s2 / 2 + Z95 * math.sqrt(s2))
