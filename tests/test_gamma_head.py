"""The latency head's oracle labels and training (dsim.explore.oracle, dsim.specdec.headfit)."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

import dsim
from dsim.cli import main
from dsim.config.scenario import load_scenario
from dsim.explore.oracle import oracle
from dsim.specdec.config import SHIPPED_HEAD, build_policy
from dsim.specdec.headfit import FEATURES, predict, train_head

ROOT = Path(__file__).resolve().parents[1]
SCN = str(ROOT / "scenarios" / "mobile_cloud_distributed.yaml")
SHORT = ["workload.num_requests=40"]


def test_oracle_label_is_the_fastest_action_meeting_the_slo(tmp_path):
    """Each label, checked against independent runs of every candidate action."""
    scn = load_scenario(SCN, SHORT)
    meta = oracle(scn.raw, tmp_path, modes=("distributed",), gammas=(2, 6), warmup=0.1)
    rows = list(csv.DictReader(open(tmp_path / "oracle.csv")))
    assert meta["rows"] == len(rows) > 10
    worlds = {}
    for k in (2, 6):
        doc = json.loads(json.dumps(scn.raw))
        doc["speculation"]["gamma"] = {"policy": "static", "k": k}
        doc["speculation"]["mode"] = "distributed"
        res = dsim.run(doc, plots=False)
        worlds[k] = {r.rid: ((r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1),
                             (r.t_first_token - r.arrival) * 1e3 <= scn.slo_ttft_ms and
                             (r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1) <= scn.slo_tpot_ms)
                     for r in res.requests if r.t_completion is not None and r.n_out > 1}
    for row in rows:
        rid = int(row["rid"])
        ok = [k for k in (2, 6) if worlds[k][rid][1]] or [2, 6]
        want = min(ok, key=lambda k: (worlds[k][rid][0], k))
        assert row["label"] == f"distributed_{want}", row
        assert float(row["tpot_ms__distributed_6"]) == pytest.approx(worlds[6][rid][0], abs=1e-6)
        assert row["label_target"] == f"{float(want):.6f}"
        assert all(row[f] != "" for f in FEATURES)


def _synthetic_oracle(path: Path, n=400, seed=1):
    """A table whose best gamma is a clean function of the RTT: 2 above 50 ms, 6 below."""
    rng = np.random.default_rng(seed)
    path.mkdir()
    meta = {"actions": ["distributed_2", "distributed_6"], "modes": ["distributed"], "gammas": [2, 6],
            "features": list(FEATURES), "rows": n}
    (path / "oracle.json").write_text(json.dumps(meta))
    cols = ["rtt_mult", "load_mult", "rid", *FEATURES, "tpot_ms__distributed_2", "ttft_ms__distributed_2",
            "meets__distributed_2", "tpot_ms__distributed_6", "ttft_ms__distributed_6", "meets__distributed_6",
            "label", "label_mode", "label_k", "label_target", "label_meets_slo"]
    with open(path / "oracle.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(cols)
        for i in range(n):
            rtt = float(rng.uniform(5, 100))
            x = [rng.uniform(0, 1), 0.0, rng.uniform(10, 60), 0.0, rtt, 0.0, 0.7, 60.0, 4.0]
            k = 2 if rtt > 50 else 6
            t2, t6 = (20.0, 25.0) if k == 2 else (25.0, 20.0)
            w.writerow([1.0 + (i % 3), 1.0, i, *x, t2, 100, 1, t6, 100, 1, f"distributed_{k}", "distributed", k,
                        float(k), 1])


def test_trained_head_reproduces_its_labels_and_is_deterministic(tmp_path):
    _synthetic_oracle(tmp_path / "o")
    a = train_head(tmp_path / "o", tmp_path / "a.yaml", hidden=(0, 8))
    train_head(tmp_path / "o", tmp_path / "b.yaml", hidden=(0, 8))
    assert (tmp_path / "a.yaml").read_text() == (tmp_path / "b.yaml").read_text()
    ch = a["report"]["chosen"]
    assert ch["train"]["label_accuracy"] >= 0.95 and ch["validation"]["label_accuracy"] >= 0.95
    assert ch["validation"]["regret"] < 0.02
    assert "held-out conditions" in a["provenance"]["split"]
    # the runtime head computes the same raw output as the trainer on the same features
    head = yaml.safe_load((tmp_path / "a.yaml").read_text())["latency_head"]
    pol = build_policy("latency_head", {k: head[k] for k in ("weights", "bias", "hidden", "k_max", "fused_k")},
                       "distributed", None)
    x = np.array([0.3, 0.0, 30.0, 0.0, 80.0, 0.0, 0.7, 60.0, 4.0])
    assert pol.raw(x) == pytest.approx(float(predict(head, x[None, :])[0]), rel=1e-9)


def test_a_head_file_and_the_shipped_default_load(tmp_path):
    _synthetic_oracle(tmp_path / "o")
    train_head(tmp_path / "o", tmp_path / "h.yaml", hidden=(0,))
    base = {"mode": "distributed", "gamma": {"policy": "latency_head", "head": str(tmp_path / "h.yaml")}}
    scn = load_scenario(SCN, SHORT + [f"speculation.gamma={json.dumps(base['gamma'])}"])
    assert scn.spec.policy_params["weights"] == yaml.safe_load((tmp_path / "h.yaml").read_text())["latency_head"][
        "weights"]
    assert SHIPPED_HEAD.is_file()               # package data: the default of latency_head
    scn = load_scenario(SCN, SHORT + ['speculation.gamma={"policy": "latency_head"}'])
    shipped = yaml.safe_load(SHIPPED_HEAD.read_text())["latency_head"]
    assert scn.spec.policy_params["weights"] == shipped["weights"]
    assert dsim.run(scn, plots=False).summary["requests"]["completed"] == 40


def test_oracle_and_training_refuse_bad_input(tmp_path, capsys):
    quick = str(ROOT / "scenarios" / "quickstart.yaml")
    assert main(["specdec", "oracle", quick, "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err.startswith("dsim: error: speculation.drafts") and not (tmp_path / "o").exists()
    assert main(["specdec", "train-head", str(tmp_path), "--out", str(tmp_path / "h.yaml")]) == 2
    assert str(tmp_path) in capsys.readouterr().err and not (tmp_path / "h.yaml").exists()
    assert main(["specdec", "oracle", SCN, "--out", str(tmp_path / "o"), "--rtt", "0,1"]) == 2
    assert capsys.readouterr().err.startswith("dsim: error: --rtt")
    assert main(["specdec", "oracle", SCN, "--out", str(tmp_path / "o"), "--gammas", "2,2"]) == 2
    assert capsys.readouterr().err.startswith("dsim: error: --gammas") and not (tmp_path / "o").exists()


def test_an_unwritable_oracle_folder_fails_before_simulating(tmp_path, capsys):
    import time
    (tmp_path / "file").write_text("x")
    t0 = time.time()
    assert main(["specdec", "oracle", SCN, "--out", str(tmp_path / "file")]) == 2
    assert time.time() - t0 < 5 and capsys.readouterr().err.startswith(f"dsim: error: {tmp_path / 'file'}")


@pytest.mark.parametrize("damage,where", [
    (lambda p: (p / "oracle.json").write_text("{not json"), "oracle.json"),
    (lambda p: (p / "oracle.csv").write_text("rid,label\n1,distributed_2\n"), "oracle.csv"),
    (lambda p: (p / "oracle.csv").write_text((p / "oracle.csv").read_text().replace(",distributed_6,", ",bogus,", 1)),
     "oracle.csv:"),
])
def test_a_damaged_oracle_is_refused_and_no_head_written(damage, where, tmp_path, capsys):
    _synthetic_oracle(tmp_path / "o")
    damage(tmp_path / "o")
    assert main(["specdec", "train-head", str(tmp_path / "o"), "--out", str(tmp_path / "h.yaml")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dsim: error: {tmp_path / 'o' / where}") and err.count("\n") == 1
    assert not (tmp_path / "h.yaml").exists() and not list(tmp_path.glob(".h.yaml*"))


def test_residual_head_gradient_fold_and_runtime_agree(tmp_path):
    """The residual block y = x + V SiLU(W x + c), out = w . y + b (seed 002 6.4.1): its analytic
    gradient matches central differences, the standardisation folds into raw-feature weights
    exactly, the runtime head computes the trainer's output and reads the block (V = 0 differs)."""
    from dsim.specdec.headfit import _residual_loss, to_raw
    rng = np.random.default_rng(3)
    d, h = len(FEATURES), 4
    X, y = rng.normal(size=(50, d)), rng.normal(size=50) * 3
    shapes = [(h, d), (h,), (d, h), (d,), ()]
    theta = rng.normal(0, 0.5, sum(int(np.prod(s)) for s in shapes))

    def unpack(t):
        out, i = [], 0
        for s in shapes:
            m = int(np.prod(s))
            out.append(t[i:i + m].reshape(s) if s else t[i])
            i += m
        return out
    _, g = _residual_loss(X, y, *unpack(theta))
    for j in rng.choice(len(theta), 25, replace=False):
        e = np.zeros_like(theta)
        e[j] = 1e-6
        num = (_residual_loss(X, y, *unpack(theta + e))[0] - _residual_loss(X, y, *unpack(theta - e))[0]) / 2e-6
        assert g[j] == pytest.approx(num, rel=1e-4, abs=1e-7)
    Xraw = X * np.arange(1, d + 1) * 10 + 5
    mu, sd = Xraw.mean(axis=0), Xraw.std(axis=0)
    W, c, V, w, b = unpack(theta)                # any weights fold; a fit's do too (next test)
    m = {"W": W, "c": c, "V": V, "w": w, "b": float(b)}
    Z = (Xraw - mu) / sd
    hz = Z @ m["W"].T + m["c"]
    want = (Z + (hz / (1 + np.exp(-hz))) @ m["V"].T) @ m["w"] + m["b"]
    head = to_raw(m, mu, sd)
    assert predict(head, Xraw) == pytest.approx(want, rel=1e-9, abs=1e-9)
    pol = build_policy("latency_head", {k: head[k] for k in ("weights", "bias", "hidden", "residual")},
                       "distributed", None)
    assert pol.raw(Xraw[0]) == pytest.approx(float(want[0]), rel=1e-9, abs=1e-9)
    flat = build_policy("latency_head", {**{k: head[k] for k in ("weights", "bias", "hidden")},
                                         "residual": np.zeros((d, h)).tolist()}, "distributed", None)
    assert flat.raw(Xraw[0]) != pytest.approx(pol.raw(Xraw[0]))
    with pytest.raises(ValueError, match="residual"):
        build_policy("latency_head", {"weights": head["weights"], "residual": head["residual"]}, "distributed", None)


def test_train_head_residual_option_writes_a_head_the_scenario_runs(tmp_path, capsys):
    _synthetic_oracle(tmp_path / "o", n=150)
    from dsim.cli import main
    assert main(["specdec", "train-head", str(tmp_path / "o"), "--out", str(tmp_path / "r.yaml"), "--hidden", "2",
                 "--residual"]) == 0
    assert "residual block" in capsys.readouterr().out
    doc = yaml.safe_load((tmp_path / "r.yaml").read_text())
    head, ch = doc["latency_head"], doc["report"]["chosen"]
    assert ch["residual"] and np.shape(head["residual"]) == (len(FEATURES), 2) and len(head["weights"]) == 9
    assert ch["validation"]["label_accuracy"] >= 0.95
    gamma = {"policy": "latency_head", "head": str(tmp_path / "r.yaml")}
    scn = load_scenario(SCN, SHORT + [f"speculation.gamma={json.dumps(gamma)}"])
    assert scn.spec.policy_params["residual"] == head["residual"]
    assert dsim.run(scn, plots=False).summary["requests"]["completed"] == 40
