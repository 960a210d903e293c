"""Device profiles against their datasheets: dense peaks, never a with-sparsity figure; a source each."""
import pytest

from dsim.config.errors import ConfigError
from dsim.config.hardware import _profiles, device_names, load_device
from dsim.specdec.devices import _profiles as draft_profiles, load_draft_profile


@pytest.mark.parametrize("name", device_names())
def test_every_gpu_profile_is_dense_and_sourced(name):
    d = load_device(name)
    assert d.source, f"{name}: no source"
    assert d.sparse_flops_bf16, f"{name}: the datasheet's with-sparsity BF16 figure is missing"
    assert d.peak_flops <= d.sparse_flops_bf16 / 2 * (1 + 1e-9)
    # a 2:4-sparsity figure is exactly twice the dense one on every NVIDIA generation: a dense peak far
    # below half of it would be a different precision or accumulate mode slipped in
    assert d.peak_flops >= 0.45 * d.sparse_flops_bf16
    if d.peak_flops_fp8 is not None:        # FP8 tensor cores run at twice the BF16 rate
        assert d.peak_flops_fp8 == pytest.approx(2 * d.peak_flops, rel=0.02)
    assert 0 < d.memory_bytes < 100 * 2 ** 30 and d.hbm_bytes_s > 5e11


def test_a_sparsity_figure_as_the_dense_peak_is_refused():
    raw = dict(_profiles()["L40S"])
    raw["peak_tflops_bf16"] = raw["sparse_tflops_bf16"]          # 733: the with-sparsity number
    with pytest.raises(ConfigError, match=r"hardware\.peak_tflops_bf16: got 733.*sparsity"):
        load_device(raw, "hardware")


def test_datasheet_dense_figures():
    """The numbers the datasheets give (dense, FP32 accumulate), pinned so an edit is deliberate."""
    want = {"H100-SXM": (989.4, 1978.9, 3350, 80), "A100-80GB": (312, None, 2039, 80),
            "A100-40GB": (312, None, 1555, 40), "L40S": (362.05, 733, 864, 48), "A40": (149.7, None, 696, 48),
            "RTX4090": (165.2, 330.3, 1008, 24), "RTXPRO6000": (503.8, 1007.6, 1792, 96)}
    assert set(want) == set(device_names())
    for name, (bf16, fp8, bw, gb) in want.items():
        d = load_device(name)
        assert d.peak_flops == pytest.approx(bf16 * 1e12)
        assert (d.peak_flops_fp8 and d.peak_flops_fp8 / 1e12) == (fp8 and pytest.approx(fp8))
        assert d.hbm_bytes_s == pytest.approx(bw * 1e9)
        # CUDA's total is a little below the marketing size (GB or GiB depending on the vendor's count)
        assert 0.9 * gb * 1e9 < d.memory_bytes <= gb * 2 ** 30


def test_peak_for_compute_dtype():
    h100, a100 = load_device("H100-SXM"), load_device("A100-80GB")
    assert h100.peak_flops_for("fp8") == pytest.approx(1978.9e12)
    assert h100.peak_flops_for("bf16") == h100.peak_flops
    assert a100.peak_flops_for("fp8") == a100.peak_flops            # no FP8 tensor cores: weight-only FP8
    assert a100.peak_flops_for("int8") == pytest.approx(624e12)
    inline = load_device({"peak_tflops_bf16": 100, "hbm_gb_s": 1000, "memory_gb": 24})
    assert inline.peak_flops_for("fp8") == inline.peak_flops and inline.source == ""


def test_every_draft_profile_is_sourced():
    for name in draft_profiles():
        assert load_draft_profile(name, "speculation").source, name
