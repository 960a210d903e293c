"""Generate valid scenarios by mutating the shipped ones within their legal ranges, run each with
every invariant checked after every step, and report any crash, hang, invariant failure or lost
request.  Where fuzz_keys.py feeds hostile values (which must be one-line errors), this feeds
plausible ones (which must simulate correctly).

    python experiments/valid_scenarios.py [--runs 2000] [--seed 0]      # ~15 min on 2 cores

Each case: a shipped scenario (its requests capped at 20-120), then 1-4 mutations drawn from the
generic ones below (scale a number, toggle an engine feature, starve the KV cache, pick another
engine generation, latency model, router or load) and a new seed.  A case passes when it ends
with a result whose request counts add up (completed + rejected + unfinished = submitted,
the requests that arrived) or is refused with a configuration error; the share of refused cases is reported.
"""
from __future__ import annotations

import argparse
import copy
import os
import random
import signal
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))    # after site-packages: an installed dsim wins over the checkout
import dsim  # noqa: E402
from dsim.cluster.routers import ROUTERS  # noqa: E402
from dsim.config.errors import ConfigError  # noqa: E402

LATENCY = ({"model": "roofline"}, {"model": "unified5"}, {"model": "physics"},
           {"model": "blackbox", "beta": [2000, 30, 0.02]}, {"model": "roofline", "overlap": 0.5})
VERSIONS = ("0.1.7", "0.4.0", "0.6.3", "0.15.1")
V0 = ("0.1.7", "0.4.0")                       # generations without chunked prefill
SKIP = ("name", "description", "seed", "output")


class _Timeout(BaseException):
    pass


def _alarm(*_):
    raise _Timeout()


def numeric_leaves(node, prefix=()):
    """(path, value) of every int/float leaf (bools excluded)."""
    if isinstance(node, dict):
        for k, v in node.items():
            if prefix == () and k in SKIP:
                continue
            yield from numeric_leaves(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from numeric_leaves(v, prefix + (i,))
    elif isinstance(node, (int, float)) and not isinstance(node, bool):
        yield prefix, node


def put(doc, path, value):
    node = doc
    for p in path[:-1]:
        node = node[p]
    node[path[-1]] = value


def mutate(doc: dict, rng: random.Random) -> list:
    """Apply 1-4 plausible changes in place; return their descriptions."""
    done = []
    eng = doc.setdefault("engine", {})
    for _ in range(rng.randint(1, 4)):
        kind = rng.choice(("scale", "scale", "toggle", "kv", "version", "latency", "router", "load", "seqs",
                           "admission", "loss", "gamma", "mode", "policy", "offload", "parallel", "slo"))
        if kind == "scale":
            leaves = list(numeric_leaves(doc))
            if not leaves:
                continue
            path, v = rng.choice(leaves)
            f = rng.choice((0.25, 0.5, 2.0, 4.0))
            nv = max(1, round(v * f)) if isinstance(v, int) else v * f
            if isinstance(v, float) and 0 < v <= 1 and nv > 1:      # shares and efficiencies stay shares
                nv = 1.0
            put(doc, path, nv)
            done.append(f"{'.'.join(map(str, path))}={nv}")
        elif kind == "toggle":
            k = rng.choice(("enable_chunked_prefill", "enable_prefix_caching"))
            eng[k] = not eng.get(k, True)
            done.append(f"engine.{k}={eng[k]}")
            if k == "enable_chunked_prefill" and not eng[k]:    # vLLM's rule: a budget >= max_model_len
                eng["max_model_len"] = 2048
                done.append("engine.max_model_len=2048")
        elif kind == "kv":
            eng["num_gpu_blocks"] = rng.choice((64, 200, 1000))
            done.append(f"engine.num_gpu_blocks={eng['num_gpu_blocks']}")
        elif kind == "version":
            eng["vllm_version"] = rng.choice(VERSIONS)
            done.append(f"engine.vllm_version={eng['vllm_version']}")
            if eng["vllm_version"] in V0:        # V0 prefills whole prompts: budget >= max_model_len
                eng["max_model_len"] = 2048
                eng["max_num_batched_tokens"] = max(2048, eng.get("max_num_batched_tokens", 0))
        elif kind == "latency" and "speculation" not in doc:
            doc["latency"] = copy.deepcopy(rng.choice(LATENCY))
            done.append(f"latency={doc['latency']}")
        elif kind == "router" and isinstance(doc.get("cluster"), dict):
            doc["cluster"]["router"] = rng.choice(sorted(ROUTERS))
            done.append(f"cluster.router={doc['cluster']['router']}")
        elif kind == "load" and isinstance(doc.get("workload"), dict) and "rate" in doc["workload"]:
            r = doc["workload"]["rate"]
            if isinstance(r, (int, float)):
                doc["workload"]["rate"] = r * rng.choice((0.2, 3.0, 10.0))
                done.append(f"workload.rate={doc['workload']['rate']}")
        elif kind == "admission" and isinstance(doc.get("cluster"), dict):
            doc["cluster"]["admission"] = rng.choice((
                {"policy": "queue_cap", "max_waiting": rng.choice((0, 4, 64))},
                {"policy": "token_bucket", "rate": rng.choice((1.0, 20.0)), "burst": 5},
                {"policy": "slo_guard"}))
            done.append(f"cluster.admission={doc['cluster']['admission']}")
        elif kind == "loss" and isinstance(doc.get("network"), dict):
            doc["network"]["loss_pct"] = rng.choice((1.0, 20.0))
            doc["network"]["max_retries"] = rng.choice((0, 1, 3))
            done.append(f"network.loss_pct={doc['network']['loss_pct']} max_retries={doc['network']['max_retries']}")
        elif kind == "gamma" and isinstance(doc.get("speculation"), dict):
            pol = rng.choice(("static", "acceptance_backoff", "specpp", "backpressure", "pid", "bandit"))
            doc["speculation"]["gamma"] = {"policy": pol} if pol != "static" else {"policy": "static", "k": rng.randint(1, 8)}
            done.append(f"speculation.gamma={doc['speculation']['gamma']}")
        elif kind == "mode" and isinstance(doc.get("speculation"), dict):
            doc["speculation"]["mode"] = rng.choice(("fused", "distributed", "hybrid", "off"))
            done.append(f"speculation.mode={doc['speculation']['mode']}")
        elif kind == "policy":
            eng["scheduling_policy"] = rng.choice(("fcfs", "priority", "edf", "age_weighted"))
            done.append(f"engine.scheduling_policy={eng['scheduling_policy']}")
        elif kind == "offload":
            eng["kv_offload"] = {"cpu_gb": rng.choice((0.05, 1, 50)), "policy": rng.choice(("write_through", "on_evict")),
                                 "overlap": rng.random() < 0.5}
            done.append(f"engine.kv_offload={eng['kv_offload']}")
        elif kind == "parallel":
            k = rng.choice(("pipeline_parallel_size", "data_parallel_size"))
            eng[k] = 2
            if k == "data_parallel_size":
                eng["enable_expert_parallel"] = True
            done.append(f"engine.{k}=2")
        elif kind == "slo":
            doc.setdefault("slo", {})["ttft_ms"] = rng.choice((50, 500, 5000))
            done.append(f"slo.ttft_ms={doc['slo']['ttft_ms']}")
        elif kind == "seqs":
            eng["max_num_seqs"] = rng.choice((1, 2, 8, 64))
            done.append(f"engine.max_num_seqs={eng['max_num_seqs']}")
    return done


def case(base: Path, rng: random.Random) -> tuple:
    doc = yaml.safe_load(base.read_text())
    doc["seed"] = rng.randrange(1 << 30)
    doc.setdefault("output", {})["plots"] = False
    wl = doc.get("workload")
    if isinstance(wl, dict) and wl.get("type") != "mix":      # every other kind takes num_requests as a cap
        wl["num_requests"] = rng.randint(20, 120)
    changes = mutate(doc, rng)
    if isinstance(wl, dict) and isinstance(wl.get("num_requests"), int):
        wl["num_requests"] = min(wl["num_requests"], 240)
    return doc, changes


def run_one(doc: dict, base_dir: Path, timeout: int) -> tuple:
    """('ok' | 'refused' | 'hang' | 'crash' | 'lost', detail); relative paths resolve from base_dir."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    here = os.getcwd()
    try:
        os.chdir(base_dir)
        res = dsim.run(doc, check_invariants=True)
    except _Timeout:
        return "hang", f"over {timeout} s"
    except ConfigError as e:
        return "refused", str(e).splitlines()[0][:160]
    except Exception as e:                                  # noqa: BLE001 - what we are looking for
        return "crash", f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    finally:
        signal.alarm(0)
        os.chdir(here)
    q = res.summary["requests"]
    parts = q["completed"] + q["rejected"] + q.get("unfinished", 0)       # submitted = arrived
    if parts != q["submitted"]:
        return "lost", f"{q}"
    return "ok", ""


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=int, default=60)
    a = ap.parse_args(argv)
    bases = sorted((ROOT / "scenarios").glob("*.yaml"))
    rng = random.Random(a.seed)
    counts: dict = {}
    t0 = time.time()
    for i in range(a.runs):
        base = rng.choice(bases)
        doc, changes = case(base, rng)
        what, detail = run_one(doc, base.parent, a.timeout)
        counts[what] = counts.get(what, 0) + 1
        if what not in ("ok", "refused"):
            print(f"case {i}: {base.stem} {' '.join(changes)}: {what}: {detail}", flush=True)
    print(f"{a.runs} cases in {time.time() - t0:.0f} s: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
    return 1 if set(counts) - {"ok", "refused"} else 0


if __name__ == "__main__":
    sys.exit(main())
