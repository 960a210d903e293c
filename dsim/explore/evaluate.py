"""One point of an exploration: a normal ``dsim.run`` reduced to one flat table row.

Runs in worker processes (joblib, Dask or Ray), so it takes and returns plain data only.
"""
from __future__ import annotations

from ..config.errors import ConfigError
from ..config.scenario import load_scenario

# summary sections copied into a row besides the vLLM-named metrics (prefix_name)
_SECTIONS = {
    "goodput": ("fraction", "requests_per_s", "slo_ttft_ms", "slo_tpot_ms"),
    "stability": ("overloaded", "queue_delay_trend_ms_per_s"),
    "requests": ("submitted", "completed", "rejected", "unfinished"),
    "scheduler": ("preemptions", "busy_fraction", "mean_batch_tokens", "peak_running", "peak_waiting"),
    "kv_cache": ("peak_usage", "mean_usage", "prefix_hit_rate"),
    "efficiency": ("gpus", "usd_per_hour", "goodput_per_gpu_s", "output_tokens_per_s_per_gpu",
                   "output_tokens_per_s_per_user"),
}


def summary_row(summary: dict) -> dict:
    """Every headline number of a summary as one flat dict (column name -> number)."""
    row = {k: v for k, v in summary.get("metrics", {}).items() if not k.endswith("_band_ms")}
    for sec, keys in _SECTIONS.items():
        for k in keys:
            if k in summary.get(sec, {}):
                row[f"{sec}_{k}"] = summary[sec][k]
    eb = summary.get("error_band", {})
    if "validated" in eb:
        row["band_validated"] = eb["validated"]
    tpot = eb.get("relative", {}).get("tpot_p50_err")
    if tpot is not None:              # real/sim - 1 of a step (TPOT p50): what capacity's band ends scale by
        row["band_tpot_p50_lo"], row["band_tpot_p50_hi"] = tpot
    queue = summary["latency_ms"]["queue"]
    if queue.get("count"):
        row["mean_queue_ms"] = queue["mean"]
        row["p99_queue_ms"] = queue["p99"]
    return row


def resolve(source, overrides, seed=None):
    """The validated scenario of a point (raises ConfigError); ``source`` may be a packed point
    (dsim.explore.portable: a scenario shipped to a cluster worker with its files)."""
    from .portable import is_packed, unpack
    if is_packed(source):
        data, folder = unpack(source)
        return load_scenario(data, list(overrides), seed, base_dir=folder)
    return load_scenario(source, list(overrides), seed)


def evaluate(source, overrides, seed=None, keep_requests: bool = False, extra=None) -> dict:
    """Run one point; return {"status": "ok", metrics...} or {"status": "error", "error": message}.
    A user error (bad value for this point) is recorded, not raised, so other points go on.
    ``extra(summary) -> dict`` adds columns of your own (e.g. from the speculation section)."""
    from ..runner import run
    try:
        scn = resolve(source, overrides, seed)
        res = run(scn, None, plots=False)
    except ConfigError as e:
        return {"status": "error", "error": str(e)}
    row = {"status": "ok", "error": "", **summary_row(res.summary)}
    if extra is not None:
        row.update(extra(res.summary))
    if keep_requests:
        row["_arrivals"] = res.requests.col("arrival").tolist()
    return row


evaluate.dsim_point = True      # called as (scenario source, overrides, ...): may travel packed (backends)
