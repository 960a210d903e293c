"""How far a dsim answer can be trusted: an error band built from the validated runs that resemble it.

Why: a capacity planner acts on one number, and dsim's error depends on where it is used (a few % on
the GPUs its curves were measured on, 15-30 % on GPUs that borrow them, far more past the knee).
Every answer therefore carries the interval that the validation data support for *this* deployment,
built by one written rule (docs/latency-models.md, "Reading an error band"):

1. **Errors.** ``dsim/data/validation_errors.csv`` (package data, written by experiments/validation.py)
   holds, per stage of every shared real vLLM run, the signed error e = (sim - real) / real of E2E
   mean/p99, TTFT p50/p99, TPOT p50/p99 and output throughput, for each latency model, zero-shot and
   calibrated, keyed by GPU, whether that GPU's GEMM curves were measured on it, model kind
   (dense / moe / quantized), engine generation and the simulated load.
2. **Similar runs.** Stages of the same latency model and study (zero-shot or calibrated; overloaded
   stages only for an overloaded run), at the first of these levels that holds: (1) same GPU, model
   kind, engine generation and load regime, (2) same GPU and engine generation -- each needing at
   least ``MIN_STAGES`` stages from ``MIN_RUNS`` runs: *within the validated range*; (3) the GPUs dsim
   was checked on but that have too few runs to be validated (what extrapolating to another GPU
   costs), (4) every stage. Levels 3-4 are *outside the validated range*, and so is a run past the
   knee or one using features no validated run had (speculative decoding, P/D, a network model).
   A model kind or engine generation that no validated run had goes straight to level 3: the
   physics is being extrapolated as much as to another GPU.
3. **Interval.** On x = log(real / sim) = -log(1 + e) of the n similar stages: centre = median,
   spread = 1.4826 x median |x - centre| (at least ``MIN_SCALE``), and the Student-t prediction
   interval centre +- t(1 - alpha/2, n - 1) x spread x sqrt(1 + 1/n) for alpha = 1 - LEVEL. Robust
   rather than conformal: with the 10-20 stages a GPU has, conformal ranks are the extreme errors and
   the band is 4-6x the typical error (docs/validation.md compares both). Fewer than 3 stages: +-
   the largest |x|. Outside the validated range the band is made symmetric about 0 (another GPU's
   bias does not carry over, its spread does).
4. **Widened** (each bound's log-ratio x ``WIDEN``, away from 0) when the stages at hand understate
   what can go wrong: the last-resort pool (level 4), features or a load no run had, or fewer than
   3 stages. The answer lists the reasons.

A calibrated run (latency written by ``dsim calibrate``) uses the calibration's own held-out errors
when it carries them (``latency.held_out_errors``), else the calibrated studies of the table.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..latency.credibility import BAND_COLUMNS
from .exact import median

LEVEL = 0.8
MIN_STAGES = 9          # 2 / (1 - LEVEL) - 1: the fewest errors with both conformal ranks
MIN_RUNS = 3            # stages of one run move together; a band from one or two runs is not a band
WIDEN = 2.0             # a judgement, not a fit: too few runs to fit it (leave-one-GPU-out in docs/validation.md)
MAD_TO_SIGMA = 1.4826  # median absolute deviation -> standard deviation of a normal
MIN_SCALE = 0.005       # the smallest spread of log(real/sim) a band claims (half a per cent)
LOAD_REGIMES = ((0.25, "light"), (0.6, "moderate"), (float("inf"), "heavy"))
# summary statistic -> the validated error it borrows (tails from p99, centres from p50 / mean)
_CENTRE, _TAIL = ("mean", "p50"), ("p90", "p95", "p99")
_METRIC_COLUMN = {"ttft": ("ttft_p50_err", "ttft_p99_err"), "tpot": ("tpot_p50_err", "tpot_p99_err"),
                  "itl": ("tpot_p50_err", "tpot_p99_err"), "e2e": ("e2e_mean_err", "e2e_p99_err")}
_SHORT = {"e2e_mean_err": "E2E mean", "e2e_p99_err": "E2E p99", "ttft_p50_err": "TTFT p50",
          "ttft_p99_err": "TTFT p99", "tpot_p50_err": "TPOT p50", "tpot_p99_err": "TPOT p99",
          "throughput_err": "throughput"}


def model_kind(model) -> str:
    """dense / moe / quantized: what a model shares with a validated one (a ModelSpec)."""
    if getattr(model, "quant", None) is not None:
        return "quantized"
    return "moe" if getattr(model, "num_experts", 0) > 0 else "dense"


def offered_load(rate: float, e2e_mean_s: float, slots: int) -> float:
    """Little's law over the batch slots: requests in flight (rate x mean E2E) per max_num_seqs.
    The same measure for a validation stage and for a new run, read off the simulation."""
    return float(rate) * float(e2e_mean_s) / max(int(slots), 1)


def load_regime(load: float | None) -> str | None:
    if load is None or not math.isfinite(load):
        return None
    return next(name for cap, name in LOAD_REGIMES if load < cap)


@dataclass(frozen=True)
class Deployment:
    """What a band is matched on (one pool of a run)."""
    latency_model: str
    gpu: str
    gpu_profiled: bool
    kind: str
    generation: str
    regime: str | None = None          # light / moderate / heavy; None when unknown
    calibrated: bool = False
    overloaded: bool = False
    unvalidated: tuple = ()            # features no validated run had
    held_out: dict | None = None       # column -> calibration's own held-out errors
    fitted_on: str | None = None       # the GPU a calibrated latency section was fitted on
    scale: float = 1.0                 # latency.scale: every step scaled by hand (a what-if)

    def describe(self) -> str:
        return f"{self.gpu}, {self.kind} model, engine {self.generation}, {self.latency_model}"


@dataclass
class Band:
    level: float
    relative: dict                     # column -> (lo, hi) bounds of real / sim - 1
    validated: bool
    basis: str                         # which runs the band was built from, in words
    runs: int | None                   # None: a calibration's own held-out errors (runs not recorded)
    stages: int
    reasons: list = field(default_factory=list)
    widened: bool = False

    def ratio(self, column: str) -> tuple | None:
        """(lo, hi) multipliers of a simulated value that bound the real one."""
        return self.relative.get(column)

    def statement(self) -> str:
        parts = []
        for col in ("tpot_p50_err", "ttft_p50_err", "e2e_mean_err"):
            r = self.relative.get(col)
            if r is not None:
                parts.append(f"{_SHORT[col]} {_pct(r[0])}/{_pct(r[1])}")
        where = (f"within the validated range: {self.basis}" if self.validated else
                 "outside the validated range (" + "; ".join(self.reasons) + f"); band from {self.basis}"
                 + (", widened" if self.widened else ""))
        n = f"{self.stages} errors" if self.runs is None else f"{self.runs} runs, {self.stages} stages"
        return (f"{self.level:.0%} band on the real value: " + (", ".join(parts) or "no metric validated") +
                f" of dsim's ({where}; {n})")


def _pct(x: float) -> str:
    return f"{x:+.0%}"


def conformal(errors, level: float = LEVEL) -> tuple | None:
    """(e_lo, e_hi): split-conformal ranks of signed relative errors; None if too few errors."""
    e = sorted(errors)
    n = len(e)
    a = 1.0 - level
    # ranks in exact arithmetic: 1 - 0.8 is 0.19999999999999996 in floats, and floor(20 x 0.1) must be 2
    k_lo, k_hi = math.floor((n + 1) * a / 2 + 1e-9), math.ceil((n + 1) * (1 - a / 2) - 1e-9)
    if k_lo < 1 or k_hi > n:
        return None
    return e[k_lo - 1], e[k_hi - 1]


def _ratio_band(errors, widen: float, method: str = "robust") -> tuple | None:
    """Bounds (lo, hi) of real/sim - 1 from errors e = sim/real - 1 (so real/sim = 1/(1+e))."""
    x = sorted(-math.log1p(e) for e in errors if e is not None and math.isfinite(e) and e > -1)   # log(real/sim)
    if not x:
        return None
    n = len(x)
    if method == "conformal":
        c = conformal([math.expm1(-v) for v in x])
        if c is None:
            return _widened(math.expm1(-max(abs(v) for v in x)), math.expm1(max(abs(v) for v in x)), widen)
        return _widened(1 / (1 + c[1]) - 1, 1 / (1 + c[0]) - 1, widen)
    if n < 3:                                            # no spread to estimate: as far as the worst error
        m = max(abs(v) for v in x)
        return _widened(math.expm1(-m), math.expm1(m), widen)
    centre = median(x)
    scale = max(MAD_TO_SIGMA * median([abs(v - centre) for v in x]), MIN_SCALE)
    half = t_quantile(1 - (1 - LEVEL) / 2, n - 1) * scale * math.sqrt(1 + 1 / n)
    return _widened(math.expm1(centre - half), math.expm1(centre + half), widen)


def _t_central(theta: float, df: int) -> float:
    """P(|T| <= sqrt(df) tan(theta)) for Student's t with integer ``df`` (the closed forms of
    Abramowitz & Stegun 26.7.3-4: a finite cosine series; no scipy, whose import costs a run 0.5 s)."""
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:                                   # odd: (2/pi)(theta + sin cos (1 + 2/3 cos^2 + ...))
        term, acc = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 1) // 2):
            term *= c2 * (2 * k) / (2 * k + 1)
            acc += term
        return 2 / math.pi * (theta + s * math.cos(theta) * acc)
    term, acc = 1.0, 1.0                          # even: sin (1 + 1/2 cos^2 + 1.3/2.4 cos^4 + ...)
    for k in range(1, df // 2):
        term *= c2 * (2 * k - 1) / (2 * k)
        acc += term
    return s * acc


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile (p > 1/2) of Student's t with ``df`` degrees of freedom, by bisection on
    the angle theta in t = sqrt(df) tan(theta) (exact to float precision)."""
    target, lo, hi = 2 * p - 1, 0.0, math.pi / 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if _t_central(mid, df) < target:
            lo = mid
        else:
            hi = mid
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def _widened(lo: float, hi: float, widen: float) -> tuple:
    """Each bound's log-ratio moved away from zero by ``widen`` (x W outside, / W inside)."""
    if widen == 1.0:
        return lo, hi

    def move(x, outward):
        y = math.log1p(x)
        return math.expm1(y * widen if outward else y / widen)
    return move(lo, lo < 0), move(hi, hi > 0)


def _f(v):
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _validated_gpus(pool) -> set:
    """GPUs with enough stages and runs of their own for a band (levels 1-2 can only hold there)."""
    out = set()
    for g in {r["gpu"] for r in pool}:
        sel = [r for r in pool if r["gpu"] == g]
        if len(sel) >= MIN_STAGES and len({r["run"] for r in sel}) >= MIN_RUNS:
            out.add(g)
    return out


def _select(dep: Deployment, pool, extrapolating: bool) -> tuple:
    """(level, stages, words) of the rule's similar runs (module docstring, step 2); ``extrapolating``:
    the deployment's model kind or engine generation is in no validated run, so levels 1-2 cannot hold."""
    def enough(sel):
        return len(sel) >= MIN_STAGES and len({r["run"] for r in sel}) >= MIN_RUNS
    same_gen = [] if extrapolating else [r for r in pool if r["gpu"] == dep.gpu and r["generation"] == dep.generation]
    sel = [r for r in same_gen if r.get("kind") == dep.kind and load_regime(_f(r.get("load"))) == dep.regime]
    if enough(sel):
        return 1, sel, f"{dep.gpu}, {dep.kind} models, engine {dep.generation}, {dep.regime} load"
    if enough(same_gen):
        return 2, same_gen, f"{dep.gpu}, engine {dep.generation}, any model and load"
    valid = _validated_gpus(pool)
    sel = [r for r in pool if r["gpu"] not in valid]
    if sel:
        return 3, sel, "GPUs dsim was checked on but not validated on (" + ", ".join(
            sorted({r["gpu"] for r in sel})) + ")"
    return 4, pool, "every validated GPU"


def band_for(dep: Deployment, rows, exclude_run: str | None = None, method: str = "robust") -> Band | None:
    """The band of ``dep`` from validation ``rows`` (dicts as in the CSV); ``exclude_run`` leaves a
    run out (the coverage study). None when the latency model was never validated."""
    n_held = min((len(v) for v in dep.held_out.values()), default=0) if dep.held_out else 0
    if n_held >= MIN_STAGES:     # the calibration's own check is enough: use it, by the same interval rule
        reasons = _reasons(dep)
        widen = WIDEN if reasons else 1.0
        rel = {c: _ratio_band(dep.held_out.get(c, ()), widen, method) for c in BAND_COLUMNS}
        rel = {c: v for c, v in rel.items() if v is not None}
        return Band(LEVEL, rel, not reasons, "this calibration's held-out errors", None, n_held, reasons,
                    widen != 1.0)
    study = ("calibrated-same-deployment", "calibrated-other-models") if dep.calibrated else ("zero-shot",)
    pool = [r for r in rows if r["latency_model"] == dep.latency_model and r.get("study", "zero-shot") in study
            and r["run"] != exclude_run and (r["overloaded"] == "1") == dep.overloaded]
    if not pool:
        return None
    unseen = [f"{dep.kind} models" for _ in (1,) if not any(r.get("kind") == dep.kind for r in pool)] + \
        [f"engine generation {dep.generation}" for _ in (1,) if not any(r["generation"] == dep.generation for r in pool)]
    if dep.overloaded:      # past the knee nothing is similar but other overloads, on any GPU
        level, sel, basis = 4, pool, "the overloaded stages of the validation runs (any GPU)"
    else:
        level, sel, basis = _select(dep, pool, bool(unseen))
    reasons = _reasons(dep) + [f"{u} were not in any validated run" if u.endswith("models") else
                               f"{u} was not in any validated run" for u in unseen]
    seen_gpu = any(r["gpu"] == dep.gpu for r in pool)
    if level > 2 and not dep.overloaded and not seen_gpu:
        reasons.insert(0, f"no validated run on {dep.gpu}" + ("" if dep.gpu_profiled else
                                                             " (its GEMM curves are borrowed from another GPU)"))
    elif level > 2 and not dep.overloaded and not unseen:
        reasons.insert(0, f"too few validated runs on {dep.gpu} with engine {dep.generation}")
    # widened where the errors at hand understate what can go wrong: features or loads no run had,
    # the last-resort pool, or too few stages to estimate a spread
    # (the one reason that sent the band to level 3 is paid for by that level's wider pool)
    widen = WIDEN if (level == 4 or len(reasons) > (1 if level > 2 else 0)) else 1.0
    rel, widened = {}, widen != 1.0
    for c in BAND_COLUMNS:
        vals = [_f(r.get(c)) for r in sel]
        b = _ratio_band(vals, 1.0, method)
        if b is None:
            continue
        if level > 2:       # other GPUs' bias does not carry over, their spread does: symmetric about 0
            m = max(abs(math.log1p(b[0])), abs(math.log1p(b[1])))
            b = (math.expm1(-m), math.expm1(m))
        w = WIDEN if sum(v is not None for v in vals) < 3 else widen     # too few to estimate a spread
        widened |= w != 1.0
        rel[c] = _widened(*b, w)
    study_name = "calibrated" if dep.calibrated else "zero-shot"
    note = (f" (this calibration's own held-out check has {n_held} errors, {MIN_STAGES} needed)"
            if dep.held_out else "")
    return Band(LEVEL, rel, not reasons, f"{study_name} {dep.latency_model} on {basis}{note}",
                len({r["run"] for r in sel}), len(sel), reasons, widened)


def _reasons(dep: Deployment) -> list:
    out = []
    if dep.overloaded:
        out.append("past the knee: the simulated queue grows, latencies depend on the horizon")
    if dep.calibrated and dep.fitted_on is not None and dep.fitted_on != dep.gpu:
        out.append(f"calibrated on {dep.fitted_on}, run on {dep.gpu}")
    if dep.scale != 1.0:
        out.append(f"latency.scale = {dep.scale:g} (every step scaled by hand)")
    out += [f"{f} was not in any validated run" for f in dep.unvalidated]
    return out


def band_columns_for(metric: str, stat: str) -> str | None:
    cols = _METRIC_COLUMN.get(metric)
    if cols is None:
        return None
    return cols[0] if stat in _CENTRE else cols[1] if stat in _TAIL else None


def interval(value: float, ratio: tuple) -> list:
    """[lo, hi] of the real value given a simulated ``value`` and a ratio band."""
    return [value * (1 + ratio[0]), value * (1 + ratio[1])]


# ---- a finished run --------------------------------------------------------------------------------
def deployments(scn, fleet, summary: dict) -> dict:
    """pool name -> Deployment of a finished run (load and overload read off its own summary)."""
    from ..latency.efficiency import curve_for
    stab = summary.get("stability", {})
    e2e = summary.get("latency_ms", {}).get("e2e", {}).get("mean")
    slots = sum(p.spec.engine.max_num_seqs * max(p.spec.replicas, 1) for p in fleet.pools.values())
    rate = stab.get("offered_requests_per_s")
    regime = load_regime(offered_load(rate, e2e / 1e3, slots)) if rate and e2e is not None else None
    common = []
    if scn.spec is not None:
        common.append("speculative decoding")
    if any(p.role != "mixed" for p in fleet.pools.values()):
        common.append("prefill/decode disaggregation")
    if fleet.network is not None:
        common.append("a network model")
    out = {}
    for name, p in fleet.pools.items():
        desc = p.latency_desc if isinstance(p.latency_desc, dict) else {}
        eng = p.spec.engine
        extra = (["pipeline parallelism"] if getattr(eng, "pipeline_parallel_size", 1) > 1 else []) + \
            (["data parallelism"] if getattr(eng, "data_parallel_size", 1) > 1 else []) + \
            (["context parallelism"] if getattr(eng, "context_parallel_size", 1) > 1 else []) + \
            (["a TP group across nodes"] if p.spec.device.crosses_nodes(eng.tensor_parallel_size
                                                                       * getattr(eng, "context_parallel_size", 1))
             else [])
        out[name] = Deployment(
            latency_model=desc.get("model", "roofline"), gpu=p.spec.device.name,
            gpu_profiled=not curve_for(p.spec.device).borrowed, kind=model_kind(p.spec.model),
            generation=eng.generation.name, regime=regime, calibrated=bool(desc.get("calibrated")),
            overloaded=bool(stab.get("overloaded")), unvalidated=tuple(common + extra),
            held_out=desc.get("held_out_errors"), fitted_on=desc.get("fitted_on") if desc.get("calibrated") else None,
            scale=float(desc.get("scale", 1.0)))
    return out


def run_band(deps: dict, rows) -> tuple:
    """(Band of the whole run, per-pool Bands): pools that differ are enveloped (the widest side wins,
    every pool's reasons kept); a pool whose latency model was never validated makes the run's band
    unvalidated."""
    bands, missing = {}, []
    for name, d in deps.items():
        b = band_for(d, rows)
        if b is None:
            missing.append(f"pool {name}: latency model {d.latency_model} was never validated")
        else:
            bands[name] = b
    if not bands:
        return None, {}
    distinct = list({(b.basis, tuple(sorted(b.relative.items())), tuple(b.reasons)): b
                     for b in bands.values()}.values())
    if len(distinct) == 1 and not missing:
        return distinct[0], bands
    rel = {}
    for c in BAND_COLUMNS:
        got = [b.relative[c] for b in distinct if c in b.relative]
        if got:
            rel[c] = (min(g[0] for g in got), max(g[1] for g in got))
    reasons = sorted({r for b in distinct for r in b.reasons}) + missing
    runs = [b.runs for b in distinct if b.runs is not None]
    return Band(LEVEL, rel, all(b.validated for b in distinct) and not missing,
                "; ".join(sorted({b.basis for b in distinct})), min(runs) if runs else None,
                min(b.stages for b in distinct), reasons, any(b.widened for b in distinct)), bands


def annotate(summary: dict, band: Band | None, per_pool: dict, deps: dict) -> None:
    """Put the band beside every latency statistic of ``summary`` (in place)."""
    if not summary.get("requests", {}).get("completed"):
        summary["error_band"] = {"level": LEVEL, "validated": False,
                                 "statement": "no error band: no request completed, there is no latency to bound"}
        return
    if band is None:
        models = sorted({d.latency_model for d in deps.values()})
        summary["error_band"] = {"level": LEVEL, "validated": False, "statement":
                                 f"no error band: latency model {', '.join(models)} was never validated against "
                                 "real runs (docs/validation.md)"}
        return
    r = lambda x: round(x, 6)      # noqa: E731  (bands are estimates: 6 decimals keep files readable)
    lat = summary.get("latency_ms", {})
    for metric, st in lat.items():
        bands = {}
        for stat in _CENTRE + _TAIL:
            col = band_columns_for(metric, stat)
            if col in band.relative and st.get(stat) is not None:
                bands[stat] = [r(v) for v in interval(st[stat], band.relative[col])]
        if bands:
            st["band"] = bands
    flat = summary.get("metrics", {})
    names = {"ttft": "ttft", "tpot": "tpot", "itl": "itl", "e2el": "e2e"}
    for key in list(flat):
        parts = key.split("_")
        if len(parts) == 3 and parts[2] == "ms" and parts[1] in names:
            stat = {"median": "p50"}.get(parts[0], parts[0])
            col = band_columns_for(names[parts[1]], stat)
            if col in band.relative and flat[key] is not None:
                flat[f"{parts[0]}_{parts[1]}_band_ms"] = [r(v) for v in interval(flat[key], band.relative[col])]
    thr = summary.get("throughput", {})
    if "throughput_err" in band.relative and thr.get("output_tokens_per_s") is not None:
        thr["output_tokens_per_s_band"] = [r(v) for v in interval(thr["output_tokens_per_s"],
                                                                   band.relative["throughput_err"])]
    d0 = next(iter(deps.values()))
    summary["error_band"] = {
        "level": LEVEL, "validated": band.validated, "statement": band.statement(), "basis": band.basis,
        "runs": band.runs, "stages": band.stages, "reasons": band.reasons, "widened": band.widened,
        "relative": {c: [r(lo), r(hi)] for c, (lo, hi) in band.relative.items()},
        "deployment": {"latency_model": d0.latency_model, "gpu": d0.gpu, "gpu_curves_measured": d0.gpu_profiled,
                       "model_kind": d0.kind, "engine_generation": d0.generation, "load_regime": d0.regime,
                       "calibrated": d0.calibrated},
        "rule": "docs/latency-models.md#reading-an-error-band"}
    if len(deps) > 1:
        summary["error_band"]["pools"] = {
            n: ({"validated": per_pool[n].validated, "basis": per_pool[n].basis, "reasons": per_pool[n].reasons}
                if n in per_pool else {"validated": False, "reasons": [f"latency model {d.latency_model} was never "
                                                                       "validated"]})
            for n, d in deps.items()}


def band_lines(summary: dict) -> list:
    """Console lines: the band of the headline statistics and the sentence that says how far to trust it."""
    eb = summary.get("error_band")
    if not eb:
        return []
    lat = summary.get("latency_ms", {})
    parts = []
    for m, stat in (("ttft", "p50"), ("ttft", "p99"), ("tpot", "p50"), ("e2e", "mean")):
        b = lat.get(m, {}).get("band", {}).get(stat)
        if b:
            parts.append(f"{m.upper()} {stat} {b[0]:.4g}-{b[1]:.4g}")
    lines = [f"  error band ({eb['level']:.0%}, ms): " + ", ".join(parts)] if parts else []
    lines.append(f"  {eb['statement']}")
    ms = summary.get("model_spread")
    if ms:
        words = [f"{m} " + (f"TTFT p50 {v['ttft_p50_ms']:.4g}, TPOT p50 {v['tpot_p50_ms']:.4g}, E2E mean "
                            f"{v['e2e_mean_ms']:.4g} ms" if "error" not in v and v.get("e2e_mean_ms") is not None
                            else "n/a (cannot model this deployment)") for m, v in ms["models"].items()]
        lines.append("  other latency models validated on this GPU: " + ("; ".join(words) if words else "none"))
    return lines


# ---- other latency models, and where a scenario's latency sections are -----------------------------
def validated_models(scn) -> list:
    """Latency models with a band within the validated range for ``scn``'s (first) deployment (enough
    validation runs on its GPU; their own bands can still be wide: docs/validation.md)."""
    from ..latency.credibility import DEFAULT_MODEL, EXPERIMENTAL, validation_rows
    from ..latency.efficiency import curve_for
    pool = scn.fleet.pools[0]
    out = []
    for m in (DEFAULT_MODEL,) + EXPERIMENTAL:
        dep = Deployment(m, pool.device.name, not curve_for(pool.device).borrowed, model_kind(pool.model),
                         pool.engine.generation.name)
        b = band_for(dep, validation_rows())
        if b is not None and b.validated:
            out.append(m)
    return out


def own_latency_pools(scn) -> list:
    """Paths of the pools that declare their own latency section (top-level latency does not reach them)."""
    return [p.path for p in scn.fleet.pools if p.path and isinstance(get_path(scn.raw, p.path + ".latency"), dict)]


def get_path(doc, key: str):
    """``doc`` at a dotted key path with [i] indices (None when absent)."""
    import re
    node = doc
    for part in key.split("."):
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_-]*)((?:\[-?\d+\])*)$", part)     # as --set reads keys
        if not m or not isinstance(node, dict) or m.group(1) not in node:
            return None
        node = node[m.group(1)]
        for ix in re.findall(r"\[(-?\d+)\]", m.group(2)):
            if not isinstance(node, list) or not -len(node) <= int(ix) < len(node):
                return None
            node = node[int(ix)]
    return node
