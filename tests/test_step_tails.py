"""latency.tail (dsim.latency.tails) and the per-step kernel noise of VIDUR's operator profiles
(dsim.latency.kernel_noise): the factor's moments, the step sigma by hand, off is byte-identical."""
import csv
import math
from pathlib import Path

import numpy as np
import pytest

import dsim
from dsim.config.errors import ConfigError
from dsim.latency import kernel_noise as KN
from dsim.latency.base import BatchShape
from dsim.latency.lut import Z95, lognormal_params
from dsim.latency.tails import TailStepModel, sigma_of_cv, sigma_of_p95

from helpers import scenario


class _Const:
    name = "const"

    def step_time(self, b):
        return 0.01


def _draws(model, n=20_000):
    b = BatchShape(decode_tokens=1, decode_ctx_sum=100, num_sampled=1, running=1)
    return np.array([model.step_time(b) for _ in range(n)]) / 0.01


def test_mean_one_lognormal_factor_has_the_stated_p95_and_cv():
    """20k draws: mean 1 (within 5 standard errors), the stated p95 / cv within sampling tolerance."""
    x = _draws(TailStepModel(_Const(), np.random.default_rng(4), sigma=sigma_of_p95(1.3)))
    cv = math.sqrt(math.expm1(sigma_of_p95(1.3) ** 2))
    assert abs(x.mean() - 1) < 5 * cv / math.sqrt(len(x))
    assert abs(np.quantile(x, 0.95) / 1.3 - 1) < 0.015
    y = _draws(TailStepModel(_Const(), np.random.default_rng(5), sigma=sigma_of_cv(0.2)))
    assert abs(y.mean() - 1) < 5 * 0.2 / math.sqrt(len(y))
    assert abs(y.std() / 0.2 - 1) < 0.04
    # the p95 inversion is the LUT's: the same lognormal both ways
    s = sigma_of_p95(1.3)
    assert math.isclose(math.exp(Z95 * s - s * s / 2), 1.3, rel_tol=1e-12)


def _profile(tmp_path):
    """A hand-made mlp.csv: ops emb, input_layernorm, add at 1 (twice), 3 tokens; a TP-2 row ignored."""
    ops = ("emb", "input_layernorm", "add")
    head = [f"time_stats.{op}.{s}" for op in ops for s in ("min", "max", "mean", "median", "std")]
    head += ["num_tokens", "num_tensor_parallel_workers"]
    stds = {  # (num_tokens, tp) -> std of emb, input_layernorm, add (ms)
        (1, 1): (0.002, 0.0002, 0.001), (1, 1, "dup"): (0.004, 0.0002, 0.001),
        (3, 1): (0.006, 0.003, 0.002), (3, 2): (9.0, 9.0, 9.0)}
    lines = [",".join(head)]
    for key, ss in stds.items():
        cells = [v for s in ss for v in ("0.1", "0.2", "0.15", "0.15", str(s))]
        lines.append(",".join(cells + [str(key[0]), str(key[1])]))
    p = tmp_path / "mlp.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


def test_step_sigma_from_a_hand_made_profile_equals_the_hand_computed_value(tmp_path):
    ops = KN.operator_noise(_profile(tmp_path), 1, ("emb", "input_layernorm", "add", "mlp_act"))
    assert set(ops) == {"emb", "input_layernorm", "add"}
    q = 1e-3 ** 2 / 12                         # the 1-us timer's rounding variance (Sheppard)

    def s(*stds):                               # duplicates averaged in variance, rounding noise taken out
        return math.sqrt(sum(max(x * x - q, 0) for x in stds) / len(stds))
    emb1, emb3 = s(0.002, 0.004), s(0.006)
    ln1, ln3 = 0.0, s(0.003)                   # 0.2 us is below the rounding noise: no kernel noise
    add1, add3 = s(0.001), s(0.002)
    calls = {"input_layernorm": 1, "add": 2}
    L = 4
    # 2 tokens: halfway between the profiled 1 and 3; 6 tokens: twice the std at 3 (held relative)
    for n, (e, ln, a) in ((2, ((emb1 + emb3) / 2, (ln1 + ln3) / 2, (add1 + add3) / 2)),
                          (6, (2 * emb3, 2 * ln3, 2 * add3)), (1, (emb1, ln1, add1))):
        corr = e + L * (ln + 2 * a)
        ind = math.sqrt(e * e + L * (ln * ln + 2 * a * a))
        assert math.isclose(float(KN.step_sigma_ms(n, ops, calls, L)), corr, rel_tol=1e-12)
        assert math.isclose(float(KN.step_sigma_ms(n, ops, calls, L, correlation="independent")), ind, rel_tol=1e-12)
        assert ind <= corr
    # the all-reduce: two per layer, at the step's message size
    ar = KN.NoiseCurve([1000, 3000], [0.002, 0.004])
    got = float(KN.step_sigma_ms(1, {}, {}, L, ar, 2000.0))
    assert math.isclose(got, 2 * L * (s(0.002) + s(0.004)) / 2, rel_tol=1e-12)
    # the p95 a LUT row gets: the lognormal with this mean and std, which the sampler inverts back
    p95 = KN.lognormal_p95(10.0, 0.5)
    mu, sig = lognormal_params(10.0, p95)
    assert math.isclose(math.sqrt(math.expm1(sig * sig)) * 10.0, 0.5, rel_tol=1e-9)
    assert KN.lognormal_p95(10.0, 0.0) == 10.0
    with pytest.raises(ValueError):
        KN.step_sigma_ms(1, ops, calls, L, correlation="partly")


def test_vidur_own_tail_samples_its_profile_sigma():
    """latency.tail: true on vidur: a step's draws have the model's mean and its profile std."""
    from dsim.config.engine import EngineConfig
    from dsim.config.hardware import load_device
    from dsim.config.model import load_model
    from dsim.config.schema.latency import parse_latency
    from dsim.latency.base import LatencyContext
    from dsim.latency.registry import build_latency
    m, d = load_model("meta-llama/Llama-2-7b-hf", "model", Path.cwd()), load_device("H100-SXM", "hardware")
    ctx = LatencyContext(m, d, EngineConfig(max_num_batched_tokens=2048), 1 << 16, np.random.default_rng(2))
    host = {"step_us": 0, "per_seq_us": 0, "per_prefill_us": 0, "eager_layer_us": 0, "eager_layer_per_seq_us": 0}
    plain = build_latency(parse_latency({"model": "vidur", "host": host}), ctx)[0]
    step, _, desc = build_latency(parse_latency({"model": "vidur", "host": host, "tail": True}), ctx)
    assert desc["tail"]["correlation"] == "correlated"
    b = BatchShape(prefill_tokens=512, num_prefill=1, prefill_attn_pairs=512 * 513 // 2, num_sampled=1, running=1)
    mean = plain.step_time(b)
    sd = plain.gpu.step_sigma(b) if hasattr(plain, "gpu") else plain.step_sigma(b)
    assert 0 < sd / mean < 0.05
    x = np.array([step.step_time(b) for _ in range(20_000)])
    assert abs(x.mean() / mean - 1) < 5 * sd / mean / math.sqrt(len(x))
    assert abs(x.std() / sd - 1) < 0.04
    # tail.correlation reaches the draws: independent operators spread a step ~10x less here
    step_i = build_latency(parse_latency({"model": "vidur", "host": host,
                                          "tail": {"correlation": "independent"}}), ctx)[0]
    sd_i = plain.gpu.step_sigma(b, "independent") if hasattr(plain, "gpu") else plain.step_sigma(b, "independent")
    assert sd_i < sd / 3
    xi = np.array([step_i.step_time(b) for _ in range(4000)])
    assert abs(xi.std() / sd_i - 1) < 0.1


def _rows(tmp_path, latency, name, **extra):
    out = tmp_path / name
    wl = {"type": "poisson", "rate": 40, "num_requests": 150, "prompt_tokens": 200, "output_tokens": 24}
    dsim.run(scenario(latency=latency, workload=wl, **extra), str(out), plots=False)
    return (out / "requests.csv").read_bytes(), list(csv.DictReader(open(out / "requests.csv")))


def test_tail_off_is_byte_identical_and_on_widens_tpot(tmp_path):
    """tail: false (the default) changes no byte; {cv} keeps the arrivals, widens the TPOT tail, and
    ``seeds: {jitter}`` moves only the draws."""
    base = {"model": "blackbox", "beta": [1000, 2, 20]}
    plain, rows = _rows(tmp_path, base, "a")
    assert _rows(tmp_path, {**base, "tail": False}, "b")[0] == plain
    _, tail = _rows(tmp_path, {**base, "tail": {"cv": 0.3}}, "c")
    _, other = _rows(tmp_path, {**base, "tail": {"cv": 0.3}}, "d", seeds={"jitter": 99})
    key = ("arrival_s", "prompt_tokens", "output_tokens")
    for r in (tail, other):
        assert [tuple(x[k] for k in key) for x in r] == [tuple(x[k] for k in key) for x in rows]
    tpot = lambda rs: np.array([float(x["tpot_ms"]) for x in rs if x["tpot_ms"]])   # noqa: E731
    assert np.quantile(tpot(tail), 0.99) > np.quantile(tpot(rows), 0.99)
    assert [x["tpot_ms"] for x in other] != [x["tpot_ms"] for x in tail]


def test_own_tail_refused_for_a_model_without_one():
    with pytest.raises(ConfigError, match=r"latency.tail: .*only lut and vidur"):
        dsim.run(scenario(latency={"model": "blackbox", "beta": [1000, 0, 0], "tail": True}))


def test_a_given_spread_carries_to_the_fallback_tier_and_no_rng_means_the_mean():
    """{cv} on a chain's head applies to the tier used; an estimate without an rng reads the mean."""
    from dsim.config.engine import EngineConfig
    from dsim.config.hardware import load_device
    from dsim.config.model import load_model
    from dsim.config.schema.latency import parse_latency
    from dsim.latency.base import LatencyContext
    from dsim.latency.registry import build_latency
    m, d = load_model("meta-llama/Llama-3.1-8B", "model", Path.cwd()), load_device("H100-SXM", "hardware")
    lat = parse_latency({"model": "vidur", "tail": {"cv": 0.1}, "fallback": ["roofline"]})
    ctx = LatencyContext(m, d, EngineConfig(), 1 << 16, np.random.default_rng(0))
    step, _, desc = build_latency(lat, ctx)
    assert desc["provider"]["used"] == "roofline" and desc["tail"]["cv"] == 0.1
    b = BatchShape(decode_tokens=8, decode_ctx_sum=8000, num_sampled=8, running=8)
    mean_step = build_latency(lat, ctx._replace(rng=None))[0]
    x = np.array([step.step_time(b) for _ in range(4000)])
    assert len(set(x)) == len(x)
    assert len({mean_step.step_time(b) for _ in range(3)}) == 1
