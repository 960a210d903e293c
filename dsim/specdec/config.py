"""The ``speculation`` section of a scenario: modes, drafter, acceptance, gamma policy, draft devices.

The section is declared and validated at the door (dsim.config.schema.speculation); ``load_spec``
turns the typed section into a SpecConfig, doing what needs files or catalogues (drafter models,
acceptance curves and bundles, the latency head file, named device profiles), each path-qualified
as the key it came from.  The runtime (dsim.specdec.runtime) builds live objects from the
SpecConfig.  Keys are documented in docs/specdec.md.
"""
from __future__ import annotations

from importlib import resources
from dataclasses import dataclass, field
from pathlib import Path

from ..config.errors import ConfigError
from ..config.files import check_expansion, read_text
from ..config.model import load_model
from ..config.schema.speculation import SIBLING_ACCEPTANCE  # noqa: F401  (tests and experiments import it here)
from ..config.schema.speculation import BundleAcceptance, GeometricAcceptance, SpeculationConfig, names
from ..config.schema.speculation_gamma import check_finite
from . import gamma as G
from .acceptance import GeometricAcceptance as Geometric, load_curves
from .devices import load_draft_profile
from .levels import load_levels
from .portfolio import load_portfolio
from .tree import TreeSpec

SHIPPED_CURVES = Path(str(resources.files("dsim").joinpath("data/acceptance/published_curves.yaml")))   # package data
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
    weight: float | None = None       # capability weight per device (cohort_assignment: capability)


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
    expectation: bool = False         # acceptance_draws: expectation (accepted = the expected count, carried)
    connectivity: object = None       # auto-topology (dsim.specdec.topology.Connectivity) or None: all pools
    cohort_assignment: str = "round_robin"   # round_robin | capability: binding of rows without draft_id
    framework: str = "vanilla"        # vanilla | eagle: what drafts fused rounds (dsim.specdec.eagle)
    verify_attention: str = "exact"   # exact | padded: the verify attention's cost (dsim.specdec.cohorts)
    levels: object = None             # Chain (dsim.specdec.levels) or None: one drafter level
    draft_kv: object = None           # schema DraftKv or None (dsim.specdec.devmem)
    draft_load: object = None         # schema DraftLoad or None (dsim.specdec.devmem)
    top_p: float = 1.0                # nucleus sampling the acceptance is read at (dsim.specdec.conditioning)
    rules: list = field(default_factory=list)   # [(domain or None, pool or None, acceptance model)]
    replay: dict | None = None        # speculation.replay_log as ReproLog.read gives it (dsim.specdec.replay)

    def make_policy(self, acceptance=None):
        """A fresh gamma policy (one per conversation, or per target for controllers); ``acceptance``:
        the conversation's own model (per-request conditioning), else the scenario's."""
        acc = self.acceptance if acceptance is None else acceptance
        memo = None
        if self.policy == "specpp":      # one memo of choices for all the conversations' policies
            key = (acc, tuple(sorted(self.policy_params.items())))
            if acceptance is not None:   # one memo per conditioned model
                memo = self.__dict__.setdefault("_specpp_memos", {}).setdefault(key, {})
            else:
                if getattr(self, "_specpp_memo", (None,))[0] != key:
                    self._specpp_memo = (key, {})
                memo = self._specpp_memo[1]
        return build_policy(self.policy, self.policy_params, self.mode, acc, memo)


def build_policy(name: str, params: dict, mode: str, acceptance, memo=None):
    p = dict(params)
    if name == "static":
        return G.StaticGamma(p.get("k", 4), G.FUSED if mode == "fused" else G.DISTRIBUTED)
    if name == "specpp":
        return G.SpecPP(acceptance, memo=memo, **p)
    cls = {"acceptance_backoff": G.AcceptanceBackoff, "latency_head": G.LatencyHead, "backpressure": G.Backpressure,
           "pid": G.PIDGamma, "bandit": G.BanditGamma}[name]
    return cls(**p)


def _relative(f: str, base_dir) -> Path:
    return Path(f) if Path(f).is_absolute() or base_dir is None else Path(base_dir) / f


def _acceptance(cfg, path: str, base_dir):
    """The acceptance model of a validated ``acceptance`` section (curve | geometric | bundle)."""
    if isinstance(cfg, GeometricAcceptance):
        return Geometric(cfg.geometric), {"model": "geometric", "rate": cfg.geometric}
    if isinstance(cfg, BundleAcceptance):
        from .bundle import load_bundle
        b = load_bundle(_relative(cfg.bundle, base_dir), f"{path}.bundle")
        return (b.acceptance(drafter=cfg.drafter, verifier=cfg.verifier),
                {"model": "bundle", "file": str(cfg.bundle), **b.meta_short()})
    name, f = cfg.curve, cfg.curves
    p = SHIPPED_CURVES if f is None else _relative(f, base_dir)
    curves = load_curves(p)
    if name not in curves:
        raise ConfigError(f"{path}.curve", name, f"a curve of {p.name} ({', '.join(sorted(curves)[:6])}, ...)")
    return curves[name], {"model": "curve", "curve": name, "file": str(f or "dsim/data/acceptance/published_curves.yaml")}


def _groups(rows, path: str) -> list:
    """Draft device groups of validated ``drafts`` rows, with their device profiles resolved."""
    if rows is None:
        return []
    out = []
    for i, (g, name) in enumerate(zip(rows, names(rows, "drafts"))):
        prof = load_draft_profile(g.profile, f"{path}[{i}].profile")
        rtt, bw, link = g.rtt_ms, g.bw_mbps, prof.default_link     # a group's own link wins
        if link is None and (rtt is None or bw is None):
            key = "rtt_ms" if rtt is None else "bw_mbps"
            raise ConfigError(f"{path}[{i}].{key}", None, f"the access link's {key} (the profile {prof.name} "
                              "has no default_link)", show_value=False)
        rtt = link[0] if rtt is None else rtt
        bw = link[1] if bw is None else bw
        t = g.think_time
        think = ("constant", 0.0, 0.0) if t is None else (t.dist, t.mean_s, t.sigma)
        out.append(DraftGroup(name, prof, g.count, rtt, bw, g.cohort, g.closed_loop, think,
                              list(g.available or ()), list(g.rtt_schedule or ()), g.max_batch, g.max_wait_ms / 1e3,
                              g.weight))
    return out


SHIPPED_HEAD = Path(str(resources.files("dsim").joinpath("data/heads/latency_head.yaml")))   # package data
_HEAD_KEYS = ("weights", "bias", "hidden", "residual", "k_max", "smoothing", "fused_below", "fused_k")


def _head_params(params: dict, where_gamma: str, base_dir) -> dict:
    """latency_head parameters: ``head: FILE`` (written by dsim specdec train-head) or, with neither
    a file nor weights, the shipped trained head; keys given beside it override the file's."""
    f = params.pop("head", None)
    if f is None and "weights" in params:
        return params
    import yaml

    from ..config.files import read_yaml
    p = SHIPPED_HEAD if f is None else _relative(f, base_dir)
    where = f"{where_gamma}.head" if f is not None else where_gamma
    if not p.exists():
        raise ConfigError(where, f, "a head file written by dsim specdec train-head")
    text = read_text(p)
    try:
        doc = read_yaml(text)
    except yaml.YAMLError:
        raise ConfigError(where, f, "a YAML head file written by dsim specdec train-head") from None
    check_expansion(doc, str(p))
    head = doc.get("latency_head") if isinstance(doc, dict) else None
    if not isinstance(head, dict) or "weights" not in head:
        raise ConfigError(where, f, "a head file with a latency_head: {weights, bias, ...} section")
    for k in ("weights", "bias", "hidden", "residual", "smoothing", "fused_below"):
        if head.get(k) is not None:          # hidden: null is a linear head
            check_finite(head[k], f"{p}: latency_head.{k}")
    return {**{k: head[k] for k in _HEAD_KEYS if k in head}, **params}


def _policy_params(gamma) -> dict:
    """The parameters written in the scenario (the policy's own defaults fill the rest); a
    latency_head key written as null means "the head file's", except hidden (null: a linear head)."""
    return {k: v for k, v in gamma.to_dict().items() if k != "policy" and (v is not None or k == "hidden")}


def load_spec(cfg: SpeculationConfig, path: str = "speculation", base_dir=None, target_model=None) -> SpecConfig:
    """Build the SpecConfig of a validated ``speculation`` section (ConfigError names the bad key)."""
    mode = cfg.mode
    drafter = load_model(cfg.drafter, f"{path}.drafter", base_dir)
    fused_drafter = (drafter if cfg.fused_drafter is None
                     else load_model(cfg.fused_drafter, f"{path}.fused_drafter", base_dir))
    acc, acc_desc = _acceptance(cfg.acceptance, f"{path}.acceptance", base_dir)
    policy, gpath = cfg.gamma.policy, f"{path}.gamma"
    params = _policy_params(cfg.gamma)
    head_file = params.get("head")
    if policy == "latency_head":
        params = _head_params(params, gpath, base_dir)
    try:
        probe = build_policy(policy, params, mode, acc)
    except (TypeError, ValueError) as e:
        if policy == "latency_head":     # a head's weights are thousands of numbers: name the file, not them
            raise ConfigError(f"{gpath}.head" if head_file is not None else gpath, head_file,
                              f"valid {policy} parameters ({e})", show_value=head_file is not None) from None
        raise ConfigError(gpath, params, f"valid {policy} parameters ({e})") from None
    groups = _groups(cfg.drafts, f"{path}.drafts")
    t = cfg.tree
    tree = None if t is None else TreeSpec(t.topk, t.tokens, t.sibling_acceptance)
    portfolio = load_portfolio(cfg.portfolio, f"{path}.portfolio", base_dir, load_model, _acceptance,
                               None if target_model is None else target_model.vocab_size)
    levels = load_levels(cfg.levels, f"{path}.levels", base_dir, load_model, _acceptance,
                         None if target_model is None else target_model.vocab_size)
    if (target_model is not None and drafter.vocab_size != target_model.vocab_size
            and not (cfg.framework == "eagle" and mode == "fused")):
        raise ConfigError(f"{path}.drafter", drafter.name,
                          f"a drafter sharing the target's vocabulary ({target_model.vocab_size} tokens, "
                          f"not {drafter.vocab_size})")
    rules = [(r.domain, r.pool, _acceptance(r.acceptance, f"{path}.acceptance_rules[{i}].acceptance", base_dir)[0])
             for i, r in enumerate(cfg.acceptance_rules or ())]
    replay = None
    if cfg.replay_log is not None:
        from .replay import ReproLog
        replay = ReproLog.read(_relative(cfg.replay_log, base_dir), f"{path}.replay_log")
    return SpecConfig(mode, drafter, fused_drafter, acc, acc_desc, cfg.temperature, policy, params, probe.k_max,
                      cfg.mode_switch.model_dump(), cfg.partial_verification.model_dump(),
                      cfg.kv_admission.max_kv_utilization_pct, cfg.cold_start.model_dump(), cfg.token_bytes,
                      cfg.bundle_bytes_per_token, cfg.header_bytes, cfg.gateway,
                      # the optional mechanisms by name: a field added to SpecConfig cannot shift them
                      groups=groups, tree=tree, portfolio=portfolio, verify_order=cfg.verify_order,
                      expectation=cfg.acceptance_draws == "expectation", cohort_assignment=cfg.cohort_assignment,
                      framework=cfg.framework, verify_attention=cfg.verify_attention, levels=levels,
                      draft_kv=cfg.draft_kv, draft_load=cfg.draft_load, top_p=cfg.top_p, rules=rules, replay=replay)


def check_targets(spec: SpecConfig, pools, path: str = "speculation") -> None:
    """Every pool a drafter may verify on shares its vocabulary (its tokenizer family): a Qwen pool
    behind a Llama drafter would verify tokens it cannot read.  ``pools``: the fleet's PoolSpecs."""
    # an EAGLE head shares the target's vocabulary by construction (and fused EAGLE uses no drafter)
    eagle = spec.framework == "eagle"
    drafters = [] if eagle and spec.mode == "fused" else [spec.drafter]
    drafters += [] if eagle else [spec.fused_drafter]
    drafters += [d.model for d in spec.portfolio.drafters] if spec.portfolio is not None else []
    drafters += [lv.model for lv in spec.levels.levels] if spec.levels is not None else []
    for pool in pools:
        for d in drafters:
            if d.vocab_size != pool.model.vocab_size:
                raise ConfigError(f"{pool.path or 'cluster.pools'}.model", pool.model.name,
                                  f"a model of the drafter's tokenizer family ({d.name}: {d.vocab_size} tokens, "
                                  f"not {pool.model.vocab_size}); speculation drafts for every pool")
