"""dsim observe against a fake OpenAI-compatible streaming server (tests/fake_openai.py) whose delays
are known: the capture's timings, token counts, errors, prompt structure, bounds (concurrency,
duration, Ctrl-C) and its exact replay by dsim cosim / dsim calibrate."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("aiohttp")

from fake_openai import CHAT_TEMPLATE_TOKENS, FakeServer  # noqa: E402

from dsim.calibrate.realrun import load_real  # noqa: E402
from dsim.config.errors import ConfigError  # noqa: E402
from dsim.cli import main  # noqa: E402

TTFT, ITL = 0.05, 0.02
# the fake's delays are sleeps in a server thread (they may run long on a loaded machine: the tests
# compare with when the fake really wrote); the client adds its event loop and HTTP parsing, ~2 ms at
# the median, but a loaded 2-core machine can stall a single reading by tens of ms, so single readings
# get a loose bound (STALL_MS) and medians a tight one (SLACK_MS)
SLACK_MS = 10.0
STALL_MS = 500.0

SCENARIO = {
    "name": "observe_small", "seed": 3, "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
    "engine": {"max_num_seqs": 256, "max_num_batched_tokens": 2048},
    "workload": {"type": "poisson", "rate": 20, "num_requests": 12,
                 "prompt_tokens": {"dist": "uniform", "min": 20, "max": 60}, "output_tokens": 5,
                 "shared_prefix": {"num_groups": 2, "users_per_group": 3, "system_prompt_len": 32}},
}


# under pytest-xdist (`-n auto --dist loadgroup`) this module's tests share one
# worker, so its module-scoped fixture (captured run against the fake server) runs once, not once per worker
pytestmark = pytest.mark.xdist_group("test_observe")


def _scenario(tmp_path, **workload):
    s = json.loads(json.dumps(SCENARIO))
    s["workload"].update(workload)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(s))
    return p


def _lines(p):
    return [json.loads(x) for x in Path(p).read_text().splitlines() if x.strip()]


def _observe(server, scn, out, *extra):
    return main(["-q", "observe", server.url, "--scenario", str(scn), "--out", str(out), *extra])


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """One capture of the shared-prefix workload, and what the fake server received."""
    d = tmp_path_factory.mktemp("obs")
    scn = _scenario(d)
    with FakeServer(TTFT, ITL) as f:
        assert _observe(f, scn, d / "cap") == 0
        received = list(f.received)
    assert main(["trace", "generate", str(scn), "--out", str(d / "drawn.jsonl")]) == 0
    return d, scn, received


def test_timings_match_the_servers_known_delays(captured):
    """Each client reading against the server's own clock (same process: one perf_counter): a chunk is
    never read before it was written and is read soon after; TTFT and the gaps are the server's."""
    d, _, received = captured
    recs = _lines(d / "cap" / "requests.jsonl")
    assert len(recs) == 12 and all(r["status"] == 200 and r["error"] is None for r in recs)
    server = {tuple(b["prompt"]): (t, writes) for t, _, b, writes in received}
    drawn = _lines(d / "cap" / "workload.jsonl")
    ttft_over, gap_err, late = [], [], []
    from dsim.serve import prompts
    for r in recs:
        t_recv, writes = server[tuple(prompts.token_ids(prompts.segments_of(drawn[r["index"]], r["index"])))]
        assert r["chunk_tokens"] == [1] * 5 and r["completion_tokens"] == 5 and len(writes) == 5
        assert r["prompt_tokens"] == r["sent_prompt_tokens"]           # token ids: the server counts what was drawn
        # the fake slept TTFT before its first chunk and ITL between chunks (a sleep may run long, never short)
        assert writes[0] - t_recv >= TTFT and min(np.diff(writes)) >= ITL - 1e-3
        chunks = np.asarray(r["chunk_s"])
        ttft = r["first_token_s"] - r["sent_s"]
        assert ttft >= writes[0] - t_recv                                # sent before received, read after written
        ttft_over.append((ttft - (writes[0] - t_recv)) * 1e3)
        gap_err += list((np.diff(chunks) - np.diff(writes)) * 1e3)
        late.append((r["sent_s"] - r["scheduled_s"]) * 1e3)
    # sent at the drawn time (never before it), read soon after written: the client's own overhead is
    # ~2 ms at the median; a loaded machine can stall a single reading
    assert min(late) >= 0 and np.median(late) < SLACK_MS and max(late) < STALL_MS, late
    assert np.median(ttft_over) < SLACK_MS and max(ttft_over) < STALL_MS, ttft_over
    assert abs(np.median(gap_err)) < SLACK_MS / 2 and max(np.abs(gap_err)) < STALL_MS, gap_err
    run = load_real(d / "cap")
    st = run.stages[0]
    assert run.source == "dsim-observe" and run.meta["clock"] == "client"
    assert st.real["ttft"]["count"] == 12 and st.real["ttft"]["p50"] >= TTFT * 1e3
    assert st.real["tpot"]["p50"] >= ITL * 1e3 - 1 and st.real["itl"]["p50"] >= ITL * 1e3 - 1


def test_the_server_received_the_drawn_prompts_with_their_shared_prefixes(captured):
    d, _, received = captured
    drawn = _lines(d / "drawn.jsonl")
    bodies = sorted((b for _, _, b, _ in received), key=lambda b: len(b["prompt"]))
    assert sorted(len(b["prompt"]) for b in bodies) == sorted(w["prompt_tokens"] for w in drawn)
    assert all(b["max_tokens"] == 5 and b["ignore_eos"] and b["min_tokens"] == 5 and b["stream"]
               and b["stream_options"]["include_usage"] for b in bodies)
    # requests of one prefix group share their 32-token system prompt, and only that
    by_time = [b for _, _, b, _ in sorted(received, key=lambda x: x[0])]
    heads = {}
    for w, b in zip(drawn, by_time):           # sent in drawn order (arrivals 10+ ms apart but for a few)
        heads.setdefault(w["prefix_group"], set()).add(tuple(b["prompt"][:32]))
    assert all(len(h) == 1 for h in heads.values()) and len(set().union(*heads.values())) == 2
    assert len({tuple(b["prompt"][32:40]) for b in bodies}) == len(bodies)     # questions differ


def test_the_replay_is_the_drawn_workload_exactly(captured):
    d, _, _ = captured
    drawn = _lines(d / "drawn.jsonl")
    assert _lines(d / "cap" / "workload.jsonl") == drawn       # dsim trace generate's lines, line for line
    run = load_real(d / "cap")
    assert [r["arrival_s"] for r in run.trace_rows] == [w["arrival_s"] for w in drawn]     # bit for bit
    for row, w in zip(run.trace_rows, drawn):
        assert (row["prompt_tokens"], row["output_tokens"]) == (w["prompt_tokens"], w["output_tokens"])
        assert row["segments"] == w["segments"] and row["prefix_group"] == w["prefix_group"]


@pytest.mark.parametrize("key,value", [("arrival_s", None), ("arrival_s", "soon"), ("prompt_tokens", 0),
                                       ("output_tokens", 1.5), ("segments", [[1, "a"]]), ("segments", 7)])
def test_an_edited_workload_line_is_a_user_error_naming_it(captured, tmp_path, key, value):
    """A capture whose workload.jsonl was edited or truncated: was an internal error (KeyError,
    TypeError), now a ConfigError naming the file, line and key."""
    d, _, _ = captured
    import shutil
    cap = tmp_path / "cap"
    shutil.copytree(d / "cap", cap)
    lines = _lines(cap / "workload.jsonl")
    if value is None:
        del lines[1][key]
    else:
        lines[1][key] = value
    (cap / "workload.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ConfigError, match=rf"workload.jsonl:2\.{key}"):
        load_real(cap)


def test_cosim_and_calibrate_read_a_capture(captured, tmp_path):
    d, scn, _ = captured
    assert main(["-q", "cosim", str(d / "cap"), "--scenario", str(scn), "--no-plots", "--out", str(tmp_path / "c")]) == 0
    rep = json.loads((tmp_path / "c" / "cosim.json").read_text())
    assert rep["source"] == "dsim-observe"
    m = rep["stages"][0]["metrics"]
    assert m["ttft"]["real"]["p50"] >= TTFT * 1e3
    assert rep["stages"][0]["requests"] == {"real": 12, "sim_completed": 12, "sim_arrived": 12}
    replay = _lines(tmp_path / "c" / "replay.jsonl")
    assert [r["segments"] for r in replay] == [w["segments"] for w in _lines(d / "drawn.jsonl")]
    assert main(["-q", "calibrate", str(d / "cap"), "--scenario", str(scn), "--max-evals", "2", "--no-loro",
                 "--out", str(tmp_path / "k")]) == 0
    cal = yaml.safe_load((tmp_path / "k" / "calibrated.yaml").read_text())
    assert cal["latency"]["model"] == "roofline"
    rep = json.loads((tmp_path / "k" / "report.json").read_text())
    assert rep["stage1"]["requests"] == 12         # per-request windows from the capture's chunk times


def test_server_errors_are_recorded_and_not_replayed(tmp_path):
    trace = tmp_path / "t.jsonl"
    rows = [(0.0, 40, 4), (0.01, 40, 7), (0.02, 41, 4), (0.03, 42, 9), (0.04, 43, 4), (0.05, 44, 11)]
    trace.write_text("".join(json.dumps({"arrival_s": a, "prompt_tokens": p, "output_tokens": o}) + "\n"
                             for a, p, o in rows))
    scn = tmp_path / "s.yaml"
    scn.write_text(yaml.safe_dump({**{k: SCENARIO[k] for k in ("model", "hardware", "seed")}, "name": "errs",
                                   "workload": {"type": "trace", "path": str(trace)}}))
    with FakeServer(0.01, 0.005, fail_500={7}, fail_400={9}, cut={11}) as f:
        assert _observe(f, scn, tmp_path / "cap") == 0
    recs = {r["index"]: r for r in _lines(tmp_path / "cap" / "requests.jsonl")}
    assert recs[1]["status"] == 500 and "boom" in recs[1]["error"]
    assert recs[3]["status"] == 400 and "prompt too long" in recs[3]["error"]
    assert recs[1]["first_token_s"] is None and recs[1]["chunk_s"] == []
    assert recs[5]["status"] == 200 and recs[5]["error"] and len(recs[5]["chunk_s"]) == 2    # cut mid-stream
    doc = json.loads((tmp_path / "cap" / "capture.json").read_text())
    assert doc["requests"] == {"drawn": 6, "sent": 6, "succeeded": 3, "failed": 3, "cancelled": 0, "not_sent": 0}
    run = load_real(tmp_path / "cap")
    assert [r["arrival_s"] for r in run.trace_rows] == [0.0, 0.02, 0.04]
    assert run.stages[0].failures == 3 and run.stages[0].overloaded


def test_concurrency_cap_bounds_the_server_and_the_replay(tmp_path):
    scn = _scenario(tmp_path, rate=200, num_requests=8)
    with FakeServer(0.02, 0.005) as f:
        assert _observe(f, scn, tmp_path / "cap", "--max-concurrency", "2") == 0
        assert f.peak == 2
    doc = json.loads((tmp_path / "cap" / "capture.json").read_text())
    assert doc["max_concurrency"] == 2 and doc["late"]["count"] >= 4      # 8 requests in ~40 ms, 2 slots
    run = load_real(tmp_path / "cap")
    assert run.scenario["workload"] == {"type": "trace", "max_concurrency": 2}
    recs = _lines(tmp_path / "cap" / "requests.jsonl")
    # each TTFT from its send time, not from the drawn arrival the slot made it miss
    assert max((r["first_token_s"] - r["sent_s"]) * 1e3 for r in recs) < 20 + STALL_MS


def test_duration_stops_sending_and_keeps_what_was_captured(tmp_path):
    scn = _scenario(tmp_path, rate=20, num_requests=40)
    with FakeServer(0.01, 0.005) as f:
        assert _observe(f, scn, tmp_path / "cap", "--duration", "0.5") == 0
    drawn = _lines(tmp_path / "cap" / "workload.jsonl")
    recs = _lines(tmp_path / "cap" / "requests.jsonl")
    assert len(drawn) == 40
    assert [r["index"] for r in recs] == [i for i, w in enumerate(drawn) if w["arrival_s"] < 0.5]
    doc = json.loads((tmp_path / "cap" / "capture.json").read_text())
    assert doc["ended"] == "duration" and doc["requests"]["not_sent"] == 40 - len(recs)
    assert all(r["status"] == 200 for r in recs)          # in flight at the end: waited for (--grace)


def test_ctrl_c_cancels_in_flight_and_writes_the_capture(tmp_path):
    """dsim observe in a process of its own, the fake server here: SIGINT once a few requests are done."""
    scn = _scenario(tmp_path, rate=4, num_requests=40, output_tokens=40)
    with FakeServer(0.01, 0.05) as f:           # 2 s a request, one sent every 0.25 s
        p = subprocess.Popen([sys.executable, "-m", "dsim.cli", "-q", "observe", f.url, "--scenario", str(scn),
                              "--out", str(tmp_path / "cap")], cwd=tmp_path, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)                     # cwd: the installed dsim
        t_end = time.monotonic() + 120
        while len(f.received) < 12 and time.monotonic() < t_end and p.poll() is None:
            time.sleep(0.05)
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err.decode()
    doc = json.loads((tmp_path / "cap" / "capture.json").read_text())
    assert doc["ended"] == "interrupted" and doc["requests"]["not_sent"] > 0 and doc["requests"]["cancelled"] > 0
    recs = _lines(tmp_path / "cap" / "requests.jsonl")
    assert any(r["cancelled"] and r["chunk_s"] for r in recs)        # its chunks so far are kept
    assert doc["requests"]["succeeded"] > 0
    assert len(load_real(tmp_path / "cap").trace_rows) == doc["requests"]["succeeded"]
    assert not [x for x in tmp_path.iterdir() if x.name.startswith(".cap.tmp")]


def test_chat_api_replays_the_servers_prompt_counts(tmp_path):
    scn = _scenario(tmp_path, num_requests=4)
    with FakeServer(0.01, 0.005) as f:
        assert _observe(f, scn, tmp_path / "cap", "--api", "chat") == 0
        bodies = [b for _, _, b, _ in f.received]
    drawn = _lines(tmp_path / "cap" / "workload.jsonl")
    assert sorted(len(b["messages"][0]["content"].split()) for b in bodies) == sorted(w["prompt_tokens"] for w in drawn)
    assert all(b["messages"][0]["role"] == "user" and "prompt" not in b for b in bodies)
    recs = _lines(tmp_path / "cap" / "requests.jsonl")
    assert all(r["prompt_tokens"] == r["sent_prompt_tokens"] + CHAT_TEMPLATE_TOKENS for r in recs)
    assert all(len(r["chunk_s"]) == 5 for r in recs)          # the role chunk carries no token
    run = load_real(tmp_path / "cap")
    for row, w in zip(run.trace_rows, drawn):
        assert row["prompt_tokens"] == w["prompt_tokens"] + CHAT_TEMPLATE_TOKENS
        assert row["segments"][:len(w["segments"])] == w["segments"]
        assert sum(n for _, n in row["segments"]) == row["prompt_tokens"]


def test_an_unreachable_server_is_a_user_error_and_writes_nothing(tmp_path, capsys):
    scn = _scenario(tmp_path)
    with FakeServer() as f:
        url = f.url
    assert main(["-q", "observe", url, "--scenario", str(scn), "--out", str(tmp_path / "cap")]) == 2
    assert "URL" in capsys.readouterr().err and not (tmp_path / "cap").exists()
    assert main(["-q", "observe", "ftp://x", "--scenario", str(scn), "--out", str(tmp_path / "cap")]) == 2


def test_import_dsim_does_not_import_aiohttp(tmp_path):
    code = "import sys, dsim, dsim.cli; assert 'aiohttp' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=tmp_path, check=True)


@pytest.mark.parametrize("flag,value", [("--max-concurrency", "0"), ("--duration", "-1"), ("--duration", "nan"),
                                        ("--grace", "-1"), ("--timeout", "0")])
def test_bad_flags_are_refused_before_anything_is_sent(tmp_path, capsys, flag, value):
    scn = _scenario(tmp_path)
    with FakeServer() as f:
        assert _observe(f, scn, tmp_path / "cap", flag, value) == 2
        assert f.received == []
    assert capsys.readouterr().err.startswith(f"dsim: error: {flag}") and not (tmp_path / "cap").exists()


def test_a_foreign_out_folder_is_refused_before_anything_is_sent(tmp_path, capsys):
    scn = _scenario(tmp_path)
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("not dsim's")
    with FakeServer() as f:
        assert _observe(f, scn, tmp_path / "mine") == 2
        assert f.received == []
    assert (tmp_path / "mine" / "notes.txt").read_text() == "not dsim's"


def test_without_vllm_extras_chunks_count_by_text_and_usage_gives_the_total(tmp_path):
    scn = _scenario(tmp_path, num_requests=3)
    with FakeServer(0.01, 0.005) as f:
        assert _observe(f, scn, tmp_path / "cap", "--no-vllm-extras") == 0
        bodies = [b for _, _, b, _ in f.received]
    assert all("ignore_eos" not in b and "min_tokens" not in b and b["stream_options"] == {"include_usage": True}
               for b in bodies)
    recs = _lines(tmp_path / "cap" / "requests.jsonl")
    assert all(r["chunk_tokens"] == [1] * 5 and r["completion_tokens"] == 5 for r in recs)


def test_filler_prompts_are_deterministic_prefix_stable_and_in_range(tmp_path):
    from dsim.serve import prompts
    a = prompts.token_ids([(1, 32), (1 << 32, 50)])
    b = prompts.token_ids([(1, 32), ((1 << 32) + 1, 50)])
    assert a[:32] == b[:32] and a[32:] != b[32:] and len(a) == 82
    assert prompts.token_ids([(7, 10)]) == prompts.token_ids([(7, 25)])[:10]     # a cut segment is a prefix
    assert prompts.token_ids([(-3, 5)]) != prompts.token_ids([(3, 5)])            # an answer's id is its own
    assert all(prompts.TOKEN_LO <= t < prompts.TOKEN_HI for t in a)
    assert len(prompts.text([(1, 40), (-2, 7)]).split()) == 47
    code = "from dsim.serve import prompts; print(prompts.token_ids([(123456789, 8)]))"
    other = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert json.loads(other) == prompts.token_ids([(123456789, 8)])               # the same in every process


def test_an_endpoint_url_must_agree_with_api():
    """A chat body sent to /v1/completions (or the reverse) failed every request and exited 0."""
    from dsim.serve.observe import endpoint
    assert endpoint("http://h:8000/v1/chat/completions", "chat") == ("http://h:8000/v1/chat/completions", "http://h:8000")
    assert endpoint("http://h:8000/v1", "completions") == ("http://h:8000/v1/completions", "http://h:8000")
    with pytest.raises(ConfigError, match=r"--api: got 'completions', expected chat"):
        endpoint("http://h:8000/v1/chat/completions", "completions")
    with pytest.raises(ConfigError, match=r"--api: got 'chat', expected completions"):
        endpoint("http://h:8000/v1/completions", "chat")
