import copy

BASE = {
    "seed": 3,
    "model": "meta-llama/Llama-3.1-8B",
    "hardware": "H100-SXM",
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 2048, "enable_prefix_caching": False},
    "latency": {"model": "blackbox", "beta": [1000, 0, 0]},
    "workload": {"type": "poisson", "rate": 10, "num_requests": 10, "prompt_tokens": 100, "output_tokens": 4},
    "output": {"plots": False},
}


def scenario(**over):
    """BASE with nested overrides: scenario(engine={'max_num_seqs': 1}) merges into engine."""
    s = copy.deepcopy(BASE)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(s.get(k), dict) and k not in ("workload", "latency"):
            s[k].update(v)
        else:
            s[k] = v
    return s


def trace_file(tmp_path, rows, name="t.jsonl"):
    import json
    p = tmp_path / name
    p.write_text("".join(json.dumps(dict(zip(("arrival_s", "prompt_tokens", "output_tokens"), r))) + "\n"
                         for r in rows))
    return p


def assert_refused(name, sets, key, tmp_path, capsys):
    """``dsim run scenarios/NAME.yaml --set S ...`` is refused as a user error: exit 2, one line that
    starts with the offending key's path, and nothing written."""
    from pathlib import Path

    from dsim.cli import main
    scn = str(Path(__file__).resolve().parents[1] / "scenarios" / f"{name}.yaml")
    args = [a for s in sets for a in ("--set", s)]
    code = main(["run", scn, *args, "--out", str(tmp_path / "o"), "--quiet", "--no-plots"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and err.startswith(f"dsim: error: {key}"), err
    assert not any(tmp_path.iterdir())


def bench_scenario(n: int, replicas: int = 1, **workload) -> dict:
    """`dsim bench`'s workload with ``n`` requests (and ``workload`` keys overridden); ``replicas``
    > 1 puts it behind JSQ at 20 req/s a replica, with TTFT/TPOT SLOs."""
    from dsim.bench import BENCH_SCENARIO
    s = copy.deepcopy(BENCH_SCENARIO)
    s["workload"].update(num_requests=n, **workload)
    if replicas > 1:
        s["cluster"] = {"router": "jsq", "pools": [{"name": "h100", "replicas": replicas}]}
        s["workload"]["rate"] = 20 * replicas
        s["slo"] = {"ttft_ms": 200, "tpot_ms": 30}
    return s


RUN_COLS = {"arrival_s": "arrival_s", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens",
            "first_token_s": "first_token_s", "last_token_s": "completion_s"}


def simulated_runs(tmp_path, models, latency, num_requests: int) -> list:
    """One simulated "real" run per model on one H100 engine (Poisson 12 req/s, uniform lengths),
    read back as dsim calibrate reads a generic CSV: what the stage-1 fitting tests calibrate on."""
    import dsim
    from dsim.calibrate.realrun import read_generic
    engine = {"max_num_seqs": 64, "enable_prefix_caching": False}
    runs = []
    for i, model in enumerate(models):
        dsim.run(scenario(seed=3 + i, model=model, latency=latency, engine=engine,
                          workload={"type": "poisson", "rate": 12.0, "num_requests": num_requests,
                                    "prompt_tokens": {"dist": "uniform", "min": 64, "max": 512},
                                    "output_tokens": {"dist": "uniform", "min": 16, "max": 256}}),
                 tmp_path / f"r{i}", plots=False)
        runs.append(read_generic(tmp_path / f"r{i}" / "requests.csv", RUN_COLS, model=model,
                                 hardware="H100-SXM", engine=engine))
    return runs


def lossy_pd(output_tokens) -> dict:
    """A prefill and a decode replica joined by a 1 Mbit/s link that loses half its packets and never
    retries: some KV transfers fail (what the P/D failure tests provoke)."""
    return {"model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "cluster": {"pools": [{"name": "prefill", "role": "prefill"}, {"name": "decode", "role": "decode"}]},
            "network": {"links": [{"src": "prefill-0", "dst": "decode-0", "rtt_ms": 2, "bw_mbps": 1}],
                        "loss_pct": 50, "max_retries": 0},
            "workload": {"type": "poisson", "rate": 50, "num_requests": 12, "prompt_tokens": 16,
                         "output_tokens": output_tokens}}
