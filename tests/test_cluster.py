"""Fleets: routers, admission, P/D disaggregation, scaling, controllers, metrics."""
import math
from pathlib import Path

import numpy as np
import pytest

import dsim
from dsim import ConfigError, Controller, Rebalance, ScaleIn, ScaleOut, SetEngine
from dsim.cluster import routers as R
from dsim.cluster.control import ReactiveAutoscaler
from dsim.metrics.fleet import jain

from helpers import scenario, trace_file

WL = {"type": "poisson", "rate": 40, "num_requests": 400,
      "prompt_tokens": {"dist": "normal", "mean": 300, "std": 100, "min": 8, "max": 900},
      "output_tokens": {"dist": "normal", "mean": 60, "std": 30, "min": 1, "max": 200}}
ROOF = {"model": "roofline"}

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"     # the suite may run from any folder


def fleet(pools, router="jsq", wl=None, **cluster):
    c = {"router": router, "pools": pools}
    c.update(cluster)
    return scenario(latency=ROOF, workload=wl or WL, cluster=c)


# ---- routers on hand-made views ---------------------------------------------------------------
class V:
    def __init__(self, name, q=0, out=0, kv=0.0, pend=0.0, cap=1.0, cached=0):
        self.name, self.queue_depth, self.outstanding, self.kv_usage = name, q, out, kv
        self.waiting, self.running = q, 0
        self.pending_tokens, self.capacity, self._cached = pend, cap, cached

    def cached_prefix(self, r):
        return self._cached


class Req:
    rid, prompt_len, max_tokens = 0, 100, 50


def rng(seed=0):
    return np.random.default_rng(seed)


def test_router_rules_on_views():
    a, b, c = V("a", q=3, out=1, kv=0.5), V("b", q=1, out=4, kv=0.2), V("c", q=2, out=2, kv=0.1)
    assert R.JSQ(rng()).choose(Req, [a, b, c]) is b
    assert R.LeastOutstanding(rng()).choose(Req, [a, b, c]) is a
    assert R.LeastKV(rng()).choose(Req, [a, b, c]) is c
    rr = R.RoundRobin(rng())
    assert [rr.choose(Req, [a, b, c]).name for _ in range(5)] == ["a", "b", "c", "a", "b"]
    idle = V("idle", q=0)
    assert all(R.JIQ(rng(s)).choose(Req, [a, idle, c]) is idle for s in range(20))
    # prefix affinity: longest cached prefix wins; the queue gap guard overrides it
    hot = V("hot", q=9, cached=512)
    assert R.PrefixAffinity(rng()).choose(Req, [a, hot, b]) is hot
    assert R.PrefixAffinity(rng(), max_queue_gap=4).choose(Req, [a, hot, b]) is b


def test_semi_clairvoyant_arithmetic():
    # (900 + 150) / 3 = 350 > (100 + 150) / 1 = 250: the slow, nearly empty replica wins
    fast, slow = V("fast", pend=900, cap=3.0), V("slow", pend=100, cap=1.0)
    sc = R.SemiClairvoyant(rng(), estimate="exact")
    assert sc.choose(Req, [fast, slow]) is slow and sc.routed_work(Req) == 150
    fast.pending_tokens = 600          # (600 + 150) / 3 = 250 = 250: tie, both get picked over seeds
    picks = {R.SemiClairvoyant(rng(s), estimate="exact").choose(Req, [fast, slow]).name for s in range(30)}
    assert picks == {"fast", "slow"}


def test_power_of_two_keeps_the_shorter_of_its_two_samples():
    vs = [V(str(i), q=i) for i in range(6)]
    g = rng(1)
    router = R.PowerOfTwo(g)
    for _ in range(500):
        state = g.bit_generator.state
        i, j = g.choice(6, 2, replace=False)          # the pair the router is about to draw
        g.bit_generator.state = state
        assert router.choose(Req, vs).queue_depth == min(int(i), int(j))
    # never the longest queue of all six
    assert all(R.PowerOfTwo(rng(s)).choose(Req, vs).name != "5" for s in range(200))


def test_weighted_power_of_two_samples_by_capacity():
    vs = [V("big", cap=3.0), V("small", cap=1.0), V("tiny", cap=1.0)]
    router = R.WeightedPowerOfTwo(rng(7))
    n = 6000
    counts = {v.name: 0 for v in vs}
    for _ in range(n):
        counts[router.choose(Req, vs).name] += 1
    # equal (empty) queues: per unit of capacity "big" has the smallest (0+1)/3, so it wins
    # whenever it is sampled: P(big in the pair) = 1 - P(pair = small, tiny) = 1 - 2*(0.2*0.25) = 0.9
    assert abs(counts["big"] / n - 0.9) < 4 * math.sqrt(0.9 * 0.1 / n)


def test_unknown_router_is_a_path_qualified_error():
    with pytest.raises(ConfigError, match=r"cluster\.router\.policy"):
        dsim.run(fleet([{"name": "a", "replicas": 2}], router="shortest"))
    with pytest.raises(ConfigError, match=r"cluster\.router\.staleness_s"):
        dsim.run(fleet([{"name": "a", "replicas": 2}], router={"policy": "jsq", "staleness_s": -1}))


# ---- JSQ in a run: never a strictly longer queue than another candidate ---------------------------
@pytest.mark.parametrize("stale", [0.0, 0.05])
def test_jsq_never_picks_a_strictly_longer_queue(monkeypatch, stale):
    seen = []
    orig = R.JSQ.choose

    def spy(self, request, candidates):
        depths = [c.queue_depth for c in candidates]
        pick = orig(self, request, candidates)
        seen.append((pick.queue_depth, min(depths), len(candidates)))
        return pick
    monkeypatch.setattr(R.JSQ, "choose", spy)
    res = dsim.run(fleet([{"name": "a", "replicas": 3}], router={"policy": "jsq", "staleness_s": stale},
                         wl=dict(WL, rate=150)))
    assert len(seen) == 400 and all(n == 3 for _, _, n in seen)
    assert all(p == m for p, m, _ in seen)
    # the views really differ (the property is not vacuous)
    assert sum(1 for p, m, _ in seen if p > 0) > 50
    assert res.summary["requests"]["completed"] == 400


def test_stale_views_herd_requests():
    """With a long staleness every request between two refreshes sees the same snapshot: JSQ sends
    them all to one replica, so the spread of per-replica counts is larger than with fresh views."""
    def spread(stale):
        s = dsim.run(fleet([{"name": "a", "replicas": 4}], router={"policy": "jsq", "staleness_s": stale},
                           wl=dict(WL, rate=200))).summary
        done = [v["completed"] for v in s["replicas"].values()]
        return max(done) - min(done), s["latency_ms"]["ttft"]["mean"]
    fresh, stale = spread(0.0), spread(1.0)
    assert stale[0] > fresh[0] and stale[1] > fresh[1]


# ---- single replica compatibility and determinism -------------------------------------------------
def test_one_pool_of_one_replica_equals_the_plain_scenario():
    plain = dsim.run(scenario(latency=ROOF, workload=WL))
    one = dsim.run(fleet([{"name": "solo", "replicas": 1}]))
    assert plain.latencies() == one.latencies()
    assert "replicas" not in plain.summary and one.summary["replicas"]["solo-0"]["completed"] == 400


def test_cluster_runs_are_byte_identical(tmp_path):
    sc = str(SCENARIOS / "hetero_fleet.yaml")
    ov = ["workload.classes[0].num_requests=300", "workload.classes[1].num_requests=60"]
    dsim.run(sc, tmp_path / "a", overrides=ov, plots=False)
    dsim.run(sc, tmp_path / "b", overrides=ov, plots=False)
    for f in ("summary.json", "requests.csv", "manifest.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()


def test_router_streams_are_private():
    """Changing the decode router's policy must not shift the entry router's random draws."""
    base = {"pools": [{"name": "p", "role": "prefill", "replicas": 3}, {"name": "d", "role": "decode", "replicas": 2}]}
    runs = []
    for dec in ("random", "least_kv"):
        s = fleet(base["pools"], router="random", disaggregation={"decode_router": dec})
        runs.append([r.prefill_replica for r in dsim.run(s).requests])
    assert runs[0] == runs[1]


# ---- admission ------------------------------------------------------------------------------------
def test_token_bucket_rejects_exactly_the_excess():
    wl = {"type": "constant", "rate": 10, "num_requests": 41, "prompt_tokens": 50, "output_tokens": 2}
    res = dsim.run(fleet([{"name": "a", "replicas": 1}], wl=wl,
                         admission={"policy": "token_bucket", "rate": 5, "burst": 1}))
    s = res.summary["requests"]
    # arrivals every 0.1 s, refill 0.5 token per gap, one token at t=0: every other request passes
    assert s["rejected"] == 20 and s["completed"] == 21
    assert s["rejected_by"] == {"admission:token_bucket": 20}
    rej = [r.rid for r in res.requests if r.reject_reason]
    assert rej == list(range(1, 41, 2))


def test_queue_cap_and_slo_guard(tmp_path):
    slow = {"model": "blackbox", "beta": [50000, 0, 0]}           # 50 ms per step
    wl = {"type": "constant", "rate": 100, "num_requests": 50, "prompt_tokens": 100, "output_tokens": 20}
    s = scenario(latency=slow, workload=wl,
                 cluster={"pools": [{"name": "a"}], "admission": {"policy": "queue_cap", "max_waiting": 3}})
    res = dsim.run(s, tmp_path / "q")
    assert res.summary["requests"]["rejected_by"] == {"admission:queue_cap": res.summary["requests"]["rejected"]}
    assert 0 < res.summary["requests"]["rejected"] < 50
    assert "admission:queue_cap" in (tmp_path / "q" / "requests.csv").read_text()
    with pytest.raises(ConfigError, match=r"cluster\.admission\.ttft_ms"):
        dsim.run(scenario(cluster={"pools": [{"name": "a"}], "admission": "slo_guard"}))


def test_slo_guard_prediction_by_hand(tmp_path):
    """Prefill rate = 2048 tokens / 50 ms step; predicted TTFT = prompt tokens queued ahead
    (waiting prompts + unfinished prompts of running requests) plus its own, over that rate."""
    from dsim.cluster.admission import SLOGuard
    from dsim.config.scenario import load_scenario
    from dsim.core.request import Request
    from dsim.runner import prepare
    slow = {"model": "blackbox", "beta": [50000, 0, 0]}
    late = {"type": "trace", "path": str(trace_file(tmp_path, [(5.0, 10, 2)]))}   # nothing before 5 s
    ses = prepare(load_scenario(scenario(latency=slow, workload=late, cluster={"pools": [{"name": "a"}]})))
    rep = ses.fleet.replicas()[0]
    rate = 2048 / 0.05
    assert rep.pool.prefill_rate == pytest.approx(rate)
    for i, n in enumerate((3000, 500, 700)):
        rep.inst.submit(Request(100 + i, 0.0, n, 4))
    ses.sim.run(until=0.01)                 # the first step starts: 2048 of 3000 tokens in flight
    new = Request(200, 0.01, 400, 4)
    ahead = 3000 + 500 + 700 + 400          # nothing computed yet: the step ends at 0.05 s
    assert rep.predict_ttft(new) == pytest.approx(ahead / rate)
    assert SLOGuard(ahead / rate * 1e3 * 1.01).reject(new, rep, 0.01) is None
    assert SLOGuard(ahead / rate * 1e3 * 0.99).reject(new, rep, 0.01) == "admission:slo_guard"
    ses.sim.run(until=0.06)                 # after the first step 2048 prompt tokens are done
    assert rep.predict_ttft(new) == pytest.approx((ahead - 2048) / rate)
    assert rep.waiting == 0 and rep.running == 3


def test_cluster_error_from_the_cli_exits_2_and_writes_nothing(tmp_path):
    import subprocess
    import sys
    import yaml
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(fleet([{"name": "a"}], router={"policy": "jsq", "stale": 1})))
    p = subprocess.run([sys.executable, "-m", "dsim.cli", "run", str(sc), "--quiet", "--out", str(tmp_path / "o")],
                       capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "cluster.router.stale" in p.stderr
    assert not (tmp_path / "o").exists()


# ---- prefill/decode disaggregation ----------------------------------------------------------------
PD = [{"name": "pre", "role": "prefill", "replicas": 2}, {"name": "dec", "role": "decode", "replicas": 2}]


def test_pd_pool_isolation_and_transfer_time():
    kv = {"latency_ms": 0.5, "bandwidth_gb_s": 10}
    res = dsim.run(fleet(PD, disaggregation={"kv_transfer": kv, "decode_router": "jsq"}), check_invariants=True)
    m = res.scenario.model
    pools = {rep.name: rep.pool.role for rep in res.fleet.replicas()}
    assert res.summary["requests"]["completed"] == 400
    for r in res.requests:
        if r.max_tokens == 1:
            assert pools[r.replica] == "prefill"
            continue
        assert pools[r.prefill_replica] == "prefill" and pools[r.replica] == "decode"
        assert r.t_kv_ready - r.t_handoff == pytest.approx(0.5e-3 + r.prompt_len * m.kv_bytes_per_token / 10e9,
                                                            rel=1e-9)
        assert r.t_first_token == r.t_handoff < r.t_kv_ready < r.t_completion
    # decode replicas computed no prompt: their prefill tokens are one per request (the 2nd token)
    for rep in res.fleet.replicas():
        if rep.pool.role == "decode":
            assert sum(rep.inst.log.prefill_tokens) == rep.inst.submitted
            assert rep.inst.kv.queries == 0
    assert res.summary["clusters"]["default"]["kv_transfer"]["transfers"] == \
        sum(1 for r in res.requests if r.max_tokens > 1)


def test_decode_replica_refuses_a_prefill():
    res = dsim.run(fleet(PD))
    dec = [rep for rep in res.fleet.replicas() if rep.pool.role == "decode"][0]
    from dsim.core.request import Request
    r = Request(10_000, res.fleet.sim.now, 100, 5)
    dec.inst.submit(r)                     # a raw prompt sent straight to a decode replica
    dec.inst.check = True
    with pytest.raises(AssertionError, match="decode replica runs the prefill"):
        res.fleet.sim.run()


def test_pd_session_affinity_keeps_conversations_together():
    wl = {"type": "poisson", "rate": 20, "num_requests": 300, "prompt_tokens": 100, "output_tokens": 20,
          "shared_prefix": {"num_groups": 3, "users_per_group": 4, "system_prompt_len": 200, "multi_turn": True}}
    res = dsim.run(fleet(PD, wl=wl, affinity="session", disaggregation={}))
    by_session: dict = {}
    for r in res.requests:
        by_session.setdefault(r.session, set()).add((r.prefill_replica, r.replica))
    assert len(by_session) == 12 and all(len(v) == 1 for v in by_session.values())


@pytest.mark.parametrize("pools,match", [
    ([{"name": "p", "role": "prefill"}], "at least one prefill pool and one decode pool"),
    ([{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode"}, {"name": "m"}], "no mixed pool"),
    ([{"name": "p"}, {"name": "p"}], "unique pool name"),
    ([{"name": "p", "replicas": 0}], r"pools\[0\]\.replicas"),
    ([{"name": "p", "replikas": 2}], r"pools\[0\]\.replikas"),
    ([{"name": "p", "engine": {"max_num_seqs": 0}}], r"pools\[0\]\.engine\.max_num_seqs"),
    ([{"name": "p", "role": "prefill"}, {"name": "d", "role": "decode", "model": "meta-llama/Llama-2-7b-hf"}],
     "one model for the prefill and decode pools"),
])
def test_cluster_config_errors(pools, match):
    with pytest.raises(ConfigError, match=match):
        dsim.run(fleet(pools))


def test_disaggregation_needs_roles():
    with pytest.raises(ConfigError, match=r"cluster\.disaggregation"):
        dsim.run(fleet([{"name": "a"}], disaggregation={}))


# ---- scaling, controllers, stepping API -------------------------------------------------------------
class Script(Controller):
    """Scale out at the first tick, in at the third, out again at the fourth."""
    interval_s = 2.0

    def __init__(self):
        self.n = 0

    def act(self, obs):
        self.n += 1
        return {1: [ScaleOut("a", 2)], 3: [ScaleIn("a", 2)], 4: [ScaleOut("a")]}.get(self.n, [])


def test_conservation_through_scale_out_and_in():
    s = fleet([{"name": "a", "replicas": 1, "max_replicas": 3, "cold_start_s": 1.5}], wl=dict(WL, rate=60))
    res = dsim.run(s, check_invariants=True, controllers=[Script()])
    f = res.fleet
    sm = res.summary
    assert sm["requests"]["completed"] == 400
    events = [(e["event"], e["replica"]) for e in sm["scale_events"]]
    assert events[:2] == [("scale_out", "a-1"), ("scale_out", "a-2")]
    assert ("scale_in", "a-2") in events or ("scale_in", "a-1") in events
    spec = f.pools["a"].spec
    cold = spec.model.weight_bytes / spec.device.weight_load_bytes_s + 1.5
    for rep in f.replicas()[1:]:
        assert rep.t_ready - rep.t_created == pytest.approx(cold)
        served = [r for r in res.requests if r.replica == rep.name]
        # nothing is routed to a replica before it is ready, or after it started draining
        assert all(r.arrival >= rep.t_ready for r in served)
        drain = [e["time_s"] for e in sm["scale_events"] if e["event"] == "scale_in" and e["replica"] == rep.name]
        if drain:
            assert all(r.arrival <= drain[0] for r in served)
            assert rep.state == "retired" and rep.t_retired >= drain[0]
    f.check_conservation()


def test_scale_in_never_goes_below_min_replicas():
    s = fleet([{"name": "a", "replicas": 2, "min_replicas": 2}])

    class Shrink(Controller):
        interval_s = 1.0

        def act(self, obs):
            return [ScaleIn("a", 5)]
    res = dsim.run(s, controllers=[Shrink()])
    assert res.summary["pools"]["a"]["replicas_final"] == 2
    assert all(a["changed"] == 0 for a in res.summary["controller_actions"])


def test_set_engine_applies_live():
    wl = dict(WL, rate=100)

    class Limit(Controller):
        interval_s = 1.0

        def act(self, obs):
            return [SetEngine("a", max_num_seqs=2)] if obs["time_s"] == 1.0 else []
    res = dsim.run(fleet([{"name": "a"}], wl=wl), controllers=[Limit()])
    log = res.instance.log
    after = [run for t, run in zip(log.t_end, log.running) if t > 1.0]
    assert max(log.running) > 2
    first_low = next(i for i, v in enumerate(after) if v <= 2)
    assert max(after[first_low:]) <= 2
    with pytest.raises(ValueError, match="max_num_seqs"):
        dsim.run(fleet([{"name": "a"}]), controllers=[type("Bad", (Controller,), {
            "interval_s": 1.0, "act": lambda self, o: [SetEngine("a", max_num_seqs=0)]})()])


def test_rebalance_moves_unstarted_requests():
    # every request shares one prefix, so prefix affinity piles them on one replica
    wl = {"type": "constant", "rate": 400, "num_requests": 300, "prompt_tokens": 200, "output_tokens": 50,
          "shared_prefix": {"num_groups": 1, "users_per_group": 1, "system_prompt_len": 64}}

    class Balance(Controller):
        interval_s = 0.1

        def act(self, obs):
            return [Rebalance("a")]
    s = fleet([{"name": "a", "replicas": 3, "engine": {"max_num_seqs": 8}}], router="prefix_affinity", wl=wl)
    res = dsim.run(s, check_invariants=True, controllers=[Balance()])
    moved = sum(a["changed"] for a in res.summary["controller_actions"])
    assert moved > 0 and res.summary["requests"]["completed"] == 300
    assert sum(rep.inst.moved_out for rep in res.fleet.replicas()) == moved
    assert min(v["completed"] for v in res.summary["replicas"].values()) > 0


def test_autoscaler_rule():
    a = ReactiveAutoscaler("p", scale_out_waiting=4, scale_in_kv=0.2, cooldown_s=10)

    def obs(t, ready=2, waiting=0, kv=0.5, busy=0.9, starting=0):
        return {"time_s": t, "pools": {"p": {"ready": ready, "waiting": waiting, "kv_usage": kv,
                                             "busy_fraction": busy, "starting": starting}}}
    assert a.act(obs(0, waiting=9)) == [ScaleOut("p")]          # 4.5 per replica > 4
    assert a.act(obs(5, waiting=50)) == []                       # cooldown
    assert a.act(obs(20, waiting=50, starting=1)) == []          # one already starting
    assert a.act(obs(30, waiting=8)) == []                       # 4 per replica is not > 4
    assert a.act(obs(40, kv=0.1)) == [ScaleIn("p")]
    assert a.act(obs(60, kv=0.1, ready=1)) == []                 # never below one


def test_autoscale_scenario_scales_out_and_in():
    res = dsim.run(str(SCENARIOS / "autoscale_ramp.yaml"), check_invariants=True, plots=False)
    kinds = [e["event"] for e in res.summary["scale_events"]]
    assert "scale_out" in kinds and "retired" in kinds
    assert res.summary["requests"]["completed"] == res.summary["requests"]["submitted"]
    # cost counts only the GPU-hours each replica was alive
    spec = res.fleet.pools["a100"].spec
    last = max(r.t_completion for r in res.requests)
    alive = sum(min(r.t_retired if r.t_retired is not None else last, last) - r.t_created for r in res.fleet.replicas())
    assert res.summary["cost"]["usd"] == pytest.approx(alive / 3600 * spec.device.usd_per_gpu_hour)


def test_cluster_env_steps_match_a_plain_run():
    sc = fleet([{"name": "a", "replicas": 2}])
    env = dsim.ClusterEnv(sc, interval_s=0.5)
    obs = env.reset()
    assert obs["pools"]["a"]["ready"] == 2 and obs["time_s"] == 0
    done = 0
    while not env.done:
        obs, m = env.step()
        done += m["completed"]
        assert set(m["busy_fraction"]) == {"a"}
    res = env.result()
    plain = dsim.run(sc)
    assert done == 400 and res.latencies() == plain.latencies()
    env.reset()
    obs, _ = env.step([ScaleOut("a")])
    pool = env.session.fleet.pools["a"]
    assert pool.cold_start_s() < 0.5 and obs["pools"]["a"]["ready"] == 3
    assert pool.replicas[2].t_ready == pytest.approx(pool.cold_start_s())
    with pytest.raises(ValueError, match="no pool"):
        env.step([ScaleOut("nope")])


# ---- metrics ------------------------------------------------------------------------------------
def test_jain_index():
    assert jain([5, 5, 5]) == pytest.approx(1.0)
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain([1, 3]) == pytest.approx(16 / 20)
    assert jain([7]) is None


def test_energy_and_cost_by_hand():
    res = dsim.run(fleet([{"name": "a", "replicas": 2}]))
    dev = res.scenario.device
    last = max(r.t_completion for r in res.requests)
    busy = sum(rep.inst.busy_time for rep in res.fleet.replicas())
    e = res.summary["energy"]
    assert e["busy_joules"] == pytest.approx(busy * dev.tdp_w)
    assert e["idle_joules"] == pytest.approx((2 * last - busy) * 0.15 * dev.tdp_w)
    assert res.summary["cost"]["usd"] == pytest.approx(2 * last / 3600 * dev.usd_per_gpu_hour)
    out = res.summary["throughput"]["output_tokens"]
    assert res.summary["cost"]["usd_per_1k_output_tokens"] == pytest.approx(res.summary["cost"]["usd"] / out * 1e3)


def test_mix_tenants_fairness_and_independent_streams():
    chat = {"name": "chat", "type": "poisson", "rate": 20, "num_requests": 200, "prompt_tokens": 200,
            "output_tokens": 50}
    long = {"name": "long", "type": "poisson", "rate": 5, "num_requests": 50, "prompt_tokens": 3000,
            "output_tokens": 50}
    both = dsim.run(fleet([{"name": "a", "replicas": 2}], wl={"type": "mix", "classes": [chat, long]}))
    alone = dsim.run(fleet([{"name": "a", "replicas": 2}], wl={"type": "mix", "classes": [chat]}))
    t_both = [r.arrival for r in both.requests if r.tenant == "chat"]
    assert t_both == [r.arrival for r in alone.requests]
    assert [r.rid for r in both.requests] == list(range(250))
    f = both.summary["fairness"]
    assert set(f["tenants"]) == {"chat", "long"}
    assert f["tenants"]["long"]["ttft_mean_ms"] > f["tenants"]["chat"]["ttft_mean_ms"]
    x = [f["tenants"][t]["ttft_mean_ms"] for t in ("chat", "long")]
    assert f["jain_ttft"] == pytest.approx(sum(x) ** 2 / (2 * sum(v * v for v in x)))
    assert "fairness" not in alone.summary
    with pytest.raises(ConfigError, match=r"workload\.classes\[1\]\.name"):
        dsim.run(fleet([{"name": "a"}], wl={"type": "mix", "classes": [chat, dict(chat)]}))


def test_bench_replicas_runs():
    from dsim.bench import bench
    out = bench(2000, replicas=4)
    assert out["replicas"] == 4 and out["requests"] == 2000 and out["sim_req_per_wall_s"] > 0


def test_gymnasium_autoscale_env_follows_the_api_and_is_deterministic():
    pytest.importorskip("gymnasium")
    import warnings

    from gymnasium.utils.env_checker import check_env

    from dsim.gym_env import DsimAutoscaleEnv
    from pathlib import Path
    env = DsimAutoscaleEnv(str(Path(__file__).resolve().parents[1] / "scenarios" / "autoscale_ramp.yaml"),
                           interval_s=10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                 # the unbounded Box is deliberate
        check_env(env, skip_render_check=True)

    def episode(actions):
        obs, _ = env.reset(seed=5)
        out = []
        for a in actions:
            obs, r, term, trunc, info = env.step(a)
            out.append((r, info["gpus"], obs.tolist()))
            if term:
                break
        return out
    plan = [[1], [0], [0], [2], [0]]
    a, b = episode(plan), episode(plan)
    assert a == b
    tp = env._tp["a100"]
    assert a[0][1] == 2 * tp                     # the added replica is paid for from the moment it starts
