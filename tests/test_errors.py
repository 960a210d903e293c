"""Every bad input: exit code 2, one line naming the key path, and no output left behind."""
import json
import subprocess
import sys

import pytest
import yaml

import dsim
from dsim.cli import main
from helpers import scenario

CASES = [
    ({"engine": {"max_num_seqs": 0}}, "engine.max_num_seqs"),
    ({"engine": {"max_num_seq": 8}}, "engine.max_num_seq"),
    ({"engine": {"gpu_memory_utilization": 1.5}}, "engine.gpu_memory_utilization"),
    ({"engine": {"enable_chunked_prefill": "yes"}}, "engine.enable_chunked_prefill"),
    ({"hardware": "H200-NVL"}, "hardware"),
    ({"model": "no-such-model"}, "model"),
    ({"model": {"config": "missing/config.json"}}, "model.config"),
    ({"latency": {"model": "magic"}}, "latency.model"),
    ({"latency": {"model": "blackbox", "beta": [1, 2]}}, "latency.beta"),
    ({"workload": {"type": "poisson", "rate": -1, "num_requests": 5, "prompt_tokens": 5, "output_tokens": 5}},
     "workload.rate"),
    ({"workload": {"type": "poisson", "rate": 1, "prompt_tokens": 5, "output_tokens": 5}}, "workload.num_requests"),
    ({"workload": {"type": "poisson", "rate": 1, "num_requests": 5, "prompt_tokens": {"dist": "zipf"},
                   "output_tokens": 5}}, "workload.prompt_tokens.dist"),
    ({"workload": {"type": "poisson", "rate": 1, "num_requests": 5, "prompt_tokens": 5, "output_tokens": 5,
                   "burstiness": 2}}, "workload.burstiness"),
    ({"workload": {"type": "trace", "path": "nope.jsonl"}}, "workload.path"),
    ({"slo": {"ttft_ms": "fast"}}, "slo.ttft_ms"),
    ({"sedd": 1}, "sedd"),
    ({"workload": {"type": "ramp", "rate": 5, "num_requests": 10, "prompt_tokens": 5, "output_tokens": 5}},
     "workload.ramp_s"),
    ({"workload": {"type": "gamma", "rate": 5, "num_requests": 10, "prompt_tokens": 5, "output_tokens": 5}},
     "workload.cv"),
    ({"workload": {"type": "staged", "stages": [{"rate": 1}], "prompt_tokens": 5, "output_tokens": 5}},
     "workload.stages[0].duration_s"),
    ({"hardware": {"peak_tflops_bf16": 100, "hbm_gb_s": 1000}}, "hardware.memory_gib"),
    ({"engine": {"tensor_parallel_size": 3}}, "engine.tensor_parallel_size"),
]


@pytest.mark.parametrize("over,path", CASES)
def test_cli_error_names_path_exits_2_and_writes_nothing(tmp_path, capsys, over, path):
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(scenario(**over)))
    out = tmp_path / "out"
    code = main(["run", str(sc), "--out", str(out), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith(f"dsim: error: {path}")
    assert "\n" not in err and "Traceback" not in err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir()] == ["s.yaml"]


def test_bad_trace_row_names_file_and_line(tmp_path, capsys):
    t = tmp_path / "t.jsonl"
    t.write_text('{"arrival_s": 0, "prompt_tokens": 5, "output_tokens": 3}\n'
                 '{"arrival_s": 1, "prompt_tokens": -4, "output_tokens": 3}\n')
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(scenario(workload={"type": "trace", "path": str(t)})))
    assert main(["run", str(sc), "--out", str(tmp_path / "o"), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"{t}:2.prompt_tokens" in err and not (tmp_path / "o").exists()


def test_yaml_syntax_error_and_missing_file(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text("engine: {max_num_seqs: [\n")
    assert main(["validate", str(sc)]) == 2
    assert "valid YAML" in capsys.readouterr().err
    assert main(["validate", str(tmp_path / "none.yaml")]) == 2


def test_set_override_and_bad_override(tmp_path, capsys):
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(scenario()))
    s = dsim.load_scenario(str(sc), ["engine.max_num_seqs=7", "workload.rate=2.5"])
    assert s.engine.max_num_seqs == 7 and s.raw["workload"]["rate"] == 2.5
    assert main(["validate", str(sc), "--set", "engine.max_num_seqs"]) == 2
    assert main(["validate", str(sc), "--set", "engine.max_num_seqs=-3"]) == 2
    err = capsys.readouterr().err
    assert "engine.max_num_seqs" in err


def test_set_into_a_list_item(tmp_path):
    sc = tmp_path / "s.yaml"
    wl = {"type": "staged", "stages": [{"rate": 1, "duration_s": 2}, {"rate": 3, "duration_s": 2}],
          "prompt_tokens": 5, "output_tokens": 5}
    sc.write_text(yaml.safe_dump(scenario(workload=wl)))
    s = dsim.load_scenario(str(sc), ["workload.stages[1].rate=7"])
    assert s.raw["workload"]["stages"][1]["rate"] == 7 and s.raw["workload"]["stages"][0]["rate"] == 1
    with pytest.raises(dsim.ConfigError, match="index"):
        dsim.load_scenario(str(sc), ["workload.stages[5].rate=7"])


def test_json_scenarios_are_accepted(tmp_path):
    sc = tmp_path / "s.json"
    sc.write_text(json.dumps(scenario()))
    assert main(["validate", str(sc)]) == 0


def test_console_script_exit_code(tmp_path):
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump(scenario(engine={"block_size": 0})))
    p = subprocess.run([sys.executable, "-m", "dsim.cli", "run", str(sc), "--quiet"], capture_output=True,
                       text=True, cwd=tmp_path)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "engine.block_size" in p.stderr
    assert not (tmp_path / "results").exists()


def test_a_closed_pipe_ends_quietly():
    """`dsim validate x | head -1`: when the reader leaves, no internal-error message, exit 141."""
    import subprocess
    import sys
    from pathlib import Path
    scn = Path(__file__).resolve().parents[1] / "scenarios" / "draft_sweep_multicluster.yaml"
    p = subprocess.Popen([sys.executable, "-m", "dsim.cli", "validate", str(scn)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()                          # the reader is gone before dsim writes
    err = p.stderr.read().decode()
    assert p.wait() == 141 and err == ""


@pytest.mark.parametrize("args", [["--requests", "0"], ["--requests", "-5"],
                                  ["--scenario", "quickstart", "--requests", "0"]])
def test_bench_refuses_a_request_count_below_one(args, capsys):
    """`dsim bench --requests 0` once ran the default 20,000 (0 read as "not given")."""
    from pathlib import Path

    from dsim.cli import main
    args = [str(Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml") if a == "quickstart" else a
            for a in args]
    assert main(["bench", *args]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip() == "dsim: error: --requests: got " \
        f"{args[-1]}, expected a number in [1, 100000000]"          # the flag named, not the key it sets


@pytest.mark.parametrize("text, want", [("1e9", 1e9), ("-1e-9", -1e-9), ("1.5e3", 1500.0), ("+2E+3", 2000.0),
                                        ("1e300", 1e300), (".5", 0.5), ("3", 3), ("1e", "1e"), ("e9", "e9")])
def test_numbers_are_read_the_way_people_write_them(text, want, tmp_path):
    """YAML 1.2 floats in files, --set and grids: '1e9' used to be the string '1e9' (YAML 1.1)."""
    from dsim.config.files import load_value, load_yaml
    from dsim.config.scenario import load_scenario
    from dsim.explore.points import _value
    got = load_value(text)
    assert got == want and type(got) is type(want)
    assert _value(text) == want and load_yaml(f"x: {text}\n", "f.yaml") == {"x": want}
    if isinstance(want, float) and want > 0:
        f = tmp_path / "s.yaml"
        # horizon_s: a number with no upper bound (workload.rate, validated at load now, stops at 1e9)
        f.write_text(f"model: meta-llama/Llama-3.1-8B\nhardware: H100-SXM\nhorizon_s: {text}\nworkload: {{type: "
                     "poisson, rate: 1, num_requests: 5, prompt_tokens: 10, output_tokens: 2}\n")
        assert load_scenario(f).raw["horizon_s"] == want and load_scenario(f).config.horizon_s == want
        assert load_scenario(f, [f"horizon_s={text}"]).raw["horizon_s"] == want


def test_round3_inputs_are_path_qualified_errors_not_internal_ones(tmp_path, capsys):
    """Reproducers of ../shared/reliability/round3 (rebuilt here): exit 2, the user's own file, line and
    field, nothing written; each was an internal error, a temp-file name or an exit 0 with nonsense."""
    import shutil
    from pathlib import Path

    from dsim.cli import main
    root = Path(__file__).resolve().parents[1]
    out = tmp_path / "out"
    t = tmp_path / "t.jsonl"                      # +inf passed ">= 0" and completed a request at t = inf
    t.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 2}\n'
                 '{"arrival_s": Infinity, "prompt_tokens": 10, "output_tokens": 2}\n')
    bench = json.loads((root / "tests" / "fixtures" / "vllm_bench_detailed.json").read_text())
    rate0 = tmp_path / "rate0.json"
    rate0.write_text(json.dumps({**bench, "request_rate": 0}))
    neg = tmp_path / "neg.json"
    neg.write_text(json.dumps({**bench, "request_rate": -1}))
    lss = tmp_path / "lss"
    shutil.copytree(root / "examples" / "real" / "RTX4090_Llama-3.1-8B", lss)
    rows = (lss / "requests.jsonl").read_text().splitlines()
    r = json.loads(rows[1])
    r["input_toks"] = 0
    (lss / "requests.jsonl").write_text("\n".join([rows[0], json.dumps(r)] + rows[2:]) + "\n")
    q = str(root / "scenarios" / "quickstart.yaml")
    cases = [
        # the whole section: a trace has no prompt_tokens (quickstart's would be an unknown key)
        (["run", q, "--set", "workload=" + json.dumps({"type": "trace", "path": str(t), "num_requests": 2})],
         f"{t}:2.arrival_s"),
        (["cosim", str(rate0), "--hardware", "H100-SXM"], f"{rate0}.request_rate"),
        (["cosim", str(neg), "--hardware", "H100-SXM"], f"{neg}.request_rate"),
        (["cosim", str(lss)], f"{lss}/requests.jsonl:2.input_toks"),
        (["capacity", q, "--slo", "ttft_p99_ms=500", "--min-goodput", "2"], "--min-goodput"),
        (["capacity", q, "--slo", "ttft_p99_ms=inf"], "--slo ttft_p99_ms=inf"),
        (["capacity", q, "--slo", "ttft_p99_ms=500", "--target-rate", "-5",
          "--vary", "cluster.pools[0].replicas"], "--target-rate"),
    ]
    for args, where in cases:
        code = main(args + ["--out", str(out)])
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith(f"dsim: error: {where}"), (args, err)
        assert "internal error" not in err and "tmp" not in err.replace(str(tmp_path), "")
        assert not out.exists()


@pytest.mark.parametrize("args, flag", [
    (["sweep", "{q}", "--grid", "workload.rate=1,2", "--jobs", "0"], "--jobs"),
    (["sweep", "{q}", "--grid", "workload.rate=1", "--seeds", "100000000"], "--seeds"),
    (["sweep", "{q}", "--grid", "workload.rate=1,2", "--jobs", "1000000"], "--jobs"),
    (["plan", "{q}", "--gpus", "2", "--space", "{space}", "--slo", "ttft_p99_ms=500", "--top", "0"], "--top"),
    (["plan", "{q}", "--gpus", "2", "--space", "{space}", "--slo", "ttft_p99_ms=500", "--rounds", "0"], "--rounds"),
    (["plan", "{q}", "--gpus", "100000000", "--space", "{space}", "--slo", "ttft_p99_ms=500"], "--gpus"),
])
def test_flags_out_of_range_are_refused_before_anything_is_written(args, flag, tmp_path, capsys):
    """sweep --jobs 0 used to leave points/ and sweep.yaml; --seeds 1e8 and --gpus 1e8 ran out of
    memory or time; plan --top 0 --rounds 0 exited 0 with an empty answer."""
    from pathlib import Path

    from dsim.cli import main
    root = Path(__file__).resolve().parents[1]
    fill = {"q": str(root / "scenarios" / "quickstart.yaml"), "space": str(root / "scenarios" / "spaces" / "small.yaml")}
    out = tmp_path / "out"
    code = main([a.format(**fill) for a in args] + ["--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith(f"dsim: error: {flag}: got "), err
    assert not out.exists()


def test_a_device_or_fifo_is_refused_not_read_forever(tmp_path, capsys):
    """`dsim lut check /dev/zero` read until MemoryError; a FIFO with no writer blocks forever."""
    import os

    from dsim.cli import main
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        assert main(["lut", "check", path]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"dsim: error: {path}") and "internal error" not in err, err
