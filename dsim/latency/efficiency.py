"""Achieved GEMM efficiency by GPU, shape and token count, fitted on measured kernel timings.

Why: one compute and one memory efficiency for every GEMM on every GPU makes small GEMMs (decode
steps, TP shards) and small batches too fast: a GEMM that reads 20 MB of weights reaches half the
HBM bandwidth of one that reads 900 MB, and a GEMM of 16 tokens keeps a fraction of the tensor
cores busy.  vidur's operator profiles (the project's measurement set, not shipped: qkv, output,
up/gate and down projections of 8 models, TP 1-8, 1-32768 tokens on A100, H100 and A40) measure
exactly that.  This module holds the physically shaped model fitted on them:

    time(m, n, k) = max(2 m n k / (peak x e_c),  bytes / (bw x e_m)) + t0
    e_c(m, n k)   = c_max x s(m / m_half, a) x s(n k / w_half, 1)       compute: tile / wave fill
    e_m(bytes)    = b_max x s(bytes / b_half, 1)                         memory: stream length
    s(x, a)       = x^a / (1 + x^a)                                      saturating, < 1

with m tokens, n x k the (TP-sharded) weight, bytes = weight + activations in and out, peak and
bw the device's datasheet dense BF16 FLOP/s and HBM bandwidth, and t0 a launch floor: seven
numbers per GPU, the only thing read at run time: package data ``coefficients/gemm_efficiency.yaml``
(``importlib.resources``), written offline by ``experiments/fit_gemm_efficiency.py`` with its
provenance and its leave-one-model-out error.

GPUs without a profile borrow one by architecture, derived from the device name (the device
profiles carry no architecture field): Hopper and datacenter Blackwell (H100/H200/H800/GH200,
B100/B200/GB200) -> h100; datacenter Ampere (A100/A800/A30) -> a100; Ada, consumer and
workstation parts (L40/L40S/L4, RTX 4090/5090, RTX 6000 Ada, RTX PRO 6000, A10/A40-class GA102)
-> a40; anything else -> a100.  A borrowed fit keeps its efficiencies (fractions) and applies them
to the device's own peak and bandwidth; ``GemmCurve.borrowed`` and ``.reason`` say so.
"""
from __future__ import annotations
from ..config.files import read_yaml

import math
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

PARAMS = ("c_max", "m_half", "a", "w_half", "b_max", "b_half", "t0_us")
PROFILED = ("h100", "a100", "a40")
# (pattern on the upper-cased device name without spaces/dashes, profile, architecture)
_ARCH = (
    (r"^(GH200|H100|H200|H800|H20)", "h100", "Hopper"),
    (r"^(GB200|GB300|B100|B200|B300)", "h100", "Blackwell datacenter"),
    (r"^(A100|A800|A30(?!\d))", "a100", "Ampere datacenter"),
    (r"^(A40|A10|A16|A2)(?!\d)", "a40", "Ampere GA10x"),
    (r"^(L40|L4(?!\d)|RTX|GEFORCE)", "a40", "Ada/Blackwell workstation or consumer"),
)
_OWN = {"h100": r"^H100", "a100": r"^A10080", "a40": r"^A40(?!\d)"}


def _positive(x) -> bool:
    """No value of x <= 0 (as numpy says it: NaN passes); a Python number without numpy, since a
    step model asks once per new batch size and numpy's scalar path costs microseconds."""
    if type(x) is float or type(x) is int:
        return not x <= 0
    return not np.any(np.asarray(x) <= 0)


def _sat(x: float, a: float) -> float:
    """x^a / (1 + x^a), rising from 0 to 1."""
    xa = x ** a
    return xa / (1.0 + xa)


@dataclass(frozen=True)
class GemmCurve:
    """One GPU's fitted efficiency model, applied to a device's own ``peak_flops`` and ``hbm_bytes_s``."""
    profile: str            # which fit: h100 | a100 | a40
    borrowed: bool          # True when the device is not the GPU the profile was measured on
    reason: str             # how the profile was chosen
    peak_flops: float
    hbm_bytes_s: float
    c_max: float
    m_half: float
    a: float
    w_half: float
    b_max: float
    b_half: float
    t0_us: float

    def compute_efficiency(self, m, nk):
        """Achieved fraction of peak FLOP/s for m tokens against an n x k weight (0 < e < c_max < 1);
        scalars or numpy arrays."""
        if not (_positive(m) and _positive(nk)):
            raise ValueError(f"GEMM shape must be positive: m={m}, n*k={nk}")
        return self.c_max * _sat(m / self.m_half, self.a) * _sat(nk / self.w_half, 1.0)

    def memory_efficiency(self, nbytes):
        """Achieved fraction of HBM bandwidth streaming ``nbytes`` in one kernel (0 < e < b_max < 1)."""
        if not _positive(nbytes):
            raise ValueError(f"GEMM bytes must be positive: {nbytes}")
        return self.b_max * _sat(nbytes / self.b_half, 1.0)

    def terms(self, m: float, n: float, k: float, weight_bytes_per_param: float = 2.0,
              act_bytes: float = 2.0, count: float = 1.0) -> tuple[float, float]:
        """(compute seconds, memory seconds) of ``count`` GEMMs of m tokens x (n x k) weights run in
        one kernel (a grouped MoE GEMM: count experts of m tokens each), without the launch floor.
        Efficiencies are those of one m x n x k problem; memory efficiency is that of the whole
        kernel's stream."""
        flops = 2.0 * m * n * k * count
        nbytes = (n * k * weight_bytes_per_param + m * (n + k) * act_bytes) * count
        tc = flops / (self.peak_flops * self.compute_efficiency(m, n * k))
        tm = nbytes / (self.hbm_bytes_s * self.memory_efficiency(nbytes))
        return tc, tm

    def time(self, m: float, n: float, k: float, weight_bytes_per_param: float = 2.0) -> float:
        """Seconds of one m x n x k GEMM: the slower of compute and memory, plus the launch floor."""
        tc, tm = self.terms(m, n, k, weight_bytes_per_param)
        return max(tc, tm) + self.t0_us * 1e-6


def architecture(device_name: str) -> tuple[str, str]:
    """(profile, architecture) for a device name, by the naming rules above; unknown -> a100."""
    key = re.sub(r"[\s_\-]", "", str(device_name)).upper()
    key = key.replace("NVIDIA", "")
    for pat, prof, arch in _ARCH:
        if re.search(pat, key):
            return prof, arch
    return "a100", "unknown"


def own_profile(device_name: str) -> str | None:
    """The profile measured on this very device (H100 SXM, A100 80GB, A40), else None."""
    key = re.sub(r"[\s_\-]", "", str(device_name)).upper()
    for prof, pat in _OWN.items():
        if re.search(pat, key):
            return prof
    return None


@lru_cache(maxsize=1)
def fitted() -> dict:
    """The shipped fit (package data): {'gpus': {profile: {params..., peak, bw, error}}, provenance}."""
    text = resources.files("dsim.latency").joinpath("coefficients/gemm_efficiency.yaml").read_text()
    data = read_yaml(text, shipped=True)
    for prof in PROFILED:
        g = data.get("gpus", {}).get(prof)
        if g is None or any(p not in g for p in PARAMS):
            raise ValueError(f"gemm_efficiency.yaml: profile {prof!r} lacks one of {PARAMS}")
    return data


def curve_from_params(params: dict, profile: str, peak_flops: float, hbm_bytes_s: float,
                      borrowed: bool = False, reason: str = "") -> GemmCurve:
    bad = [p for p in PARAMS if not (isinstance(params.get(p), (int, float)) and math.isfinite(params[p])
                                     and params[p] > 0)]
    if bad:
        raise ValueError(f"GEMM efficiency parameters must be positive numbers: {bad}")
    if not (params["c_max"] < 1 and params["b_max"] < 1):
        raise ValueError("GEMM efficiency ceilings c_max and b_max must be below 1")
    if peak_flops <= 0 or hbm_bytes_s <= 0:
        raise ValueError(f"device peak FLOP/s and bandwidth must be positive: {peak_flops}, {hbm_bytes_s}")
    return GemmCurve(profile, borrowed, reason, float(peak_flops), float(hbm_bytes_s),
                     **{p: float(params[p]) for p in PARAMS})


def curve_for(device) -> GemmCurve:
    """The efficiency curve for a ``DeviceProfile``: its own fit if it was profiled, else borrowed
    by architecture (see the module docstring), on the device's own peak and bandwidth."""
    own = own_profile(device.name)
    if own is not None:
        prof, borrowed, reason = own, False, f"measured on this GPU ({own})"
    else:
        prof, arch = architecture(device.name)
        borrowed = True
        reason = (f"no profile for {device.name}; {arch} -> {prof} fit on this device's peak and bandwidth"
                  if arch != "unknown" else
                  f"no profile and unknown architecture for {device.name!r}; a100 fit on its peak and bandwidth")
    return curve_from_params(fitted()["gpus"][prof], prof, device.peak_flops, device.hbm_bytes_s, borrowed, reason)
