"""Report contents a user reads first: manifest provenance, vLLM-named metrics, requests.csv,
console lines, output folders, error hints and the Python Result API."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest

import dsim
from dsim.cli import main
from dsim.metrics.writers import COLUMNS, to_json

ROOT = Path(__file__).resolve().parents[1]
QS = str(ROOT / "scenarios" / "quickstart.yaml")
FIXTURE = ROOT / "tests" / "fixtures" / "vllm_bench_detailed.json"
SMALL = ["workload.num_requests=200"]


def _run_cli(tmp_path, *extra):
    out = tmp_path / "r"
    assert main(["run", QS, "--out", str(out), "--quiet", "--no-plots", *extra]) == 0
    return out


def test_manifest_records_overrides_resolved_scenario_and_versions(tmp_path):
    out = _run_cli(tmp_path, "--set", "workload.rate=40", "--set", "workload.num_requests=150")
    m = json.loads((out / "manifest.json").read_text())
    assert m["overrides"] == ["workload.rate=40", "workload.num_requests=150"]
    assert m["resolved_scenario"]["workload"]["rate"] == 40
    assert m["resolved_scenario"]["workload"]["prompt_tokens"]["dist"] == "normal"   # the file's own keys too
    v = m["versions"]
    assert set(v) >= {"dsim", "python", "numpy", "simpy", "git_commit"}
    # ask the installed package how it was installed (PEP 610), not the folder layout beside the tests
    import shutil
    import subprocess
    from importlib import metadata
    from urllib.parse import unquote, urlparse
    raw = next((t for d in metadata.distributions(name="dsim") if (t := d.read_text("direct_url.json"))), None)
    info = json.loads(raw) if raw else {}
    if (info.get("dir_info") or {}).get("editable") and shutil.which("git"):     # an editable checkout
        src = unquote(urlparse(info["url"]).path)
        head = subprocess.run(["git", "-C", src, "rev-parse", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        if head:
            assert v["git_commit"].split("-")[0] == head
    elif not isinstance(info.get("vcs_info"), dict):                             # a plain wheel / sdist
        assert v["git_commit"] is None


def test_default_output_folder_is_unique_per_resolved_scenario(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for rate in (10, 20, 10):
        assert main(["run", QS, "--quiet", "--no-plots", "--set", f"workload.rate={rate}", *sum(
            (["--set", s] for s in SMALL), [])]) == 0
    folders = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert len(folders) == 2 and all(f.startswith("quickstart-") for f in folders)


def test_resolve_prints_the_scenario_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", QS, "--resolve", "--set", "engine.max_num_seqs=7"]) == 0
    text = capsys.readouterr().out
    assert "max_num_seqs: 7" in text and "results/quickstart-" in text
    assert not (tmp_path / "results").exists()


def test_flat_metrics_use_vllm_bench_names_and_match_requests(tmp_path):
    out = _run_cli(tmp_path, "--set", "output.percentiles=[50,99,99.9]", *sum((["--set", s] for s in SMALL), []))
    s = json.loads((out / "summary.json").read_text())
    m = s["metrics"]
    # every scalar metric a `vllm bench serve` result file carries that dsim can know has the same name
    bench = json.loads(FIXTURE.read_text())
    for k in ("completed", "duration", "total_input_tokens", "total_output_tokens", "request_throughput",
              "output_throughput", "mean_ttft_ms"):
        assert k in bench and k in m
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p50", "p99", "p99.9"):
            assert f"{stat}_{name}_ms" in m
    assert "p90_ttft_ms" not in m                                 # only the configured percentiles
    with open(out / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    ttft = np.array([float(r["ttft_ms"]) for r in rows])
    e2e = np.array([float(r["e2e_ms"]) for r in rows])
    assert m["median_ttft_ms"] == pytest.approx(np.median(ttft), rel=1e-6)
    assert m["std_e2el_ms"] == pytest.approx(np.std(e2e), rel=1e-5)
    assert m["p99.9_e2el_ms"] == pytest.approx(np.percentile(e2e, 99.9), rel=1e-6)
    assert m["total_token_throughput"] == pytest.approx(
        (m["total_input_tokens"] + m["total_output_tokens"]) / m["duration"], rel=1e-9)
    assert s["latency_ms"]["ttft"]["min"] == pytest.approx(ttft.min(), rel=1e-6)


def test_requests_csv_marks_missing_values_empty(tmp_path):
    out = _run_cli(tmp_path, *sum((["--set", s] for s in SMALL), []))
    text = (out / "requests.csv").read_text()
    rows = list(csv.DictReader(text.splitlines()))
    assert rows[0]["prefix_group"] == "" and rows[0]["session"] == "" and rows[0]["kv_ready_s"] == ""
    assert ",-1," not in text and not text.split("\n")[1].endswith("-1")


def test_json_floats_are_rounded():
    assert json.loads(to_json({"a": 0.1 + 0.2, "b": [1 - 1e-16]})) == {"a": 0.3, "b": [1.0]}


def test_console_shows_goodput_cost_and_output_tokens(capsys):
    assert main(["run", QS, "--out", "/dev/null/x"]) == 2                 # path-qualified, nothing run
    capsys.readouterr()
    from dsim.metrics.console import summary_lines
    res = dsim.run(QS, overrides=SMALL)
    text = "\n".join(summary_lines("q", res.summary))
    assert "output tok/s" in text and "goodput" in text and "meet ttft <= 500 ms" in text and "cost $" in text


def test_result_api_to_pandas_and_metrics():
    pd = pytest.importorskip("pandas")
    res = dsim.run(QS, overrides=SMALL)
    df = res.to_pandas()
    assert isinstance(df, pd.DataFrame) and list(df.columns) == list(COLUMNS) and len(df) == 200
    assert df["ttft_ms"].median() == pytest.approx(res.metrics["median_ttft_ms"], rel=1e-9)
    assert df["prefix_group"].isna().all()
    assert res.metrics["completed"] == 200


@pytest.mark.parametrize("doc, where, hint", [
    ({"workloadd": {"type": "poisson"}}, "workloadd", "did you mean 'workload'"),
    ({"engine": {"max_num_seq": 3}}, "engine.max_num_seq", "did you mean 'max_num_seqs'"),
])
def test_unknown_keys_are_named_with_a_suggestion(doc, where, hint):
    base = {"model": "meta-llama/Llama-3.1-8B", "hardware": "H100-SXM",
            "workload": {"type": "poisson", "rate": 1, "num_requests": 2, "prompt_tokens": 8, "output_tokens": 2}}
    base.update(doc)
    with pytest.raises(dsim.ConfigError) as e:
        dsim.load_scenario(base)
    assert str(e.value).startswith(f"{where}: unknown key") and hint in str(e.value)


def test_model_names_resolve_case_insensitively_and_base_to_instruct():
    from dsim.config.model import load_model
    assert load_model("meta-llama/Llama-3.1-70B").total_params == load_model(
        "meta-llama/Llama-3.1-70B-Instruct").total_params
    assert load_model("META-LLAMA/llama-3.1-8b").num_layers == 32
    with pytest.raises(dsim.ConfigError, match=r"did you mean 'meta-llama/Llama-3.1-8B'\?"):
        load_model("meta-llama/Llama-3.1-7B")


def test_timeline_decimation_keeps_a_one_step_spike():
    from dsim.metrics.plots import minmax_decimate
    t = np.arange(100_000, dtype=float)
    y = np.zeros_like(t)
    y[54_321] = 500.0
    y[77_777] = -3.0
    td, yd = minmax_decimate(t, y, 1000)
    assert len(td) <= 1000 and yd.max() == 500.0 and yd.min() == -3.0
    assert np.all(np.diff(td) > 0)                                        # still a time series
    assert minmax_decimate(t[:10], y[:10], 1000)[0].size == 10            # short series untouched


def test_plots_name_the_run(tmp_path):
    from dsim.metrics.plots import title_of
    scn = dsim.load_scenario(ROOT / "scenarios" / "router_comparison.yaml")
    assert title_of(scn) == "router_comparison: 4 x meta-llama/Llama-3.1-8B on H100-SXM"
    res = dsim.run(QS, overrides=SMALL, out_dir=tmp_path / "r", plots=True)
    assert (res.out_dir / "plots" / "latency_cdf.png").stat().st_size > 10_000


def test_models_fitted_on_another_gpu_are_flagged():
    wl = {"type": "poisson", "rate": 2, "num_requests": 10, "prompt_tokens": 50, "output_tokens": 5}
    base = {"model": "meta-llama/Llama-3.1-8B", "workload": wl}
    res = dsim.run({**base, "hardware": "A100-80GB", "latency": {"model": "unified5"}})
    assert res.manifest["latency"]["fitted_on"] == "H100-SXM"
    assert any("fitted on H100-SXM" in w and "A100-80GB" in w for w in res.summary["warnings"])
    res = dsim.run({**base, "hardware": "H100-SXM", "latency": {"model": "roofline", "fitted_on": "H100-SXM"}})
    assert "warnings" not in res.summary


def test_rerun_into_an_existing_report_swaps_it_in_one_step(tmp_path):
    """A report replacing an older one in the same folder: report files the new run did not write go,
    and on Linux the swap is one renameat2(RENAME_EXCHANGE), so a kill can never leave a mix of two
    runs (the folder's inode changes: it is the new directory)."""
    import os

    from dsim.cli import main
    from dsim.metrics.writers import MARKER, _renameat2
    out = tmp_path / "r"
    q = str(Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml")
    assert main(["run", q, "--set", "workload.num_requests=20", "--out", str(out), "--quiet", "--no-plots",
                 "--emit-vllm-traces"]) == 0
    assert "vllm_traces.otlp.jsonl" in (out / MARKER).read_text().split()
    before = os.stat(out).st_ino
    old_summary = (out / "summary.json").read_text()
    assert main(["run", q, "--set", "workload.num_requests=30", "--out", str(out), "--quiet", "--no-plots"]) == 0
    assert not (out / "vllm_traces.otlp.jsonl").exists()            # the older run's, not this one's
    assert (out / "summary.json").read_text() != old_summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]       # no temp folder left
    if _renameat2() is not None:
        assert os.stat(out).st_ino != before


def test_a_folder_dsim_did_not_write_is_refused_and_left_alone(tmp_path, capsys, monkeypatch):
    """--out on a user's folder (or a report someone added files to) is exit 2 before any simulation,
    and not one file in it is moved, copied or deleted; the current folder and its parents too."""
    import os

    from dsim.cli import main
    q = str(Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml")
    mine = tmp_path / "mine"
    (mine / "sub").mkdir(parents=True)
    (mine / "notes.txt").write_text("mine")
    (mine / "sub" / "more.txt").write_text("also mine")
    ino = os.stat(mine).st_ino
    assert main(["run", q, "--out", str(mine), "--quiet", "--no-plots"]) == 2
    assert "it holds 'notes.txt', which dsim did not write" in capsys.readouterr().err
    assert os.stat(mine).st_ino == ino and sorted(os.listdir(mine)) == ["notes.txt", "sub"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]    # no temp folder either
    rep = tmp_path / "rep"                                             # a report with a user's file in it
    assert main(["run", q, "--set", "workload.num_requests=20", "--out", str(rep), "--quiet", "--no-plots"]) == 0
    (rep / "plots").mkdir(exist_ok=True)
    (rep / "plots" / "my.svg").write_text("x")
    assert main(["run", q, "--set", "workload.num_requests=20", "--out", str(rep), "--quiet", "--no-plots"]) == 2
    assert (rep / "plots" / "my.svg").read_text() == "x"
    monkeypatch.chdir(mine / "sub")
    for target in (".", "..", str(tmp_path)):
        assert main(["run", q, "--out", target, "--quiet", "--no-plots"]) == 2
    assert (mine / "sub" / "more.txt").read_text() == "also mine"
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["run", q, "--set", "workload.num_requests=20", "--out", str(empty), "--quiet", "--no-plots"]) == 0


def test_stale_temp_folders_of_dead_processes_go_whatever_their_report(tmp_path):
    import os

    from dsim.metrics.writers import AtomicOutput
    dead = tmp_path / ".other.tmp-999999999-abc"                      # no such process
    dead.mkdir()
    (dead / "summary.json").write_text("{}")
    alive = tmp_path / f".other.tmp-{os.getpid()}-abc"                 # this process: kept
    alive.mkdir()
    user = tmp_path / ".hidden.tmp-notapid-x"                           # not our pattern: kept
    user.mkdir()
    ao = AtomicOutput(tmp_path / "r")
    ao.abort()
    assert not dead.exists() and alive.exists() and user.exists()


def test_sigterm_is_handled_like_sigint_and_leaves_no_output(tmp_path):
    """kill / timeout / Docker / Slurm send SIGTERM: exit 143, one line, no report and no temp folder."""
    import signal
    import subprocess
    import sys
    import time
    q = str(Path(__file__).resolve().parents[1] / "scenarios" / "quickstart.yaml")
    out = tmp_path / "r"
    p = subprocess.Popen([sys.executable, "-m", "dsim.cli", "run", q, "--set", "workload.num_requests=2000000",
                          "--out", str(out), "--quiet", "--no-plots"], stderr=subprocess.PIPE, text=True,
                         cwd=tmp_path)
    deadline = time.time() + 60
    while not any(tmp_path.glob(".r.tmp-*")) and time.time() < deadline and p.poll() is None:
        time.sleep(0.05)
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    err = p.communicate(timeout=60)[1]
    assert p.returncode == 143 and err.strip().splitlines()[-1] == "dsim: terminated"
    assert not out.exists() and not any(tmp_path.glob(".r.tmp-*"))


def test_an_output_block_commits_at_its_end_drops_on_error_and_keeps_an_early_commit(tmp_path):
    """The one output helper every command uses (``with output_folder(out) as ao``): the folder
    appears whole when the block ends, nothing (not even a temp folder) when it raises, a block
    that committed before raising (capacity's 'nothing fits' card) keeps its folder, and None
    asks for no folder."""
    import pytest

    from dsim.metrics.writers import output_folder
    with output_folder(tmp_path / "ok") as ao:
        ao.write_text("a.txt", "a")
        assert not (tmp_path / "ok").exists()                  # not before the block ends
    assert (tmp_path / "ok" / "a.txt").read_text() == "a"
    with pytest.raises(RuntimeError):
        with output_folder(tmp_path / "bad") as ao:
            ao.write_text("a.txt", "a")
            raise RuntimeError("mid-write")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ok"]
    with pytest.raises(RuntimeError):
        with output_folder(tmp_path / "early") as ao:
            ao.write_text("card.md", "nothing fits")
            ao.commit()
            raise RuntimeError("reported after the card")
    assert (tmp_path / "early" / "card.md").read_text() == "nothing fits"
    with output_folder(None) as ao:
        assert ao is None
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    with pytest.raises(Exception, match="which dsim did not write"):
        with output_folder(mine):
            pass
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_write_atomic_gives_the_umask_mode_not_mkstemps_0600(tmp_path):
    """A trace or fitted file written atomically is readable as a plain open() would leave it."""
    import os

    from dsim.metrics.writers import write_atomic
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "t.jsonl", "{}\n")
        os.umask(0o077)
        write_atomic(tmp_path / "private.jsonl", "{}\n")
    finally:
        os.umask(old)
    assert (tmp_path / "t.jsonl").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "private.jsonl").stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
