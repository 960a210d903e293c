"""Pipeline, data and expert parallelism in `dsim plan`'s spaces: a replica is TP x PP x DP GPUs in the
budget, in the screen and in deploy/ (dsim/explore/plan.py); P/D spaces refuse PP/DP (plan_pd.py)."""
from __future__ import annotations

from pathlib import Path

import yaml

from dsim.explore.plan import plan

ROOT = Path(__file__).resolve().parents[1]
QUICK = str(ROOT / "scenarios" / "quickstart.yaml")
MOE = str(ROOT / "scenarios" / "dp_ep_moe.yaml")


def _serve(out: Path, pool: str) -> str:
    return next(x for x in (out / "deploy" / "serve.sh").read_text().split("# pool ") if x.startswith(pool))


def _gpu_request(out: Path, pool: str) -> int:
    dep = next(d for d in yaml.safe_load_all((out / "deploy" / f"{pool}.k8s.yaml").read_text())
               if d["kind"] == "Deployment")
    return dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]


def test_pipeline_parallel_candidates_count_tp_x_pp_gpus(tmp_path):
    space = {"tensor_parallel_size": [1, 2], "replicas": "auto", "engine.pipeline_parallel_size": [2]}
    out = tmp_path / "p"
    res = plan(QUICK, space, gpus=4, slos=["ttft_p99_ms=500", "tpot_p99_ms=50"], band=False, screen_check=0,
               overrides=["workload.rate=40", "workload.num_requests=400"], out=out)
    got = {(c["tensor_parallel_size"], c["replicas"], c["gpus"]) for c in res["rows"]}
    assert got == {(1, 1, 2), (1, 2, 4), (2, 1, 4)}              # TP x PP x replicas <= 4, never more
    b = res["best"]
    assert (b["tensor_parallel_size"], b["replicas"], b["gpus"]) == (1, 1, 2)
    line = _serve(out, "main")
    assert "--tensor-parallel-size 1 --pipeline-parallel-size 2 --data-parallel-size 1" in line
    assert "1 replica(s) x 2 H100-SXM GPU(s)" in line and _gpu_request(out, "main") == 2


def test_moe_data_and_expert_parallel_is_planned_and_deployed(tmp_path):
    """Qwen3-30B-A3B at 40 req/s on one replica: DP ranks with EP. Each DP rank is a scheduler of its own, so
    the screen splits the replica's load over them (carrying it on one engine, it pruned DP=4, which passes);
    the best is DP=4 on 4 GPUs and its vllm serve line says so."""
    space = {"tensor_parallel_size": [1], "replicas": [1], "engine.data_parallel_size": [1, 2, 4]}
    out = tmp_path / "moe"
    res = plan(MOE, space, gpus=4, slos=["ttft_p99_ms=1000", "tpot_p99_ms=50"], band=False, screen_check=0,
               overrides=["workload.rate=40", "workload.num_requests=600"], out=out)
    rows = {c["engine.data_parallel_size"]: c for c in res["rows"]}
    assert {d: c["gpus"] for d, c in rows.items()} == {1: 1, 2: 2, 4: 4}
    assert rows[1]["screen"] == "pruned" and "per replica" in rows[1]["reason"]
    assert rows[4]["screen"] == "kept" and rows[4]["pass"]
    b = res["best"]
    assert b["engine.data_parallel_size"] == 4 and b["gpus"] == 4
    line = _serve(out, "main")
    assert "--data-parallel-size 4" in line and "--enable-expert-parallel" in line and _gpu_request(out, "main") == 4


def test_dense_model_data_parallel_is_pruned_with_the_engine_reason():
    space = {"tensor_parallel_size": [1], "replicas": [1], "engine.data_parallel_size": [2]}
    res = plan(QUICK, space, gpus=2, slos=["ttft_p99_ms=500"], band=False, screen_check=0,
               overrides=["workload.num_requests=100"])
    (row,) = res["rows"]
    assert row["screen"] == "pruned" and "data_parallel_size" in row["reason"] and "MoE" in row["reason"]
    assert res["best"] is None and res["simulated"] == 0


def test_pd_space_refuses_pipeline_and_data_parallel_roles(tmp_path, capsys):
    """The simulator does not run PP virtual engines or DP ranks in a prefill/decode pool (dsim.cluster.fleet):
    a P/D space that lists them is a path-qualified error before anything runs, not candidates that all fail."""
    from dsim.cli import main
    for key in ("engine.pipeline_parallel_size", "engine.data_parallel_size"):
        f = tmp_path / "space.yaml"
        f.write_text(yaml.safe_dump({"disaggregated": {"prefill": {key: [1, 2]}}}))
        code = main(["plan", QUICK, "--gpus", "4", "--space", str(f), "--slo", "ttft_p99_ms=300", "--out",
                     str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith(f"dsim: error: {f}: disaggregated.prefill.{key}: got [1, 2]"), err
        assert "not simulated in a prefill/decode pool" in err and not (tmp_path / "o").exists()
