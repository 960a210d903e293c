"""The ``hardware``: section of a scenario (declared schema; see dsim.config.schema.base for the rules).

A device is a profile name (device_profiles/*.yaml) or an inline mapping with the same keys.
Every profile in those files is validated by :class:`HardwareSection` too (dsim.config.hardware), so a
profile file and an inline device accept the same keys with the same bounds and messages.
"""
from __future__ import annotations

from ..errors import ConfigError
from .base import Float, Int, Section, Str, model_validator
from .named import NameOr

_POSITIVE = Float(0, lo_open=True)


class HardwareSection(Section):
    """One GPU's datasheet figures: dense tensor peaks, memory, bandwidths, power and price."""
    name: Str | None = None
    """Device name in reports (inline devices only; None: custom).  A profile is named by its key."""
    peak_tflops_bf16: _POSITIVE
    """Dense BF16 tensor-core peak with FP32 accumulate, TFLOP/s (never a with-sparsity figure)."""
    sparse_tflops_bf16: _POSITIVE | None = None
    """The datasheet's BF16 figure with 2:4 sparsity, TFLOP/s: a check that peak_tflops_bf16 is at most half."""
    peak_tflops_fp8: _POSITIVE | None = None
    """Dense FP8 tensor peak, TFLOP/s (None: no FP8 tensor cores; FP8 checkpoints run weight-only at BF16)."""
    peak_tops_int8: _POSITIVE | None = None
    """Dense INT8 tensor peak, TOP/s, for W8A8 int8 checkpoints (None: run at the BF16 peak)."""
    hbm_gb_s: _POSITIVE
    """Device memory bandwidth, GB/s (1e9 bytes)."""
    memory_gib: _POSITIVE | None = None
    """Device memory, GiB (2^30 bytes), as CUDA reports it; exactly one of memory_gib and memory_gb."""
    memory_gb: _POSITIVE | None = None
    """Device memory, GB (1e9 bytes), as datasheets give it; exactly one of memory_gib and memory_gb."""
    interconnect: Str = ""
    """GPU-to-GPU link, free text (e.g. NVLink4), for reports."""
    interconnect_gb_s: _POSITIVE = 32
    """Per-direction GPU-to-GPU bandwidth for tensor-parallel collectives, GB/s."""
    interconnect_latency_us: Float(0) = 10
    """Fixed latency of one collective, microseconds."""
    collective_step_latency_us: Float(0) | None = None
    """Latency of one step (one neighbour exchange) of a ring or tree all-reduce, microseconds, for
    engine.all_reduce_algorithm (None: interconnect_latency_us / 14, the steps of an 8-GPU ring)."""
    gpus_per_node: Int(1, 1024) | None = None
    """GPUs of this kind in one node on the interconnect; a TP group beyond it crosses nodes (None: no limit)."""
    internode_gb_s: _POSITIVE | None = None
    """Per-GPU bandwidth between nodes (its NIC), GB/s, for a TP group beyond gpus_per_node (None: such a
    group is refused)."""
    internode_latency_us: Float(0) = 20
    """Fixed latency of one collective across nodes, microseconds."""
    max_tensor_parallel: Int(1, 1024) | None = None
    """Largest tensor_parallel_size a deployment on this device may use (None: no limit)."""
    max_pipeline_parallel: Int(1, 1024) | None = None
    """Largest pipeline_parallel_size a deployment on this device may use (None: no limit)."""
    tdp_w: _POSITIVE = 700
    """Board power limit, W (energy estimates: power x busy time)."""
    pcie_gb_s: _POSITIVE = 32
    """Host link bandwidth per direction, GB/s (CPU KV offload, cold-start weight load)."""
    pcie_efficiency: Float(0, 1, lo_open=True) = 0.75
    """Achieved share of pcie_gb_s, in (0, 1]."""
    idle_w: Float(0) | None = None
    """Board power when idle, W (None: 15 % of tdp_w)."""
    usd_per_gpu_hour: Float(0) | None = None
    """Price of one GPU-hour for cost reports, USD (None: no cost reported)."""
    weight_load_gb_s: _POSITIVE | None = None
    """Weight load rate per GPU at cold start, GB/s (None: pcie_gb_s x pcie_efficiency)."""
    source: Str = ""
    """Where the figures come from (datasheet, whitepaper and year)."""

    @model_validator(mode="after")
    def _memory_and_dense_peak(self):
        if (self.memory_gib is None) == (self.memory_gb is None):
            raise ConfigError("memory_gib", None, "device memory: memory_gib (GiB, as CUDA reports it) "
                              "or memory_gb (1e9 bytes), exactly one", show_value=False)
        sparse = self.sparse_tflops_bf16
        if sparse is not None and self.peak_tflops_bf16 * 1e12 > sparse * 1e12 / 2 * (1 + 1e-9):
            raise ConfigError("peak_tflops_bf16", self.peak_tflops_bf16,
                              f"the dense figure, at most half the with-sparsity sparse_tflops_bf16 "
                              f"({sparse:g}): a datasheet's sparsity figure is not a dense peak")
        return self


HardwareField = NameOr(HardwareSection, "a device profile name or a mapping",
                       "A device profile of device_profiles/ (H100-SXM, A100-80GB, L40S, ...)") | None
