"""The attack suite's fixed CI sample (experiments/attack.py, issue 36 item 6) and regression tests for
what its campaigns found.  Every case must end with exit 0 or a one-line exit-2 error within its
alarm, leave no output on exit 2 and write nothing outside its folder.  A failure prints the case's
mutator, seed, index, what it did and the command that reproduces it."""
import json
import os
import shutil
import signal
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))
import attack  # noqa: E402

from dsim.cli import main  # noqa: E402

SAMPLE = {"structural": 40, "data": 30, "flags": 60}      # seed 0; the file takes ~25 s on 2 cores
CASES = [(m, i) for m, n in SAMPLE.items() for i in range(n)]


@pytest.mark.parametrize("mutator,index", CASES, ids=[f"{m}-{i}" for m, i in CASES])
def test_attack_sample_ends_cleanly(tmp_path, mutator, index):
    case = attack.MUTATORS[mutator](0, index)
    r = attack.execute(case, tmp_path, timeout=20)
    assert r.verdict is None, f"{case.describe()}: {r.verdict}: {r.err}  [{case.reproduce()}]"


def test_every_subcommand_has_a_working_base_for_the_flag_mutator():
    """A new subcommand's numeric flags are found automatically; it needs one working invocation."""
    paths = [p for p, _ in attack.subcommands()]
    assert set(paths) == set(attack.BASES), set(paths) ^ set(attack.BASES)
    assert len(attack.flag_space()) >= 300


def test_mutators_are_deterministic():
    for m in attack.MUTATORS:
        assert attack.MUTATORS[m](3, 7).what == attack.MUTATORS[m](3, 7).what


# ---- regressions found by the campaigns --------------------------------------------------------------
class _Slow(Exception):
    pass


@pytest.fixture(autouse=True)
def _alarm(request):
    """A regression that hangs again (alias bomb, FIFO) fails after 30 s instead of stalling CI."""
    if "sample" in request.node.name:          # execute() sets its own alarm
        yield
        return

    def fire(*_):
        raise _Slow("still running after 30 s")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(30)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _refused(capsys, argv, where, out=None):
    code = main(argv)
    err = [x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("dsim: warning:")]
    assert code == 2 and len(err) == 1, (code, err)
    assert err[0].startswith("dsim: error: ") and where in err[0], err[0]
    assert "internal error" not in err[0]
    if out is not None:
        assert not Path(out).exists()
    return err[0]


def _scenario(tmp_path, **keys):
    doc = {"name": "r", "model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
           "workload": {"type": "poisson", "rate": 5, "num_requests": 5, "prompt_tokens": 64, "output_tokens": 8}}
    doc.update(keys)
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    return p


def test_yaml_alias_bomb_is_refused_not_expanded(tmp_path, capsys):
    """Nine levels of nine *aliases (9^10 values, 600 bytes) hung in str(rate) before the workload."""
    chain = ['&l0 [x, x, x, x, x, x, x, x, x]'] + [f"&l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]"
                                                     for i in range(1, 10)]
    p = tmp_path / "bomb.yaml"
    p.write_text("name: b\nmodel: meta-llama/Llama-3.1-8B\nhardware: H100-SXM\n"
                 f"workload: {{type: poisson, num_requests: 5, rate: [{', '.join(chain)}]}}\n")
    _refused(capsys, ["run", str(p), "--out", str(tmp_path / "o")], f"{p}: at most", tmp_path / "o")
    ok = tmp_path / "ok.yaml"                 # ordinary anchors still work
    ok.write_text("name: a\nmodel: meta-llama/Llama-3.1-8B\nhardware: H100-SXM\nengine: &e {max_num_seqs: 8}\n"
                  "cluster: {pools: [{name: p, replicas: 1, engine: *e}]}\n"
                  "workload: {type: poisson, rate: 5, num_requests: 5, prompt_tokens: 64, output_tokens: 8}\n")
    assert main(["validate", str(ok)]) == 0


@pytest.mark.parametrize("key", ["prompt_tokens", "output_tokens"])
def test_trace_with_1e30_tokens_is_refused(tmp_path, capsys, key):
    """It overflowed the ledger's int64 columns at the end of the run (internal error)."""
    t = tmp_path / "t.jsonl"
    row = {"arrival_s": 1, "prompt_tokens": 10, "output_tokens": 10}
    t.write_text(json.dumps({"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 10}) + "\n"
                 + json.dumps({**row, key: 10 ** 30}) + "\n")
    p = _scenario(tmp_path, workload={"type": "trace", "path": str(t)})
    _refused(capsys, ["run", str(p), "--quiet", "--out", str(tmp_path / "o")], f"{t}:2.{key}", tmp_path / "o")


def test_bench_json_and_run_folder_with_1e30_tokens_are_refused(tmp_path, capsys):
    b = json.loads((ROOT / "tests" / "fixtures" / "vllm_bench_detailed.json").read_text())
    b["input_lens"][1] = 10 ** 30
    f = tmp_path / "b.json"
    f.write_text(json.dumps(b))
    _refused(capsys, ["cosim", str(f), "--hardware", "H100-SXM", "--out", str(tmp_path / "o")],
             f"{f}.input_lens[1]", tmp_path / "o")
    src = ROOT / "examples" / "real" / "RTX4090_Llama-3.1-8B"
    d = tmp_path / "run"
    shutil.copytree(src, d)
    rows = (d / "requests.jsonl").read_text().splitlines()
    r = json.loads(rows[2])
    r["output_toks"] = 10 ** 30
    rows[2] = json.dumps(r)
    (d / "requests.jsonl").write_text("\n".join(rows) + "\n")
    _refused(capsys, ["cosim", str(d), "--out", str(tmp_path / "o")], "requests.jsonl:3.output_toks", tmp_path / "o")


def _iperf(tmp_path):
    d = tmp_path / "ip"
    shutil.copytree(ROOT / "examples" / "real" / "h100-llama-2-7b-tp1-general", d)
    return d


@pytest.mark.parametrize("how", ["fifo", "binary", "list", "abc", "nan"])
def test_inference_perf_yaml_files_are_read_like_user_files(tmp_path, capsys, how):
    """A FIFO exp-config.yaml blocked forever; junk bytes gave an error naming no file; a list or a
    non-integer tensor_parallelism was an internal error."""
    d = _iperf(tmp_path)
    f = d / "exp-config.yaml"
    if how == "fifo":
        f.unlink()
        os.mkfifo(f)
    elif how == "binary":
        f.write_bytes(b"\xff\xfe\x00junk")
    elif how == "list":
        f.write_text("- 1\n- 2\n")
    else:
        doc = yaml.safe_load(f.read_text())
        doc["tensor_parallelism"] = "abc" if how == "abc" else float("nan")
        f.write_text(yaml.safe_dump(doc))
    _refused(capsys, ["cosim", str(d), "--no-plots", "--out", str(tmp_path / "o")], str(f), tmp_path / "o")


def test_undecodable_requests_and_profiling_logs_name_their_file(tmp_path, capsys):
    d = tmp_path / "run"
    shutil.copytree(ROOT / "examples" / "real" / "RTX4090_Llama-3.1-8B", d)
    (d / "requests.jsonl").write_bytes(b"\x99\xfe junk\n")
    _refused(capsys, ["cosim", str(d), "--out", str(tmp_path / "o")], str(d / "requests.jsonl"), tmp_path / "o")
    logs = tmp_path / "logs.jsonl"
    logs.write_bytes(b'{"k": 2, "accepted": 1, "context_len": 5}\n\xff\xfe\n')
    _refused(capsys, ["acceptance", "train", str(logs), "--out", str(tmp_path / "b.joblib")], str(logs),
             tmp_path / "b.joblib")


def test_latency_head_with_a_malformed_hidden_layer_names_the_file(tmp_path, capsys):
    """[biases, weights] instead of [weights, biases] was an IndexError (internal error)."""
    head = yaml.safe_load((ROOT / "dsim" / "data" / "heads" / "latency_head.yaml").read_text())
    head["latency_head"]["hidden"].reverse()
    h = tmp_path / "head.yaml"
    h.write_text(yaml.safe_dump(head))
    doc = yaml.safe_load((ROOT / "scenarios" / "trained_gamma_head.yaml").read_text())
    doc["speculation"]["gamma"] = {"policy": "latency_head", "head": str(h)}
    doc["workload"]["num_requests"] = 5
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(doc))
    err = _refused(capsys, ["run", str(p), "--out", str(tmp_path / "o")], "speculation.gamma.head", tmp_path / "o")
    assert str(h) in err and len(err) < 400


LUT = str(ROOT / "luts" / "llama-2-7b_h100_tp1.csv")
RUN = str(ROOT / "examples" / "real" / "RTX4090_Llama-3.1-8B")
FLAGS = [   # (argv without --out, the flag the message must name); each was an internal error or a hang
    (["fit", RUN, "--max-evals", str(10 ** 30)], "--max-evals"),
    (["fit", RUN, "--jobs", str(10 ** 30)], "--jobs"),
    (["calibrate", RUN, "--max-evals", str(10 ** 30)], "--max-evals"),
    (["calibrate", RUN, "--jobs", str(10 ** 30)], "--jobs"),
    (["acceptance", "train", "{logs}", "--max-depth", str(10 ** 30)], "--max-depth"),
    (["lut", "build", "--model", "meta-llama/Llama-2-7b-hf", "--hardware", "H100-SXM", "--contexts", str(10 ** 30)],
     "--contexts"),
    (["bench", "--requests", "0"], "--requests"),
    (["bench", "--rate", "1e308"], "--rate"),
]


@pytest.mark.parametrize("argv,flag", FLAGS, ids=[f"{a[0]}{f}" for a, f in FLAGS])
def test_numeric_flags_past_their_bounds_are_refused(tmp_path, capsys, argv, flag):
    out = tmp_path / "o"
    extra = [] if argv[0] == "bench" else ["--out", str(out)]
    argv = [str(attack._acc_logs(tmp_path)) if a == "{logs}" else a for a in argv]
    _refused(capsys, argv + extra, flag, out)


def test_train_head_seed_and_hidden_bounds(tmp_path, capsys):
    """--hidden 1e30 was numpy's 'Maximum allowed dimension exceeded', --seed -1 a ValueError."""
    assert main(["specdec", "train-head", str(tmp_path), "--hidden", str(10 ** 30), "--out",
                 str(tmp_path / "h.yaml")]) == 2
    assert "--hidden" in capsys.readouterr().err
    assert main(["specdec", "train-head", str(tmp_path), "--seed", "-1", "--out", str(tmp_path / "h.yaml")]) == 2
    assert "--seed" in capsys.readouterr().err
