"""Oracle labels for the speculation-length head (seed 002 6.4.1): which (mode, gamma) each
conversation should have used, from simulated counterfactuals.

The simulator cannot fork a running SimPy state, so the counterfactuals are *common-action
worlds*: for every candidate action (fused or distributed, gamma in {2, 3, 4, 6, 8}) the scenario
runs again with every round forced to that action, same seed and same arrivals (common random
numbers).  A conversation's label is the action whose world gave it the lowest TPOT among those
meeting its TTFT and TPOT targets (the lowest TPOT when none does).  Its features are the nine
inputs the latency head sees (``dsim.specdec.gamma.LatencyHead.features``) at its first decision
after warm-up, recorded in a *behaviour* run (the scenario under a constant-gamma head).  Each
condition (RTT multiplier x load multiplier) repeats this; conditions are the groups a trained
head is validated across.

The columns of ``oracle.csv`` are documented in docs/gamma-head.md.
"""
from __future__ import annotations

import copy
import csv
import json
from pathlib import Path

from ..config.errors import ConfigError
from ..metrics.writers import AtomicOutput
from ..specdec.gamma import DISTRIBUTED, FUSED
from ..specdec.headfit import FEATURES
from .backends import run_calls

GAMMAS = (2, 3, 4, 6, 8)
MODES = (FUSED, DISTRIBUTED)
BEHAVIOUR_K = 4


def action_name(a) -> str:
    return f"{a[0]}_{a[1]}"


def head_target(a, modes) -> float:
    """What the head regresses on: gamma; when it also picks the mode, 1 stands for fused (the
    head's fused_below rule)."""
    return 1.0 if len(modes) > 1 and a[0] == FUSED else float(a[1])


def _condition(raw: dict, rtt_mult: float, load_mult: float) -> dict:
    """The scenario with every draft group's RTT (and RTT schedule) and the arrival rate scaled."""
    doc = copy.deepcopy(raw)
    for g in doc["speculation"].get("drafts") or []:
        g["rtt_ms"] = g["rtt_ms"] * rtt_mult
        if g.get("rtt_schedule"):
            g["rtt_schedule"] = [[t, v * rtt_mult] for t, v in g["rtt_schedule"]]
    wl = doc["workload"]
    if load_mult != 1.0:
        if "rate" not in wl:
            raise ConfigError("workload.rate", None, "an arrival rate to scale (load multipliers)", show_value=False)
        wl["rate"] = wl["rate"] * load_mult
    doc["output"] = {"plots": False}
    return doc


def _run_world(doc: dict, action) -> dict:
    """One common-action world: rid -> (ttft_ms, tpot_ms, meets SLO) of every completed request."""
    from ..config.scenario import load_scenario
    from ..metrics.measures import meets_slo
    from ..runner import simulate
    doc = copy.deepcopy(doc)
    sp = doc["speculation"]
    sp["mode"] = action[0]
    sp["gamma"] = {"policy": "static", "k": action[1]}
    sp.pop("mode_switch", None)
    scn = load_scenario(doc)
    ses = simulate(scn)
    out = {}
    for r in ses.reqs:                   # the ledger of every request, in id order
        if r.t_completion is not None and r.n_out > 1:
            out[r.rid] = ((r.t_first_token - r.arrival) * 1e3,
                          (r.t_last_token - r.t_first_token) * 1e3 / (r.n_out - 1),
                          meets_slo(r, scn.slo_ttft_ms, scn.slo_tpot_ms))
    return out


def _behaviour(doc: dict, warmup: float) -> dict:
    """rid -> feature vector at the conversation's first decision with a full history, after warm-up."""
    from ..config.scenario import load_scenario
    from ..runner import Session
    doc = copy.deepcopy(doc)
    sp = doc["speculation"]
    sp["gamma"] = {"policy": "latency_head", "weights": [0.0] * len(FEATURES), "bias": float(BEHAVIOUR_K),
                   "default_k": BEHAVIOUR_K}
    if sp.get("mode_switch", {}).get("policy") == "gamma_policy":
        sp["mode_switch"] = {"policy": "rtt_load"}
    ses = Session(load_scenario(doc))
    arrivals = sorted(r.arrival for r in ses.reqs)
    t_warm = arrivals[0] + warmup * (arrivals[-1] - arrivals[0]) if arrivals else 0.0
    feats: dict = {}

    def record(r, pol):
        x = getattr(pol, "last_x", None)
        if x is not None and r.rid not in feats and r.arrival >= t_warm:
            feats[r.rid] = [float(v) for v in x]
    ses.spec.decision_hook = record
    ses.run_to_end()
    return feats


def _condition_rows(raw: dict, rtt_mult: float, load_mult: float, warmup: float, actions, modes) -> list:
    doc = _condition(raw, rtt_mult, load_mult)
    feats = _behaviour(doc, warmup)
    worlds = [_run_world(doc, a) for a in actions]
    rows = []
    for rid in sorted(feats):
        outcomes = [w.get(rid) for w in worlds]
        if any(o is None for o in outcomes):
            continue                            # unfinished (or one token) in some world
        ok = [i for i, o in enumerate(outcomes) if o[2]]
        pool = ok or range(len(actions))
        best = min(pool, key=lambda i: (outcomes[i][1], i))
        row = {"rtt_mult": rtt_mult, "load_mult": load_mult, "rid": rid}
        row.update(dict(zip(FEATURES, feats[rid])))
        for a, o in zip(actions, outcomes):
            n = action_name(a)
            row[f"tpot_ms__{n}"] = o[1]
            row[f"ttft_ms__{n}"] = o[0]
            row[f"meets__{n}"] = int(o[2])
        row["label"] = action_name(actions[best])
        row["label_mode"], row["label_k"] = actions[best]
        row["label_target"] = head_target(actions[best], modes)
        row["label_meets_slo"] = int(outcomes[best][2])
        rows.append(row)
    return rows


def oracle(scenario, out_dir, *, rtt_mults=(1.0,), load_mults=(1.0,), warmup: float = 0.1, modes=MODES,
           gammas=GAMMAS, jobs: int = 1) -> dict:
    """Write ``oracle.csv`` (one row per labelled conversation and condition) and ``oracle.json``
    (provenance and label counts) to ``out_dir``; return the JSON document.  ``modes``: the modes
    the labels choose among (one mode: the head picks gamma only)."""
    from ..config.scenario import load_scenario
    scn = load_scenario(scenario)
    if scn.spec is None or not scn.spec.groups:
        raise ConfigError("speculation.drafts", None, "draft devices (the oracle compares fused and distributed "
                          "rounds)", show_value=False)
    if not 0 <= warmup < 1:
        raise ConfigError("--warmup", warmup, "a share of the arrival span in [0, 1)")
    for flag, vals in (("--rtt", rtt_mults), ("--load", load_mults)):
        if not vals or not all(v > 0 for v in vals):
            raise ConfigError(flag, list(vals), "positive multipliers")
    if not modes or any(m not in MODES for m in modes) or len(set(modes)) != len(modes):
        raise ConfigError("--modes", list(modes), "fused and/or distributed, each once")
    if not gammas or any(not isinstance(k, int) or k < 1 for k in gammas) or len(set(gammas)) != len(gammas):
        raise ConfigError("--gammas", list(gammas), "distinct positive integers")
    actions = tuple((m, k) for m in modes for k in gammas)
    raw = scn.raw
    calls = [(raw, rm, lm, warmup, actions, tuple(modes)) for rm in rtt_mults for lm in load_mults]
    with AtomicOutput(Path(out_dir)) as ao:  # an unwritable folder fails here, before any simulation
        rows = [row for part in run_calls(_condition_rows, calls, jobs) for row in part]
        return _write(ao, scn, rows, actions, modes, gammas, rtt_mults, load_mults, warmup)


def _write(ao, scn, rows, actions, modes, gammas, rtt_mults, load_mults, warmup) -> dict:
    cols = (["rtt_mult", "load_mult", "rid", *FEATURES]
            + [f"{m}__{action_name(a)}" for a in actions for m in ("tpot_ms", "ttft_ms", "meets")]
            + ["label", "label_mode", "label_k", "label_target", "label_meets_slo"])
    with open(ao.path("oracle.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols, lineterminator="\n")
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.6f}" if isinstance(v, float) else v) for k, v in row.items()})
    counts: dict = {}
    for row in rows:
        counts[row["label"]] = counts.get(row["label"], 0) + 1
    meta = {"scenario": scn.name, "scenario_sha256": scn.digest, "seed": scn.seed,
            "rtt_mults": list(rtt_mults), "load_mults": list(load_mults), "warmup": warmup,
            "actions": [action_name(a) for a in actions], "modes": list(modes), "gammas": list(gammas),
            "features": list(FEATURES),
            "behaviour": f"latency_head with constant gamma {BEHAVIOUR_K}", "rows": len(rows),
            "labels": dict(sorted(counts.items())),
            "method": "common-action worlds (every round forced to one action, same seed); label = lowest TPOT "
                      "meeting the TTFT/TPOT targets"}
    ao.write_text("oracle.json", json.dumps(meta, indent=2, sort_keys=True) + "\n")
    return meta
