"""Round three's data-file reproducers (issue 36, items 3, 4 and 6-data), rebuilt in tmp_path: each is
exit 2 (or, for `lut check`, findings with exit 1) with one line naming the user's file and field,
and nothing written; before, each was an internal error, a temp-file name, or exit 0 with nonsense."""
import copy
import json
import math
from pathlib import Path

import pytest
import yaml

from dsim.cli import main

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "tests" / "fixtures" / "vllm_bench_detailed.json"
LSS = ROOT / "examples" / "real" / "RTX4090_Llama-3.1-8B"
LUT = ROOT / "luts" / "llama-2-7b_h100_tp1.csv"
CATALOG = ROOT / "dsim" / "config" / "catalog" / "llama-3.1-8b-instruct.json"
HEAD = ROOT / "dsim" / "data" / "heads" / "latency_head.yaml"
QUICK = ROOT / "scenarios" / "quickstart.yaml"


def _fails(capsys, tmp_path, args, where, also=()):
    """Exit 2, one line starting with ``where`` (holding each of ``also``), no --out folder, no temp name."""
    out = tmp_path / "out"
    code = main(args + ["--out", str(out)])
    err = "\n".join(x for x in capsys.readouterr().err.strip().splitlines() if not x.startswith("dsim: warning:"))
    assert code == 2, (args, err)
    assert err.startswith(f"dsim: error: {where}"), err
    assert "\n" not in err and "internal error" not in err and "Traceback" not in err
    assert "tmp" not in err.replace(str(tmp_path), ""), err          # never a temp replay.jsonl
    for s in also:
        assert s in err, err
    assert not out.exists()
    return err


# ---- vllm bench JSON ----------------------------------------------------------------------------------
def _bench(**change):
    d = json.loads(BENCH.read_text())
    for k, v in change.items():
        if isinstance(v, tuple):
            d[k][v[0]] = v[1]
        else:
            d[k] = v
    return d


BENCH_CASES = {
    "list": ([_bench()], "{p}", "JSON object"),
    "itls_int": (_bench(itls=5), "{p}.itls", "per-request list"),
    "ttft_nan": (_bench(ttfts=(1, math.nan)), "{p}.ttfts[1]", "finite"),
    "ttft_inf": (_bench(ttfts=(1, math.inf)), "{p}.ttfts[1]", "finite"),
    "ttft_text": (_bench(ttfts=(0, "x")), "{p}.ttfts[0]", "finite"),
    "itl_nan": (_bench(itls=(0, [0.01, math.nan])), "{p}.itls[0][1]", "finite"),
    "all_errored": (_bench(errors=["boom"] * 6), "{p}", "no request"),
    "all_zero_tokens": (_bench(output_lens=[0] * 6), "{p}", "no request"),
    "input_zero": (_bench(input_lens=(0, 0)), "{p}.input_lens[0]", "integer >= 1"),
    "input_fraction": (_bench(input_lens=(0, 1.5)), "{p}.input_lens[0]", "integer >= 1"),
    "output_text": (_bench(output_lens=(0, "x")), "{p}.output_lens[0]", "integer >= 0"),
    "errors_short": (_bench(errors=[""]), "{p}.errors", "one entry per request"),
    "burstiness_text": (_bench(burstiness="x"), "{p}.burstiness", "finite number > 0"),
    "duration_text": (_bench(duration="x"), "{p}.duration", "seconds"),
}


@pytest.mark.parametrize("name", sorted(BENCH_CASES))
def test_bad_vllm_bench_json_names_file_and_field(tmp_path, capsys, name):
    doc, where, why = BENCH_CASES[name]
    p = tmp_path / f"{name}.json"
    p.write_text(json.dumps(doc))               # NaN/Infinity as Python's json writes them
    _fails(capsys, tmp_path, ["cosim", str(p), "--hardware", "H100-SXM", "--no-plots"], where.format(p=p), [why])


# ---- meta.json + requests.jsonl -----------------------------------------------------------------------
def _lss(tmp_path, meta=None, rows=None, n=20):
    d = tmp_path / "lss"
    d.mkdir()
    m = json.loads((LSS / "meta.json").read_text())
    lines = (LSS / "requests.jsonl").read_text().splitlines()[:n]
    (d / "meta.json").write_text(json.dumps(meta(m) if meta else m))
    (d / "requests.jsonl").write_text(rows(lines) if rows else "\n".join(lines) + "\n")
    return d


def test_meta_json_that_is_a_list(tmp_path, capsys):
    d = _lss(tmp_path, meta=lambda m: [m])
    _fails(capsys, tmp_path, ["cosim", str(d), "--no-plots"], f"{d}/meta.json", ["JSON object"])


def test_requests_jsonl_that_is_one_array(tmp_path, capsys):
    d = _lss(tmp_path, rows=lambda ls: json.dumps([json.loads(x) for x in ls]) + "\n")
    _fails(capsys, tmp_path, ["cosim", str(d), "--no-plots"], f"{d}/requests.jsonl:1", ["one request a line"])


def test_replay_that_can_serve_no_request_is_refused_before_simulating(tmp_path, capsys):
    d = _lss(tmp_path, meta=lambda m: {**m, "kv_cache": {**m["kv_cache"], "num_gpu_blocks": 1}})
    _fails(capsys, tmp_path, ["cosim", str(d), "--no-plots"], "engine.num_gpu_blocks: got 1", ["KV blocks"])


def test_run_with_one_kv_block_is_an_error_not_an_empty_report(tmp_path, capsys):
    _fails(capsys, tmp_path, ["run", str(QUICK), "--quiet", "--no-plots", "--set", "engine.num_gpu_blocks=1"],
           "engine.num_gpu_blocks: got 1", ["needs", "KV blocks", "a replica has 1"])


def test_run_whose_every_request_is_too_long_is_an_error(tmp_path, capsys):
    _fails(capsys, tmp_path, ["run", str(QUICK), "--quiet", "--no-plots", "--set", "engine.max_model_len=16"],
           "engine.max_model_len: got 16", ["smallest request", "is longer"])


def _identical_timestamps(ls):
    out = []
    for x in ls:
        r = json.loads(x)
        r["first_token_ts"] = r["last_token_ts"] = r["queued_ts"]
        out.append(json.dumps(r))
    return "\n".join(out) + "\n"


def test_cosim_with_nothing_to_compare_is_an_error(tmp_path, capsys):
    d = _lss(tmp_path, rows=_identical_timestamps)
    _fails(capsys, tmp_path, ["cosim", str(d), "--no-plots"], str(d), ["at least one metric to compare"])


def test_calibrate_with_an_infinite_loss_writes_nothing(tmp_path, capsys):
    d = _lss(tmp_path, rows=_identical_timestamps)
    _fails(capsys, tmp_path, ["calibrate", str(d), "--max-evals", "1", "--no-loro"], str(d), ["loss", "inf"])


# ---- generic CSV --------------------------------------------------------------------------------------
COLS = "arrival_s=t,prompt_tokens=inp,output_tokens=out,ttft_s=ttft,e2e_s=lat"


@pytest.mark.parametrize("unit", ["0", "nan", "-1"])
def test_time_unit_must_be_finite_and_positive(tmp_path, capsys, unit):
    p = tmp_path / "r.csv"
    p.write_text("t,inp,out,ttft,lat\n0,100,5,0.2,0.5\n1,100,5,0.2,0.5\n")
    _fails(capsys, tmp_path, ["cosim", str(p), "--columns", COLS, "--time-unit", unit, "--model",
                              "meta-llama/Llama-3.1-8B", "--hardware", "H100-SXM", "--no-plots"], "--time-unit")


def test_generic_row_with_zero_tokens_names_the_users_file(tmp_path, capsys):
    p = tmp_path / "r.csv"
    p.write_text("t,inp,out,ttft,lat\n0,100,5,0.2,0.5\n1,0,5,0.2,0.5\n")
    _fails(capsys, tmp_path, ["cosim", str(p), "--columns", COLS, "--model", "meta-llama/Llama-3.1-8B",
                              "--hardware", "H100-SXM", "--no-plots"], f"{p}:3.inp")


# ---- LUTs ----------------------------------------------------------------------------------------------
def _lut(tmp_path, edit):
    lines = LUT.read_text().splitlines()
    rows = [r.split(",") for r in lines[1:]]
    edit(rows)
    p = tmp_path / "t.csv"
    p.write_text("\n".join([lines[0]] + [",".join(r) for r in rows]) + "\n")
    return p


def _set(i, col, v):
    def edit(rows):
        rows[i][col] = v
    return edit


@pytest.mark.parametrize("value", ["nan", "inf"])
def test_lut_with_a_non_finite_latency_is_invalid_for_check_and_run(tmp_path, capsys, value):
    p = _lut(tmp_path, _set(3, 9, value))
    assert main(["lut", "check", str(p)]) == 2
    assert capsys.readouterr().err.strip() == f"dsim: error: {p}:5: latency_ms: got '{value}', expected a finite number"
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump({"model": "meta-llama/Llama-2-7b-hf", "hardware": "H100-SXM",
                                  "latency": {"model": "lut", "path": str(p)},
                                  "workload": {"type": "poisson", "rate": 1, "num_requests": 3,
                                               "prompt_tokens": 10, "output_tokens": 3}}))
    _fails(capsys, tmp_path, ["run", str(sc), "--quiet"], f"{p}:5: latency_ms")


def _zero_all(rows):
    for r in rows:
        r[9] = "0"


LUT_FINDINGS = {
    "all_zero": (_zero_all, ["every latency_ms", "is 0"]),
    "foreign_model": (_set(5, 1, "meta-llama/Llama-2-70b-hf"), [":7: foreign model", "Llama-2-70b-hf"]),
    "duplicate": (lambda rows: rows.append(list(rows[7])), [":394: duplicate of line 9", "dsim run refuses"]),
}


@pytest.mark.parametrize("name", sorted(LUT_FINDINGS))
def test_lut_check_findings(tmp_path, capsys, name):
    edit, says = LUT_FINDINGS[name]
    p = _lut(tmp_path, edit)
    assert main(["lut", "check", str(p)]) == 1
    out = capsys.readouterr().out
    for s in says:
        assert s in out, out
    assert main(["lut", "check", str(LUT)]) == 0                # the shipped table stays clean
    assert main(["lut", "check", str(LUT), "--model", "meta-llama/Llama-2-70b-hf"]) == 1
    assert "foreign model: 392 row(s)" in capsys.readouterr().out


# ---- model config.json --------------------------------------------------------------------------------
MODEL_CASES = {
    "hidden_text": ({"hidden_size": "4096"}, "hidden_size"),
    "hidden_fraction": ({"hidden_size": 4096.5}, "hidden_size"),
    "layers_bool": ({"num_hidden_layers": True}, "num_hidden_layers"),
    "kv_heads_text": ({"num_key_value_heads": "8"}, "num_key_value_heads"),
    "intermediate_negative": ({"intermediate_size": -5}, "intermediate_size"),
    "vocab_zero": ({"vocab_size": 0}, "vocab_size"),
    "moe_0_experts_5_active": ({"num_local_experts": 0, "num_experts_per_tok": 5}, "num_experts_per_tok"),
}


@pytest.mark.parametrize("name", sorted(MODEL_CASES))
def test_bad_model_config_names_file_and_key(tmp_path, capsys, name):
    change, key = MODEL_CASES[name]
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({**json.loads(CATALOG.read_text()), **change}))
    sc = tmp_path / "s.yaml"
    sc.write_text(yaml.safe_dump({**yaml.safe_load(QUICK.read_text()), "model": {"config": str(cfg)}}))
    _fails(capsys, tmp_path, ["run", str(sc), "--quiet", "--no-plots"], f"{cfg}.{key}: got")


# ---- gamma head files ---------------------------------------------------------------------------------
@pytest.mark.parametrize("key,index,value", [("bias", None, math.nan), ("weights", 3, math.inf)])
def test_gamma_head_with_non_finite_weights_is_refused(tmp_path, capsys, key, index, value):
    doc = yaml.safe_load(HEAD.read_text())
    head = copy.deepcopy(doc)
    if index is None:
        head["latency_head"][key] = value
    else:
        head["latency_head"][key][index] = value
    hp = tmp_path / "head.yaml"
    hp.write_text(yaml.safe_dump(head))
    sc = yaml.safe_load((ROOT / "scenarios" / "trained_gamma_head.yaml").read_text())
    sc["speculation"]["gamma"] = {"policy": "latency_head", "head": str(hp)}
    sp = tmp_path / "s.yaml"
    sp.write_text(yaml.safe_dump(sc))
    where = f"{hp}: latency_head.{key}" + ("" if index is None else f"[{index}]")
    _fails(capsys, tmp_path, ["run", str(sp), "--quiet", "--no-plots"], where, ["finite"])

