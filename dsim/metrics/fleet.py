"""Fleet metrics: per replica, pool and cluster; cost and energy; Jain fairness across tenants.

Energy per GPU: busy time x TDP (or the LUT's measured per-step energy when the latency model
has it) + idle time x ``idle_w``; a replica counts from its creation (cold start included) to its
retirement or the end of the run.  Cost: alive GPU-hours x ``usd_per_gpu_hour``.
"""
from __future__ import annotations

import numpy as np

from ..core.request import PENDING
from .measures import busy_and_kv, ledger_latencies, meets_slo_mask, stats


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
    gpus = spec.engine.tensor_parallel_size
    dev = spec.device
    alive = _alive(rep, t_end)
    busy = min(rep.inst.busy_time, alive)
    lut_mj = getattr(rep.inst.step_model, "energy_mj", None)
    busy_j = lut_mj / 1e3 if lut_mj is not None else busy * dev.tdp_w * gpus
    idle_j = (alive - busy) * dev.idle_power_w * gpus
    cost = alive / 3600 * gpus * dev.usd_per_gpu_hour if dev.usd_per_gpu_hour is not None else None
    return {"gpus": gpus, "alive_s": alive, "busy_s": busy, "busy_joules": busy_j, "idle_joules": idle_j,
            "cost_usd": cost, "energy_source": "lut" if lut_mj is not None else "device power states"}


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


def _ledger_block(led, sel) -> dict:
    """TTFT, TPOT and E2E statistics of the ledger's completed rows ``sel`` (a mask, or indices in
    the order the statistics sum them)."""
    lat = ledger_latencies(led, sel)
    return {k: stats(lat[f"{k}_ms"]) for k in ("ttft", "tpot", "e2e")}


def fleet_sections(fleet, led, t_end: float) -> dict:
    """``replicas``, ``pools`` and ``clusters`` sections of the summary, from the run's sealed
    RequestLedger (completed requests grouped by the replica that finished them)."""
    done = np.flatnonzero(led.present("t_completion"))
    rep_code = led.col("replica")[done]
    n_out, prompt = led.col("n_out"), led.col("prompt_len")

    def rows_of(names) -> np.ndarray:          # completed rows finished on these replicas, in id order
        codes = [c for c in (led.code_of(n) for n in names) if c is not None]
        return done[np.isin(rep_code, codes)]
    replicas = {}
    for rep in fleet.replicas():
        i = rep.inst
        log = i.log
        busy, kv_used, kv_peak = busy_and_kv(log)
        p = replica_power(rep, t_end)
        replicas[rep.name] = {
            "pool": rep.pool.name, "cluster": rep.pool.cluster.name, "role": rep.pool.role, "state": rep.state,
            "created_s": rep.t_created, "ready_s": rep.t_ready, "retired_s": rep.t_retired,
            "submitted": i.submitted, "completed": i.n_completed, "rejected": i.n_rejected,
            "handed_off": i.handed_off, "steps": i.num_steps, "preemptions": i.num_preemptions,
            "busy_fraction": busy / p["alive_s"] if p["alive_s"] else 0.0,
            "mean_kv_usage": kv_used / busy / i.kv.total if busy else 0.0,
            "peak_kv_usage": kv_peak / i.kv.total if kv_peak is not None else 0.0,
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
        pools[name] = {
            "cluster": pool.cluster.name, "role": pool.role, "model": pool.spec.model.name,
            "hardware": pool.spec.device.name, "gpus_per_replica": pool.spec.gpus_per_replica,
            "replicas_initial": pool.spec.replicas, "replicas_final": len(pool.ready), "peak_replicas": pool.peak_ready,
            "replicas_created": len(reps),
            "completed": int(rows.size), "output_tokens": out_tok,
            "busy_fraction": sum(x["busy_s"] for x in pw) / tot_alive if tot_alive else 0.0,
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
    return {"replicas": replicas, "pools": pools, "clusters": clusters}


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
