"""Speed of each latency model, the VIDUR build time, the LUT round trip, and the seed-001
decode numbers quoted in docs/latency-models.md.

    python experiments/latency_model_speed.py      # ~40 s on 2 cores
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
import dsim  # noqa: E402
from dsim.config.hardware import load_device  # noqa: E402
from dsim.config.model import load_model  # noqa: E402
from dsim.latency.base import BatchShape  # noqa: E402
from dsim.latency.roofline import RooflineModel  # noqa: E402

L7 = "meta-llama/Llama-2-7b-hf"


def scn(latency, rate=10, n=5000):
    return {"name": "speed", "seed": 1, "model": L7, "hardware": "H100-SXM", "engine": {"max_num_seqs": 128},
            "latency": latency, "output": {"plots": False},
            "workload": {"type": "poisson", "rate": rate, "num_requests": n, "prompt_tokens": 500,
                         "output_tokens": 200}}


def speed():
    print("model            req/wall-s   steps/wall-s   (Llama-2-7B H100, 5,000 requests, after a warm-up)")
    for m in ("roofline", "unified5", "physics", "vidur", "lut", "calibrated_tps"):
        lat = {"model": m}
        if m == "lut":
            lat["path"] = str(ROOT / "luts" / "llama-2-7b_h100_tp1.csv")
        s = scn(lat, rate=1 if m == "calibrated_tps" else 10)
        dsim.run(s)
        t = time.perf_counter()
        r = dsim.run(s)
        dt = time.perf_counter() - t
        print(f"{m:16s} {5000 / dt:10,.0f}   {r.summary['scheduler']['steps'] / dt:12,.0f}")


def vidur_build():
    code = ("import time; t=time.perf_counter(); from dsim.config.model import load_model; "
            "from dsim.config.hardware import load_device; from dsim.latency.vidur import VidurModel; "
            "t1=time.perf_counter(); VidurModel(load_model('%s'), load_device('H100-SXM'), %d, max_tokens=2048); "
            "print(round(time.perf_counter()-t1, 3))")
    with tempfile.TemporaryDirectory() as td:
        env = dict(os.environ, DSIM_CACHE_DIR=td)
        for model, tp in ((L7, 1), ("meta-llama/Llama-2-70b-hf", 4)):
            cold = subprocess.run([sys.executable, "-c", code % (model, tp)], env=env, capture_output=True, text=True)
            warm = subprocess.run([sys.executable, "-c", code % (model, tp)], env=env, capture_output=True, text=True)
            print(f"vidur build {model} TP{tp}: cold {cold.stdout.strip()} s, cached {warm.stdout.strip()} s "
                  "(after imports)")


def lut_round_trip():
    with tempfile.TemporaryDirectory() as td:
        out = Path(td) / "l7.csv"
        subprocess.run([sys.executable, "-m", "dsim.cli", "lut", "build", "--model", L7, "--hardware", "H100-SXM",
                        "--latency", "roofline", "--out", str(out)], check=True, capture_output=True)
        wl = {"type": "poisson", "rate": 5, "num_requests": 200, "prompt_tokens": 512, "output_tokens": 128}
        a = dsim.run(dict(scn({"model": "roofline"}), workload=wl)).summary["latency_ms"]
        b = dsim.run(dict(scn({"model": "lut", "path": str(out)}), workload=wl)).summary["latency_ms"]
        print("LUT built from roofline vs roofline: " + ", ".join(
            f"{k.upper()} {b[k]['mean'] / a[k]['mean'] - 1:+.1%}" for k in ("ttft", "tpot", "e2e")))


def seed001_vs_roofline():
    r = RooflineModel(load_model(L7), load_device("A100-80GB"))
    for B in (1, 8, 64, 128):
        t = r.step_time(BatchShape(decode_tokens=B, decode_ctx_sum=B * 600, num_sampled=B))
        print(f"decode step, batch {B:3d}: seed 001 {math.sqrt(B) / 200 * 1e3:5.1f} ms, roofline A100 {t * 1e3:5.1f} ms")
    p = r.step_time(BatchShape(prefill_tokens=2048, num_prefill=4, prefill_attn_pairs=4 * 512 * 513 // 2,
                               num_sampled=4))
    print(f"prefill: seed 001 3,000 tokens/s, roofline A100 {2048 / p:,.0f} tokens/s")


if __name__ == "__main__":
    speed()
    vidur_build()
    lut_round_trip()
    seed001_vs_roofline()
