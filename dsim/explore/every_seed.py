"""``dsim plan --seeds K``: the top configurations judged on K seeds, for both planners.

One seed is one draw of the workload (arrival times, lengths): a configuration that meets the SLOs on
the scenario's seed may miss them on the next, and a plan should not pick an answer that luck made.
Shared by the single-pool (plan.py) and the prefill/decode (plan_pd.py) planner, which differ only in
the overrides that make a candidate's scenario.
"""
from __future__ import annotations

from .backends import run_calls
from .capacity import probe

# the columns the check adds to a candidate row (top.csv, candidates.csv)
SEED_COLS = ("seeds_passed", "p99_ttft_ms_max_over_seeds", "p99_tpot_ms_max_over_seeds")


def on_every_seed(ok: list, top: int, k: int, overrides_of, src, slos: dict, warmup: float, min_goodput, jobs: int,
                  backend: str, address, seed0: int) -> list:
    """The passing configurations ``ok`` (best first), those checked simulated with seeds seed0+1 ..
    seed0+k-1 as well, in batches of ``top`` until ``top`` of them pass on every seed (or none is left);
    one that fails a seed is no longer passing (``pass`` False, ``reasons`` say on how many seeds it
    passed) and is left out of the returned list.  ``overrides_of(c)``: the overrides of candidate ``c``'s
    scenario.  Each checked row gets ``seeds_passed`` (of k) and the largest p99 TTFT/TPOT over its seeds."""
    kept, i = [], 0
    while len(kept) < top and i < len(ok):
        batch, i = ok[i:i + top], i + top
        todo = [(c, sd) for c in batch for sd in range(seed0 + 1, seed0 + k)]
        calls = [(src, list(overrides_of(c)) + [f"seed={sd}"], slos, warmup, min_goodput) for c, sd in todo]
        rows: dict = {}
        for (c, _), row in zip(todo, list(run_calls(probe, calls, jobs, backend, address))):
            rows.setdefault(id(c), []).append(row)
        for c in batch:
            runs = [c] + rows.get(id(c), [])
            c["seeds_passed"] = sum(1 for r in runs if r.get("pass"))
            for m in ("p99_ttft_ms", "p99_tpot_ms"):
                vals = [r[m] for r in runs if r.get(m) is not None]
                if vals:
                    c[f"{m}_max_over_seeds"] = max(vals)
            if c["seeds_passed"] == k:
                kept.append(c)
            else:
                c["pass"] = False
                c["reasons"] = f"passes on {c['seeds_passed']} of {k} seeds"
    return kept + list(ok[i:])
