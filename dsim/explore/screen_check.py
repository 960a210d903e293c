"""Is the plan's screen pruning configurations that would have passed?  Simulate a sample and count.

The screen's estimates are meant to be optimistic (lower bounds on latency, no queueing), so a pruned
candidate should fail in simulation too.  A wrong formula, a latency model the fixed point misreads or
a workload the mean lengths describe badly can break that silently; the only check is the simulation
itself.  So after the search, up to N pruned candidates (a deterministic sample: the scenario's seed
draws it) are simulated with the same judge as the survivors, and the plan reports how many of them
would have been accepted -- the screen's false-prune count on that sample.

The sampled candidates are never ranked (the answer does not depend on the sample size); their
results are kept in ``check_*`` columns.  Candidates pruned because their scenario is invalid (the
model does not fit, a bad knob value) cannot be simulated and are not sampled.
"""
from __future__ import annotations

import numpy as np

from .backends import run_calls
from .capacity import probe

DEFAULT_SAMPLE = 8


def sample_pruned(rows: list, n: int, seed: int) -> list:
    """Up to ``n`` simulable pruned rows, drawn without replacement by ``seed``, in table order."""
    pool = [c for c in rows if c.get("screen") == "pruned" and not c.get("_unfit")]
    if n <= 0 or not pool:
        return []
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, 0x5C4EE7])    # its own stream: not the run's draws
    pick = sorted(rng.choice(len(pool), size=min(n, len(pool)), replace=False).tolist())
    return [pool[i] for i in pick]


def check_screen(rows: list, n: int, seed: int, overrides_of, src, slos, warmup, min_goodput, jobs, backend,
                 address) -> dict:
    """Simulate a sample of the pruned ``rows`` (``overrides_of(row)``: the --set list that makes its
    scenario) and mark each with ``check_pass`` and its p99 TTFT/TPOT; return the counts."""
    sample = sample_pruned(rows, n, seed)
    calls = [(src, overrides_of(c), slos, warmup, min_goodput, True) for c in sample]
    for c, row in zip(sample, list(run_calls(probe, calls, jobs, backend, address))):
        c["check_pass"] = bool(row["pass"])
        c["check_reasons"] = "; ".join(row.get("reasons", []))
        c["check_p99_ttft_ms"] = row.get("p99_ttft_ms")
        c["check_p99_tpot_ms"] = row.get("p99_tpot_ms")
        c["check_early_stopped"] = bool(row.get("early_stopped"))
    simulable = sum(1 for c in rows if c.get("screen") == "pruned" and not c.get("_unfit"))
    return {"requested": n, "simulable_pruned": simulable, "sampled": len(sample),
            "would_pass": sum(1 for c in sample if c["check_pass"])}


def check_phrase(chk: dict | None) -> str:
    """The plan line's clause: '; screen check: 0 of 8 sampled pruned candidates pass in simulation'."""
    if not chk or not chk["requested"]:
        return ""
    if not chk["sampled"]:
        return "; screen check: no simulable pruned candidate to sample"
    return (f"; screen check: {chk['would_pass']} of {chk['sampled']} sampled pruned candidates pass in "
            "simulation" + (" (the screen pruned them wrongly)" if chk["would_pass"] else ""))


def check_md(chk: dict | None, rows: list, keys: list) -> list:
    """plan.md's section: the counts, and every sampled candidate with its simulated verdict."""
    if not chk or not chk["requested"]:
        return []
    out = ["", "## Screen check", "",
           f"{chk['sampled']} of the {chk['simulable_pruned']} simulable pruned candidates (a sample drawn by the "
           f"scenario's seed) simulated with the same judge as the survivors (stopped early once certain to fail): **{chk['would_pass']} would have "
           "met the SLOs** (false prunes). They are not ranked; their results are the `check_*` columns of "
           "candidates.csv.", ""]
    sampled = [c for c in rows if "check_pass" in c]
    if sampled:
        cols = keys + ["reason", "check_pass", "check_p99_ttft_ms", "check_p99_tpot_ms"]
        out += ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
        for c in sampled:
            out.append("| " + " | ".join(_cell(c.get(k)) for k in cols) + " |")
    return out


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v).replace("|", "/")


CHECK_COLS = ("check_pass", "check_reasons", "check_p99_ttft_ms", "check_p99_tpot_ms", "check_early_stopped")
