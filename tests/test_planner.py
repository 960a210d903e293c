"""The online planner (dsim.cluster.planner): forked forecasts are the run's own continuation, the
objective and the judging rule by hand, hysteresis, cold starts, the trend forecast, bad input."""
import copy
import json
from pathlib import Path

import numpy as np
import pytest

import dsim
from dsim.cluster import planner as pl
from dsim.config.errors import ConfigError

BASE = {
    "name": "planner_test", "seed": 3,
    "model": "meta-llama/Llama-3.1-8B", "hardware": "A100-80GB",
    "engine": {"max_num_seqs": 64, "max_num_batched_tokens": 2048},
    "latency": {"model": "roofline"},
    "cluster": {"router": "jsq",
                "pools": [{"name": "a100", "replicas": 1, "min_replicas": 1, "max_replicas": 3, "cold_start_s": 4}],
                "controllers": [{"type": "planner", "cadence_s": 10, "forecast": "oracle"}]},
    "workload": {"type": "staged", "stages": [{"rate": 3, "duration_s": 20}, {"rate": 24, "duration_s": 30},
                                              {"rate": 3, "duration_s": 30}],
                 "prompt_tokens": {"dist": "constant", "value": 600}, "output_tokens": {"dist": "constant", "value": 120}},
    "slo": {"ttft_ms": 800, "tpot_ms": 60},
}


def _scn(**planner):
    s = copy.deepcopy(BASE)
    s["cluster"]["controllers"][0].update(planner)
    return s


def _run(scn, tmp_path=None):
    res = dsim.run(scn, None if tmp_path is None else str(tmp_path / "out"), plots=False)
    return res.summary


def test_judge_by_hand():
    nan = np.nan
    #            arrival first last  done  n_out rejected ttft_slo tpot_slo
    rows = [(0.0, 0.5, 1.5, 1.5, 11, False, 1000.0, 200.0),   # met: ttft 500, tpot 100
            (0.0, 0.5, 3.5, 3.5, 11, False, 1000.0, 200.0),   # tpot 300 > 200: missed
            (0.0, 1.5, 2.0, 2.0, 2, False, 1000.0, 200.0),    # ttft 1500: missed
            (1.0, nan, nan, nan, 0, True, 1000.0, 200.0),     # rejected: missed
            (3.0, nan, nan, nan, 0, False, 1000.0, 200.0),    # 1 s old, no token yet: not judged yet
            (1.5, nan, nan, nan, 0, False, 1000.0, 200.0),    # 2.5 s old, no token: missed
            (3.5, 3.8, 3.9, nan, 3, False, 1000.0, 200.0)]    # first token in time, running: met so far
    cols = [np.array(c, dtype=float) for c in zip(*rows)]
    cols[5] = cols[5].astype(bool)
    out = pl.judge(*cols, t_end=4.0)
    assert out["judged"] == 6 and out["met"] == 2
    assert out["attainment"] == pytest.approx(2 / 6)
    # TTFTs of the judged, not rejected requests: 500, 500, 1500, 300 and the 2,500 ms the late
    # one has waited so far (a starving request counts in the tail)
    assert out["ttft_p99_ms"] == pytest.approx(np.percentile([500, 500, 1500, 2500, 300], 99))


def test_choose_by_hand():
    f = [{"attainment": 0.90, "gpus": 1, "ttft_p99_ms": 500},     # the current configuration: infeasible
         {"attainment": 0.97, "gpus": 3, "ttft_p99_ms": 400},
         {"attainment": 0.96, "gpus": 2, "ttft_p99_ms": 900},
         {"attainment": 0.99, "gpus": 2, "ttft_p99_ms": 300}]
    assert pl.choose(f, 0.95, None) == 3                  # fewest GPUs among the feasible, then attainment
    assert pl.choose(f, 0.95, 350) == 3
    assert pl.choose(f, 0.95, 250) == 1                   # none feasible: the most GPUs (attainment unread)
    assert pl.choose(f[:3], 0.95, 800) == 1               # 2 breaks the p99 bound
    tie = [{"attainment": 1.0, "gpus": 2, "ttft_p99_ms": 1}, {"attainment": 1.0, "gpus": 2, "ttft_p99_ms": 1}]
    assert pl.choose(tie, 0.95, None) == 0                # a tie keeps the current configuration
    early = [{"attainment": 0.99, "gpus": 1, "ttft_p99_ms": 1, "stopped_early": True},   # partial: infeasible
             {"attainment": 0.5, "gpus": 2, "ttft_p99_ms": 1}, {"skipped": True, "gpus": 3}]
    assert pl.choose(early, 0.95, None) == 1


def test_a_forked_forecast_is_the_runs_own_continuation(monkeypatch):
    """With the oracle forecast and one candidate (the current configuration), each child simulates
    exactly what the run then does: every request it saw finish has the same times, bit for bit."""
    original = pl.SimulationPlanner._simulate
    seen = {}

    def hook(self, cand):
        self.fleet.done_hooks.append(lambda r: seen.setdefault("rows", []).append(
            [r.rid, r.arrival, r.t_first_token, r.t_completion, r.n_out]))
        out = original(self, cand)
        out["finished"] = seen.get("rows", [])
        return out
    monkeypatch.setattr(pl.SimulationPlanner, "_simulate", hook)
    monkeypatch.setattr(pl.SimulationPlanner, "prune", False)      # every forecast runs its whole horizon
    s = _run(_scn(pools={"a100": {"replicas": [1]}}))
    led_rows = {}
    ticks = s["planner"]["tick_log"]
    assert len(ticks) >= 5 and all(len(t["candidates"]) == 1 and not t["changed"] for t in ticks)
    res = dsim.run(_scn(pools={"a100": {"replicas": [1]}}), plots=False)
    led = res.requests
    for rid, a, f, c, n in zip(led.col("rid").tolist(), led.col("arrival").tolist(), led.col("t_first_token").tolist(),
                               led.col("t_completion").tolist(), led.col("n_out").tolist()):
        led_rows[rid] = [rid, a, f, c, n]
    checked = 0
    for t in ticks:
        fc = t["candidates"][0]
        assert fc["finished"], "a forecast saw no request finish"
        for row in fc["finished"]:
            assert row == led_rows[row[0]]
            checked += 1
        # and the judged outcome is the one the report computes from the run afterwards
        assert {k: fc[k] for k in ("judged", "met", "attainment", "ttft_p99_ms", "fairness_gap")} == t["actual"]
        assert t["attainment_error"] == 0.0
    assert checked > 200


def test_pruning_changes_no_decision(monkeypatch):
    """Skipping candidates that cannot win and stopping doomed forecasts early give the decisions a
    full forecast of every candidate gives, tick by tick (and so the same run)."""
    scn = _scn(forecast="trend", cadence_s=5)
    scn["cluster"]["pools"][0]["max_replicas"] = 4
    fast = _run(scn)["planner"]["tick_log"]
    monkeypatch.setattr(pl.SimulationPlanner, "prune", False)
    full = _run(scn)["planner"]["tick_log"]
    assert [(t["time_s"], t["candidates"][t["chosen"]]["config"]) for t in fast] == \
        [(t["time_s"], t["candidates"][t["chosen"]]["config"]) for t in full]
    assert not any(c.get("skipped") or c.get("stopped_early") for t in full for c in t["candidates"])
    cut = sum(1 for t in fast for c in t["candidates"] if c.get("skipped") or c.get("stopped_early"))
    assert cut > 0


def test_the_planner_scales_out_under_a_burst_and_pays_the_cold_start(tmp_path):
    s = _run(_scn(), tmp_path)
    p = s["planner"]
    assert p["changes"] >= 2
    outs = [a for a in s["controller_actions"] if a["action"] == "scale_out"]
    ins = [a for a in s["controller_actions"] if a["action"] == "scale_in"]
    assert outs and ins and min(a["time_s"] for a in outs) < min(a["time_s"] for a in ins)
    # a new replica is ready its pool's cold start after the action: weights / load rate + cold_start_s
    loaded = dsim.load_scenario(_scn())
    cold = loaded.model.weight_bytes / loaded.device.weight_load_bytes_s + 4     # TP 1, cold_start_s 4
    born = [r for name, r in s["replicas"].items() if name != "a100-0"]
    assert born
    ready = [r for r in born if r.get("ready_s") is not None]
    assert ready                                   # at least one new replica came up, and each after its cold start
    for r in ready:
        assert r["ready_s"] - r["created_s"] == pytest.approx(cold, rel=1e-9)
    # the planner's choice beats keeping one replica: the same day without changes
    static = _run(_scn(pools={"a100": {"replicas": [1]}}))
    assert s["goodput"]["fraction"] > static["goodput"]["fraction"] + 0.2


def test_hysteresis_keeps_changes_a_dwell_apart():
    def staircase(dwell):
        s = _scn(cadence_s=5, min_dwell_s=dwell, forecast="trend")
        s["workload"]["stages"] = [{"rate": 3, "duration_s": 15}, {"rate": 12, "duration_s": 10},
                                   {"rate": 22, "duration_s": 10}, {"rate": 30, "duration_s": 15},
                                   {"rate": 3, "duration_s": 30}]
        s["cluster"]["pools"][0]["max_replicas"] = 4
        return sorted(t["time_s"] for t in _run(s)["planner"]["tick_log"] if t["changed"])
    free = staircase(0)
    assert any(b - a < 25 for a, b in zip(free, free[1:]))          # it would change this often
    held = staircase(25)
    assert len(held) >= 2 and all(b - a >= 25 - 1e-9 for a, b in zip(held, held[1:]))


def test_runs_are_deterministic(tmp_path):
    a = _run(_scn(forecast="trend"), tmp_path / "a")
    b = _run(_scn(forecast="trend"), tmp_path / "b")
    assert (tmp_path / "a" / "out" / "summary.json").read_bytes() == (tmp_path / "b" / "out" / "summary.json").read_bytes()
    assert a["planner"]["ticks"] > 0 and json.dumps(a) == json.dumps(b)


def test_bad_planner_sections_are_clear_errors():
    s = _scn(pools={"b200": {"replicas": [1, 2]}})
    with pytest.raises(ConfigError, match=r"cluster\.controllers\[0\]\.pools\.b200"):
        dsim.load_scenario(s)
    s = _scn()
    del s["slo"]
    with pytest.raises(ConfigError, match="an SLO to plan for"):
        dsim.run(s, plots=False)
    with pytest.raises(ConfigError, match="forecast"):
        dsim.load_scenario(_scn(forecast="crystal_ball"))
    with pytest.raises(ConfigError, match="trigger_check_s"):
        dsim.load_scenario(_scn(trigger_check_s=20, cadence_s=10))
    closed = _scn(forecast="recent")
    closed["workload"]["max_concurrency"] = 16
    with pytest.raises(ConfigError, match="closed-loop"):
        dsim.run(closed, plots=False)
    huge = _scn(pools={"a100": {"replicas": list(range(1, 65)), "max_num_seqs": list(range(1, 65)),
                                "max_num_batched_tokens": list(range(64, 128))}})
    huge["cluster"]["pools"][0]["max_replicas"] = 64
    with pytest.raises(ConfigError, match="candidate space of at most"):
        dsim.run(huge, plots=False)


def test_a_listed_replica_count_is_tried_on_an_unbounded_pool():
    s = _scn(pools={"a100": {"replicas": [1, 4]}})
    del s["cluster"]["pools"][0]["max_replicas"]
    ticks = _run(s)["planner"]["tick_log"]
    assert {c["config"]["a100"]["replicas"] for t in ticks for c in t["candidates"] if not c.get("skipped")} >= {4}


def test_the_realised_outcome_stops_at_a_runs_horizon(monkeypatch):
    """With the oracle the forecast of the kept configuration is exact, also when the run stops
    (horizon_s, no drain) inside a tick's horizon: requests never sent are not judged."""
    s = _scn(pools={"a100": {"replicas": [1]}})
    s["horizon_s"], s["drain"] = 55, False
    monkeypatch.setattr(pl.SimulationPlanner, "prune", False)
    p = _run(s)["planner"]
    assert p["ticks"] >= 4 and p["mean_abs_attainment_error"] == 0.0


def test_the_trend_forecast_extrapolates_the_rate_by_hand():
    """1 request/s over [0, 10), 2/s over [10, 20): at t = 20 with a 10 s horizon the linear
    extrapolation is 3/s, so the last window (20 requests) is replayed 1.5x faster and repeated:
    30 requests over [20, 30).  ``recent`` replays the 20 as they came, 10 s later."""
    from types import SimpleNamespace
    from dsim.workload.generator import Workload
    arr = np.concatenate([np.arange(10) + 0.5, 10 + np.arange(20) * 0.5 + 0.25])
    wl = Workload(arrivals=arr, prompts=np.full(30, 100), outputs=np.full(30, 10))
    p = object.__new__(pl.SimulationPlanner)
    p.session = SimpleNamespace(workload=wl, sent=30)
    p.horizon = 10.0
    p._arrivals = None
    p.cfg = SimpleNamespace(forecast="trend")
    clones = p._recent(20.0)
    t = np.array([c.arrival for c in clones])
    assert len(clones) == 30 and t.min() >= 20 and t.max() < 30 and np.all(np.diff(t) > 0)
    assert t[:20] == pytest.approx(20 + (arr[10:] - 10) / 1.5)
    assert len({c.rid for c in clones}) == 30 and min(c.rid for c in clones) >= 30
    p.cfg = SimpleNamespace(forecast="recent")
    p._arrivals = None
    same = p._recent(20.0)
    assert [c.arrival for c in same] == pytest.approx(list(arr[10:] + 10))
    assert [c.prompt_len for c in same] == [100] * 20


def test_fairness_gap_by_hand():
    n = 23
    ones = np.ones(n)
    # tenant a: 10 judged, all met; b: 10 judged, 5 met (TTFT 2 s > 1 s); c: 3 judged (too few to count)
    first = np.array([0.5] * 10 + [0.5] * 5 + [2.0] * 5 + [0.5] * 3)
    cols = [np.zeros(n), first, first + 1, first + 1, 11 * ones, np.zeros(n, bool), 1000 * ones, 1000 * ones]
    tenant = ["a"] * 10 + ["b"] * 10 + ["c"] * 3
    out = pl.judge(*cols, t_end=10.0, tenant=tenant)
    assert out["judged"] == 23 and out["met"] == 18
    assert out["fairness_gap"] == pytest.approx(0.5)
    f = [{"attainment": 0.96, "gpus": 1, "ttft_p99_ms": 1, "fairness_gap": 0.5},
         {"attainment": 0.96, "gpus": 2, "ttft_p99_ms": 1, "fairness_gap": 0.1}]
    assert pl.choose(f, 0.95, None) == 0 and pl.choose(f, 0.95, None, max_gap=0.2) == 1


def test_cost_usd_prices_each_pools_gpus():
    """cost: usd ranks candidates by dollars per hour: replicas x GPUs x the device's price."""
    scn = _scn(cost="usd", pools={"a100": {"replicas": [1, 2]}, "h100": {"replicas": [1, 2]}})
    scn["cluster"]["pools"].append({"name": "h100", "hardware": "H100-SXM", "replicas": 1, "min_replicas": 1,
                                    "max_replicas": 2, "cold_start_s": 4})
    loaded = dsim.load_scenario(scn)
    price = {p.name: p.device.usd_per_gpu_hour for p in loaded.fleet.pools}
    assert price["a100"] != price["h100"]
    s = _run(scn)
    cands = [c for t in s["planner"]["tick_log"] for c in t["candidates"]]
    assert len({tuple(c["config"][n]["replicas"] for n in price) for c in cands}) == 4
    for c in cands:
        assert c["gpus"] == pytest.approx(sum(c["config"][n]["replicas"] * price[n] for n in price))


def test_speculation_candidates_switch_k_live():
    """A planner with speculation_k candidates forecasts each k (oracle) and applies its choice
    with SetSpeculation."""
    root = Path(__file__).resolve().parents[1]
    over = ["workload.num_requests=240", "workload.rate=20", "slo.tpot_ms=9",
            "cluster.pools=[{name: h100, replicas: 1}]",
            "cluster.controllers=[{type: planner, cadence_s: 4, forecast: oracle, "
            "pools: {h100: {replicas: [1], speculation_k: [1, 6]}}}]"]
    s = dsim.run(str(root / "scenarios" / "datacenter_fused.yaml"), overrides=over, plots=False).summary
    ticks = s["planner"]["tick_log"]
    ks = {c["config"]["h100"]["speculation_k"] for t in ticks for c in t["candidates"]}
    assert ks == {None, 1, 6}
    chosen = [t["candidates"][t["chosen"]]["config"]["h100"]["speculation_k"] for t in ticks if t["changed"]]
    acts = [a for a in s["controller_actions"] if a["action"] == "set_speculation"]
    assert chosen and len(acts) == len(chosen) and [a["changed"]["k"] for a in acts] == chosen
    with pytest.raises(ConfigError, match="speculation section"):
        dsim.run(_scn(pools={"a100": {"speculation_k": [2]}}), plots=False)


def test_the_observation_carries_speculation_telemetry_and_a_drop_triggers_a_tick():
    """Each speculative pool's observation counts the drafts verified and accepted in the window
    (per-target counters); from the start they add up to the per-request totals.  A fall of the
    window's acceptance rate below the last tick's by more than trigger_acceptance_drop plans early."""
    from types import SimpleNamespace

    from dsim.cluster.control import Window
    from dsim.runner import simulate
    root = Path(__file__).resolve().parents[1]
    scn = dsim.load_scenario(str(root / "scenarios" / "datacenter_fused.yaml"), ["workload.num_requests=60"])
    ses = simulate(scn)
    win = Window.__new__(Window)                  # a window opened at t = 0, read after the run
    win.fleet, win.spec = ses.fleet, {}
    spec = [win._speculation(name, pool) for name, pool in ses.fleet.pools.items()]
    states = ses.spec.states.values()
    assert sum(s["verified"] for s in spec) == sum(st.verified for st in states) > 0
    assert sum(s["accepted"] for s in spec) == sum(st.accepted for st in states)
    assert all(s["acceptance_rate"] == s["accepted"] / s["verified"] for s in spec if s["verified"])
    again = [win._speculation(name, pool) for name, pool in ses.fleet.pools.items()]
    assert all(s["verified"] == 0 and s["acceptance_rate"] is None for s in again)     # a new, empty window
    p = object.__new__(pl.SimulationPlanner)
    p.cfg = SimpleNamespace(trigger_waiting=None, trigger_busy_swing=None, trigger_acceptance_drop=0.1)
    p._acc_tick, p._acc_now = {"h100": 0.80}, {"h100": 0.65}
    ob = {"pools": {"h100": {"waiting": 0, "ready": 1}}}
    assert p._trigger(ob, {"h100": 0.5}, {}) == "acceptance_drop:h100"
    p._acc_now = {"h100": 0.75}
    assert p._trigger(ob, {"h100": 0.5}, {}) is None
