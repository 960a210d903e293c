"""Fleet metrics: per replica, pool and cluster; cost and energy; Jain fairness across tenants.

Energy per GPU: busy time x TDP (or the LUT's measured energy of the steps the replica ran when
the latency model has it) + idle time x ``idle_w``; a replica counts from its creation (cold start
included) to its retirement or the end of the run.  Cost: alive GPU-hours x ``usd_per_gpu_hour``.
Each request's share of the busy energy is its ``energy_j`` (dsim.serving.instance).

Controller-facing load (seed 001, "Metrics Exposed"): ``gpu_utilization`` (dsim.metrics.measures),
memory utilisation (KV bytes in use over one GPU's memory, percent) and its spread over the
replicas, ``memory_efficiency`` = mean / max of that spread (1 / seed 001's imbalance factor).
"""
from __future__ import annotations

import numpy as np

from ..core.request import PENDING, REJECTED
from .exact import sorted_unique
from .measures import busy_and_kv, gpu_utilization, latency_column, meets_slo_mask, stats

BLOCK = 1 << 16              # values a block-wise column computation handles at a time


def jain(values) -> float | None:
    """Jain's index (sum x)^2 / (n sum x^2): 1 when all equal, 1/n when one class gets everything."""
    x = np.asarray([v for v in values if v is not None], dtype=float)
    if x.size < 2 or not (x ** 2).sum():
        return None
    return float(x.sum() ** 2 / (x.size * (x ** 2).sum()))


def _alive(rep, t_end: float) -> float:
    stop = rep.t_retired if rep.t_retired is not None else t_end
    return max(0.0, min(stop, t_end) - rep.t_created)


def replica_power(rep, t_end: float) -> dict:
    """GPUs, alive seconds, busy/idle joules and cost of one replica."""
    spec = rep.pool.spec
    gpus = spec.engine.tensor_parallel_size * spec.engine.context_parallel_size
    dev = spec.device
    alive = _alive(rep, t_end)
    busy = min(rep.inst.busy_time, alive)
    # an LUT's energy of the steps the replica ran (not of the step in flight at a stop, nor of the
    # estimates a scheduling policy asks the model for)
    lut = getattr(rep.inst.step_model, "energy_mj", None) is not None
    busy_j = rep.inst.lut_j if lut else busy * dev.tdp_w * gpus
    idle_j = (alive - busy) * dev.idle_power_w * gpus
    cost = alive / 3600 * gpus * dev.usd_per_gpu_hour if dev.usd_per_gpu_hour is not None else None
    return {"gpus": gpus, "alive_s": alive, "busy_s": busy, "busy_joules": busy_j, "idle_joules": idle_j,
            "cost_usd": cost, "energy_source": "lut" if lut else "device power states"}


def energy_cost(replicas, t_end: float, out_tok: int, all_tok: int) -> tuple[dict, dict | None]:
    pw = [replica_power(r, t_end) for r in replicas]
    busy = sum(p["busy_joules"] for p in pw)
    idle = sum(p["idle_joules"] for p in pw)
    sources = sorted({p["energy_source"] for p in pw})
    energy = {"joules": busy + idle, "busy_joules": busy, "idle_joules": idle,
              "joules_per_output_token": (busy + idle) / out_tok if out_tok else None,
              "source": "+".join(sources)}
    costs = [p["cost_usd"] for p in pw]
    cost = None
    if all(c is not None for c in costs):
        usd = sum(costs)
        cost = {"usd": usd, "gpu_hours": sum(p["alive_s"] * p["gpus"] for p in pw) / 3600,
                "usd_per_1k_output_tokens": usd / out_tok * 1e3 if out_tok else None,
                "usd_per_1k_tokens": usd / all_tok * 1e3 if all_tok else None}
    return energy, cost


def efficiency(replicas, t_end: float, span: float, out_tok: int, good: int | None, tpot_mean_ms) -> dict:
    """What a planner ranks configurations by: work per GPU and per user, GPUs and $/hour.
    GPUs are time-averaged over the accounting window (autoscaled fleets change size)."""
    pw = [replica_power(r, t_end) for r in replicas]
    gpu_s = sum(p["alive_s"] * p["gpus"] for p in pw)
    window = max(t_end, 1e-12)
    costs = [p["cost_usd"] for p in pw]
    out = {"gpus": gpu_s / window, "gpu_seconds": gpu_s,
           "output_tokens_per_s_per_gpu": out_tok / gpu_s if gpu_s else 0.0,
           "output_tokens_per_s_per_user": 1e3 / tpot_mean_ms if tpot_mean_ms else None,
           "usd_per_hour": sum(costs) / window * 3600 if all(c is not None for c in costs) else None}
    if good is not None:
        out["goodput_per_gpu_s"] = good / gpu_s if gpu_s else 0.0
    return out


def replica_usage(rep, t_end: float) -> dict:
    """One replica's load from its step log: busy seconds, KV block-seconds and peak blocks in use,
    prefill and decode tokens, alive seconds, the compute work of seed 001's ``gpu_utilization``
    (replica-seconds) and the percent of one GPU's memory a KV block in use takes."""
    log = rep.inst.log
    busy, kv_s, kv_peak = busy_and_kv(log)
    pre, dec = log.token_totals()
    pool = rep.pool
    return {"busy_s": busy, "kv_block_s": kv_s, "kv_peak": kv_peak or 0, "prefill_tokens": pre,
            "decode_tokens": dec, "alive_s": _alive(rep, t_end),
            "work_s": pool.work_s(pre, dec) if pre or dec else 0.0,
            "block_pct": 100.0 * pool.gpu_block_fraction}


def memory_utilization(use: dict) -> tuple:
    """(mean over busy time, peak) percent of one GPU's memory holding KV, of a ``replica_usage``."""
    mean = use["kv_block_s"] / use["busy_s"] * use["block_pct"] if use["busy_s"] else 0.0
    return mean, use["kv_peak"] * use["block_pct"]


def spread(values) -> dict:
    """min, max, mean and std (population) of per-replica values; ``memory_efficiency`` = mean/max
    (1 / seed 001's memory_imbalance_factor; 1.0 when nothing is in use)."""
    x = np.asarray(values, dtype=float)
    if not x.size:
        return {"mean": 0.0, "min": 0.0, "max": 0.0, "std": 0.0, "efficiency": 1.0}
    mx = float(x.max())
    return {"mean": float(x.mean()), "min": float(x.min()), "max": mx, "std": float(x.std()),
            "efficiency": float(x.mean()) / mx if mx > 0 else 1.0}


def _ledger_block(led, sel) -> dict:
    """TTFT, TPOT and E2E statistics of the ledger's completed rows ``sel`` (a mask, or indices in
    the order the statistics sum them)."""
    return {k: stats(latency_column(led, sel, f"{k}_ms")) for k in ("ttft", "tpot", "e2e")}   # one at a time


def fleet_sections(fleet, led, t_end: float, usage: dict | None = None) -> dict:
    """``replicas``, ``pools`` and ``clusters`` sections of the summary, from the run's sealed
    RequestLedger (completed requests grouped by the replica that finished them); ``usage``: the
    replicas' ``replica_usage`` by name, when the caller has them."""
    done = np.flatnonzero(led.present("t_completion"))
    rep_code = led.col("replica")[done]
    n_out, prompt = led.col("n_out"), led.col("prompt_len")

    def rows_of(names) -> np.ndarray:          # completed rows finished on these replicas, in id order
        codes = [c for c in (led.code_of(n) for n in names) if c is not None]
        return done[np.isin(rep_code, codes)]
    replicas = {}
    usage = dict(usage or {})
    for rep in fleet.replicas():
        i = rep.inst
        log = i.log
        use = usage.get(rep.name)
        if use is None:
            use = usage[rep.name] = replica_usage(rep, t_end)
        busy, kv_used, kv_peak = use["busy_s"], use["kv_block_s"], use["kv_peak"]
        mem_mean, mem_peak = memory_utilization(use)
        p = replica_power(rep, t_end)
        replicas[rep.name] = {
            "pool": rep.pool.name, "cluster": rep.pool.cluster.name, "role": rep.pool.role, "state": rep.state,
            "created_s": rep.t_created, "ready_s": rep.t_ready, "retired_s": rep.t_retired,
            "submitted": i.submitted, "completed": i.n_completed, "rejected": i.n_rejected,
            "handed_off": i.handed_off, "steps": i.num_steps, "preemptions": i.num_preemptions,
            "busy_fraction": busy / p["alive_s"] if p["alive_s"] else 0.0,
            "mean_kv_usage": kv_used / busy / i.kv.total if busy else 0.0,
            "peak_kv_usage": kv_peak / i.kv.total,
            "peak_waiting": log.peak_waiting(), "peak_running": log.peak_running(),
            "mean_memory_utilization": mem_mean, "peak_memory_utilization": mem_peak,
            "prefill_tokens": use["prefill_tokens"], "decode_tokens": use["decode_tokens"],
            "gpu_utilization": gpu_utilization(use["work_s"], use["alive_s"]),
            "prefix_hit_rate": i.kv.hits / i.kv.queries if i.kv.queries else 0.0,
            "energy_joules": p["busy_joules"] + p["idle_joules"], "cost_usd": p["cost_usd"],
        }
    pools = {}
    for name, pool in fleet.pools.items():
        reps = pool.replicas
        rows = np.concatenate([rows_of([rep.name]) for rep in reps]) if reps else done[:0]   # replica by replica
        out_tok = int(n_out[rows].sum())
        energy, cost = energy_cost(reps, t_end, out_tok, out_tok + int(prompt[rows].sum()))
        pw = [replica_power(r, t_end) for r in reps]
        tot_alive = sum(x["alive_s"] for x in pw)
        served = [usage[r.name] for r in reps if r.t_ready is not None]     # not the ones cancelled starting
        mem = spread([memory_utilization(u)[0] for u in served])
        pools[name] = {
            "cluster": pool.cluster.name, "role": pool.role, "model": pool.spec.model.name,
            "hardware": pool.spec.device.name, "gpus_per_replica": pool.spec.gpus_per_replica,
            "replicas_initial": pool.spec.replicas, "replicas_final": len(pool.ready), "peak_replicas": pool.peak_ready,
            "replicas_created": len(reps),
            "completed": int(rows.size), "output_tokens": out_tok,
            "busy_fraction": sum(x["busy_s"] for x in pw) / tot_alive if tot_alive else 0.0,
            "gpu_utilization": gpu_utilization(sum(usage[r.name]["work_s"] for r in reps), tot_alive),
            "memory_utilization": {k: mem[k] for k in ("mean", "min", "max", "std")},
            "peak_memory_utilization": max((memory_utilization(u)[1] for u in served), default=0.0),
            "memory_efficiency": mem["efficiency"],
            "latency_ms": _ledger_block(led, rows), "energy": energy, "cost": cost,
        }
    clusters = {}
    for c in fleet.clusters:
        reps = [r for p in c.pools for r in p.replicas]
        rows = rows_of({r.name for r in reps})
        out_tok = int(n_out[rows].sum())
        energy, cost = energy_cost(reps, t_end, out_tok, out_tok + int(prompt[rows].sum()))
        clusters[c.name] = {"router": c.router.policy, "pools": [p.name for p in c.pools], "completed": int(rows.size),
                            "latency_ms": _ledger_block(led, rows), "energy": energy, "cost": cost}
        if c.disagg:
            clusters[c.name]["decode_router"] = c.decode_router.policy
            clusters[c.name]["kv_transfer"] = c.transfer.summary()
            clusters[c.name]["decode_admission"] = decode_admission(led, [r.name for r in reps])
    return {"replicas": replicas, "pools": pools, "clusters": clusters}


def decode_admission(led, names) -> dict:
    """P/D, over the requests whose prefill ran on one of the replicas ``names``: the decode-side
    wait (KV arrived at the decode replica to its first admission there: ``decode_scheduled_s -
    kv_ready_s``), how many were deferred (a step of the decode replica started after the request
    joined its queue and did not admit it) and how many were dropped after their prefill
    (rejected: the KV transfer failed, or the decode replica refused them), by reason."""
    pre = led.col("prefill_replica")
    mine = np.isin(pre, [c for c in (led.code_of(n) for n in names) if c is not None])
    adm = mine & led.present("t_decode_scheduled")
    wait = (led.col("t_decode_scheduled")[adm] - led.col("t_kv_ready")[adm]) * 1e3
    drop = mine & (led.col("state") == REJECTED)
    codes, counts = np.unique(led.col("reject_reason")[drop], return_counts=True)
    return {"admitted": int(adm.sum()), "wait_ms": stats(wait), "deferred": int(led.col("decode_deferred")[adm].sum()),
            "dropped": int(drop.sum()),
            "dropped_by": dict(sorted((led.string_table[c], int(k)) for c, k in zip(codes, counts)))}


def fairness(led, slo_ttft_ms, slo_tpot_ms) -> dict | None:
    """Per-tenant service and Jain's index over tenants (when the workload has two or more), from
    the run's sealed RequestLedger."""
    tenant = led.col("tenant")
    names = led.string_table
    tenants = sorted((names[c], c) for c in set(tenant.tolist()) if names[c])
    if len(tenants) < 2:
        return None
    sent = led.col("state") != PENDING
    finished = led.present("t_completion")
    per = {}
    for t, code in tenants:
        mine = tenant == code
        sub = mine & finished
        n_sub = int(sub.sum())
        n_all = int((mine & sent).sum())
        lat = _ledger_block(led, sub)
        row = {"requests": n_all, "completed": n_sub,
               "completed_fraction": n_sub / n_all if n_all else None,
               "ttft_mean_ms": lat["ttft"].get("mean"), "tpot_mean_ms": lat["tpot"].get("mean"),
               "e2e_mean_ms": lat["e2e"].get("mean")}
        if slo_ttft_ms is not None or slo_tpot_ms is not None:
            good = int(meets_slo_mask(led, sub, slo_ttft_ms, slo_tpot_ms).sum())
            row["goodput_fraction"] = good / n_all if n_all else None
        per[t] = row
    out = {"tenants": per,
           "jain_ttft": jain(v["ttft_mean_ms"] for v in per.values()),
           "jain_tpot": jain(v["tpot_mean_ms"] for v in per.values()),
           "jain_completed": jain(v["completed_fraction"] for v in per.values())}
    if slo_ttft_ms is not None or slo_tpot_ms is not None:
        out["jain_goodput"] = jain(v["goodput_fraction"] for v in per.values())
    return out


def _pow2_bins(x: np.ndarray) -> tuple:
    """Power-of-two bins of token counts: (bin of each value, [(bin, lowest, highest count)] of the
    bins present, in increasing order): 0, 1, 2-3, 4-7, ..., 2^k to 2^(k+1) - 1."""
    k = np.empty(x.size, dtype=np.int8)       # bins 0..64: a byte each
    for i in range(0, x.size, BLOCK):         # a block at a time: five temporaries of 8 bytes a value
        b = x[i:i + BLOCK]
        k[i:i + BLOCK] = np.where(b > 0, np.floor(np.log2(np.maximum(b, 1))).astype(np.int64) + 1, 0)  # exact
    return k, [(b, 0 if b == 0 else 2 ** (b - 1), 0 if b == 0 else 2 ** b - 1) for b in sorted_unique(k).tolist()]


def length_bins(led, slo_ttft_ms, slo_tpot_ms, pcts) -> dict:
    """Service by length, from the run's sealed RequestLedger, in power-of-two bins of tokens
    (lists in increasing length, each bin with its ``min_tokens`` and ``max_tokens``).

    ``prompt``: per prompt-length bin, the requests that arrived, completed fraction, TTFT
    statistics, mean TPOT and E2E, and with an SLO the goodput fraction (each request by its own
    targets, else the scenario's); Jain's index over the bins of the completed fraction, mean TPOT
    and goodput fraction (TTFT grows with the prompt by design, so it has no index here).
    ``output``: per output-length bin (generated tokens) of the completed requests, TPOT statistics
    (requests with more than one token) and mean E2E."""
    sent = led.col("state") != PENDING
    finished = led.present("t_completion")
    slo = slo_ttft_ms is not None or slo_tpot_ms is not None or led.present("ttft_slo_ms").any() \
        or led.present("tpot_slo_ms").any()
    # the latencies of every request once (NaN where not completed), sliced per bin in id order:
    # the same values, in the same order, as ledger_latencies of each bin (read a block of rows
    # at a time, and only the three used: a million requests hold 8 MB a column)
    every = np.ones(led.n, dtype=bool)
    lat = {k: latency_column(led, every, k) for k in ("ttft_ms", "e2e_ms")}
    n_out = led.col("n_out")
    multi = n_out > 1
    tpot = np.full(n_out.size, np.nan)
    tpot[multi] = latency_column(led, every, "tpot_ms")
    del every
    multi &= finished
    good = np.zeros(n_out.size, dtype=bool)
    if slo:
        good[finished] = meets_slo_mask(led, finished, slo_ttft_ms, slo_tpot_ms)
    kp, bins = _pow2_bins(led.col("prompt_len"))
    prompt = []
    for b, lo, hi in bins:
        mine = (kp == b) & sent
        n_all = int(mine.sum())
        if not n_all:
            continue
        sub = mine & finished
        n_sub = int(sub.sum())
        tp, e2e = tpot[sub & multi], lat["e2e_ms"][sub]
        row = {"min_tokens": lo, "max_tokens": hi, "requests": n_all, "completed": n_sub,
               "completed_fraction": n_sub / n_all,
               "ttft_ms": stats(lat["ttft_ms"][sub], pcts),
               "tpot_mean_ms": float(tp.mean()) if tp.size else None,
               "e2e_mean_ms": float(e2e.mean()) if e2e.size else None}
        if slo:
            row["goodput_fraction"] = int(good[sub].sum()) / n_all
        prompt.append(row)
    out = {"prompt": prompt,
           "jain_completed": jain(v["completed_fraction"] for v in prompt),
           "jain_tpot": jain(v["tpot_mean_ms"] for v in prompt)}
    if slo:
        out["jain_goodput"] = jain(v["goodput_fraction"] for v in prompt)
    ko, bins = _pow2_bins(n_out)
    output = []
    for b, lo, hi in bins:
        sub = (ko == b) & finished
        if not sub.any():
            continue
        output.append({"min_tokens": lo, "max_tokens": hi, "completed": int(sub.sum()),
                       "tpot_ms": stats(tpot[sub & multi], pcts), "e2e_mean_ms": float(lat["e2e_ms"][sub].mean())})
    out["output"] = output
    return out
