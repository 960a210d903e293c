"""Speculative decoding in the simulator: token accounting, KV rollback, each mode's event sequence,
acceptance statistics through the busy loop, mode switching, cold starts, spills, determinism."""
import math
from pathlib import Path

import pytest
from helpers import scenario, trace_file

import dsim
from dsim.config.errors import ConfigError
from dsim.config.scenario import load_scenario
from dsim.latency.base import BatchShape
from dsim.network.fabric import Network
from dsim.runner import simulate
from dsim.serving.instance import Instance
from dsim.specdec.acceptance import tokens_per_step

ROOF = {"model": "roofline"}


def spec_scn(spec, n=1, prompt=100, out=128, rate=10, **kw):
    return scenario(latency=ROOF, workload={"type": "poisson", "rate": rate, "num_requests": n,
                                            "prompt_tokens": prompt, "output_tokens": out},
                    speculation=spec, **kw)


def run(scn, check=True):
    return simulate(load_scenario(scn), check_invariants=check)


def only_state(ses):
    (st,) = ses.spec.states.values()
    return st


def test_token_accounting_all_accepted():
    # rate 1: every draft passes; k = min(4, remaining - 1): 25 rounds of 5 tokens, then one of 2
    ses = run(spec_scn({"mode": "fused", "acceptance": {"geometric": 1.0}, "gamma": {"k": 4}}))
    st = only_state(ses)
    (r,) = ses.reqs
    assert r.n_out == 128
    assert st.rounds == 26 and st.accepted == 25 * 4 + 1 == st.verified
    assert st.accepted + st.rounds + 1 == r.n_out          # accepted + one per round + the first token


def test_token_accounting_all_rejected():
    ses = run(spec_scn({"mode": "fused", "acceptance": {"geometric": 0.0}, "gamma": {"k": 4}}))
    st = only_state(ses)
    assert st.rounds == 127 and st.accepted == 0
    # k is capped so that no round can overshoot max_tokens: sum_{n=1..127} min(4, 127 - n)
    assert st.verified == sum(min(4, 127 - n) for n in range(1, 128)) == 498
    assert st.rollbacks == sum(1 for n in range(1, 128) if min(4, 127 - n) > 0)


def test_kv_rolled_back_exactly(monkeypatch):
    """After every verify step the request holds exactly ceil(context / block) blocks, so the KV of
    rejected positions went back to the free pool (no prefix caching, one request)."""
    seen = []
    orig = Instance._verified

    def spy(self, spec, t_end, emit_t):
        orig(self, spec, t_end, emit_t)
        for r, k, a in spec:
            if r.rid in self.running:
                seen.append((k, a))
                assert self.kv.total - self.kv.free_count == math.ceil(r.num_computed / self.bs)
    monkeypatch.setattr(Instance, "_verified", spy)
    run(spec_scn({"mode": "fused", "acceptance": {"geometric": 0.6}, "gamma": {"k": 6}}, out=300))
    assert len(seen) > 20 and any(a < k for k, a in seen) and any(a == k for k, a in seen)


def test_fused_step_time_is_drafts_plus_verify():
    ses = run(spec_scn({"mode": "fused", "acceptance": {"geometric": 1.0}, "gamma": {"k": 3}}, out=9))
    inst = ses.fleet.replicas()[0].inst
    # step 2: the first verify: KV of the 100 prompt tokens, a chunk of the first token + 3 drafts
    c, p = 4, 100
    verify = inst.step_model.step_time(BatchShape(prefill_tokens=c, num_prefill=1, prefill_attn_pairs=c * p + c * (c + 1) // 2,
                                                  prefill_ctx_tokens=p, num_sampled=1, prefill_chunk_sq=c * c, running=1))
    drafts = sum(inst.draft_model.step_time(BatchShape(decode_tokens=1, decode_ctx_sum=p + j, num_sampled=1, running=1))
                 for j in (1, 2, 3))
    assert inst.log.dur[1] == pytest.approx(verify + drafts, rel=1e-12)
    assert inst.log.decode_tokens[1] == 4 and inst.log.prefill_tokens[1] == 0


def test_distributed_event_sequence_by_hand(monkeypatch):
    """One phone, one request: prompt up, prefill, result down, k drafts on the phone, bundle up,
    verify, done; the client sees the last token one downlink later."""
    sends = []
    orig = Network.send

    def spy(self, src, dst, nbytes, *rest):
        sends.append((self.env.now, src, dst, nbytes))
        return orig(self, src, dst, nbytes, *rest)
    monkeypatch.setattr(Network, "send", spy)
    spec = {"mode": "distributed", "acceptance": {"geometric": 1.0}, "gamma": {"k": 2},
            "header_bytes": 0, "token_bytes": 4, "bundle_bytes_per_token": 8,
            "drafts": [{"name": "ph", "profile": "phone-flagship", "count": 1, "rtt_ms": 40, "bw_mbps": 8}]}
    ses = run(spec_scn(spec, prompt=100, out=4))
    (r,) = ses.reqs
    inst = ses.fleet.replicas()[0].inst
    dev = ses.spec.devices[0]
    bw = 8 * 1e6 / 8
    assert [(s, d, n) for _, s, d, n in sends] == [("ph-0", "gateway", 400), ("gateway", "ph-0", 4),
                                                   ("ph-0", "gateway", 16)]
    one_way = 0.020
    t_up = r.arrival + one_way + 400 / bw
    alpha = inst.queueing.delay(r, None)
    assert r.t_queued == pytest.approx(t_up + alpha, abs=1e-12)
    prefill_end = t_up + alpha + inst.log.dur[0]
    assert sends[1][0] == pytest.approx(prefill_end, abs=1e-12)
    drafted = prefill_end + one_way + 4 / bw + dev.token_time(100) + dev.token_time(101)
    assert sends[2][0] == pytest.approx(drafted, abs=1e-12)
    verified = drafted + one_way + 16 / bw + inst.log.dur[1]
    tok = inst.token_overhead
    assert r.t_completion == pytest.approx(verified + tok + inst.post_overhead + one_way, abs=1e-12)
    assert r.t_first_token == pytest.approx(prefill_end + tok + one_way, abs=1e-12)
    assert r.n_out == 4 and only_state(ses).rounds == 1


def test_acceptance_statistics_through_the_loop():
    ses = run(spec_scn({"mode": "fused", "acceptance": {"geometric": 0.7}, "gamma": {"k": 4}}, n=40, out=400,
                       rate=4), check=False)
    full = [st for st in ses.spec.states.values()]
    rounds = sum(s.rounds for s in full)
    measured = (sum(s.accepted for s in full) + rounds) / rounds
    expect = tokens_per_step([0.7] * 4)
    # the last rounds of each request are capped (k < 4): allow for them, then 3 %
    assert measured == pytest.approx(expect, rel=0.03)


def test_published_curve_tau_reproduced_in_loop():
    curve = "eagle-3-llama-3.1-8b-mt-bench-t0"
    ses = run(spec_scn({"mode": "fused", "acceptance": {"curve": curve}, "gamma": {"k": 6}}, n=30, out=600,
                       rate=2), check=False)
    sts = list(ses.spec.states.values())
    rounds = sum(s.rounds for s in sts if s.rounds)
    measured = (sum(s.accepted for s in sts) + rounds) / rounds
    acc = ses.scn.spec.acceptance
    expect = tokens_per_step(acc.probabilities(400, 6, 0.0))
    assert measured == pytest.approx(expect, rel=0.05)


def test_hybrid_switches_to_fused_when_rtt_rises():
    spec = {"mode": "hybrid", "gamma": {"k": 3}, "mode_switch": {"max_rtt_ms": 60},
            "drafts": [{"name": "ph", "profile": "laptop-m3pro", "count": 60, "rtt_ms": 20, "bw_mbps": 100,
                        "rtt_schedule": [[3.0, 200]]}]}
    ses = run(spec_scn(spec, n=60, out=64, rate=10))
    early = [s for r, s in ((r, ses.spec.states[r.rid]) for r in ses.reqs) if r.t_completion < 3.0]
    late = [s for r, s in ((r, ses.spec.states[r.rid]) for r in ses.reqs) if r.arrival > 3.2]
    assert early and late
    assert all(s.fused_rounds == 0 and s.dist_rounds > 0 for s in early)
    assert all(s.dist_rounds == 0 and s.fused_rounds > 0 for s in late)


def test_cold_start_of_fused_drafter(tmp_path):
    spec = {"mode": "fused", "gamma": {"k": 3}, "cold_start": {"initially_warm": False, "load_s": 0.5,
                                                                 "warm_retention_s": 2.0}}
    trace = {"type": "poisson", "rate": 1, "num_requests": 1, "prompt_tokens": 100, "output_tokens": 16}
    ses = run(scenario(latency=ROOF, workload=trace, speculation=spec))
    (r,) = ses.reqs
    assert ses.spec.targets[ses.fleet.replicas()[0].name].cold_starts == 1
    # the first round waited for the load: the second token is >= 0.5 s after the first
    assert r.t_completion - r.t_first_token > 0.5
    # two bursts further apart than the retention window: two cold starts
    f = trace_file(tmp_path, [(0.0, 100, 16), (10.0, 100, 16)])
    ses = run(scenario(latency=ROOF, workload={"type": "trace", "path": str(f)}, speculation=spec))
    assert ses.spec.targets[ses.fleet.replicas()[0].name].cold_starts == 2


def test_kv_spill_to_fused():
    spec = {"mode": "distributed", "gamma": {"k": 3}, "kv_admission": {"max_kv_utilization_pct": 0.0001},
            "drafts": [{"name": "ph", "profile": "phone-flagship", "count": 2, "rtt_ms": 30, "bw_mbps": 50}]}
    ses = run(spec_scn(spec, n=4, out=32))
    s = ses.spec
    rounds = sum(st.rounds for st in s.states.values())
    assert s.spills == rounds > 0 and all(st.dist_rounds == 0 for st in s.states.values())


def test_partial_verification_sampled_share():
    """sampled: a round is verified in full with probability sample_rate, else only its first draft."""
    spec = {"mode": "fused", "gamma": {"k": 4}, "acceptance": {"geometric": 1.0},
            "partial_verification": {"mode": "sampled", "sample_rate": 0.3}}
    ses = run(spec_scn(spec, n=20, out=200, rate=2), check=False)
    # every draft is accepted: a fully verified round checks k = 4 (fewer only in the capped last
    # rounds), a short one 1, so verified = rounds + 3 x full rounds
    rounds = sum(st.rounds for st in ses.spec.states.values())
    verified = sum(st.verified for st in ses.spec.states.values())
    full = (verified - rounds) / 3          # each full round verifies 3 more than a short one
    assert full / rounds == pytest.approx(0.3, abs=0.04)


def test_rollback_penalty_is_added_to_the_step():
    base = {"mode": "fused", "gamma": {"k": 3}, "acceptance": {"geometric": 0.0}}
    a = run(spec_scn(base, out=12)).fleet.replicas()[0].inst.log.dur
    b = run(spec_scn(dict(base, partial_verification={"rollback_penalty_ms": 5}), out=12)).fleet.replicas()[0].inst.log.dur
    # step 0 is the prefill; every later step verifies drafts that are all rejected (k > 0 until the cap)
    assert b[0] == a[0]
    diffs = [y - x for x, y in zip(a[1:], b[1:])]
    assert len(diffs) == 11 and all(d == pytest.approx(0.005, abs=1e-12) for d in diffs[:-1])
    assert diffs[-1] == pytest.approx(0.0, abs=1e-12)      # the last round is capped to k = 0: nothing to reject


def test_hybrid_latency_head_picks_the_mode():
    """gamma_policy switch: the latency head's output (bias 6 - 0.05 x RTT) drafts on the device at 20 ms
    RTT (gamma 5) and goes fused at 150 ms (gamma clamps to 1)."""
    w = [0, 0, 0, 0, -0.05, 0, 0, 0, 0]
    spec = {"mode": "hybrid", "gamma": {"policy": "latency_head", "weights": w, "bias": 6.0, "k_max": 8},
            "mode_switch": {"policy": "gamma_policy"},
            "drafts": [{"name": "lp", "profile": "laptop-m3pro", "count": 60, "rtt_ms": 20, "bw_mbps": 100,
                        "rtt_schedule": [[3.0, 150]]}]}
    ses = run(spec_scn(spec, n=60, out=48, rate=10))
    sts = [(r, ses.spec.states[r.rid]) for r in ses.reqs]
    early = [s for r, s in sts if r.t_completion < 3.0]
    late = [s for r, s in sts if r.arrival > 3.5]
    assert early and late
    assert sum(s.dist_rounds for s in early) > 10 * sum(s.fused_rounds for s in early)
    assert sum(s.fused_rounds for s in late) > 10 * sum(s.dist_rounds for s in late)
    assert all(s.drafted_now in (1, 5) or s.rounds == 0 for _, s in sts)


def test_partial_verification_first_token():
    spec = {"mode": "fused", "gamma": {"k": 4}, "partial_verification": {"mode": "first_token"}}
    ses = run(spec_scn(spec, n=3, out=64))
    for st in ses.spec.states.values():
        assert st.verified <= st.rounds and st.drafted > st.verified


def test_closed_loop_think_time_and_throttling():
    spec = {"mode": "distributed", "gamma": {"k": 4},
            "drafts": [{"name": "ph", "profile": {"kind": "phone", "peak_tflops": 2, "mem_gb_s": 30, "memory_gb": 8,
                                                  "power_w": 5, "throttle_after_s": 0.5, "throttle_factor": 0.5},
                        "count": 1, "rtt_ms": 10, "bw_mbps": 50, "closed_loop": True,
                        "think_time": {"dist": "constant", "mean_s": 1.0}}]}
    ses = run(spec_scn(spec, n=3, out=64, rate=1000))
    a, b, c = sorted(ses.reqs, key=lambda r: r.rid)
    assert b.arrival == pytest.approx(a.t_completion + 1.0, abs=1e-9)
    assert c.arrival == pytest.approx(b.t_completion + 1.0, abs=1e-9)
    dev = ses.spec.devices[0]
    assert dev.throttled_s > 0 and dev.energy_j == pytest.approx(5 * dev.busy_s)


def test_a_pause_longer_than_the_cooldown_cools_the_device():
    """Throttling starts throttle_after_s into a hot stretch; a pause of cooldown_s or more (here the
    user's think time between requests) starts a new one, so each later request drafts its first
    0.5 s at full speed: at least 2 x 0.5 s less throttled than when the device never cools."""
    throttled = {}
    for cool in (0.8, 5.0):
        spec = {"mode": "distributed", "gamma": {"k": 4},
                "drafts": [{"name": "ph", "profile": {"kind": "phone", "peak_tflops": 2, "mem_gb_s": 30, "memory_gb": 8,
                                                      "power_w": 5, "throttle_after_s": 0.5, "throttle_factor": 0.5,
                                                      "cooldown_s": cool},
                            "count": 1, "rtt_ms": 10, "bw_mbps": 50, "closed_loop": True,
                            "think_time": {"dist": "constant", "mean_s": 1.0}}]}
        ses = run(spec_scn(spec, n=3, out=64, rate=1000))
        throttled[cool] = ses.spec.devices[0].throttled_s
    assert throttled[0.8] < throttled[5.0] - 2 * 0.5


def test_availability_window_delays_drafting():
    spec = {"mode": "distributed", "gamma": {"k": 2},
            "drafts": [{"name": "ph", "profile": "phone-flagship", "count": 1, "rtt_ms": 10, "bw_mbps": 50,
                        "available": [[2.0, 100.0]]}]}
    ses = run(spec_scn(spec, n=1, out=8))
    (r,) = ses.reqs
    assert r.t_first_token < 1.0 < 2.0 < r.t_completion


def test_deterministic_outputs(tmp_path):
    spec = {"mode": "hybrid", "gamma": {"policy": "acceptance_backoff"},
            "drafts": [{"name": "ph", "profile": "phone-flagship", "count": 5, "rtt_ms": 50, "bw_mbps": 20},
                       {"name": "lp", "profile": "laptop-rtx4060", "count": 3, "rtt_ms": 8, "bw_mbps": 300}]}
    scn = spec_scn(spec, n=60, out=64, rate=8)
    a = dsim.run(scn, tmp_path / "a")
    dsim.run(scn, tmp_path / "b")
    for f in ("requests.csv", "summary.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert a.summary["speculation"]["rounds_by_mode"]["distributed"] > 0


@pytest.mark.parametrize("spec,where", [
    ({"mode": "distributed"}, "speculation.drafts"),
    ({"mode": "fused", "gamma": {"policy": "pid", "kq": 1}}, "speculation.gamma"),
    ({"mode": "fused", "acceptance": {"curve": "nope"}}, "speculation.acceptance.curve"),
    ({"mode": "distributed", "drafts": [{"profile": "pixel", "rtt_ms": 1, "bw_mbps": 1}]},
     "speculation.drafts[0].profile"),
    ({"mode": "fused", "drafter": "meta-llama/Llama-2-7b-hf"}, "speculation.drafter"),
    ({"mode": "fused", "bogus": 1}, "speculation.bogus"),
])
def test_config_errors_are_path_qualified(spec, where):
    with pytest.raises(ConfigError) as e:
        load_scenario(spec_scn(spec))
    assert where in str(e.value)


def test_yaml_off_means_plain_decoding(tmp_path):
    import yaml
    s = spec_scn({"mode": "fused"})
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(s).replace("mode: fused", "mode: off"))
    ses = simulate(load_scenario(p))
    assert ses.scn.spec.mode == "off" and ses.reqs[0].spec is None
    assert ses.spec.states[0].rounds == 0 and ses.reqs[0].n_out == 128


def test_verify_rows_of_a_lut_cost_the_verification(tmp_path):
    """A LUT with verify rows: a verify step of one request at fanout 4 costs the verify row; without
    verify rows (the shipped LUTs) it is looked up as a prefill chunk."""
    from dsim.config.hardware import load_device
    from dsim.config.model import load_model
    from dsim.latency.lut import LutModel, LutTable, export_rows, read_lut, rows_to_csv
    from dsim.latency.roofline import RooflineModel
    m, dev = load_model("meta-llama/Llama-3.1-8B"), load_device("H100-SXM")
    roof = RooflineModel(m, dev, 1)
    f = tmp_path / "l.csv"
    f.write_text(rows_to_csv(export_rows(roof, m, dev, 1, contexts=(128, 512, 2048), microbatches=(1, 4),
                                         verify_k=(2, 4))))
    lut = LutModel(LutTable(read_lut(f), str(f)))
    ctx, k = 512, 4
    c = k + 1
    b = BatchShape(prefill_tokens=c, num_prefill=1, prefill_attn_pairs=c * ctx + c * (c + 1) // 2,
                   prefill_ctx_tokens=ctx, num_sampled=1, prefill_chunk_sq=c * c, running=1,
                   num_verify=1, verify_tokens=c, verify_ctx_sum=ctx)
    assert lut.step_time(b) == pytest.approx(roof.step_time(b), rel=1e-6)      # the row is the roofline's
    plain = b._replace(num_verify=0, verify_tokens=0, verify_ctx_sum=0)
    assert lut.step_time(plain) != pytest.approx(lut.step_time(b), rel=1e-3)   # a 5-token "prefill" row
    # through the loop: a LUT-backed fused run uses the verify rows
    s = spec_scn({"mode": "fused", "gamma": {"k": 4}}, out=16)
    s["latency"] = {"model": "lut", "path": str(f)}
    ses = run(s)
    assert ses.reqs[0].n_out == 16


def test_verify_queue_count_is_maintained(monkeypatch):
    """The runtime's per-target count of conversations with drafts waiting equals a direct count."""
    from dsim.specdec.runtime import SpecRuntime
    orig = SpecRuntime._next_round
    checked = []

    def spy(self, st, r, inst):
        direct = sum(1 for x in inst.spec_dec.values() if x.spec.ready) + sum(
            1 for x in inst.waiting if x.spec is not None and x.spec.ready)
        assert self.targets[inst.name].ready_n == direct
        checked.append(direct)
        orig(self, st, r, inst)
    monkeypatch.setattr(SpecRuntime, "_next_round", spy)
    run(spec_scn({"mode": "fused", "gamma": {"k": 3}}, n=40, out=64, rate=40,
                 engine={"max_num_seqs": 8}))
    assert max(checked) > 0


def _pd_spec(mode="distributed", n=120, extra=()):
    from pathlib import Path
    scn = Path(__file__).resolve().parents[1] / "scenarios" / "pd_speculation.yaml"
    return load_scenario(str(scn), [f"speculation.mode={mode}", f"workload.num_requests={n}", *extra])


def test_pd_speculation_verifies_on_the_decode_pool_only(monkeypatch):
    """Every round is verified on a decode replica after the KV handoff; the prefill pool only
    prefills (pool isolation is checked again at the end of the run)."""
    from dsim.specdec.runtime import SpecRuntime
    where = []
    orig, orig_next = SpecRuntime.round_done, SpecRuntime._next_round

    def spy(self, st, r, inst, k, a, last=False):
        where.append((inst.role, r.prefill_replica is not None, r.t_kv_ready is not None))
        return orig(self, st, r, inst, k, a, last)

    def spy_next(self, st, r, inst):     # a round verified in a target's one pass (dsim.specdec.diststep)
        where.append((inst.role, r.prefill_replica is not None, r.t_kv_ready is not None))
        return orig_next(self, st, r, inst)
    monkeypatch.setattr(SpecRuntime, "round_done", spy)
    monkeypatch.setattr(SpecRuntime, "_next_round", spy_next)
    ses = simulate(_pd_spec(), check_invariants=True)
    assert len(where) > 1000 and set(where) == {("decode", True, True)}
    assert all(r.spec.rounds > 0 for r in ses.reqs if r.t_completion is not None and r.max_tokens > 2)


def test_gateway_to_replica_hop_is_on_the_path():
    """With the replicas in the network, a prompt crosses gateway -> prefill replica after routing
    (ROUTED meanwhile), and each round's messages run between the decode replica and the device."""
    ses = simulate(_pd_spec(extra=["latency.alpha=[0, 0, 0]"]))     # no API delay before the queue
    net = ses.fleet.network
    hop = net.latency_s("gateway", "prefill-0")
    assert hop > 0
    for r in (r for r in ses.reqs if r.t_completion is not None):
        # the hop's latency, its serialization overhead, and the prompt's bytes at the edge rate at most
        assert hop + net.overhead_s <= r.t_queued - r.t_routed <= hop + net.overhead_s + 1e-3
    links = net.summary(ses.sim.now)["links"]
    assert links["decode-0->leaf1"]["bytes"] > 0 and links["decode-1->leaf1"]["bytes"] > 0
    # plain decoding sends nothing out of the decode replicas (the KV only comes in)
    off = simulate(_pd_spec("off"))
    links = off.fleet.network.summary(off.sim.now)["links"]
    assert "decode-0->leaf1" not in links and "decode-1->leaf1" not in links


def test_per_request_speculation_columns_add_up_to_the_summary(tmp_path):
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    res = dsim.run(str(root / "scenarios" / "hybrid_rtt.yaml"), overrides=["workload.num_requests=120"], plots=False)
    df = res.to_pandas()
    s = res.summary["speculation"]
    assert df["spec_rounds"].sum() == s["rounds"] and df["spec_accepted_tokens"].sum() == s["accepted_tokens"]
    assert df["spec_drafted_tokens"].sum() == s["drafted_tokens"]
    assert df["spec_fused_rounds"].sum() == s["rounds_by_mode"]["fused"]
    done = df[df["state"] == "completed"]
    tvt = done.loc[done["spec_rounds"] > 0, "spec_tvt_ms"]
    assert tvt.max() == pytest.approx(s["tvt_ms"]["max"], rel=1e-9)
    assert done["spec_device"].str.startswith("laptop-").all()
    # the prompt crosses the device's access link before the gateway routes it
    assert (done["route_ms"] > 0).all()
    plain = dsim.run(scenario()).to_pandas()
    assert plain["spec_rounds"].isna().all() and plain["spec_device"].isna().all()


def test_batched_drafting_by_hand():
    from types import SimpleNamespace

    import simpy

    from dsim.config.model import load_model
    from dsim.specdec.devices import DraftDevice, load_draft_profile

    class Stub:                   # 1 ms a step + 0.1 ms per drafted token + 1 us per context token
        def step_time(self, b):
            return 1e-3 + 1e-4 * b.decode_tokens + 1e-6 * b.decode_ctx_sum

    env = simpy.Environment()
    grp = SimpleNamespace(profile=load_draft_profile("edge-orin-agx", "p"), available=[], max_batch=4, max_wait_s=0.0)
    dev = DraftDevice(env, "e0", grp, load_model("meta-llama/Llama-3.2-1B", "d", None))
    dev.step = Stub()
    # three rounds (k, ctx): step 1 drafts all three, step 2 the two with k >= 2, step 3 the last
    s1 = 1e-3 + 3e-4 + 1e-6 * (101 + 201 + 301)
    s2 = 1e-3 + 2e-4 + 1e-6 * (102 + 202)
    s3 = 1e-3 + 1e-4 + 1e-6 * 203
    jobs = [(2, 100), (3, 200), (1, 300)]
    assert dev.batch_times(jobs) == pytest.approx([s1 + s2, s1 + s2 + s3, s1])
    done = {}
    for i, (k, c) in enumerate(jobs):
        dev.submit(k, c, lambda i=i: done.setdefault(i, env.now))
    env.run()
    assert done == pytest.approx({0: s1 + s2, 1: s1 + s2 + s3, 2: s1})
    assert dev.tokens == 6 and dev.busy_s == pytest.approx(s1 + s2 + s3)


def test_draft_batching_scenario_keeps_up_where_single_rounds_do_not():
    from pathlib import Path
    path = str(Path(__file__).resolve().parents[1] / "scenarios" / "edge_draft_batching.yaml")
    over = ["workload.num_requests=200"]
    batched = dsim.run(path, overrides=over, plots=False).summary
    single = dsim.run(path, overrides=over + ["speculation.drafts[0].max_batch=1"], plots=False).summary
    assert batched["latency_ms"]["tpot"]["p50"] < 0.2 * single["latency_ms"]["tpot"]["p50"]
    assert batched["goodput"]["fraction"] > 0.9 > single["goodput"]["fraction"]


def test_max_wait_without_a_batch_is_refused():
    from pathlib import Path
    path = str(Path(__file__).resolve().parents[1] / "scenarios" / "edge_draft_batching.yaml")
    with pytest.raises(ConfigError, match=r"^speculation.drafts\[0\].max_wait_ms"):
        dsim.run(path, overrides=["speculation.drafts[0].max_batch=1", "speculation.drafts[0].max_wait_ms=5"])


def _mobile_session(n=60):
    from pathlib import Path

    from dsim.runner import Session
    path = str(Path(__file__).resolve().parents[1] / "scenarios" / "mobile_cloud_distributed.yaml")
    return Session(load_scenario(path, [f"workload.num_requests={n}"]), check_invariants=True)


def test_set_speculation_fixes_k_and_turns_speculation_off():
    from dsim.cluster.control import SetSpeculation, apply_action
    from dsim.metrics.speculation import spec_summary
    from dsim.metrics.summary import summarize
    ses = _mobile_session()
    apply_action(ses.fleet, SetSpeculation("default", k=2))
    ses.run_to_end()
    spec = spec_summary(ses.spec, ses.reqs, ses.sim.now, {})
    assert spec["rounds"] > 0 and spec["drafted_tokens"] == 2 * spec["rounds"]        # every round drafts 2
    ses = _mobile_session()
    apply_action(ses.fleet, SetSpeculation("default", mode="off"))
    ses.run_to_end()
    spec = spec_summary(ses.spec, ses.reqs, ses.sim.now, {})
    assert spec["drafted_tokens"] == 0 and spec["rounds_by_mode"]["distributed"] == 0
    assert sum(d.tokens for d in ses.spec.devices) == 0                              # no device drafted
    assert summarize(ses.scn, ses.fleet, ses.reqs)["requests"]["completed"] == 60
    with pytest.raises(ValueError, match="SetSpeculation.mode"):
        apply_action(ses.fleet, SetSpeculation("default", mode="tree"))


def _verify_order_run(order, monkeypatch):
    """mobile_cloud_distributed under a 16-token budget (three rounds a step): after each schedule,
    the latest deadline served against the earliest deadline left waiting for budget."""
    from pathlib import Path
    seen = []
    orig = Instance._schedule

    def spy(self, now):
        out = orig(self, now)
        served = [r.spec.deadline for r, k, _ in self._spec_sched if k]
        waiting = [r.spec.deadline for r in self.running.values()
                   if r.spec is not None and r.spec.ready and not r.prefilling
                   and all(r is not row[0] for row in self._spec_sched)]
        if served and waiting:
            seen.append(max(served) <= min(waiting))
        return out
    monkeypatch.setattr(Instance, "_schedule", spy)
    scn = Path(__file__).resolve().parents[1] / "scenarios" / "mobile_cloud_distributed.yaml"
    ses = simulate(load_scenario(str(scn), [f"speculation.verify_order={order}", "engine.max_num_batched_tokens=16",
                                            "workload.num_requests=200"]))
    return seen, ses


def test_edf_verification_serves_the_earliest_deadlines_first(monkeypatch):
    seen, ses = _verify_order_run("edf", monkeypatch)
    assert len(seen) > 60 and all(seen)
    # deadline = drafts at the target + the TVT target (40 ms)
    st = next(iter(ses.spec.states.values()))
    assert st.deadline == pytest.approx(st.t_ready + 0.040, abs=1e-12)
    seen, _ = _verify_order_run("fcfs", monkeypatch)
    assert not all(seen)            # admission order does serve later deadlines first


def test_edf_verification_needs_a_round_target(tmp_path, capsys):
    from helpers import assert_refused
    assert_refused("datacenter_fused", ["speculation.verify_order=edf", "slo.tvt_ms=null", "slo.tpot_ms=null"],
                   "speculation.verify_order", tmp_path, capsys)


def test_single_target_sweep_is_router_independent():
    """Seed 002 7.1's sanity check: with one replica per pool no router has a choice to make, so
    jsq, round_robin and random give the same run (it breaks if a router's draws came from a
    stream another part of the run also draws from)."""
    from pathlib import Path
    scn = str(Path(__file__).resolve().parents[1] / "scenarios" / "draft_sweep_single_target.yaml")
    outs = [dsim.run(scn, overrides=["workload.num_requests=60", "speculation.drafts[0].count=10",
                                     f"cluster.router={r}"], plots=False).summary
            for r in ("jsq", "round_robin", "random")]
    assert outs[0]["latency_ms"] == outs[1]["latency_ms"] == outs[2]["latency_ms"]
    assert outs[0]["requests"]["completed"] == 60


def test_a_replica_cut_off_from_the_gateway_is_refused(tmp_path, capsys):
    from helpers import assert_refused
    assert_refused("draft_sweep_multicluster", ["network.links[10].src=''"], "network", tmp_path, capsys)


def test_accept_rows_samples_like_one_row_at_a_time():
    """A step's verifications draw their uniforms at once; every row must get what ``accept`` gives
    row by row from the same stream (same accepted counts, penalties, rollbacks, stream state)."""
    from types import SimpleNamespace

    import numpy as np
    from dsim.specdec.state import SpecState
    ses = run(spec_scn({"mode": "fused", "gamma": {"k": 4}, "acceptance": {"geometric": 0.6},
                        "partial_verification": {"rollback_penalty_ms": 2}}, out=8))
    rt = ses.spec
    ks = [4, 0, 1, 7, 3, 0, 5, 2] * 20

    def rows():
        return [[SimpleNamespace(spec=SpecState(rt, None, None, True), num_computed=100 + i), k, None]
                for i, k in enumerate(ks)]
    rt.rng = np.random.default_rng(7)
    batch = rows()
    extra = rt.accept_rows(batch)
    end_batch = rt.rng.bit_generator.state
    rt.rng = np.random.default_rng(7)
    single = rows()
    want = [rt.accept(r.spec, r, k) for r, k, _ in single]
    assert [row[2] for row in batch] == [a for a, _ in want]
    assert extra == sum(x for _, x in want) and extra > 0
    assert [row[0].spec.rollbacks for row in batch] == [row[0].spec.rollbacks for row in single]
    assert rt.rng.bit_generator.state == end_batch
    assert len({row[2] for row in batch}) > 3           # the rows really differ


def test_fused_drafts_of_mixed_lengths_batch_by_draft_step():
    """Draft step j runs every fused request with k >= j: rows of k = 1, 3, 3, 5 (and a distributed
    row and a k = 0 row, which draft nothing here) cost steps at batch 4, 3, 3, 1, 1."""
    from types import SimpleNamespace
    ses = run(spec_scn({"mode": "fused", "acceptance": {"geometric": 0.5}, "gamma": {"k": 3}}, out=4))
    inst = ses.fleet.replicas()[0].inst

    def row(k, ctx, fused=True):
        return [SimpleNamespace(num_computed=ctx, spec=SimpleNamespace(fused=fused, tree=None)), k, 0]
    spec = [row(3, 200), row(1, 50), row(5, 900), row(3, 10), row(4, 77, fused=False), row(0, 400)]
    rows = [(3, 200), (1, 50), (5, 900), (3, 10)]
    want = 0.0
    for j in range(1, 6):
        live = [c for k, c in rows if k >= j]
        want += inst.draft_model.step_time(BatchShape(decode_tokens=len(live), decode_ctx_sum=sum(live) + len(live) * j,
                                                      num_sampled=len(live), running=len(live)))
    assert inst._draft_time(spec) == want
    assert inst._draft_time([row(2, 5, fused=False)]) == 0.0


def test_specpp_policies_of_one_configuration_share_their_choices():
    """Every conversation gets its own SpecPP policy; the configuration hands them one memo, so a
    context's choice is computed once per run, not once per conversation."""
    ses = run(spec_scn({"mode": "fused", "acceptance": {"geometric": 0.8},
                        "gamma": {"policy": "specpp", "threshold": 0.5, "k_max": 8}}, n=3, out=20))
    cfg = ses.spec.cfg
    pols = [st.policy for st in ses.spec.states.values()]
    assert len(pols) == 3 and len({id(p) for p in pols}) == 3
    assert len({id(p._memo) for p in pols}) == 1 and pols[0]._memo is cfg.make_policy()._memo
    assert sum(len(v) for v in pols[0]._memo.values()) > 3      # filled by the run


def _two_pools(second: dict) -> dict:
    return {"name": "x", "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "workload": {"type": "poisson", "rate": 5, "num_requests": 20, "prompt_tokens": 100, "output_tokens": 8},
            "cluster": {"pools": [{"name": "llama", "replicas": 1}, {"name": "other", "replicas": 1, **second}]},
            "speculation": {"mode": "fused"}}


def test_a_drafter_is_refused_on_a_pool_of_another_tokenizer_family():
    """Only the first pool's model was checked against the drafter: a Qwen pool behind the Llama
    drafter (128,256 vs 152,064 tokens) was accepted."""
    import dsim
    from dsim.config.errors import ConfigError
    with pytest.raises(ConfigError) as e:
        dsim.load_scenario(_two_pools({"model": "qwen2.5-7b-instruct"}))
    assert str(e.value).startswith("cluster.pools[1].model: got 'qwen2.5-7b-instruct', expected a model of "
                                   "the drafter's tokenizer family (meta-llama/Llama-3.2-1B: 128256 tokens")
    scn = dsim.load_scenario(_two_pools({"model": "meta-llama/Llama-3.1-70B-Instruct",
                                         "engine": {"tensor_parallel_size": 4}}))     # same family: fine
    assert [p.model.vocab_size for p in scn.fleet.pools] == [128256, 128256]


def _hybrid_decisions(dwell: float) -> dict:
    """Each conversation's (time, mode) decisions under an RTT that flips 15 <-> 150 ms every 0.5 s."""
    import dsim
    from dsim.specdec import modes
    sched = [[0.5 * i, 150 if i % 2 else 15] for i in range(1, 80)]
    scn = {"name": "h", "seed": 3, "model": "meta-llama/Llama-3.1-8B", "hardware": "A100-80GB",
           "workload": {"type": "poisson", "rate": 4, "num_requests": 40, "prompt_tokens": 200, "output_tokens": 200},
           "speculation": {"mode": "hybrid", "gamma": {"policy": "static", "k": 4},
                           "mode_switch": {"policy": "rtt_load", "max_rtt_ms": 60, "min_fused_dwell_s": dwell},
                           "drafts": [{"name": "l", "profile": "laptop-rtx4060", "count": 8, "rtt_ms": 15,
                                       "bw_mbps": 100, "rtt_schedule": sched}]}}
    real, by = modes.DraftingModes._mode, {}

    def spy(self, st, tel, pmode, tgt):
        m = real(self, st, tel, pmode, tgt)
        by.setdefault(id(st), []).append((self.env.now, m))
        return m
    modes.DraftingModes._mode = spy
    try:
        dsim.run(scn)
    finally:
        modes.DraftingModes._mode = real
    return by


def _inside_a_dwell_not_fused(by: dict, dwell: float) -> int:
    """Decisions that are not fused although a fused one of the same conversation started a dwell
    less than ``dwell`` seconds before (the rule, written independently of the runtime)."""
    from dsim.specdec.gamma import FUSED
    bad = 0
    for decisions in by.values():
        until = -1.0
        for t, m in decisions:
            if t < until:
                bad += m != FUSED
            elif m == FUSED:
                until = t + dwell
    return bad


def test_fused_hysteresis_keeps_a_conversation_fused_for_the_dwell():
    """speculation.mode_switch.min_fused_dwell_s (seed 002's fused hysteresis): under an RTT that
    flips every 0.5 s, no conversation goes back to distributed drafting within 0.6 s of turning
    fused; without the dwell it does, hundreds of times."""
    assert _inside_a_dwell_not_fused(_hybrid_decisions(0.0), 0.6) > 100
    assert _inside_a_dwell_not_fused(_hybrid_decisions(0.6), 0.6) == 0


def test_expectation_draws_accept_the_expected_count_with_no_randomness(tmp_path):
    """acceptance_draws: expectation (seed 002 section 3.2): a chain accepts sum_i prod_{j<=i} p_j
    drafts in expectation, carried over rounds; a run then does not depend on the draws' seed."""
    from types import SimpleNamespace

    from dsim.specdec.acceptance import expected_accepted
    st = SimpleNamespace(acc_carry=0.0)
    assert [expected_accepted(st, [0.8, 0.5]) for _ in range(5)] == [1, 1, 1, 1, 2]     # 1.2 per round
    assert st.acc_carry == pytest.approx(0.0, abs=1e-9)
    assert expected_accepted(SimpleNamespace(acc_carry=0.0), [1.0, 1.0, 1.0]) == 3
    root = Path(__file__).resolve().parents[1]
    base = ["workload.num_requests=60", "speculation.acceptance_draws=expectation"]

    def rows(extra):
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        dsim.run(str(root / "scenarios" / "datacenter_fused.yaml"), str(out), plots=False, overrides=base + extra)
        return (out / "requests.csv").read_text()
    assert rows([]) == rows(["seeds={simulation: 99}"])
    sampled = ["speculation.acceptance_draws=sample"]
    assert rows(sampled) != rows(sampled + ["seeds={simulation: 99}"])
    with pytest.raises(dsim.ConfigError, match="acceptance_draws"):
        dsim.load_scenario(str(root / "scenarios" / "tree_drafts.yaml"), ["speculation.acceptance_draws=expectation"])
    # rollbacks are charged in expectation too (1 - prod p per round), not on every round whose
    # carried count falls short of k: about as many as sampling gives
    share = {}
    for mode in ("sample", "expectation"):
        sp = dsim.run(str(root / "scenarios" / "datacenter_fused.yaml"), plots=False,
                      overrides=["workload.num_requests=60", f"speculation.acceptance_draws={mode}"]).summary["speculation"]
        share[mode] = sp["rollbacks"] / sp["rounds"]
    assert 0 < share["expectation"] < 0.95 and abs(share["expectation"] - share["sample"]) < 0.15, share
