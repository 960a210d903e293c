"""A Dynamo-style planner, the baseline the simulation planner is compared with (issue 41 item 2).

NVIDIA Dynamo's throughput-based planner does not simulate: every adjustment interval it predicts
the next interval's request count and mean input/output lengths (a constant or ARIMA predictor),
reads the capacity of one engine off tables profiled before deployment (prefill: TTFT against the
input length, one request at a time; decode: inter-token latency against concurrency and context),
scales those by correction factors (observed / expected TTFT and ITL), and sets the replica counts
the predicted token rates need.  This module does the same inside dsim, with tables that
``profile_pool`` builds from one replica of the pool: TTFT by running dsim on one request, ITL
from the replica's own step model (``dsim profile`` prints them).  A mixed pool time-shares prefill and decode, so it gets the sum of the two fractional
needs; a prefill or decode pool of a P/D cluster gets its own one.  docs/planner.md.
"""
from __future__ import annotations

import copy
import math

import numpy as np

from ..config.errors import ConfigError
from ..latency.base import decode_curve
from .control import ScaleIn, ScaleOut, Window, apply_action

ISL_GRID = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
CTX_GRID = (256, 1024, 4096, 8192)
FILLS = (0.0, 0.125, 0.25, 0.5, 0.75, 1.0)       # decoders profiled per context, as shares of the most that fit
FILL_STEPS = 64
DECODE_OUT = 24            # output tokens a decoder's KV room is counted with (n_max)
ARIMA_MIN_POINTS = 6       # intervals of history before ARIMA replaces the constant predictor
_CACHE: dict = {}


class Profile:
    """One replica's measured tables, and the interpolations Dynamo's planner reads off them.

    Decode is tabulated, as Dynamo's decode profile is, by how full the KV cache is: row i holds
    the ITL of ``conc[i][k]`` decoders at context ``ctx[i]``, for concurrencies spread up to the
    most that fit (``n_max``); between contexts the tables are compared at the same KV fill, so a
    long context's smaller ceiling does not cap a short one's."""

    def __init__(self, isl, ttft_s, ctx, conc, itl_s, gpus: int, kv_tokens: float, max_seqs: int):
        self.isl, self.ttft_s = np.asarray(isl, float), np.asarray(ttft_s, float)
        self.ctx = np.asarray(ctx, float)
        self.conc = [np.asarray(r, float) for r in conc]
        self.itl_s = [np.asarray(r, float) for r in itl_s]
        self.gpus, self.kv_tokens, self.max_seqs = gpus, float(kv_tokens), int(max_seqs)

    def n_max(self, ctx: float) -> float:
        """Most decoders of this context the replica holds (KV cache, then max_num_seqs)."""
        return min(float(self.max_seqs), self.kv_tokens / (ctx + DECODE_OUT))

    def ttft(self, isl: float) -> float:
        """Seconds to the first token of one request of ``isl`` tokens, alone on the replica."""
        return float(np.interp(isl, self.isl, self.ttft_s))

    def prefill_tps(self, isl: float) -> float:
        """Prompt tokens per second one replica prefills at this input length (single-batched)."""
        return isl / self.ttft(isl)

    def itl(self, conc: float, ctx: float) -> float:
        """Seconds per decode step with ``conc`` decoders at context ``ctx``: each row read at the
        same KV fill (conc / n_max(ctx)), then linear in the context; inf past a full cache."""
        fill = conc / self.n_max(ctx)
        if fill > 1 + 1e-9:
            return math.inf
        by_ctx = [float(np.interp(fill * self.n_max(c), n, t)) for c, n, t in zip(self.ctx, self.conc, self.itl_s)]
        return float(np.interp(ctx, self.ctx, by_ctx))

    def decode_tps(self, ctx: float, itl_target: float) -> float:
        """Output tokens per second one replica decodes at the fullest KV fill (of 64 steps) whose
        ITL stays within ``itl_target`` (at least one decoder)."""
        first = self.itl(1, ctx)
        if not math.isfinite(first):                 # not even one decoder of this context fits
            return 0.0
        best = 1.0 / first
        top = self.n_max(ctx)
        for k in range(1, FILL_STEPS + 1):
            n = max(1.0, top * k / FILL_STEPS)
            itl = self.itl(n, ctx)
            if itl <= itl_target:
                best = max(best, n / itl)
        return best

    def to_dict(self) -> dict:
        return {"gpus_per_replica": self.gpus, "kv_tokens": self.kv_tokens, "max_num_seqs": self.max_seqs,
                "prefill": {"isl": self.isl.tolist(), "ttft_s": self.ttft_s.tolist()},
                "decode": {"context": self.ctx.tolist(), "concurrency": [r.tolist() for r in self.conc],
                           "itl_s": [r.tolist() for r in self.itl_s]}}


def _pool_scenario(raw: dict, index: int, workload: dict) -> dict:
    """The scenario of one replica of pool ``index`` serving ``workload`` (no controllers)."""
    s = copy.deepcopy(raw)
    pools = (s.get("cluster") or {}).get("pools") or [{"name": "default"}]
    pool = dict(pools[index])
    for k in ("min_replicas", "max_replicas", "router_weight", "role"):
        pool.pop(k, None)
    pool["replicas"] = 1
    s["cluster"] = {"pools": [pool]}
    for k in ("network", "speculation", "horizon_s"):
        s.pop(k, None)
    s["workload"] = workload
    s["drain"] = True
    s["output"] = {"plots": False}
    return s


def profile_pool(raw: dict, index: int, simulate, base_dir=None) -> Profile:
    """Measure pool ``index`` of the resolved scenario ``raw`` on one replica: the TTFT of one
    request per input length (a run each), and the duration of a decode-only step of n decoders per
    context length.  ``simulate``: the runner's ``simulate`` (handed down: this layer sits below
    the runner).  Deterministic; cached per pool configuration in the process."""
    from ..config.scenario import load_scenario
    key = repr((raw.get("model"), raw.get("hardware"), raw.get("engine"), raw.get("latency"),
                ((raw.get("cluster") or {}).get("pools") or [None])[index], raw.get("seed"), raw.get("seeds"),
                str(base_dir)))
    if key in _CACHE:
        return _CACHE[key]

    def run(wl: dict):
        scn = load_scenario(_pool_scenario(raw, index, wl), base_dir=base_dir)
        return scn, simulate(scn, keep_steps=True)
    scn, ses = run({"type": "constant", "rate": "inf", "num_requests": 1,
                  "prompt_tokens": {"dist": "constant", "value": 16}, "output_tokens": {"dist": "constant", "value": 1}})
    limit = scn.engine.max_model_len
    isl = [n for n in ISL_GRID if n + 2 <= limit]
    ttft = []
    for n in isl:
        _, ses = run({"type": "constant", "rate": "inf", "num_requests": 1,
                      "prompt_tokens": {"dist": "constant", "value": n}, "output_tokens": {"dist": "constant", "value": 2}})
        r = ses.reqs[0]
        ttft.append(r.t_first_token - r.arrival)
    rep = ses.fleet.pools[scn.fleet.pools[0].name].replicas[0]
    kv_tokens = scn.fleet.pools[0].engine.block_size * ses.fleet.pools[scn.fleet.pools[0].name].kv_blocks
    ctx = [c for c in CTX_GRID if c + DECODE_OUT <= limit]
    concs, itl = [], []
    for c in ctx:
        top = int(min(scn.engine.max_num_seqs, kv_tokens // (c + DECODE_OUT)))
        ns = sorted({max(1, round(top * f)) for f in FILLS})
        # a decode-only step of n decoders at context c, timed by the replica's own step model
        # (GPU and host costs): what a profiler reads off a steady decode; a simulation of n
        # requests would mix in the prefills that admit them
        itl.append([decode_curve(rep.inst.step_model, n, n)(n * c) for n in ns])
        concs.append(ns)
    prof = Profile(isl, ttft, ctx, concs, itl, scn.fleet.pools[0].gpus_per_replica, kv_tokens, scn.engine.max_num_seqs)
    _CACHE[key] = prof
    return prof


def profile_scenario(scn, simulate) -> dict:
    """``dsim profile``: every pool's tables, by pool name (a scenario of clusters is refused);
    ``simulate`` as for ``profile_pool``."""
    if (scn.raw.get("cluster") or {}).get("clusters") is not None:
        raise ConfigError("cluster.clusters", None, "a single cluster's pools (dsim profile measures cluster.pools)",
                          show_value=False)
    return {p.name: profile_pool(scn.raw, i, simulate, scn.base_dir).to_dict() for i, p in enumerate(scn.fleet.pools)}


def predict(history: list, kind: str) -> float:
    """The next value of a per-interval series: the last one (``constant``), or a one-step ARIMA(1,1,1)
    forecast (statsmodels) once there are ``ARIMA_MIN_POINTS`` intervals, never below 0."""
    if not history:
        return 0.0
    if kind == "constant" or len(history) < ARIMA_MIN_POINTS or len(set(history)) == 1:
        return float(history[-1])
    import warnings
    from statsmodels.tsa.arima.model import ARIMA
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = ARIMA(np.asarray(history, dtype=float), order=(1, 1, 1)).fit()
    value = float(fit.forecast(1)[0])
    return max(0.0, value) if math.isfinite(value) else float(history[-1])


def replicas_needed(prof: Profile, role: str, num_req: float, isl: float, osl: float, interval: float,
                    itl_target: float, p_corr: float, d_corr: float) -> tuple:
    """(prefill need, decode need, replicas) for a pool, Dynamo's way: predicted prompt tokens/s
    (scaled by min(1, prefill correction)) over one replica's prefill rate at that length; predicted
    output tokens/s over one replica's decode rate at the ITL target divided by the decode correction."""
    p_need = num_req * isl / interval * min(1.0, p_corr) / prof.prefill_tps(max(isl, 1.0))
    d_cap = prof.decode_tps(isl + osl / 2, itl_target / d_corr if d_corr > 0 else itl_target)
    d_need = num_req * osl / interval / d_cap if d_cap > 0 else (math.inf if num_req * osl > 0 else 0.0)
    need = {"prefill": p_need, "decode": d_need}.get(role, p_need + d_need)
    # a context no replica holds (d_cap 0): as many replicas as the pool may have
    return p_need, d_need, max(1, math.ceil(need - 1e-9)) if math.isfinite(need) else 10 ** 9


class InterpolatingPlanner:
    """``type: planner, kind: interpolate``: the Dynamo-style baseline (see the module docstring)."""

    def __init__(self, cfg, fleet, session, path: str):
        if cfg.predictor == "arima":
            import importlib.util
            if importlib.util.find_spec("statsmodels") is None:
                raise ConfigError(f"{path}.predictor", "arima", "statsmodels installed (pip install statsmodels, or "
                                  "dsim's planner extra), or predictor: constant") from None
        scn = session.scn
        if "pools" not in (scn.raw.get("cluster") or {}):
            raise ConfigError(f"{path}.kind", "interpolate", "a cluster of pools (cluster.pools), not clusters")
        self.cfg, self.fleet, self.path = cfg, fleet, path
        self.interval_s = cfg.cadence_s
        self.dwell = cfg.cadence_s if cfg.min_dwell_s is None else cfg.min_dwell_s
        tpot = scn.slo_tpot_ms
        self.itl_target = math.inf if tpot is None else tpot / 1e3
        self.profiles = {p.name: profile_pool(scn.raw, i, session.simulate_scenario, scn.base_dir)
                         for i, p in enumerate(scn.fleet.pools)}
        self.history: dict = {name: {"num_req": [], "isl": [], "osl": []} for name in fleet.pools}
        self.ticks: list = []
        self.last_change = -math.inf

    def run(self, log: list):
        env = self.fleet.sim.env
        win = Window(self.fleet)
        while True:
            yield env.timeout(self.cfg.cadence_s)
            if self.fleet.done:
                return
            self._tick(env.now, win.observe(), self.fleet.ledger.n, log)

    def _observed(self, start: int) -> dict:
        """Per pool, over the requests that finished since the last tick: count, mean prompt and
        output length, mean TTFT (s) and mean ITL (s)."""
        led = self.fleet.ledger
        rows = led.since(start)
        done = rows.present("t_completion")
        rep, pre_rep = rows.col("replica"), rows.col("prefill_replica")
        out = {}
        arr, first, last = rows.col("arrival"), rows.col("t_first_token"), rows.col("t_last_token")
        n_out, prompt = rows.col("n_out").astype(float), rows.col("prompt_len").astype(float)
        for name, pool in self.fleet.pools.items():
            codes = [c for c in (led.code_of(r.name) for r in pool.replicas) if c is not None]
            # a prefill pool's requests finish on decode replicas: they are its by their prefill replica
            col = pre_rep if pool.role == "prefill" else rep
            mine = done & np.isin(col, codes) if len(self.fleet.pools) > 1 else done
            multi = mine & (n_out > 1)
            out[name] = {"num_req": int(mine.sum()),
                         "isl": float(prompt[mine].mean()) if mine.any() else 0.0,
                         "osl": float(n_out[mine].mean()) if mine.any() else 0.0,
                         "ttft_s": float((first[mine] - arr[mine]).mean()) if mine.any() else None,
                         "itl_s": float(((last[multi] - first[multi]) / (n_out[multi] - 1)).mean())
                         if multi.any() else None}
        return out

    def _tick(self, now: float, obs: dict, n_rows: int, log: list) -> None:
        seen = getattr(self, "_rows", 0)
        measured = self._observed(seen)
        self._rows = n_rows
        cfg = self.cfg
        entry = {"time_s": now, "pools": {}}
        actions = []
        for name, m in measured.items():
            prof, pool, h = self.profiles[name], self.fleet.pools[name], self.history[name]
            for k in ("num_req", "isl", "osl"):
                h[k].append(m[k] if k == "num_req" or m["num_req"] else (h[k][-1] if h[k] else 0.0))
            num_req, isl, osl = (predict(h[k], cfg.predictor) for k in ("num_req", "isl", "osl"))
            p_corr = d_corr = 1.0
            if cfg.correction and m["ttft_s"] is not None and m["isl"] > 0:
                p_corr = m["ttft_s"] / prof.ttft(m["isl"])
            ready = obs["pools"][name]["ready"]
            if cfg.correction and m["itl_s"] is not None and ready:
                conc = max(1.0, obs["pools"][name]["running"] / ready)
                expected = prof.itl(conc, m["isl"] + m["osl"] / 2)
                if math.isfinite(expected):      # past the profiled concurrency: no correction
                    d_corr = m["itl_s"] / expected
            p_need, d_need, want = replicas_needed(prof, pool.role, num_req, isl, osl, cfg.cadence_s,
                                                   self.itl_target, p_corr, d_corr)
            lo, hi = pool.spec.min_replicas, pool.spec.max_replicas or 10 ** 9
            want = min(max(want, lo), hi)
            have = len(pool.ready) + len(pool.starting)
            entry["pools"][name] = {"observed": m, "predicted": {"num_req": num_req, "isl": isl, "osl": osl},
                                    "prefill_correction": p_corr, "decode_correction": d_corr,
                                    "prefill_need": p_need, "decode_need": d_need, "replicas": want}
            if want != have and now - self.last_change >= self.dwell - 1e-9:
                actions.append(ScaleOut(name, want - have) if want > have else ScaleIn(name, have - want))
        for a in actions:
            rec = apply_action(self.fleet, a)
            rec.update(time_s=now, by="planner")
            log.append(rec)
        if actions:
            self.last_change = now
        entry["changed"] = bool(actions)
        self.ticks.append(entry)

    def report(self, _led) -> dict:
        return {"kind": "interpolate", "predictor": self.cfg.predictor, "ticks": len(self.ticks),
                "changes": sum(t["changed"] for t in self.ticks),
                "profiles": {k: p.to_dict() for k, p in self.profiles.items()}, "tick_log": self.ticks}
