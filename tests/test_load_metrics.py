"""Issue 42 items 7 and 8: controller-facing load metrics (seed 001 "Metrics Exposed") and the
per-replica, per-request, P/D and by-length metrics of summary.json / requests.csv (seed 002
section 8), each checked against a number worked out here by hand or recomputed from requests.csv
and the step log, plus their invariants."""
import csv
import math
import sys
from pathlib import Path

import numpy as np
import pytest

import dsim
from dsim.metrics.fleet import jain

from helpers import scenario, trace_file

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures"))
from make_scenario_digests import FIXTURE  # noqa: E402

MS1 = {"model": "blackbox", "beta": [1000, 0, 0]}          # every step takes 1 ms
KV_TOK = 131072                                             # Llama-3.1-8B: 2 x 32 layers x 1024 x 2 bytes
W = 700.0                                                   # H100-SXM TDP, TP 1


def _csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


# ---- per request: energy and KV footprint ---------------------------------------------------------
def test_request_energy_and_kv_footprint_by_hand(tmp_path):
    """A (prompt 100, 10 tokens) at 0 and B (prompt 50, 5 tokens) at 3.5 ms, 1 ms steps at 700 W
    (0.7 J a step, split equally over the step's tokens).  A runs alone in steps 1-4 (prefill,
    then 3 decodes) and 10; step 5 holds A's decode and B's 50-token prefill (A 1/51, B 50/51);
    steps 6-9 one decode each (0.35 J each).  KV: A ends holding 109 tokens = 7 blocks of 16,
    B 54 tokens = 4 blocks."""
    wl = {"type": "trace", "path": str(trace_file(tmp_path, [(0.0, 100, 10), (0.0035, 50, 5)]))}
    res = dsim.run(scenario(workload=wl, latency=MS1), tmp_path / "o")
    a, b = res.requests[0], res.requests[1]
    assert (b.t_scheduled, b.t_completion, a.t_completion) == pytest.approx((0.004, 0.009, 0.010))
    assert a.energy_j == pytest.approx(0.7 * 4 + 0.7 / 51 + 4 * 0.35 + 0.7, rel=1e-12)
    assert b.energy_j == pytest.approx(0.7 * 50 / 51 + 4 * 0.35, rel=1e-12)
    assert a.energy_j + b.energy_j == pytest.approx(res.summary["energy"]["busy_joules"], rel=1e-12)
    assert (a.kv_peak_bytes, b.kv_peak_bytes) == (7 * 16 * KV_TOK, 4 * 16 * KV_TOK)
    rows = _csv(tmp_path / "o" / "requests.csv")
    assert [float(r["energy_j"]) for r in rows] == pytest.approx([a.energy_j, b.energy_j], abs=1e-6)
    assert [int(r["kv_peak_bytes"]) for r in rows] == [7 * 16 * KV_TOK, 4 * 16 * KV_TOK]


def _energy_check(res):
    """Every request's energy sums to the replicas' busy energy; a single replica's to its own."""
    total = float(res.requests.col("energy_j").sum())
    busy = res.summary["energy"]["busy_joules"]
    assert total == pytest.approx(busy, rel=1e-9)
    assert (res.requests.col("energy_j") >= 0).all()
    reps = res.fleet.replicas()
    if len(reps) == 1:
        assert total == pytest.approx(reps[0].inst.busy_time * W * reps[0].pool.spec.engine.tensor_parallel_size,
                                      rel=1e-9) or res.summary["energy"]["source"] == "lut"


@pytest.mark.parametrize("name,sets", [
    ("quickstart.yaml", []),
    ("pd_disagg.yaml", ["workload.num_requests=300"]),
    ("pd_speculation.yaml", ["workload.num_requests=60"]),
    ("lut.yaml", ["workload.num_requests=200"]),
    ("tree_drafts.yaml", ["workload.num_requests=40"]),
    ("capacity_70b_azure.yaml", ["horizon_s=20", "drain=false"]),      # stopped with requests in flight
])
def test_request_energy_sums_to_the_busy_energy(name, sets):
    res = dsim.run(str(ROOT / "scenarios" / name), overrides=sets, plots=False)
    _energy_check(res)
    if name.startswith("capacity"):
        assert res.summary["requests"]["unfinished"] > 0


def test_lut_busy_energy_counts_the_steps_not_the_estimates():
    """An edf policy asks the LUT for prefill-time estimates, which add to the model's own energy
    counter; the replica's busy energy (and so the requests' sum) is that of the steps it ran."""
    res = dsim.run(str(ROOT / "scenarios" / "lut.yaml"), plots=False,
                   overrides=["workload.num_requests=100", "engine.scheduling_policy=edf", "slo.ttft_ms=500"])
    inst = res.fleet.replicas()[0].inst
    assert res.summary["energy"]["busy_joules"] == inst.lut_j < inst.step_model.energy_mj / 1e3
    _energy_check(res)


def test_request_energy_is_the_same_with_and_without_fast_forward():
    """Quiet decode stretches add each step's energy per token as the loop does: the columns are
    byte for byte those of a run stepped one at a time (invariant checks turn the fast-forward off)."""
    from helpers import bench_scenario
    sc = bench_scenario(800, rate=6)
    fast, slow = dsim.run(sc), dsim.run(sc, check_invariants=True)
    assert fast.fleet.replicas()[0].inst.ff_steps > 0 and slow.fleet.replicas()[0].inst.ff_steps == 0
    for col in ("energy_j", "kv_peak_bytes"):
        assert fast.requests.col(col).tobytes() == slow.requests.col(col).tobytes()
    _energy_check(fast)


def test_kv_footprint_is_the_blocks_of_the_longest_context():
    """Without preemption or drafts a request's most KV is at its end: ceil((prompt + tokens - 1) /
    16) blocks (the last token's KV is never computed); a P/D request holds that on its decode replica."""
    for name, sets in (("quickstart.yaml", []), ("pd_disagg.yaml", ["workload.num_requests=300"])):
        res = dsim.run(str(ROOT / "scenarios" / name), overrides=sets, plots=False)
        led = res.requests
        done = led.present("t_completion")
        ctx = led.col("prompt_len") + led.col("n_out") - 1
        want = -(-ctx // 16) * 16 * res.scenario.model.kv_bytes_per_token
        assert res.summary["scheduler"]["preemptions"] == 0
        assert (led.col("kv_peak_bytes")[done] == want[done]).all()
        assert (led.col("kv_peak_bytes")[~done] == 0).all()


def test_added_columns_keep_the_pinned_request_digests():
    """The scenario digests hash only the columns their recording checkout wrote (by name): new
    columns leave every pin as it was (tests/test_scenarios.py checks the pins themselves)."""
    import json
    from dsim.metrics.writers import COLUMNS
    pins = json.loads(FIXTURE.read_text())
    new = {"energy_j", "kv_peak_bytes", "decode_scheduled_s"}
    assert new <= set(COLUMNS)
    assert all(set(p["columns"]) <= set(COLUMNS) for p in pins.values())     # every pinned column still written
    older = [name for name, p in pins.items() if not new & set(p["columns"])]
    assert len(older) >= 30                  # pins recorded before these columns (37 of 65), still checked by name


# ---- per replica: peaks, memory and compute utilisation ---------------------------------------
def test_replica_peaks_by_hand(tmp_path):
    """Ten requests at t = 0, round-robin over two replicas: five each; max_num_seqs 2 admits two
    in the first step, so at its end two run and three wait (the step log counts at step ends)."""
    wl = {"type": "trace", "path": str(trace_file(tmp_path, [(0.0, 100, 6)] * 10))}
    sc = scenario(workload=wl, latency=MS1, engine={"max_num_seqs": 2},
                  cluster={"router": "round_robin", "pools": [{"name": "a", "replicas": 2}]})
    res = dsim.run(sc)          # fewer steps than a StepLog chunk: every step is in the log
    for rep in res.fleet.replicas():
        row = res.summary["replicas"][rep.name]
        assert (row["peak_running"], row["peak_waiting"]) == (2, 3)
        log = rep.inst.log
        assert (row["peak_running"], row["peak_waiting"]) == (max(log.running), max(log.waiting))
    assert res.summary["scheduler"]["peak_running"] == 2


def test_memory_utilization_by_hand():
    """One request (prompt 100, 10 tokens) alone: 7 blocks of 16 tokens after each of its 10 steps
    but the last (it finished and freed them): mean 6.3 blocks over busy time, peak 7; a block is
    16 x 131072 bytes on one 80 GB GPU."""
    res = dsim.run(scenario(workload={"type": "constant", "rate": 1, "num_requests": 1, "prompt_tokens": 100,
                                      "output_tokens": 10}, latency=MS1, cluster={"pools": [{"name": "a"}]}))
    mem = res.scenario.device.memory_bytes
    block = 16 * KV_TOK / mem * 100
    rep = res.summary["replicas"]["a-0"]
    assert rep["peak_memory_utilization"] == pytest.approx(7 * block, rel=1e-12)
    assert rep["mean_memory_utilization"] == pytest.approx(6.3 * block, rel=1e-12)
    kv = res.summary["kv_cache"]
    assert (kv["peak_memory_utilization"], kv["mean_memory_utilization"]) == pytest.approx((7 * block, 6.3 * block))
    pool = res.summary["pools"]["a"]
    assert pool["memory_utilization"] == pytest.approx({"mean": 6.3 * block, "min": 6.3 * block,
                                                        "max": 6.3 * block, "std": 0.0})
    assert pool["memory_efficiency"] == 1.0


def test_gpu_utilization_by_hand(tmp_path):
    """Seed 001: min(100, 100 x (prefill load + 0.3 x decode load)).  With 1 ms steps the pool's
    prefill rate is 2048 tokens / ms and its decode rate 64 tokens / ms (a full token budget; a
    batch of 64); the loads are the tokens computed (prompts, and every token after the first,
    from requests.csv) over those rates x the replica's alive time (to the last completion)."""
    wl = {"type": "poisson", "rate": 200, "num_requests": 200, "prompt_tokens": {"dist": "uniform", "min": 20,
          "max": 600}, "output_tokens": {"dist": "uniform", "min": 1, "max": 40}}
    res = dsim.run(scenario(workload=wl, latency=MS1, cluster={"pools": [{"name": "a"}]}), tmp_path / "o")
    rows = _csv(tmp_path / "o" / "requests.csv")
    pre = sum(int(r["prompt_tokens"]) for r in rows)
    dec = sum(int(r["generated_tokens"]) - 1 for r in rows)
    alive = max(float(r["completion_s"]) for r in rows)
    want = min(100.0, 100 * (pre / 2048e3 + 0.3 * dec / 64e3) / alive)
    rep = res.summary["replicas"]["a-0"]
    assert (rep["prefill_tokens"], rep["decode_tokens"]) == (pre, dec)
    assert rep["gpu_utilization"] == pytest.approx(want, rel=1e-6)
    assert res.summary["pools"]["a"]["gpu_utilization"] == pytest.approx(want, rel=1e-6)
    assert res.summary["scheduler"]["gpu_utilization"] == pytest.approx(want, rel=1e-6)
    assert 0 < want < 100


def test_pool_memory_spread_and_efficiency():
    """Two replicas: the pool's spread is over its replicas' mean memory utilisation; efficiency
    = mean / max (1 / seed 001's imbalance factor)."""
    wl = {"type": "poisson", "rate": 60, "num_requests": 150, "prompt_tokens": 300, "output_tokens": 40}
    sc = scenario(workload=wl, cluster={"router": "random", "pools": [{"name": "a", "replicas": 2}]})
    s = dsim.run(sc).summary
    vals = [s["replicas"][n]["mean_memory_utilization"] for n in ("a-0", "a-1")]
    m = s["pools"]["a"]["memory_utilization"]
    assert m == pytest.approx({"mean": np.mean(vals), "min": min(vals), "max": max(vals), "std": np.std(vals)})
    assert m["std"] >= 0 and m["min"] <= m["mean"] <= m["max"]
    assert s["pools"]["a"]["memory_efficiency"] == pytest.approx(np.mean(vals) / max(vals))
    assert 0 < s["pools"]["a"]["memory_efficiency"] <= 1
    assert s["pools"]["a"]["peak_memory_utilization"] == max(s["replicas"][n]["peak_memory_utilization"]
                                                               for n in ("a-0", "a-1"))


# ---- the controller observation --------------------------------------------------------------
class Recorder(dsim.Controller):
    interval_s = 0.0075

    def __init__(self):
        self.obs = []

    def act(self, obs):
        self.obs.append(obs)
        return []


def test_observation_queue_velocity_counts_and_utilization():
    """queue_velocity = (waiting now - waiting at the previous observation) / interval, waiting
    recomputed from the requests (arrived, not yet scheduled: no alpha, no preemption here);
    prefilling + decoding = running; gpu_utilization from the tokens of the steps that ended in the
    interval (the step log; the decode rate is at a batch of max_num_seqs = 8); memory: percent of
    GPU memory of the blocks in use, spread >= 0."""
    wl = {"type": "poisson", "rate": 3000, "num_requests": 120, "prompt_tokens": {"dist": "uniform", "min": 50,
          "max": 1500}, "output_tokens": 8}
    sc = scenario(workload=wl, latency=MS1, engine={"max_num_seqs": 8},
                  cluster={"pools": [{"name": "a", "replicas": 2}]})
    rec = Recorder()
    res = dsim.run(sc, controllers=[rec])
    led = res.requests
    arr, sched = led.col("arrival"), led.col("t_scheduled")
    assert res.summary["scheduler"]["preemptions"] == 0 and len(rec.obs) >= 4

    def depth(t):
        return int(((arr <= t) & ~(sched <= t)).sum())
    logs = [rep.inst.log for rep in res.fleet.replicas()]
    pool = res.fleet.pools["a"]
    prev_t, prev_d, moved = 0.0, 0, False
    for o in rec.obs:
        p, t = o["pools"]["a"], o["time_s"]
        assert p["waiting"] == depth(t) == o["queue_depth"]
        assert p["queue_velocity"] == pytest.approx((depth(t) - prev_d) / (t - prev_t))
        assert o["queue_velocity"] == p["queue_velocity"]
        moved |= p["queue_velocity"] != 0
        assert p["prefilling"] + p["decoding"] == p["running"] and p["prefilling"] >= 0 <= p["decoding"]
        sel = [(np.asarray(lg.t_end) > prev_t) & (np.asarray(lg.t_end) <= t) for lg in logs]
        pre = sum(int(np.asarray(lg.prefill_tokens)[s].sum()) for lg, s in zip(logs, sel))
        dec = sum(int(np.asarray(lg.decode_tokens)[s].sum()) for lg, s in zip(logs, sel))
        # decode rate: a batch of min(64, max_num_seqs) = 8 tokens a 1 ms step
        want = min(100.0, 100 * (pre / 2048e3 + 0.3 * dec / 8e3) / ((t - prev_t) * p["ready"]))
        assert p["gpu_utilization"] == pytest.approx(want, rel=1e-9, abs=1e-12)
        frac = 100 * 16 * KV_TOK / res.scenario.device.memory_bytes
        assert p["memory_utilization"] == pytest.approx(p["kv_usage"] * pool.kv_blocks * frac, rel=1e-9)
        assert p["memory_utilization_std"] >= 0
        assert p["memory_utilization_min"] <= p["memory_utilization"] <= p["memory_utilization_max"]
        assert 0 < p["memory_efficiency"] <= 1
        prev_t, prev_d = t, depth(t)
    assert moved


def test_cluster_env_reports_interval_load_in_its_metrics():
    wl = {"type": "poisson", "rate": 400, "num_requests": 60, "prompt_tokens": 200, "output_tokens": 8}
    env = dsim.ClusterEnv(scenario(workload=wl, latency=MS1, cluster={"pools": [{"name": "a"}]}), interval_s=0.01)
    obs = env.reset()
    assert "gpu_utilization" not in obs["pools"]["a"] and "queue_velocity" not in obs
    while not env.done:
        obs, m = env.step()
        assert set(m["gpu_utilization"]) == set(m["queue_velocity_by_pool"]) == {"a"}
        assert m["queue_velocity"] == m["queue_velocity_by_pool"]["a"]
        assert 0 <= m["gpu_utilization"]["a"] <= 100 and "memory_efficiency" in obs["pools"]["a"]


# ---- P/D: the decode-side wait --------------------------------------------------------------------
def test_pd_decode_wait_and_deferrals(tmp_path):
    """Decode replicas admit one request at a time (max_num_seqs 1): a request whose KV arrives
    while another decodes waits.  The wait is decode_scheduled_s - kv_ready_s of requests.csv; a
    request is deferred when a step of its decode replica started after its KV arrived (no alpha
    here) and before its admission (from the step log)."""
    wl = {"type": "poisson", "rate": 200, "num_requests": 80, "prompt_tokens": 200, "output_tokens": 6}
    pools = [{"name": "pre", "role": "prefill"}, {"name": "dec", "role": "decode", "engine": {"max_num_seqs": 1}}]
    res = dsim.run(scenario(workload=wl, latency=MS1, cluster={"pools": pools, "disaggregation": {}}),
                   tmp_path / "o")
    rows = [r for r in _csv(tmp_path / "o" / "requests.csv") if r["decode_scheduled_s"]]
    assert len(rows) == 80
    wait = np.array([(float(r["decode_scheduled_s"]) - float(r["kv_ready_s"])) * 1e3 for r in rows])
    sec = res.summary["clusters"]["default"]["decode_admission"]
    assert sec["admitted"] == 80 and sec["dropped"] == 0 and sec["dropped_by"] == {}
    for p in (50, 90, 99):
        assert sec["wait_ms"][f"p{p}"] == pytest.approx(np.percentile(wait, p), abs=1e-3)   # csv: 1 us
    dec = [rep for rep in res.fleet.replicas() if rep.pool.role == "decode"][0].inst.log
    starts = np.asarray(dec.t_end) - np.asarray(dec.dur)
    led = res.requests                      # unrounded times: a step may start within 1 us of a KV arrival
    ready, adm = led.col("t_kv_ready"), led.col("t_decode_scheduled")
    deferred = sum(bool(((starts > ready[i] + 1e-12) & (starts < adm[i] - 1e-12)).any())
                   for i in np.flatnonzero(led.present("t_decode_scheduled")))
    assert sec["deferred"] == deferred > 0
    assert (wait >= 0).all() and sec["wait_ms"]["max"] > 0


def test_pd_dropped_after_prefill_are_counted():
    """A KV transfer the network gives up on (max_retries 0 on a lossy link) ends its request after
    its prefill: dropped, by reason; the others are admitted on the decode replica."""
    from helpers import lossy_pd
    res = dsim.run(lossy_pd(3))
    failed = res.summary["network"]["failed"]
    sec = res.summary["clusters"]["default"]["decode_admission"]
    assert failed > 0 and sec["dropped"] == failed and sec["dropped_by"] == {"kv_transfer_failed": failed}
    assert sec["admitted"] == 12 - failed == res.summary["requests"]["completed"]
    _energy_check(res)                      # a dropped request keeps the energy of its prefill
    led = res.requests
    assert (led.col("energy_j")[led.col("state") == 5] > 0).all()


# ---- by length: fairness over prompt bins, TPOT over output bins ----------------------------------
def test_length_bins_recomputed_from_requests_csv(tmp_path):
    wl = {"type": "poisson", "rate": 30, "num_requests": 400,
          "prompt_tokens": {"dist": "lognormal", "mean": 400, "std": 500, "min": 3, "max": 6000},
          "output_tokens": {"dist": "uniform", "min": 1, "max": 300}}
    res = dsim.run(scenario(workload=wl, slo={"ttft_ms": 60, "tpot_ms": 12}), tmp_path / "o")
    rows = _csv(tmp_path / "o" / "requests.csv")
    lb = res.summary["length_bins"]

    def bin_of(n):
        return 0 if n == 0 else int(math.log2(n)) + 1
    prompt = {}
    for r in rows:
        prompt.setdefault(bin_of(int(r["prompt_tokens"])), []).append(r)
    assert [b["min_tokens"] for b in lb["prompt"]] == [2 ** (k - 1) for k in sorted(prompt)]
    for b in lb["prompt"]:
        rs = prompt[bin_of(b["min_tokens"])]
        assert b["max_tokens"] == 2 * b["min_tokens"] - 1
        assert (b["requests"], b["completed"]) == (len(rs), sum(r["state"] == "completed" for r in rs))
        assert b["ttft_ms"]["mean"] == pytest.approx(np.mean([float(r["ttft_ms"]) for r in rs]), abs=1e-5)
        good = sum(float(r["ttft_ms"]) <= 60 and (not r["tpot_ms"] or float(r["tpot_ms"]) <= 12) for r in rs)
        assert b["goodput_fraction"] == pytest.approx(good / len(rs))
    assert lb["jain_goodput"] == pytest.approx(jain(b["goodput_fraction"] for b in lb["prompt"]))
    assert lb["jain_tpot"] == pytest.approx(jain(b["tpot_mean_ms"] for b in lb["prompt"]))
    assert len(lb["prompt"]) >= 4 and 0 < lb["jain_goodput"] <= 1
    out = {}
    for r in rows:
        out.setdefault(bin_of(int(r["generated_tokens"])), []).append(r)
    assert [b["min_tokens"] for b in lb["output"]] == [0 if k == 0 else 2 ** (k - 1) for k in sorted(out)]
    for b in lb["output"]:
        tp = [float(r["tpot_ms"]) for r in out[bin_of(b["min_tokens"])] if r["tpot_ms"]]
        assert b["tpot_ms"]["count"] == len(tp)
        if tp:
            for p in (50, 90, 99):
                assert b["tpot_ms"][f"p{p}"] == pytest.approx(np.percentile(tp, p), abs=1e-5)
