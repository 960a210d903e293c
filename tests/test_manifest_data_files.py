"""manifest.json names every data file a run read by content (sha256), not only by path: the hash
follows the file's bytes, and unchanged inputs still give byte-identical reports."""
import json
import shutil
from pathlib import Path

import dsim

ROOT = Path(__file__).resolve().parents[1]
LUT = ROOT / "luts" / "llama-2-7b_h100_tp1.csv"
TRACE = ROOT / "scenarios" / "data" / "sample_trace.jsonl"


def _lut_scenario(lut: Path) -> dict:
    return {"name": "lut", "seed": 13, "model": "meta-llama/Llama-2-7b-hf", "hardware": "H100-SXM",
            "latency": {"model": "lut", "path": str(lut), "select": {"tensor_parallel": 1},
                        "decode_phase": "fused_decode"},
            "workload": {"type": "poisson", "rate": 12, "num_requests": 40, "prompt_tokens": 512,
                         "output_tokens": 50},
            "output": {"plots": False}}


def _files(out: Path) -> dict:
    return {d["path"]: d for d in json.loads((out / "manifest.json").read_text())["data_files"]}


def test_lut_hash_follows_content_and_runs_stay_identical(tmp_path):
    import hashlib
    lut = tmp_path / "t.csv"
    shutil.copy(LUT, lut)
    dsim.run(_lut_scenario(lut), tmp_path / "a")
    dsim.run(_lut_scenario(lut), tmp_path / "b")       # same process: the LUT and hash caches are hit
    for f in ("manifest.json", "summary.json", "requests.csv", "timeline.csv"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    a = _files(tmp_path / "a")
    entry = a[str(lut.resolve())]
    assert entry["sha256"] == hashlib.sha256(lut.read_bytes()).hexdigest() and entry["bytes"] == lut.stat().st_size
    # one latency value changed, same length: the hash (and only the hash) says so
    text = lut.read_text()
    header, row = text.splitlines()[:2]
    value = row.split(",")[header.split(",").index("latency_ms")]          # the first row's latency
    changed = value[:-1] + ("1" if value[-1] != "1" else "2")              # same length, one digit off
    lut.write_text(text.replace(value, changed, 1))
    dsim.run(_lut_scenario(lut), tmp_path / "c")
    c = _files(tmp_path / "c")[str(lut.resolve())]
    assert c["bytes"] == entry["bytes"] and c["sha256"] != entry["sha256"]
    assert c["sha256"] == hashlib.sha256(lut.read_bytes()).hexdigest()


def test_trace_and_model_config_are_hashed(tmp_path):
    trace = tmp_path / "t.jsonl"
    shutil.copy(TRACE, trace)
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
                               "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
                               "vocab_size": 128256, "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}))
    scn = {"name": "t", "model": {"config": str(cfg)}, "hardware": "H100-SXM",
           "workload": {"type": "trace", "path": str(trace), "num_requests": 30}, "output": {"plots": False}}
    dsim.run(scn, tmp_path / "a")
    a = _files(tmp_path / "a")
    assert set(a) == {str(trace.resolve()), str(cfg.resolve())}
    lines = trace.read_text().splitlines()
    trace.write_text("\n".join(lines[:-1]) + "\n")          # a request fewer (after the 30 replayed)
    dsim.run(scn, tmp_path / "b")
    b = _files(tmp_path / "b")
    assert b[str(trace.resolve())]["sha256"] != a[str(trace.resolve())]["sha256"]
    assert b[str(cfg.resolve())] == a[str(cfg.resolve())]
    # the requests are the same 30: only the manifest tells the inputs apart
    assert (tmp_path / "a" / "requests.csv").read_bytes() == (tmp_path / "b" / "requests.csv").read_bytes()
