"""The ``speculation`` section of a scenario: modes, drafter, acceptance, gamma policy, draft devices.

Parsed once at load time so a typo fails before anything runs (path-qualified ConfigError); the
runtime (dsim.specdec.runtime) builds live objects from the parsed description.  Keys are
documented in docs/specdec.md.
"""
from __future__ import annotations

import math
from importlib import resources
from dataclasses import dataclass, field
from pathlib import Path

from ..config.errors import ConfigError
from ..config.limits import MAX_DEVICES, MAX_SPEC_K, MAX_TIME_S, MIN_BW_MBPS
from ..config.fields import Section, check_number
from ..config.files import check_expansion, read_text
from ..config.model import load_model
from . import gamma as G
from .acceptance import GeometricAcceptance, load_curves
from .devices import load_draft_profile
from .portfolio import load_portfolio
from .tree import TreeSpec

SIBLING_ACCEPTANCE = 0.48   # fits EAGLE-1 tree vs chain on MT-bench, greedy (experiments/tree_vs_chain.py)

MODES = ("off", "fused", "distributed", "hybrid")
SHIPPED_CURVES = Path(str(resources.files("dsim").joinpath("data/acceptance/published_curves.yaml")))   # package data
DEFAULT_CURVE = "draft-model-llama-3.1-8b-instruct-cnn-dm-gsm8k-humaneval-held-out"
POLICIES = ("static", "acceptance_backoff", "specpp", "latency_head", "backpressure", "pid", "bandit")
PER_TARGET = ("latency_head", "backpressure", "pid", "bandit")   # one controller per target replica


@dataclass
class DraftGroup:
    name: str
    profile: object
    count: int
    rtt_ms: float
    bw_mbps: float
    cohort: str | None
    closed_loop: bool
    think: tuple                      # (dist, mean_s, sigma)
    available: list                   # [(start_s, end_s)], empty = always
    rtt_schedule: list                # [(t_s, rtt_ms)]
    max_batch: int = 1                # rounds a device drafts together (seed 002 6.1)
    max_wait_s: float = 0.0           # how long a device waits for a batch to fill


@dataclass
class SpecConfig:
    mode: str
    drafter: object                   # ModelSpec drafting on devices
    fused_drafter: object             # ModelSpec drafting on targets (fused mode)
    acceptance: object
    acceptance_desc: dict
    temperature: float
    policy: str
    policy_params: dict
    k_max: int
    switch: dict
    partial: dict
    kv_spill_pct: float | None
    cold: dict
    token_bytes: float
    bundle_bytes_per_token: float
    header_bytes: float
    gateway: str
    groups: list = field(default_factory=list)
    tree: object = None               # TreeSpec (dsim.specdec.tree) or None for chain drafts
    portfolio: object = None          # Portfolio (dsim.specdec.portfolio) or None: one drafter
    verify_order: str = "fcfs"        # fcfs | edf: which ready rounds a step's token budget serves first

    def make_policy(self):
        """A fresh gamma policy (one per conversation, or per target for controllers)."""
        memo = None
        if self.policy == "specpp":      # one memo of choices for all the conversations' policies
            key = (self.acceptance, tuple(sorted(self.policy_params.items())))
            if getattr(self, "_specpp_memo", (None,))[0] != key:
                self._specpp_memo = (key, {})
            memo = self._specpp_memo[1]
        return build_policy(self.policy, self.policy_params, self.mode, self.acceptance, memo)


def build_policy(name: str, params: dict, mode: str, acceptance, memo=None):
    p = dict(params)
    if name == "static":
        return G.StaticGamma(p.get("k", 4), G.FUSED if mode == "fused" else G.DISTRIBUTED)
    if name == "specpp":
        return G.SpecPP(acceptance, memo=memo, **p)
    cls = {"acceptance_backoff": G.AcceptanceBackoff, "latency_head": G.LatencyHead, "backpressure": G.Backpressure,
           "pid": G.PIDGamma, "bandit": G.BanditGamma}[name]
    return cls(**p)


_POLICY_KEYS = {
    "static": ("k",),
    "acceptance_backoff": ("k0", "k_min", "k_max"),
    "specpp": ("threshold", "k_min", "k_max"),
    "latency_head": ("head", "weights", "bias", "hidden", "k_max", "smoothing", "fused_below", "default_k", "history",
                     "fused_k",
                     "queue_capacity"),
    "backpressure": ("k0", "k_min", "k_max", "queue_high", "queue_low", "kv_high", "confident"),
    "pid": ("k0", "k_min", "k_max", "target_queue", "kp", "ki", "kd"),
    "bandit": ("k_min", "k_max", "c"),
}


def _acceptance(raw, path: str, base_dir):
    s = Section(raw if raw is not None else {}, path)
    kinds = [k for k in ("curve", "geometric", "bundle") if k in s.data]
    if len(kinds) > 1:
        raise ConfigError(path, sorted(s.data), "one of curve, geometric or bundle")
    if "geometric" in s.data:
        rate = s.num("geometric", lo=0, hi=1)
        s.done()
        return GeometricAcceptance(rate), {"model": "geometric", "rate": rate}
    if "bundle" in s.data:
        from .bundle import load_bundle
        f = s.str("bundle")
        p = Path(f) if Path(f).is_absolute() or base_dir is None else Path(base_dir) / f
        drafter = s.str("drafter", None)
        verifier = s.str("verifier", None)
        s.done()
        b = load_bundle(p, s.sub("bundle"))
        return b.acceptance(drafter=drafter, verifier=verifier), {"model": "bundle", "file": str(f), **b.meta_short()}
    name = s.str("curve", DEFAULT_CURVE)
    f = s.str("curves", None)
    s.done()
    p = SHIPPED_CURVES if f is None else (Path(f) if Path(f).is_absolute() or base_dir is None else Path(base_dir) / f)
    curves = load_curves(p)
    if name not in curves:
        raise ConfigError(s.sub("curve"), name, f"a curve of {p.name} ({', '.join(sorted(curves)[:6])}, ...)")
    return curves[name], {"model": "curve", "curve": name, "file": str(f or "dsim/data/acceptance/published_curves.yaml")}


def _think(raw, path: str) -> tuple:
    if raw is None:
        return ("constant", 0.0, 0.0)
    s = Section(raw, path)
    dist = s.str("dist", "exponential", choices=("lognormal", "exponential", "constant"))
    mean = s.num("mean_s", lo=0, hi=MAX_TIME_S)
    sigma = s.num("sigma", 1.0, lo=0, hi=100)
    s.done()
    return (dist, mean, sigma)


def _windows(raw, path: str, what: str, width: int = 2) -> list:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(path, raw, f"a list of {what}")
    out = []
    for i, row in enumerate(raw):
        if (not isinstance(row, list) or len(row) != width
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= MAX_TIME_S * 1e3
                           for x in row)):
            raise ConfigError(f"{path}[{i}]", row, what)
        out.append(tuple(float(x) for x in row))
    return out


def _groups(raw, path: str) -> list:
    if raw is None:
        return []
    if not isinstance(raw, list) or not raw:
        raise ConfigError(path, raw, "a non-empty list of draft device groups")
    out, names = [], set()
    for i, row in enumerate(raw):
        p = f"{path}[{i}]"
        s = Section(row, p)
        name = s.str("name", f"drafts{i}")
        if name in names:
            raise ConfigError(s.sub("name"), name, "a name used by one group only")
        names.add(name)
        prof = load_draft_profile(s.raw("profile"), s.sub("profile"))
        count = s.int("count", 1, lo=1, hi=MAX_DEVICES)
        rtt = s.num("rtt_ms", lo=0, hi=MAX_TIME_S * 1e3)
        bw = s.num("bw_mbps", lo=MIN_BW_MBPS)
        cohort = s.str("cohort", None)
        closed = s.bool("closed_loop", False)
        think = _think(s.raw("think_time", None), s.sub("think_time"))
        avail = _windows(s.raw("available", None), s.sub("available"), "[start_s, end_s] with end after start")
        for j, (a, b) in enumerate(avail):
            if b <= a:
                raise ConfigError(f"{s.sub('available')}[{j}]", [a, b], "[start_s, end_s] with end after start")
        sched = _windows(s.raw("rtt_schedule", None), s.sub("rtt_schedule"), "[t_s, rtt_ms]")
        max_batch = s.int("max_batch", 1, lo=1, hi=4096)
        max_wait = s.num("max_wait_ms", 0.0, lo=0, hi=MAX_TIME_S * 1e3) / 1e3
        if max_wait and max_batch == 1:
            raise ConfigError(s.sub("max_wait_ms"), max_wait * 1e3, "0 unless max_batch > 1 (nothing to wait for)")
        s.done()
        out.append(DraftGroup(name, prof, count, rtt, bw, cohort, closed, think, avail, sched, max_batch, max_wait))
    return out


def _tree(raw, path: str):
    """``speculation.tree``: EAGLE-style tree drafts; the gamma policy's k is the tree's depth."""
    if raw is None:
        return None
    s = Section(raw, path)
    topk = s.int("topk", 4, lo=1, hi=64)
    tokens = s.int("tokens", 16, lo=1, hi=1024)
    sib = s.num("sibling_acceptance", SIBLING_ACCEPTANCE, lo=0, hi=1)
    s.done()
    return TreeSpec(topk, tokens, sib)


SHIPPED_HEAD = Path(str(resources.files("dsim").joinpath("data/heads/latency_head.yaml")))   # package data
_HEAD_KEYS = ("weights", "bias", "hidden", "k_max", "smoothing", "fused_below", "fused_k")


def _head_params(params: dict, g, base_dir) -> dict:
    """latency_head parameters: ``head: FILE`` (written by dsim specdec train-head) or, with neither
    a file nor weights, the shipped trained head; keys given beside it override the file's."""
    f = params.pop("head", None)
    if f is None and "weights" in params:
        return params
    import yaml
    p = SHIPPED_HEAD if f is None else (Path(f) if Path(f).is_absolute() or base_dir is None else Path(base_dir) / f)
    where = g.sub("head") if f is not None else g.path
    if not p.exists():
        raise ConfigError(where, f, "a head file written by dsim specdec train-head")
    text = read_text(p)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ConfigError(where, f, "a YAML head file written by dsim specdec train-head") from None
    check_expansion(doc, str(p))
    head = doc.get("latency_head") if isinstance(doc, dict) else None
    if not isinstance(head, dict) or "weights" not in head:
        raise ConfigError(where, f, "a head file with a latency_head: {weights, bias, ...} section")
    for k in ("weights", "bias", "hidden", "smoothing", "fused_below"):
        if head.get(k) is not None:          # hidden: null is a linear head
            _finite(head[k], f"{p}: latency_head.{k}")
    return {**{k: head[k] for k in _HEAD_KEYS if k in head}, **params}


def _finite(v, where: str) -> None:
    """Every number of a head's weights finite: a NaN bias made every decision NaN, clamped to k_max
    without a word."""
    if isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _finite(x, f"{where}[{i}]")
    elif isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ConfigError(where, v, "a finite number")


def load_spec(raw, path: str = "speculation", base_dir=None, target_model=None) -> SpecConfig:
    """Parse and validate the ``speculation`` section (ConfigError names the bad key)."""
    s = Section(raw, path)
    if isinstance(raw, dict) and raw.get("mode") is False:      # YAML 1.1 reads a bare `off` as false
        raw = s.data = dict(raw, mode="off")
    mode = s.str("mode", "fused", choices=MODES)
    drafter = load_model(s.raw("drafter", "meta-llama/Llama-3.2-1B"), s.sub("drafter"), base_dir)
    fused = s.raw("fused_drafter", None)
    fused_drafter = drafter if fused is None else load_model(fused, s.sub("fused_drafter"), base_dir)
    acc, acc_desc = _acceptance(s.raw("acceptance", None), s.sub("acceptance"), base_dir)
    temp = s.num("temperature", 0.0, lo=0)
    g = Section(s.raw("gamma", {}), s.sub("gamma"))
    policy = g.str("policy", "static", choices=POLICIES)
    params = {}
    for k in _POLICY_KEYS[policy]:
        if k in g.data:
            params[k] = g.raw(k)
            if k in ("k", "k0", "k_min", "k_max", "default_k", "fused_k"):
                check_number(params[k], g.sub(k), lo=1, hi=MAX_SPEC_K, integer=True)
            elif isinstance(params[k], float):
                check_number(params[k], g.sub(k))          # finite
    g.done()
    if policy == "latency_head":
        for k in ("weights", "bias", "hidden"):
            if params.get(k) is not None:
                _finite(params[k], g.sub(k))
        head_file = params.get("head")
        params = _head_params(params, g, base_dir)
    try:
        probe = build_policy(policy, params, mode, acc)
    except (TypeError, ValueError) as e:
        if policy == "latency_head":     # a head's weights are thousands of numbers: name the file, not them
            raise ConfigError(g.sub("head") if head_file is not None else s.sub("gamma"), head_file,
                              f"valid {policy} parameters ({e})", show_value=head_file is not None) from None
        raise ConfigError(s.sub("gamma"), params, f"valid {policy} parameters ({e})") from None
    k_max = probe.k_max
    sw = Section(s.raw("mode_switch", {}), s.sub("mode_switch"))
    switch = {"policy": sw.str("policy", "rtt_load", choices=("rtt_load", "gamma_policy")),
              "max_rtt_ms": sw.num("max_rtt_ms", 60.0, lo=0),
              "max_verify_queue": sw.int("max_verify_queue", 64, lo=0)}
    sw.done()
    if switch["policy"] == "gamma_policy" and policy != "latency_head":
        raise ConfigError(s.sub("mode_switch.policy"), "gamma_policy", "rtt_load unless gamma.policy is latency_head")
    pv = Section(s.raw("partial_verification", {}), s.sub("partial_verification"))
    partial = {"mode": pv.str("mode", "all", choices=("all", "first_token", "sampled")),
               "sample_rate": pv.num("sample_rate", 1.0, lo=0, hi=1),
               "rollback_penalty_ms": pv.num("rollback_penalty_ms", 0.0, lo=0)}
    pv.done()
    ka = Section(s.raw("kv_admission", {}), s.sub("kv_admission"))
    spill = ka.num("max_kv_utilization_pct", None, lo=0, hi=100, lo_open=True)
    ka.str("spill_mode", "fused", choices=("fused",))
    ka.done()
    cs = Section(s.raw("cold_start", {}), s.sub("cold_start"))
    cold = {"load_s": cs.num("load_s", None, lo=0),
            "warm_retention_s": cs.num("warm_retention_s", 600.0, lo=0),
            "initially_warm": cs.bool("initially_warm", True)}
    cs.done()
    tok = s.num("token_bytes", 4.0, lo=0)
    bundle = s.num("bundle_bytes_per_token", 8.0, lo=0)
    header = s.num("header_bytes", 64.0, lo=0)
    gateway = s.str("gateway", "gateway")
    groups = _groups(s.raw("drafts", None), s.sub("drafts"))
    tree = _tree(s.raw("tree", None), s.sub("tree"))
    verify_order = s.str("verify_order", "fcfs", choices=("fcfs", "edf"))
    portfolio = load_portfolio(s.raw("portfolio", None), s.sub("portfolio"), base_dir, load_model, _acceptance,
                               None if target_model is None else target_model.vocab_size)
    s.done()
    if tree is not None or portfolio is not None:
        what = "tree drafts" if tree is not None else "a drafter portfolio"
        for i, g in enumerate(groups):
            if g.max_batch > 1:
                raise ConfigError(f"{s.sub('drafts')}[{i}].max_batch", g.max_batch,
                                  f"1 with {what} (batched drafting is modelled for one drafter's chains only)")
    if mode in ("distributed", "hybrid") and not groups:
        raise ConfigError(s.sub("drafts"), None, f"draft devices: mode {mode} drafts on them", show_value=False)
    if target_model is not None and drafter.vocab_size != target_model.vocab_size:
        raise ConfigError(s.sub("drafter"), drafter.name,
                          f"a drafter sharing the target's vocabulary ({target_model.vocab_size} tokens, "
                          f"not {drafter.vocab_size})")
    return SpecConfig(mode, drafter, fused_drafter, acc, acc_desc, temp, policy, params, k_max, switch, partial,
                      spill, cold, tok, bundle, header, gateway, groups, tree, portfolio, verify_order)
