"""The P/D planner's screen (stage 1 of plan_pd.py): every candidate judged from the latency model alone.

A candidate's estimates depend on its prefill family only through one replica's prompt tokens/s and
lone-prompt step, and on its decode family only through the decode fixed point at the rate per decode
replica.  So each family of a role is loaded and modelled once (not once per pairing with the other
role: that was 216 scenario loads and 8,000 fixed points for the 70B space), each decode fixed point is
computed once per replica count, and the verdicts of all (prefill replicas, decode replicas) splits of
a pairing are computed as numpy arrays.  The scalar ``screen_candidate`` is the same rule on one row.
"""
from __future__ import annotations

import math

import numpy as np

from ..config.errors import ConfigError
from ..config.scenario import load_scenario
from ..latency.base import LatencyContext
from ..latency.registry import build_latency
from .deploy import gpus_per_replica
from .pd_space import ROLES, _replica_counts, cluster_override
from .plan import _step


def _pool_model(pool, base_dir):
    """(step-time function, KV tokens of one replica) of a pool; ConfigError when the model does not fit."""
    eng = pool.engine
    kv = eng.kv_blocks(pool.model, pool.device)
    step = build_latency(pool.latency, LatencyContext(pool.model, pool.device, eng, kv, base_dir=base_dir))[0]
    return step.step_time, kv * eng.block_size


def prefill_capacity(pool, base_dir, mean_prompt: float) -> dict:
    """Prompt tokens/s one prefill replica sustains: its token budget prefilled in every step (a full
    prefill batch of mean-length prompts) over the step time of that batch; and the lone-prompt step
    (the TTFT floor)."""
    step, _ = _pool_model(pool, base_dir)
    budget = pool.engine.max_num_batched_tokens
    t_full = _step(step, budget, 0, 0, mean_prompt)
    t_one = _step(step, min(max(int(mean_prompt), 1), budget), 0, 0, mean_prompt)
    return {"tokens_per_s": budget / t_full, "t_full": t_full, "t_one": t_one}


def decode_fixed_point(pool, base_dir, rate: float, prompt: float, output: float, model=None) -> dict:
    """Step time of a decode replica carrying ``rate`` req/s: B = rate x output x t, t = step(B decodes)
    (the single-pool screen with no prefill in the step).  ``overloaded`` names the bound it breaks.
    ``model``: the pool's (step function, KV tokens) when already built."""
    step, kv_tokens = model or _pool_model(pool, base_dir)
    eng = pool.engine
    ctx = prompt + output / 2
    t = _step(step, 0, 1, ctx, prompt)
    for _ in range(60):
        b = math.ceil(rate * output * t)
        if b > eng.max_num_seqs or b * (prompt + output) > kv_tokens or t > 60:
            return {"t": t, "batch": b, "overloaded": f"{rate:.2f} req/s per decode replica needs a batch of {b} "
                    f"per {t * 1e3:.1f} ms step (max_num_seqs {eng.max_num_seqs}, KV {kv_tokens} tokens)"}
        t2 = _step(step, 0, max(b, 1), ctx, prompt)
        if abs(t2 - t) <= 1e-4 * t:
            t = t2
            break
        t = t2
    return {"t": t, "batch": math.ceil(rate * output * t), "overloaded": ""}


def kv_transfer_s(scn, prompt: float) -> float:
    """Seconds to move one mean prompt's KV from a prefill to a decode replica (latency + bytes / bandwidth)."""
    from ..config.schema.cluster import KvTransferConfig
    cl = scn.fleet.clusters[0]
    spec = getattr(cl.disaggregation, "kv_transfer", None) or KvTransferConfig()
    return spec.latency_ms / 1e3 + prompt * cl.pools[0].model.kv_bytes_per_token / (spec.bandwidth_gb_s * 1e9)


def uncached_prompt_tokens(scn, pool) -> float:
    """Mean prompt tokens per request a prefill pool must compute with an ideal prefix cache: a block is
    free when the same content (prompt blocks only: the prefill pool never holds a decode's output) was in
    any earlier request's prompt.  An upper bound on the hits (no eviction, one cache for every replica),
    so the prefill load it gives is a lower bound and the screen never prunes for lack of caching."""
    from ..core.simulation import Simulation
    from ..serving.prefix import block_hashes
    from ..workload.generator import build_requests
    reqs, _ = build_requests(scn.config.workload, Simulation(scn.seed, scn.seeds).rng, scn.base_dir)
    if not reqs:
        return 0.0
    if not pool.engine.enable_prefix_caching:
        return sum(r.prompt_len for r in reqs) / len(reqs)
    bs = pool.engine.block_size
    seen: set = set()
    new = 0
    for r in sorted(reqs, key=lambda r: (r.arrival, r.rid)):
        if r.segments is None:
            new += r.prompt_len
            continue
        hs = block_hashes(r, r.prompt_len // bs, bs)
        hit = 0
        while hit < len(hs) and hs[hit] in seen:
            hit += 1
        hit = min(hit * bs, r.prompt_len - 1)         # vLLM computes at least the last prompt token
        new += r.prompt_len - hit
        seen.update(hs)
        r.block_hashes = None
    return new / len(reqs)


def screen_candidate(scn, w: dict, slos: dict, pre: dict | None = None) -> dict:
    """Estimates and verdict of one candidate scenario (two pools: prefill first); ``pre``: its
    prefill_capacity when already known (it does not depend on the replica counts)."""
    pp, dp = scn.fleet.pools
    P, O, rate = w["prompt"], w["output"], w["rate"]
    pre = pre or prefill_capacity(pp, scn.base_dir, P)
    dec = decode_fixed_point(dp, scn.base_dir, rate / dp.replicas, P, O)
    return screen_rows([pp.replicas], [dp.replicas], pre, {dp.replicas: dec}, kv_transfer_s(scn, P), w, slos)[0]


def screen_rows(prefill_replicas, decode_replicas, pre: dict, dec: dict, tx: float, w: dict, slos: dict) -> list:
    """Estimates and verdicts of the splits (prefill_replicas[i], decode_replicas[i]) of one pairing, as
    arrays: ``pre`` the prefill family's prefill_capacity, ``dec`` {decode replicas: decode_fixed_point at
    rate / that many}, ``tx`` the KV transfer seconds.  A split is pruned when the prefill pool is
    overloaded, else when the decode pool is, else at the first SLO whose (optimistic) estimate misses."""
    pr = np.asarray(prefill_replicas, dtype=np.int64)
    dr = np.asarray(decode_replicas, dtype=np.int64)
    P, O, rate = w["prompt"], w["output"], w["rate"]
    offered = rate * w.get("uncached_prompt", P)      # prompt tokens/s the prefill pool computes
    cap = pr * pre["tokens_per_s"]
    util = offered / cap
    drs = dr.tolist()
    t = np.array([dec[d]["t"] for d in drs], dtype=float)
    tpot = t + tx / max(O - 1, 1)
    est = {"tpot": tpot, "itl": t, "ttft": np.full(t.shape, pre["t_one"]), "e2el": pre["t_one"] + tx + (O - 1) * t}
    code = np.where(util > 1, 1, 0)
    code[(code == 0) & np.array([bool(dec[d]["overloaded"]) for d in drs], dtype=bool)] = 2
    checks = []
    for i, (key, bound) in enumerate(slos.items()):
        e = est[key[:-3].split("_", 1)[1]] * 1e3
        code[(code == 0) & (e > bound)] = 3 + i
        checks.append((key, bound, e.tolist()))
    rows = []
    for j, (c, d, cp, u, tt, tp) in enumerate(zip(code.tolist(), drs, cap.tolist(), util.tolist(), t.tolist(),
                                                  tpot.tolist())):
        row = {"est_prefill_tokens_per_s": cp, "est_offered_prefill_tokens_per_s": offered, "est_prefill_util": u,
               "est_decode_step_ms": tt * 1e3, "est_decode_batch": dec[d]["batch"], "est_kv_transfer_ms": tx * 1e3,
               "est_ttft_floor_ms": pre["t_one"] * 1e3, "est_tpot_ms": tp * 1e3, "screen": "kept", "reason": ""}
        if c == 1:
            row.update(screen="pruned", reason=f"prefill overloaded: {offered:.0f} prompt tokens/s offered > "
                       f"{cp:.0f} the pool prefills")
        elif c == 2:
            row.update(screen="pruned", reason="decode overloaded: " + dec[d]["overloaded"])
        elif c >= 3:
            key, bound, e = checks[c - 3]
            row.update(screen="pruned", reason=f"{key} estimate {e[j]:.1f} > {bound:g}")
        rows.append(row)
    return rows


def screen_grid(src, sp, bc: dict, user: list, w: dict, slos: dict, gpus, usd, device_name: str) -> list:
    """Every candidate of the P/D space ``sp`` within the budgets, screened: one row per (prefill family,
    decode family, prefill replicas, decode replicas), in the space's order, with the overrides that make
    its scenario (``_ov``).  Families whose scenario is invalid are pruned with the error (``_unfit``)."""
    uncached: dict = {}
    info = {r: [_role_info(src, bc, user, w, r, f, device_name, uncached) for f in sp.role_families(r)]
            for r in ROLES}
    loaded = next((i["scn"] for r in ROLES for i in info[r] if i["scn"] is not None), None)
    tx = kv_transfer_s(loaded, w["prompt"]) if loaded is not None else 0.0
    cands = []
    for pf in info["prefill"]:
        for df in info["decode"]:
            bad = pf["error"] or df["error"]
            price = {"prefill": pf["price"], "decode": df["price"]}
            if usd is not None and bad is None and None in price.values():
                bad = ConfigError("--budget-usd-per-hour", usd, f"GPU-hour prices for {pf['name']} and "
                                  f"{df['name']} (usd_per_gpu_hour of the device profiles)")
            fam = {**pf["values"], **df["values"], "prefill_hardware": pf["name"], "decode_hardware": df["name"]}
            one = {**pf["values"], **df["values"]}
            prs = np.array(_replica_counts(sp, "prefill", pf["per"], pf["price"], gpus, usd), dtype=np.int64)
            drs = np.array(_replica_counts(sp, "decode", df["per"], df["price"], gpus, usd), dtype=np.int64)
            PR, DR = (a.ravel() for a in np.meshgrid(prs, drs, indexing="ij"))
            n = PR * pf["per"] + DR * df["per"]
            keep = np.ones(n.shape, dtype=bool) if gpus is None else n <= gpus
            cost = None
            if None not in price.values():
                cost = (PR * pf["per"]) * price["prefill"] + (DR * df["per"]) * price["decode"]
                if usd is not None:
                    keep &= cost <= usd + 1e-9
            PR, DR, n = PR[keep], DR[keep], n[keep]
            cost = cost[keep].tolist() if cost is not None else [None] * len(n)
            if bad is None:
                dec = {d: df["fixed"](d) for d in sorted(set(DR.tolist()))}
                rows = screen_rows(PR, DR, pf["pre"], dec, tx, {**w, "uncached_prompt": pf["uncached"]}, slos)
            else:
                rows = [{"screen": "pruned", "reason": str(bad), "_unfit": True}] * len(n)
            for pr, dr, g, usd_h, row in zip(PR.tolist(), DR.tolist(), n.tolist(), cost, rows):
                c = {**fam, "prefill_replicas": pr, "decode_replicas": dr, "gpus": g, "usd_per_hour": usd_h}
                c["_ov"] = cluster_override(bc, {**one, "prefill_replicas": pr, "decode_replicas": dr})
                c.update(row)
                cands.append(c)
    return cands


def _role_info(src, bc, user, w, role: str, fam: dict, device_name: str, uncached: dict) -> dict:
    """One family of one role, modelled once: its device, GPUs per replica, price, and for a prefill
    family its capacity, for a decode family a memoised fixed point per decode replica count.  Loaded as
    a scenario whose two pools both take this family's values (a pool depends on its own role's values
    only), so a family's error is its own; ``uncached``: prefix-cache hits per (caching on, block size)."""
    mirror = {}
    for r in ROLES:
        mirror.update({k.replace(role, r, 1): v for k, v in fam.items()})
    info = {"values": fam, "name": fam[f"{role}_hardware"] or device_name, "per": fam[f"{role}_tp"],
            "price": None, "error": None, "scn": None}
    try:
        scn = load_scenario(src, user + [cluster_override(bc, {**mirror, "prefill_replicas": 1, "decode_replicas": 1})])
        pool = scn.fleet.pools[ROLES.index(role)]
        info.update(per=gpus_per_replica(pool.engine), price=pool.device.usd_per_gpu_hour, name=pool.device.name)
        if role == "prefill":
            info["pre"] = prefill_capacity(pool, scn.base_dir, w["prompt"])
            key = (pool.engine.enable_prefix_caching, pool.engine.block_size)
            if key not in uncached:
                uncached[key] = uncached_prompt_tokens(scn, pool)
            info["uncached"] = uncached[key]
        else:
            model = _pool_model(pool, scn.base_dir)                 # raises when the model does not fit
            memo: dict = {}

            def fixed(d, pool=pool, scn=scn, model=model, memo=memo):
                if d not in memo:
                    memo[d] = decode_fixed_point(pool, scn.base_dir, w["rate"] / d, w["prompt"], w["output"], model)
                return memo[d]
            info["fixed"] = fixed
        info["scn"] = scn
    except ConfigError as e:
        info["error"] = e
    return info
