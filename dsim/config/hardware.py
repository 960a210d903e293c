"""Device profiles: datasheet compute, bandwidth, memory and interconnect of one GPU."""
from __future__ import annotations

from importlib import resources
from pathlib import Path

from dataclasses import dataclass
from functools import lru_cache

import yaml

from .errors import ConfigError
from .files import package_folder
from .fields import Section

GIB = 1 << 30
PROFILE_DIRS = [package_folder("dsim.device_profiles")]   # the repository's device_profiles/ (setup.py)


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    peak_flops: float          # FLOP/s, dense bf16
    hbm_bytes_s: float         # bytes/s
    memory_bytes: float
    interconnect_bytes_s: float
    interconnect_latency_s: float
    interconnect: str = ""
    tdp_w: float = 700.0
    pcie_bytes_s: float = 32e9
    pcie_efficiency: float = 0.75
    idle_w: float | None = None        # board power when idle (default 15 % of TDP)
    usd_per_gpu_hour: float | None = None
    weight_load_gb_s: float | None = None   # cold start: weight load rate per GPU (default PCIe)
    peak_flops_fp8: float | None = None     # FLOP/s, dense FP8 tensor cores (None: no FP8 tensor cores)
    peak_ops_int8: float | None = None      # OP/s, dense INT8 tensor cores
    sparse_flops_bf16: float | None = None  # the datasheet's BF16 figure with 2:4 sparsity (a check only)
    source: str = ""                        # datasheet the figures come from

    def peak_flops_for(self, dtype: str, share: float = 1.0) -> float:
        """Dense tensor peak for GEMMs whose inputs are ``dtype`` (``ModelSpec.compute_dtype``):
        ``fp8`` and ``int8`` use the FP8 / INT8 tensor rate when the device has one and fall back to
        the BF16 peak otherwise (vLLM then runs the checkpoint weight-only, e.g. FP8 Marlin on Ampere);
        anything else (bf16, fp4 without a profile figure) is the BF16 peak.  With ``share`` < 1 only
        that share of the FLOPs runs in ``dtype`` and the rest at the BF16 peak: the result is the
        rate of the mix (``ModelSpec.compute_dtype_share``: unquantized layers stay BF16)."""
        peak = {"fp8": self.peak_flops_fp8, "int8": self.peak_ops_int8}.get(dtype)
        if not peak or share <= 0:
            return self.peak_flops
        if share >= 1:
            return peak
        return 1.0 / (share / peak + (1.0 - share) / self.peak_flops)

    @property
    def idle_power_w(self) -> float:
        return self.idle_w if self.idle_w is not None else 0.15 * self.tdp_w

    @property
    def weight_load_bytes_s(self) -> float:
        if self.weight_load_gb_s is not None:
            return self.weight_load_gb_s * 1e9
        return self.pcie_bytes_s * self.pcie_efficiency


@lru_cache(maxsize=None)
def _profiles() -> dict[str, dict]:
    out: dict[str, dict] = {}
    for d in PROFILE_DIRS:
        for f in sorted(d.glob("*.yaml")):
            data = yaml.safe_load(f.read_text()) or {}
            for k, v in data.items():
                out[str(k)] = dict(v, _file=str(f))
    return out


def device_names() -> list[str]:
    return sorted(_profiles())


def _tera(v: float | None) -> float | None:
    return None if v is None else v * 1e12


def _build(name: str, d: dict, path: str) -> DeviceProfile:
    s = Section({k: v for k, v in d.items() if k != "_file"}, path)
    # memory in GiB (what CUDA reports) or in GB (1e9 B, datasheets); exactly one of them
    gib, gb = s.num("memory_gib", None, lo=0, lo_open=True), s.num("memory_gb", None, lo=0, lo_open=True)
    if (gib is None) == (gb is None):
        raise ConfigError(s.sub("memory_gib"), None, "device memory: memory_gib (GiB, as CUDA reports it) "
                          "or memory_gb (1e9 bytes), exactly one", show_value=False)
    p = DeviceProfile(
        name=name,
        peak_flops=s.num("peak_tflops_bf16", lo=0, lo_open=True) * 1e12,
        hbm_bytes_s=s.num("hbm_gb_s", lo=0, lo_open=True) * 1e9,
        memory_bytes=gib * GIB if gib is not None else gb * 1e9,
        interconnect=s.str("interconnect", ""),
        interconnect_bytes_s=s.num("interconnect_gb_s", 32, lo=0, lo_open=True) * 1e9,
        interconnect_latency_s=s.num("interconnect_latency_us", 10, lo=0) * 1e-6,
        tdp_w=s.num("tdp_w", 700, lo=0, lo_open=True),
        pcie_bytes_s=s.num("pcie_gb_s", 32, lo=0, lo_open=True) * 1e9,
        pcie_efficiency=s.num("pcie_efficiency", 0.75, lo=0, hi=1, lo_open=True),
        idle_w=s.num("idle_w", None, lo=0),
        usd_per_gpu_hour=s.num("usd_per_gpu_hour", None, lo=0),
        weight_load_gb_s=s.num("weight_load_gb_s", None, lo=0, lo_open=True),
        peak_flops_fp8=_tera(s.num("peak_tflops_fp8", None, lo=0, lo_open=True)),
        peak_ops_int8=_tera(s.num("peak_tops_int8", None, lo=0, lo_open=True)),
        sparse_flops_bf16=_tera(s.num("sparse_tflops_bf16", None, lo=0, lo_open=True)),
        source=s.str("source", ""),
    )
    s.done()
    if p.sparse_flops_bf16 is not None and p.peak_flops > p.sparse_flops_bf16 / 2 * (1 + 1e-9):
        raise ConfigError(s.sub("peak_tflops_bf16"), p.peak_flops / 1e12,
                          f"the dense figure, at most half the with-sparsity sparse_tflops_bf16 "
                          f"({p.sparse_flops_bf16 / 1e12:g}): a datasheet's sparsity figure is not a dense peak")
    return p


def resolve_profile(value, path: str, profiles: dict, build, what: str):
    """``build(name, mapping, path)`` of a named profile from ``profiles`` or of an inline mapping
    (its optional ``name`` key names it)."""
    if isinstance(value, str):
        prof = profiles.get(value)
        if prof is None:
            raise ConfigError(path, value, f"a {what} (" + ", ".join(sorted(profiles)) + ") or a mapping")
        return build(value, prof, f"{path}[{value}]")
    if isinstance(value, dict):
        d = dict(value)
        name = str(d.pop("name", "custom"))
        return build(name, d, path)
    raise ConfigError(path, value, f"a {what} name or a mapping")


def load_device(value, path: str = "hardware") -> DeviceProfile:
    """A profile name from device_profiles/gpus.yaml, or an inline mapping with the same keys."""
    return resolve_profile(value, path, _profiles(), _build, "device profile")
