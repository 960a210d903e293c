"""The reproducibility log (issue 43.7, seed 002 section 2): output.repro_log records every mode
decision and acceptance outcome; speculation.replay_log replays them."""
import json

import pytest
from helpers import scenario

import dsim
from dsim.config.errors import ConfigError

# hybrid drafting whose RTT crosses the selector's bound and back, an acceptance-driven gamma
# policy and sampled partial verification: every kind of decision the log holds is random or
# depends on a random draw
SPEC = {"mode": "hybrid", "acceptance": {"geometric": 0.7},
        "gamma": {"policy": "acceptance_backoff", "k_max": 6},
        "mode_switch": {"max_rtt_ms": 60},
        "partial_verification": {"mode": "sampled", "sample_rate": 0.5, "rollback_penalty_ms": 1},
        "drafts": [{"name": "lap", "profile": "laptop-rtx4060", "count": 6, "rtt_ms": 15, "bw_mbps": 100,
                    "rtt_schedule": [[1.0, 150], [2.0, 15]]}]}


def scn(**over):
    s = scenario(latency={"model": "roofline"}, workload={"type": "poisson", "rate": 20, "num_requests": 50,
                                                          "prompt_tokens": 80, "output_tokens": 40},
                 speculation=dict(SPEC), **over)
    return s


def out(tmp_path, name, s):
    d = tmp_path / name
    dsim.run(s, d, plots=False)
    return d


def test_record_then_replay_with_another_seed_gives_the_same_requests(tmp_path):
    rec = out(tmp_path, "rec", scn(output={"plots": False, "repro_log": True}))
    plain = out(tmp_path, "plain", scn())
    log = (rec / "repro_log.jsonl").read_text().splitlines()
    head, events = json.loads(log[0]), [json.loads(x) for x in log[1:]]
    assert head["repro_log"] == 1 and not (plain / "repro_log.jsonl").exists()
    # recording changes nothing, and the log holds both modes, partial-KV draws and rollbacks
    assert (rec / "requests.csv").read_bytes() == (plain / "requests.csv").read_bytes()
    modes = {e["mode"] for e in events if e["ev"] == "mode"}
    accepts = [e for e in events if e["ev"] == "accept"]
    assert modes == {"fused", "distributed"} and any(e["kv"] < e["k"] for e in events if e["ev"] == "mode")
    summ = json.loads((rec / "summary.json").read_text())["speculation"]
    assert sum(e["k"] for e in accepts) == summ["verified_tokens"] and sum(e["a"] for e in accepts) == summ["accepted_tokens"]
    assert sum(e["rb"] for e in accepts) == summ["rollbacks"]
    # another simulation seed draws other acceptance: other requests ...
    other = out(tmp_path, "other", scn(seeds={"simulation": 99}))
    assert (other / "requests.csv").read_bytes() != (rec / "requests.csv").read_bytes()
    # ... unless the log is replayed: then byte-identical requests, every event taken from the log
    s = scn(seeds={"simulation": 99}, output={"plots": False, "repro_log": True})
    s["speculation"]["replay_log"] = str(rec / "repro_log.jsonl")
    rep = out(tmp_path, "rep", s)
    assert (rep / "requests.csv").read_bytes() == (rec / "requests.csv").read_bytes()
    r = json.loads((rep / "summary.json").read_text())["speculation"]["replay"]
    assert r == {"replayed": len(events), "fallbacks": 0}
    assert json.loads((rep / "summary.json").read_text())["speculation"]["rollbacks"] == summ["rollbacks"] > 0
    assert (rep / "repro_log.jsonl").read_text().splitlines()[1:] == log[1:]     # the same log again


def test_an_edited_draw_changes_the_run(tmp_path):
    """One verification edited to reject all its drafts: that conversation needs more rounds (the
    log has none for them: they are drawn, counted as fallbacks), and the requests differ."""
    import csv
    rec = out(tmp_path, "rec", scn(output={"plots": False, "repro_log": True}))
    lines = (rec / "repro_log.jsonl").read_text().splitlines()
    i = next(i for i, x in enumerate(lines) if '"ev":"accept"' in x and json.loads(x)["a"] >= 2)
    e = json.loads(lines[i])
    e["a"], e["rb"] = 0, 1
    lines[i] = json.dumps(e)
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(lines) + "\n")
    s = scn()
    s["speculation"]["replay_log"] = str(edited)
    rep = out(tmp_path, "rep", s)
    assert (rep / "requests.csv").read_bytes() != (rec / "requests.csv").read_bytes()
    summ = json.loads((rep / "summary.json").read_text())["speculation"]
    assert summ["replay"]["fallbacks"] >= 1
    rows = [{r["request_id"]: r for r in csv.DictReader(open(d / "requests.csv"))} for d in (rec, rep)]
    rid = str(e["rid"])
    # its tokens are accepted drafts + one per round + the first: fewer accepted, more rounds
    assert int(rows[1][rid]["spec_rounds"]) > int(rows[0][rid]["spec_rounds"])
    assert int(rows[1][rid]["spec_accepted_tokens"]) < int(rows[0][rid]["spec_accepted_tokens"])


def test_an_edited_decision_draws_its_verification(tmp_path):
    """A mode line edited to draft fewer tokens (k = 1) than its recorded verification held: that
    verification is not the one the log recorded (another k), so it is drawn (a fallback), never
    the log's a, which could exceed the drafts."""
    rec = out(tmp_path, "rec", scn(output={"plots": False, "repro_log": True}))
    lines = (rec / "repro_log.jsonl").read_text().splitlines()
    ev = [json.loads(x) for x in lines[1:]]
    acc = next(e for e in ev if e["ev"] == "accept" and e["a"] >= 2)
    i = next(i for i, e in enumerate(ev, 1) if e["ev"] == "mode" and e["rid"] == acc["rid"] and e["n"] == acc["n"])
    e = json.loads(lines[i])
    e["k"], e["kv"] = 1, 1
    lines[i] = json.dumps(e)
    edited = tmp_path / "edited.jsonl"
    edited.write_text("\n".join(lines) + "\n")
    s = scn(output={"plots": False, "repro_log": True})
    s["speculation"]["replay_log"] = str(edited)
    rep = out(tmp_path, "rep", s)
    assert json.loads((rep / "summary.json").read_text())["speculation"]["replay"]["fallbacks"] >= 1
    got = [json.loads(x) for x in (rep / "repro_log.jsonl").read_text().splitlines()[1:]]
    mine = next(g for g in got if g["ev"] == "accept" and g["rid"] == acc["rid"] and g["n"] == acc["n"])
    assert mine["k"] == 1 and mine["a"] <= 1


def test_bad_logs_and_a_log_without_speculation_are_refused(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"repro_log": 1}\n{"ev": "accept", "rid": 0, "n": 0, "k": 2, "a": 3, "rb": 0}\n')
    s = scn()
    s["speculation"]["replay_log"] = str(bad)
    with pytest.raises(ConfigError, match=r"bad.jsonl:2.a"):
        dsim.run(s)
    bad.write_text("not a log\n")
    with pytest.raises(ConfigError, match=r"speculation.replay_log"):
        dsim.run(s)
    with pytest.raises(ConfigError, match=r"output.repro_log"):
        dsim.run(scenario(output={"plots": False, "repro_log": True}))
