"""Device profiles: datasheet compute, bandwidth, memory and interconnect of one GPU."""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache


from .files import read_yaml
from .errors import ConfigError
from .files import package_folder

GIB = 1 << 30
RING8_STEPS = 14       # steps of a ring all-reduce over 8 GPUs, 2 (p - 1): a profile's per-collective latency
PROFILE_DIRS = [package_folder("dsim.device_profiles")]   # the repository's device_profiles/ (setup.py): shipped data


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
    collective_step_latency_s: float | None = None   # one ring/tree step (None: interconnect latency / 14)
    gpus_per_node: int | None = None        # GPUs on one node's interconnect (None: no limit)
    internode_bytes_s: float | None = None  # per-GPU NIC bandwidth between nodes (None: not given)
    internode_latency_s: float = 20e-6      # one collective across nodes
    max_tensor_parallel: int | None = None
    max_pipeline_parallel: int | None = None

    def crosses_nodes(self, tp: int) -> bool:
        """Does a TP group of ``tp`` GPUs span more than one node?"""
        return self.gpus_per_node is not None and tp > self.gpus_per_node

    def collective_link(self, tp: int) -> tuple[float, float, float]:
        """(bytes/s, latency of one collective s, latency of one ring/tree step s) of the links a TP
        group's all-reduce runs on: the node's interconnect, or across nodes the slower of it and the
        per-GPU inter-node link (dsim.latency.collectives)."""
        if not self.crosses_nodes(tp):
            step = self.collective_step_latency_s
            return (self.interconnect_bytes_s, self.interconnect_latency_s,
                    step if step is not None else self.interconnect_latency_s / RING8_STEPS)
        bw = min(self.interconnect_bytes_s, self.internode_bytes_s or self.interconnect_bytes_s)
        return bw, self.internode_latency_s, self.internode_latency_s / RING8_STEPS

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
    """Every profile in the profile files, by name, as written (validated when one is used)."""
    out: dict[str, dict] = {}
    for i, d in enumerate(PROFILE_DIRS):
        for f in sorted(d.glob("*.yaml")):
            data = read_yaml(f.read_text(), shipped=i == 0) or {}     # a folder added later is a user's
            for k, v in data.items():
                out[str(k)] = v
    return out


def device_names() -> list[str]:
    return sorted(_profiles())


def _tera(v: float | None) -> float | None:
    return None if v is None else v * 1e12


def _build(name: str, h) -> DeviceProfile:
    """The runtime profile from a HardwareSection (validated: bounds, memory, dense peak)."""
    return DeviceProfile(
        name=name,
        peak_flops=h.peak_tflops_bf16 * 1e12,
        hbm_bytes_s=h.hbm_gb_s * 1e9,
        memory_bytes=h.memory_gib * GIB if h.memory_gib is not None else h.memory_gb * 1e9,
        interconnect=h.interconnect,
        interconnect_bytes_s=h.interconnect_gb_s * 1e9,
        interconnect_latency_s=h.interconnect_latency_us * 1e-6,
        tdp_w=h.tdp_w,
        pcie_bytes_s=h.pcie_gb_s * 1e9,
        pcie_efficiency=h.pcie_efficiency,
        idle_w=h.idle_w,
        usd_per_gpu_hour=h.usd_per_gpu_hour,
        weight_load_gb_s=h.weight_load_gb_s,
        peak_flops_fp8=_tera(h.peak_tflops_fp8),
        peak_ops_int8=_tera(h.peak_tops_int8),
        sparse_flops_bf16=_tera(h.sparse_tflops_bf16),
        source=h.source,
        collective_step_latency_s=None if h.collective_step_latency_us is None else h.collective_step_latency_us * 1e-6,
        gpus_per_node=h.gpus_per_node,
        internode_bytes_s=None if h.internode_gb_s is None else h.internode_gb_s * 1e9,
        internode_latency_s=h.internode_latency_us * 1e-6,
        max_tensor_parallel=h.max_tensor_parallel,
        max_pipeline_parallel=h.max_pipeline_parallel,
    )


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


def _parsed(name: str, mapping, path: str) -> DeviceProfile:
    from .schema.base import parse
    from .schema.hardware import HardwareSection
    return _build(name, parse(HardwareSection, mapping, path))


def load_device(value, path: str = "hardware") -> DeviceProfile:
    """A profile name from device_profiles/gpus.yaml or an inline device (a HardwareSection, or a
    mapping parsed into one).  A profile in a file is checked by the same HardwareSection as an
    inline device, its errors at ``hardware[<name>].<key>``."""
    from .schema.hardware import HardwareSection
    if isinstance(value, HardwareSection):
        return _build(value.name if value.name is not None else "custom", value)
    return resolve_profile(value, path, _profiles(), _parsed, "device profile")
