"""Co-simulation and calibration: real-run readers, dsim cosim, vLLM trace streams, fitting."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from helpers import scenario

import dsim
from dsim.calibrate.cosim import cosimulate, replay_rows, replay_scenario
from dsim.calibrate.calibrate import UNIFIED5, loss_of, evaluate, stage2
from dsim.calibrate.fit import fit_traces
from dsim.calibrate.realrun import load_real, read_generic, read_vllm_bench
from dsim.calibrate.vllm_traces import alpha_table, beta_table, read_otlp
from dsim.cli import main
from dsim.config.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
REAL = ROOT.parent / "shared" / "data" / "real"
LSS = REAL / "llmservingsim-vllm" / "RTX4090_Llama-3.1-8B"
IPERF = REAL / "inference-perf-h100" / "20260217-231439-llama-2-7b-tp1-general"
BENCH = ROOT / "tests" / "fixtures" / "vllm_bench_detailed.json"
needs_real = pytest.mark.skipif(not LSS.is_dir(), reason="shared real runs not available")

ROUND_TRIP = yaml.safe_load((ROOT / "scenarios" / "trace_roundtrip.yaml").read_text())
U5_BETA = ROUND_TRIP["latency"]["beta"]
U5_ALPHA = ROUND_TRIP["latency"]["alpha"]


def u5_scenario(n=200, **kw):
    """scenarios/trace_roundtrip.yaml with n requests (and other top-level keys replaced)."""
    s = copy.deepcopy(ROUND_TRIP)
    s["workload"]["num_requests"] = n
    s.update(kw)
    return s


# ---- readers --------------------------------------------------------------------------------------------
@needs_real
def test_llmservingsim_reader_matches_raw_file():
    run = load_real(LSS)
    raw = [json.loads(x) for x in (LSS / "requests.jsonl").open()]
    assert run.source == "llmservingsim" and len(run.trace_rows) == len(raw) == 300
    assert run.scenario["hardware"] == "RTX4090"
    assert run.scenario["engine"]["num_gpu_blocks"] == 2588 and run.scenario["engine"]["max_num_seqs"] == 256
    ttft = [(r["first_token_ts"] - r["queued_ts"]) * 1e3 for r in raw]
    st = run.stages[0]
    assert st.real["ttft"]["mean"] == pytest.approx(np.mean(ttft))
    assert st.real["ttft"]["p90"] == pytest.approx(np.percentile(ttft, 90))
    q0 = min(r["queued_ts"] for r in raw)
    assert sorted(r["arrival_s"] for r in run.trace_rows)[0] == 0.0
    assert run.trace_rows[5]["arrival_s"] == pytest.approx(raw[5]["queued_ts"] - q0)


@needs_real
def test_inference_perf_reader_stages_and_overload():
    run = load_real(IPERF)
    assert run.source == "inference-perf" and [s.rate for s in run.stages] == [8.0, 20.0]
    assert (run.stages[1].t0, run.stages[1].t1) == (600.0, 1200.0)
    d = json.loads((IPERF / "results" / "stage_1_lifecycle_metrics.json").read_text())
    assert run.stages[1].real["ttft"]["p50"] == pytest.approx(
        d["successes"]["latency"]["time_to_first_token"]["median"] * 1e3)
    assert not run.overloaded
    over = load_real(REAL / "inference-perf-h100" / "20260217-170634-llama-2-7b-tp1-reasoning")
    assert over.overloaded and over.stages[0].failures > 0
    wl = run.scenario["workload"]      # the resolved client config (10 x 10 pool), not profile.yaml's 9 groups
    assert wl["shared_prefix"]["num_groups"] == 10 and wl["output_tokens"] == 248


SHIPPED_IPERF = ROOT / "examples" / "real" / "h100-llama-2-7b-tp1-general"


def test_inference_perf_reader_replays_the_clients_prompt_pool():
    """results/config.yaml (10 groups x 10 prompts) wins over profile.yaml (9 system prompts x 5 users,
    which that inference-perf release ignored): 100 full prompts, request n sends prompt n mod 100."""
    from dsim.core.rng import PartitionedRNG
    from dsim.workload.generator import build_requests
    run = load_real(SHIPPED_IPERF)
    assert run.meta["client_config"] == "results/config.yaml"
    assert any(n.startswith("prompts: a pool of 10 x 10 = 100 fixed prompts") for n in run.notes)
    scn = replay_scenario(run, None, (), 42)
    scn["workload"]["stages"] = [{"rate": 8.0, "duration_s": 30.0}]
    reqs, _ = build_requests(scn["workload"], PartitionedRNG(42), None)
    segs = [r.segments for r in reqs]
    assert len(reqs) == 240 and len(set(segs[:100])) == 100
    assert all(segs[i] == segs[i % 100] for i in range(len(segs)))
    assert {s[0] for s in segs} == {(g + 1, 100) for g in range(10)}          # 10 shared 100-token system prompts
    assert all(r.prompt_len == 100 + 447 for r in reqs)


def test_inference_perf_reader_falls_back_to_the_profile(tmp_path):
    import shutil
    shutil.copytree(SHIPPED_IPERF, tmp_path / "run")
    (tmp_path / "run" / "results" / "config.yaml").unlink()
    run = load_real(tmp_path / "run")
    sp = run.scenario["workload"]["shared_prefix"]
    assert run.meta["client_config"] == "profile.yaml" and "question_pool" not in sp
    assert (sp["num_groups"], sp["users_per_group"]) == (9, 5)


def test_replayed_prefix_hit_rate_is_the_pools():
    """Simulated prefix-cache hits equal the count computed from the pool alone: the first use of a
    group's first prompt hits nothing, the group's other first uses hit the system prompt's full blocks,
    every later use hits the whole prompt but its last token (vLLM recomputes it), in whole blocks."""
    run = load_real(SHIPPED_IPERF)
    scn = replay_scenario(run, None, (), 42)
    scn["workload"]["stages"] = [{"rate": 4.0, "duration_s": 80.0}]      # 320 requests, far from overload
    from dsim.config.scenario import load_scenario
    from dsim.runner import run as run_scenario
    res = run_scenario(load_scenario(scn))
    block = res.summary["kv_cache"]["block_size"]
    n, pool, per_group, sys_len, prompt = 320, 100, 10, 100, 547
    first_pass = 10 * (per_group - 1) * (sys_len // block) * block
    expected = first_pass + (n - pool) * ((prompt - 1) // block) * block
    assert res.summary["requests"]["completed"] == n
    assert res.summary["kv_cache"]["prefix_hit_tokens"] == expected


def test_vllm_bench_reader_fixture():
    run = read_vllm_bench(BENCH)
    st = run.stages[0]
    assert st.samples["ttft"] == pytest.approx([20, 30, 25, 18, 57])      # the failed request is dropped
    assert st.samples["e2e"][0] == pytest.approx(20 + 33)                   # TTFT + sum of ITLs
    assert st.samples["tpot"][1] == pytest.approx(10.0)                     # 4 gaps of 10 ms / (5 - 1)
    assert len(st.samples["tpot"]) == 4                                     # a 1-token request has no TPOT
    assert st.real["itl"]["count"] == 14
    a = replay_rows(run, 7)
    assert a == replay_rows(run, 7) and a != replay_rows(run, 8)            # seeded regeneration
    assert a[0]["arrival_s"] == 0.0 and all(x["arrival_s"] <= y["arrival_s"] for x, y in zip(a, a[1:]))


def test_vllm_bench_closed_loop_is_replayed_with_its_cap(tmp_path):
    d = json.loads(BENCH.read_text())
    d["max_concurrency"] = 2
    p = tmp_path / "b.json"
    p.write_text(json.dumps(d))
    run = read_vllm_bench(p)
    assert run.scenario["workload"]["max_concurrency"] == 2
    scn = replay_scenario(run, {"hardware": "H100-SXM"}, (), 1, tmp_path / "t.jsonl")
    assert scn["workload"]["max_concurrency"] == 2
    d["max_concurrency"] = 0
    p.write_text(json.dumps(d))
    with pytest.raises(ConfigError, match="max_concurrency: got 0"):
        read_vllm_bench(p)


def test_generic_reader_mapping_and_errors(tmp_path):
    p = tmp_path / "r.csv"
    p.write_text("t,inp,out,first,lat\n1000,100,5,1020,1100\n1500,200,1,1530,1530\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("t,inp,out,ttft,lat\n0,100,5,0.2,0.1\n")
    with pytest.raises(ConfigError, match=r"bad.csv:2: 0 <= TTFT <= E2E"):
        read_generic(bad, {"arrival_s": "t", "prompt_tokens": "inp", "output_tokens": "out", "ttft_s": "ttft",
                           "e2e_s": "lat"})
    cols = {"arrival_s": "t", "prompt_tokens": "inp", "output_tokens": "out", "first_token_s": "first",
            "last_token_s": "lat"}
    run = read_generic(p, cols, model="meta-llama/Llama-3.1-8B", hardware="H100-SXM", time_unit=1e-3)
    st = run.stages[0]
    assert st.samples["ttft"] == pytest.approx([20, 30]) and st.samples["e2e"] == pytest.approx([100, 30])
    assert st.samples["tpot"] == pytest.approx([20.0])
    assert [r["arrival_s"] for r in run.trace_rows] == pytest.approx([0.0, 0.5])
    with pytest.raises(ConfigError, match=r"r.csv:2.nope"):
        read_generic(p, {**cols, "arrival_s": "nope"})
    with pytest.raises(ConfigError, match=r"columns.bogus"):
        read_generic(p, {**cols, "bogus": "t"})


# ---- co-simulation ---------------------------------------------------------------------------------------
def test_cosim_of_dsims_own_output_is_exact(tmp_path):
    """Replaying dsim's own per-request output with the same settings must give ~0 error everywhere."""
    scn = scenario(workload={"type": "poisson", "rate": 20, "num_requests": 120, "prompt_tokens":
                             {"dist": "uniform", "low": 50, "high": 400}, "output_tokens": {"dist": "uniform",
                                                                                            "low": 2, "high": 60}},
                   latency={"model": "roofline"})
    res = dsim.run(scn, tmp_path / "orig")
    cols = {"arrival_s": "arrival_s", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens",
            "first_token_s": "first_token_s", "last_token_s": "completion_s"}
    run = read_generic(tmp_path / "orig" / "requests.csv", cols, model=scn["model"], hardware=scn["hardware"],
                       engine=scn["engine"])
    rep = cosimulate(run, {"latency": {"model": "roofline"}}, out_dir=tmp_path / "cos")
    for m in ("ttft", "tpot", "e2e"):
        c = rep["stages"][0]["metrics"][m]
        assert c["mape"] < 1e-3, (m, c)
        assert c["ks"] < 0.03
    assert res.summary["requests"]["completed"] == rep["stages"][0]["requests"]["sim_completed"]
    out = tmp_path / "cos"
    assert {p.name for p in out.iterdir()} >= {"cosim.json", "cosim.md", "scenario.yaml", "replay.jsonl", "plots"}
    # the saved scenario reruns the replay
    again = dsim.run(out / "scenario.yaml")
    assert again.summary["latency_ms"]["e2e"]["mean"] == pytest.approx(
        res.summary["latency_ms"]["e2e"]["mean"], rel=1e-4)


def test_cosim_detects_a_slower_simulator(tmp_path):
    scn = scenario(workload={"type": "poisson", "rate": 5, "num_requests": 60, "prompt_tokens": 300,
                             "output_tokens": 30}, latency={"model": "roofline"})
    dsim.run(scn, tmp_path / "orig")
    cols = {"arrival_s": "arrival_s", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens",
            "first_token_s": "first_token_s", "last_token_s": "completion_s"}
    run = read_generic(tmp_path / "orig" / "requests.csv", cols, model=scn["model"], hardware=scn["hardware"])
    rep = cosimulate(run, {"latency": {"model": "roofline", "compute_efficiency": 0.25,
                                       "memory_efficiency": 0.35}})
    e = rep["stages"][0]["metrics"]["tpot"]["error"]["mean"]
    assert e > 0.5            # a simulator with ~half the bandwidth is much slower, and the report says so


@needs_real
def test_cosim_cli_on_real_run(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["cosim", str(LSS), "--out", str(out), "--no-plots"]) == 0
    rep = json.loads((out / "cosim.json").read_text())
    assert set(rep["stages"][0]["metrics"]) == {"ttft", "tpot", "e2e"}
    assert rep["stages"][0]["metrics"]["e2e"]["ks"] is not None
    assert "MAPE" in capsys.readouterr().out
    assert "| all | TTFT | mean |" in (out / "cosim.md").read_text()


def test_cosim_engine_clock_run_takes_the_latency_model_from_set(tmp_path):
    """An engine-clock run (no API time) zeroes the API alpha of the model that will run, after
    --set: --set latency.model=physics used to receive the base roofline's 3-term [0, 0, 0]."""
    run = load_real(ROOT / "examples" / "real" / "RTX4090_Llama-3.1-8B")
    assert run.meta.get("clock") == "engine"
    t = tmp_path / "t.jsonl"
    phys = replay_scenario(run, None, ["latency.model=physics"], 1, t)
    assert phys["latency"] == {"model": "physics"}                 # physics keeps its own 11 alpha terms
    roof = replay_scenario(run, None, [], 1, t)
    assert roof["latency"]["alpha"] == [0.0, 0.0, 0.0]
    u5 = replay_scenario(run, {"latency": {"model": "roofline", "alpha": [9, 8, 7]}},
                         ["latency.model=unified5"], 1, t)
    assert u5["latency"]["alpha"] == [0.0, 8, 0.0]                 # unified5 keeps a1 (after the last token)
    kept = replay_scenario(run, None, ["latency.alpha=[5000, 0, 0]"], 1, t)
    assert kept["latency"]["alpha"] == [5000, 0, 0]                # an explicit --set alpha wins
    assert main(["cosim", str(ROOT / "examples" / "real" / "RTX4090_Llama-3.1-8B"), "--set", "latency.model=physics",
                 "--out", str(tmp_path / "c"), "--no-plots"]) == 0
    assert json.loads((tmp_path / "c" / "cosim.json").read_text())["stages"][0]["metrics"]["e2e"]["ks"] is not None


def test_simulate_run_with_a_latency_section_applies_the_engine_clock_rule():
    """Fits and validation pass their own latency section: an engine-clock replay must still drop
    the API alpha (it used to keep it, so held-out errors carried 15 ms of API time they never had)."""
    from dsim.calibrate.cosim import simulate_run
    run = load_real(ROOT / "examples" / "real" / "RTX4090_Llama-3.1-8B")
    _, scn = simulate_run(run, None, [], 1,
                          {"model": "roofline", "alpha": [15000.0, 0.3, 0.0]})
    assert scn["latency"]["alpha"] == [0.0, 0.0, 0.0]


def test_cosim_cli_bad_input_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "c"
    assert main(["cosim", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert main(["cosim", str(BENCH), "--out", str(out)]) == 2           # the file names no hardware
    err = capsys.readouterr().err
    assert "hardware" in err and "Traceback" not in err
    assert not out.exists()
    assert main(["cosim", str(BENCH), "--hardware", "H100-SXM", "--set", "latency.model=nope",
                 "--out", str(out)]) == 2
    assert not out.exists()


# ---- vLLM tracing streams ---------------------------------------------------------------------------------
def test_traces_reconstruct_every_step_exactly(tmp_path):
    """With preemption and prefix caching, the BatchShape rebuilt from snapshots equals the simulator's."""
    res = dsim.run(ROOT / "scenarios" / "staged_shared_prefix.yaml", vllm_traces=True)
    assert res.summary["scheduler"]["preemptions"] > 0 and res.summary["kv_cache"]["prefix_hit_rate"] > 0
    p = tmp_path / "t.otlp.jsonl"
    res.write_vllm_traces(p)
    rows = beta_table(read_otlp(p))
    rec = res.recorders[0][1]
    assert len(rows) == len(rec.steps) == res.instance.num_steps
    assert all(r.shape == s[3] for r, s in zip(rows, rec.steps))
    assert sum(r.duration_s for r in rows) == pytest.approx(res.instance.busy_time, rel=1e-6)


def test_journey_events_and_alpha_table(tmp_path):
    res = dsim.run(u5_scenario(60), vllm_traces=True)
    p = tmp_path / "t.otlp.jsonl"
    res.write_vllm_traces(p)
    tr = read_otlp(p)
    j = tr.journeys[("replica0", "7")]
    order = ["ARRIVED", "QUEUED", "SCHEDULED", "FIRST_TOKEN", "FIRST_RESPONSE", "FINISHED", "DEPARTED"]
    times = [j[k][0] for k in order]
    assert times == sorted(times)
    r = next(x for x in res.requests if x.rid == 7)
    assert j["FIRST_RESPONSE"][0] == pytest.approx(r.t_first_token, abs=1e-9)
    rows = alpha_table(tr)
    assert len(rows) == 60
    assert all(a.api_delay_s == pytest.approx(0.012, abs=1e-8) for a in rows)
    assert all(a.token_overhead_s == pytest.approx(4e-6, abs=1e-8) for a in rows)


def test_tracing_does_not_change_results_and_is_deterministic(tmp_path):
    plain = dsim.run(u5_scenario(80), tmp_path / "a")
    for d in ("b", "c"):
        dsim.run(u5_scenario(80), tmp_path / d, vllm_traces={"step_rate": 0.5, "rich_rate": 0.5})
    assert (tmp_path / "a" / "requests.csv").read_bytes() == (tmp_path / "b" / "requests.csv").read_bytes()
    t1 = (tmp_path / "b" / "vllm_traces.otlp.jsonl").read_bytes()
    assert t1 == (tmp_path / "c" / "vllm_traces.otlp.jsonl").read_bytes()
    rows = beta_table(read_otlp(tmp_path / "b" / "vllm_traces.otlp.jsonl"))
    n = plain.instance.num_steps
    assert 0.4 * n < len(rows) < 0.6 * n
    assert 0.35 < sum(r.rich for r in rows) / len(rows) < 0.65


def test_emit_vllm_traces_cli(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(u5_scenario(30)))
    assert main(["run", str(sc), "--quiet", "--out", str(tmp_path / "o"), "--emit-vllm-traces"]) == 0
    first = json.loads((tmp_path / "o" / "vllm_traces.otlp.jsonl").read_text().splitlines()[0])
    scope = first["resourceSpans"][0]["scopeSpans"][0]
    assert scope["scope"]["name"] == "vllm.api" and scope["spans"][0]["name"] == "llm_request"
    assert main(["run", str(sc), "--quiet", "--out", str(tmp_path / "p"), "--emit-vllm-traces",
                 "--trace-step-rate", "0"]) == 2
    assert not (tmp_path / "p").exists()


def test_traces_name_each_pools_model_and_gpu(tmp_path):
    res = dsim.run(ROOT / "scenarios" / "hetero_fleet.yaml", vllm_traces=True,
                   overrides=["workload.classes[0].num_requests=20", "workload.classes[1].num_requests=20"])
    p = tmp_path / "t.otlp.jsonl"
    res.write_vllm_traces(p)
    tr = read_otlp(p)
    want = {rep.name: (rep.pool.spec.model.name, rep.pool.spec.device.name) for rep in res.fleet.replicas()}
    got = {k: (v["dsim.model"], v["dsim.hardware"]) for k, v in tr.resources.items()}
    assert got == want and len({hw for _, hw in got.values()}) > 1


def test_bad_trace_file_is_a_clear_error(tmp_path):
    p = tmp_path / "x.otlp.jsonl"
    p.write_text('{"resourceSpans": []}\nnot json\n')
    with pytest.raises(ConfigError, match=r"x.otlp.jsonl:2"):
        read_otlp(p)


# ---- fitting --------------------------------------------------------------------------------------------
def test_round_trip_recovers_unified5_coefficients(tmp_path):
    res = dsim.run(u5_scenario(200), vllm_traces=True)
    p = tmp_path / "t.otlp.jsonl"
    res.write_vllm_traces(p)
    got, trained = fit_traces([p], "unified5")
    for g, t in zip(got["beta"] + got["alpha"], U5_BETA + U5_ALPHA):
        assert g == pytest.approx(t, rel=0.02)
    assert trained["models"] == ["meta-llama/Llama-3.1-8B"]
    # and through the CLI, into a file the unified5 model loads
    out = tmp_path / "c.yaml"
    assert main(["fit", str(p), "--model", "unified5", "--out", str(out)]) == 0
    inline = dsim.run(u5_scenario(40))
    filed = dsim.run(u5_scenario(40, latency={"model": "unified5", "coefficients": str(out)}))
    assert filed.summary["latency_ms"]["e2e"]["mean"] == pytest.approx(inline.summary["latency_ms"]["e2e"]["mean"],
                                                                         rel=1e-4)


def test_physics_fit_predicts_step_times(tmp_path):
    res = dsim.run(u5_scenario(120), vllm_traces=True)
    p = tmp_path / "t.otlp.jsonl"
    res.write_vllm_traces(p)
    got, _ = fit_traces([p], "physics")
    assert len(got["beta"]) == 16 and min(got["beta"]) >= 0
    assert got["fit"]["mape"] < 0.02 and got["gamma"] in (0.1, 0.3, 0.5, 0.8)
    out = tmp_path / "p.yaml"
    assert main(["fit", str(p), "--model", "physics", "--out", str(out)]) == 0
    r = dsim.run(u5_scenario(40, latency={"model": "physics", "coefficients": str(out)}))
    assert r.summary["requests"]["completed"] == 40


def test_fit_without_rich_steps_is_a_clear_error(tmp_path):
    res = dsim.run(u5_scenario(30), vllm_traces={"rich_rate": 1e-9})
    p = tmp_path / "t.otlp.jsonl"
    res.write_vllm_traces(p)
    with pytest.raises(ConfigError, match="rich-mode"):
        fit_traces([p], "unified5")


def test_stage2_nelder_mead_moves_toward_the_truth(tmp_path):
    """'Real' data from dsim with betas 1.4x the starting point: stage 2 must cut the loss."""
    truth = [b * 1.4 for b in U5_BETA]
    dsim.run(u5_scenario(150, latency={"model": "unified5", "beta": truth, "alpha": U5_ALPHA}), tmp_path / "real")
    cols = {"arrival_s": "arrival_s", "prompt_tokens": "prompt_tokens", "output_tokens": "output_tokens",
            "first_token_s": "first_token_s", "last_token_s": "completion_s"}
    run = read_generic(tmp_path / "real" / "requests.csv", cols, model="meta-llama/Llama-3.1-8B",
                       hardware="H100-SXM", engine={"max_num_seqs": 64, "max_num_batched_tokens": 512})
    lat0 = {"model": "unified5", "beta": U5_BETA, "alpha": U5_ALPHA}
    assert loss_of(evaluate([run], None, (), 42, {**lat0, "beta": truth})) < 1e-3
    s2 = stage2([run], None, (), 42, lat0, UNIFIED5, max_evals=25)
    b = s2["latency"]["beta"]
    assert s2["evaluations"] <= 25 + 1 and s2["loss"] < 0.5 * s2["loss_start"]
    assert np.mean(b) > np.mean(U5_BETA)        # moved up, toward the 1.4x truth


def test_inference_perf_message_gaps_are_not_compared_as_itl(tmp_path):
    """inference-perf's ITL times SSE messages (two per token in the shipped H100 run, median gap
    ~0.03 ms): it must not be compared with the simulator's per-token gaps (that gave 5,000 % MAPE)."""
    run = load_real(ROOT / "examples" / "real" / "h100-llama-2-7b-tp1-general")
    for st in run.stages:
        assert "itl" not in st.real
        x = st.itl_not_compared
        assert x["p50"] < 0.25 * x["mean"]
        assert x["per_token"] / x["mean"] == pytest.approx(2.0, abs=0.05)
    assert any("messages per token" in n for n in run.notes)
    rep = cosimulate(run, overrides=["workload.stages[0].duration_s=20", "workload.stages[1].duration_s=20"],
                     out_dir=tmp_path / "c", plots=False)
    assert all("itl" not in st["metrics"] for st in rep["stages"])


def test_fit_cli_uses_calibrates_stage2_and_stays_physical(tmp_path, capsys):
    """`dsim fit RUN` refines unified5 with `dsim calibrate`'s stage 2: betas stay in their physical
    range (>= 1 x the roofline time), even from seed 003's sub-roofline start."""
    out = tmp_path / "u5.yaml"
    assert main(["fit", str(ROOT / "examples" / "real" / "RTX4090_Llama-3.1-8B"), "--model", "unified5",
                 "--max-evals", "3", "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())["unified5_coefficients"]
    s2 = doc["fit"]["stage2"]
    assert s2["evaluations"] <= 4 and s2["loss"] <= s2["loss_start"] and "converged" in s2
    assert all(b >= 1.0 for b in doc["beta"][:3])
    assert "stage 2: loss" in capsys.readouterr().out
