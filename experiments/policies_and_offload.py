"""Scheduling policies and the CPU KV tier against the behaviour they are known for:

1. priority scheduling keeps the high class's TTFT under overload, FCFS does not (vLLM's
   --scheduling-policy priority; scenarios/priority_classes.yaml);
2. EDF (least slack first) meets a tight class's TTFT target that FCFS misses at ~90 % load
   (scenarios/edf_slo_classes.yaml);
3. a CPU tier raises the prefix hit rate and lowers TTFT when the shared prefixes do not fit in
   GPU KV, and does nothing once it is smaller than the working set (scenarios/kv_offload_cpu.yaml,
   2,000 requests, swept over cpu_gb).

    python experiments/policies_and_offload.py        # ~2 min; writes docs/policies-offload.{json,png}
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

import dsim

ROOT = Path(__file__).resolve().parents[1]
SCN = ROOT / "scenarios"


def ttft_by(res, key) -> dict:
    out: dict = {}
    for r in res.requests:
        if r.t_first_token is not None:
            out.setdefault(key(r), []).append((r.t_first_token - r.arrival) * 1e3)
    return {k: {"p50": float(np.percentile(v, 50)), "p99": float(np.percentile(v, 99)), "n": len(v)}
            for k, v in sorted(out.items())}


def priority_study() -> dict:
    rows = {}
    for pol in ("fcfs", "priority", "age_weighted"):
        over = [f"engine.scheduling_policy={pol}"] + (["engine.age_weight=0.05"] if pol == "age_weighted" else [])
        res = dsim.run(str(SCN / "priority_classes.yaml"), overrides=over, plots=False)
        rows[pol] = ttft_by(res, lambda r: r.tenant)
    return rows


def edf_study() -> dict:
    rows = {}
    for pol in ("fcfs", "edf"):
        res = dsim.run(str(SCN / "edf_slo_classes.yaml"), overrides=[f"engine.scheduling_policy={pol}"], plots=False)
        rows[pol] = {name: {"ttft_p99_ms": c["ttft_ms"]["p99"], "slo_attainment": c["slo_attainment"]}
                     for name, c in res.summary["slo_classes"].items()}
        rows[pol]["all"] = {"slo_attainment": res.summary["goodput"]["fraction"]}
    return rows


def offload_study() -> list:
    rows = []
    for gb in (0, 5, 25, 50, 100, 200):
        over = ["workload.num_requests=2000"] + (["engine.kv_offload=null"] if gb == 0 else [f"engine.kv_offload.cpu_gb={gb}"])
        s = dsim.run(str(SCN / "kv_offload_cpu.yaml"), overrides=over, plots=False).summary
        k = s["kv_cache"]
        rows.append({"cpu_gb": gb, "gpu_hit_rate": k["prefix_hit_rate"],
                     "cpu_hit_rate": k.get("cpu_tier", {}).get("hit_rate", 0.0),
                     "ttft_p50_ms": s["latency_ms"]["ttft"]["p50"], "ttft_p99_ms": s["latency_ms"]["ttft"]["p99"],
                     "slo_fraction": s["goodput"]["fraction"]})
    return rows


def plot(pri: dict, off: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    pols = list(pri)
    x = np.arange(len(pols))
    for i, cls in enumerate(("chat", "batch")):
        a.bar(x + (i - 0.5) * 0.35, [pri[p][cls]["p50"] / 1e3 for p in pols], 0.35, label=f"{cls} TTFT p50")
    a.set_xticks(x, ["fcfs", "priority", "age_weighted\n(0.05/s)"])
    a.set_yscale("log")
    a.set_ylabel("TTFT p50 (s, log)")
    a.set_title("priority_classes.yaml (overloaded)")
    a.legend()
    gb = [r["cpu_gb"] for r in off]
    b.plot(gb, [100 * (r["gpu_hit_rate"] + r["cpu_hit_rate"]) for r in off], "o-", label="prefix hits, % of queried")
    b.set_xlabel("CPU tier (GB)")
    b.set_ylabel("% of queried tokens")
    b2 = b.twinx()
    b2.plot(gb, [r["ttft_p50_ms"] for r in off], "s--", color="C3", label="TTFT p50 (ms)")
    b2.set_ylabel("TTFT p50 (ms)")
    b.set_title("kv_offload_cpu.yaml, 2,000 requests")
    b.legend(loc="center right")
    b2.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    pri, edf, off = priority_study(), edf_study(), offload_study()
    out = {"priority_classes_ttft_ms": pri, "edf_slo_classes": edf, "kv_offload_sweep": off}
    (ROOT / "docs" / "policies-offload.json").write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    plot(pri, off, ROOT / "docs" / "policies-offload.png")
    print("| policy | chat TTFT p50 / p99 ms | batch TTFT p50 / p99 ms |")
    print("|---|---|---|")
    for p, v in pri.items():
        print(f"| {p} | {v['chat']['p50']:,.0f} / {v['chat']['p99']:,.0f} | {v['batch']['p50']:,.0f} / {v['batch']['p99']:,.0f} |")
    print("\n| policy | interactive TTFT p99 ms | interactive attainment | all attainment |")
    print("|---|---|---|---|")
    for p, v in edf.items():
        print(f"| {p} | {v['interactive']['ttft_p99_ms']:,.0f} | {v['interactive']['slo_attainment']:.1%} | "
              f"{v['all']['slo_attainment']:.1%} |")
    print("\n| CPU tier GB | GPU hits | CPU hits | TTFT p50 ms | TTFT p99 ms | meet SLO |")
    print("|---|---|---|---|---|---|")
    for r in off:
        print(f"| {r['cpu_gb']} | {r['gpu_hit_rate']:.1%} | {r['cpu_hit_rate']:.1%} | {r['ttft_p50_ms']:,.0f} | "
              f"{r['ttft_p99_ms']:,.0f} | {r['slo_fraction']:.1%} |")


if __name__ == "__main__":
    main()
