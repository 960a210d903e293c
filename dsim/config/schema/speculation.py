"""The ``speculation``: section of a scenario (declared schema; see dsim.config.schema.base for the rules).

Everything a scenario can say about speculative decoding is declared here: the mode, the drafters
(``drafter``/``fused_drafter`` are model references resolved by dsim.config.model.load_model), the
acceptance model, the sub-sections read by the runtime, the draft device groups with their device
profiles, tree drafts and the drafter portfolio; the gamma policies are in speculation_gamma.  The
builder (dsim.specdec.config.load_spec) keeps what needs files or catalogues: model configs,
acceptance curve and bundle files, the latency head file, named device profiles.
"""
from __future__ import annotations

from typing import Annotated, Literal, Union

from ..errors import ConfigError
from ..limits import MAX_DEVICES, MAX_SPEC_K, MAX_TIME_S, MIN_BW_MBPS
from .base import (BeforeValidator, Bool, Choice, Discriminator, Float, Int, Raw, Section, Str, Tag, checked,
                   field_validator, model_validator, one_of)
from .speculation_devices import DraftKv, DraftLoad
from .speculation_gamma import GammaField, K, StaticGamma
from .topology import AutoTopology

MODES = ("off", "fused", "distributed", "hybrid")
KINDS = ("phone", "laptop", "edge")
DEFAULT_DRAFTER = "meta-llama/Llama-3.2-1B"
DEFAULT_CURVE = "draft-model-llama-3.1-8b-instruct-cnn-dm-gsm8k-humaneval-held-out"
SIBLING_ACCEPTANCE = 0.48   # fits EAGLE-1 tree vs chain on MT-bench, greedy (experiments/tree_vs_chain.py)
MAX_MS = MAX_TIME_S * 1e3


# ---- field types of this section --------------------------------------------------------------------

def _one_of(members: dict, pick, check):
    """One of several shapes, told apart by ``pick(value) -> tag`` after ``check`` has refused
    anything that is none of them (the JSON Schema lists every shape).

    Tags here are phrases ("by prompt_tokens"), never a key a user writes, so no tag can be
    mistaken for a key of the user's mapping (choose: prompt_tokens beside prompt_tokens: [...])."""
    union = Union[tuple(Annotated[m, Tag(t)] for t, m in members.items())]
    return Annotated[union, Discriminator(pick), BeforeValidator(check)]


def _tag_of(members: dict, v) -> str | None:
    """The tag of a value that is already one of ``members`` (a default, a re-validated section)."""
    return next((t for t, m in members.items() if isinstance(m, type) and isinstance(v, m)), None)


_MODE_CHECK = one_of(*MODES)


def _mode(v):
    return _MODE_CHECK("off" if v is False else v)      # YAML 1.1 reads a bare `off` as false


# an editor's YAML server reads `mode: off` as false too, so the JSON Schema accepts it
Mode = checked(str, _mode, {"anyOf": [{"type": "string", "enum": list(MODES)},
                                      {"const": False, "description": "YAML 1.1's bare off"}]})

ModelRef = Raw({"anyOf": [{"type": "string", "description": "a catalogue model name"},
                          {"type": "object", "properties": {"config": {"type": "string"}, "name": {"type": "string"}},
                           "description": "{config: path/to/config.json, name: optional}"}]})


def Windows(what: str, *, ordered: bool = False):
    """A list of ``[a, b]`` pairs of numbers in [0, MAX_TIME_S x 1e3], read as float tuples
    (``ordered``: b after a)."""
    def check(v):
        if not isinstance(v, list):
            raise ConfigError("", v, f"a list of {what}")
        out = []
        for i, row in enumerate(v):
            if (not isinstance(row, list) or len(row) != 2
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and 0 <= x <= MAX_MS
                               for x in row)
                    or (ordered and row[1] <= row[0])):
                raise ConfigError(f"[{i}]", row, what)
            out.append(tuple(float(x) for x in row))
        return out
    pair = {"type": "array", "items": {"type": "number", "minimum": 0}, "minItems": 2, "maxItems": 2}
    return checked(list, check, {"type": "array", "items": pair})


# ---- acceptance: curve | geometric | bundle, told apart by which key is written -------------------------

class CurveAcceptance(Section):
    """A published acceptance curve (per draft position, by context length and temperature)."""
    curve: Str = DEFAULT_CURVE
    """Name of the curve in the curves file."""
    curves: Str | None = None
    """Curves file, relative to the scenario (None: dsim's shipped published_curves.yaml)."""


class GeometricAcceptance(Section):
    """Every draft position accepted with the same probability."""
    geometric: Float(0, 1)
    """Per-position acceptance probability, in [0, 1]."""


class BundleAcceptance(Section):
    """An acceptance bundle fitted from logs (docs/acceptance-bundle.md)."""
    bundle: Str
    """Bundle file, relative to the scenario."""
    drafter: Str | None = None
    """Drafter id inside the bundle (None: the bundle's only or default drafter)."""
    verifier: Str | None = None
    """Verifier id inside the bundle (None: the bundle's only or default verifier)."""


_ACCEPTANCE = {"a curve": CurveAcceptance, "a geometric rate": GeometricAcceptance, "a bundle": BundleAcceptance}
_ACCEPTANCE_KEYS = ("curve", "geometric", "bundle")


def _acceptance_kind(v) -> str:
    if isinstance(v, dict):
        return "a geometric rate" if "geometric" in v else "a bundle" if "bundle" in v else "a curve"
    return _tag_of(_ACCEPTANCE, v)


def _acceptance_shape(v):
    if v is None:
        return {}
    if isinstance(v, Section):
        return v
    if not isinstance(v, dict):
        raise ConfigError("", v, "a mapping")
    if sum(k in v for k in _ACCEPTANCE_KEYS) > 1:
        raise ConfigError("", sorted(v), "one of curve, geometric or bundle")
    return v


AcceptanceField = _one_of(_ACCEPTANCE, _acceptance_kind, _acceptance_shape)


class AcceptanceRule(Section):
    """A request's acceptance model when it matches: its domain label and/or the pool verifying it."""
    domain: Str | None = None
    """The request's domain label (a tenant's ``domain`` or a trace's column; None: any)."""
    pool: Str | None = None
    """The pool of the replica verifying its drafts (None: any)."""
    acceptance: AcceptanceField
    """Its acceptance model (as speculation.acceptance)."""

    @model_validator(mode="after")
    def _matches_something(self):
        if self.domain is None and self.pool is None:
            raise ConfigError("domain", None, "a domain or a pool to match (a rule for every request is "
                              "speculation.acceptance)", show_value=False)
        return self


# ---- sub-sections read by the runtime ----------------------------------------------------------------------

class ModeSwitch(Section):
    """Hybrid mode: how each round picks distributed or fused drafting."""
    policy: Choice("rtt_load", "gamma_policy") = "rtt_load"
    """rtt_load: distributed while the device's RTT and the verify queue are under the bounds below;
    gamma_policy: as the latency_head gamma policy says."""
    max_rtt_ms: Float(0) = 60.0
    """Largest device RTT for distributed drafting, ms (rtt_load)."""
    max_verify_queue: Int(0) = 64
    """Longest verify queue for distributed drafting, requests (rtt_load)."""
    max_link_utilization: Float(0, 1, lo_open=True) | None = None
    """Network-aware guard (seed 002 6.1): a round drafts fused while the device's access link
    carried more than this share of its bandwidth over the last ``link_window_s`` (rtt_load and
    gamma_policy; None: the link's load is not read)."""
    link_window_s: Float(0, MAX_TIME_S, lo_open=True) = 1.0
    """Trailing window the access link's utilisation is measured over, s."""
    min_fused_dwell_s: Float(0) = 0.0
    """Fused hysteresis: once a conversation's round is switched to fused, its rounds stay fused for
    this many seconds, so a jittery RTT does not flip it back and forth (0: no dwell)."""


class PartialVerification(Section):
    """How many of a round's drafts hold KV while waiting to be verified."""
    mode: Choice("all", "first_token", "sampled") = "all"
    """all: every draft; first_token: one; sampled: every draft with probability sample_rate, else one."""
    sample_rate: Float(0, 1) = 1.0
    """Probability that a round keeps all its drafts (mode sampled)."""
    rollback_penalty_ms: Float(0) = 0.0
    """Time added to a round that rejects a draft, ms."""


class KvAdmission(Section):
    """Spill to fused drafting when the target's KV cache is nearly full."""
    max_kv_utilization_pct: Float(0, 100, lo_open=True) | None = None
    """KV use above this percentage makes a round fused (None: never spill)."""
    spill_mode: Choice("fused") = "fused"
    """Where a spilled round drafts."""


class ColdStart(Section):
    """Loading the fused drafter's weights on a target before it can draft."""
    load_s: Float(0) | None = None
    """Load time, s (None: the fused drafter's weight bytes over the GPU's weight-load rate)."""
    warm_retention_s: Float(0) = 600.0
    """An idle drafter stays loaded this long, s."""
    initially_warm: Bool = True
    """Drafters are loaded at the start of the run."""


class TreeDrafts(Section):
    """EAGLE-style tree drafts: the gamma policy's k is the tree's depth (docs/tree-drafts.md)."""
    topk: Int(1, 64) = 4
    """Candidates the drafter keeps at each level."""
    tokens: Int(1, 1024) = 16
    """Most likely nodes verified in one step under a tree attention mask."""
    sibling_acceptance: Float(0, 1) = SIBLING_ACCEPTANCE
    """Acceptance of a lower-ranked candidate once the higher-ranked ones at its level are rejected."""


# ---- draft devices ----------------------------------------------------------------------------------------

class AccessLink(Section):
    """A draft device's access link to the gateway."""
    rtt_ms: Float(0, MAX_MS)
    """Round-trip time, ms."""
    bw_mbps: Float(MIN_BW_MBPS)
    """Bandwidth, Mbit/s."""


def _link_shape(v):
    if not isinstance(v, (str, dict, Section)):
        raise ConfigError("", v, "a link class name (wifi, lte, 5g, ethernet) or {rtt_ms, bw_mbps}")
    return v


LinkField = _one_of({"a link class": Str, "a link": AccessLink},
                    lambda v: "a link class" if isinstance(v, str) else "a link", _link_shape)


class DraftDeviceProfile(Section):
    """A phone, laptop or edge GPU that drafts (an entry of device_profiles/drafts/*.yaml,
    or written inline).  Drafting is memory-bound at batch 1, so mem_gb_s matters most."""
    kind: Choice(*KINDS)
    """phone | laptop | edge (fairness reports group by it)."""
    peak_tflops: Float(0, lo_open=True)
    """Dense FP16 TFLOP/s usable by the drafter."""
    mem_gb_s: Float(0, lo_open=True)
    """Memory bandwidth, GB/s."""
    memory_gb: Float(0, lo_open=True)
    """Device memory, GB."""
    weight_bits: Int(2, 32) = 16
    """Bits per drafter weight as deployed (4 = int4: a quarter of the bf16 bytes)."""
    compute_efficiency: Float(0, 1, lo_open=True) = 0.5
    """Achievable fraction of peak_tflops (roofline)."""
    memory_efficiency: Float(0, 1, lo_open=True) = 0.6
    """Achievable fraction of mem_gb_s (roofline)."""
    step_overhead_ms: Float(0) = 1.0
    """Fixed cost per draft token (runtime, kernel launches), ms."""
    power_w: Float(0)
    """Power while drafting, W (energy = power x drafting time unless joules_per_token is given)."""
    joules_per_token: Float(0) | None = None
    """Energy per drafted token, J (None: from power_w)."""
    throttle_after_s: Float(0) | None = None
    """Continuous drafting before thermal throttling, s (None: never throttles)."""
    throttle_factor: Float(0, 1, lo_open=True) = 1.0
    """Speed multiplier once throttled."""
    cooldown_s: Float(0) = 60.0
    """Idle time that resets throttling, s."""
    source: Str = ""
    """Where the figures come from (datasheet, memory configuration)."""
    lut_ids: list[Str] = []
    """Draft-side latency tables (device_profiles/drafts/luts/<id>.csv): the first whose draft_decode rows
    are for the drafter times its tokens; a drafter no table has is timed by the roofline."""
    kv_cache_limit_mb: Float(0, lo_open=True) | None = None
    """Memory for the drafter's KV cache, MB: a draft batch holds contexts whose KV fits in it (the first
    round of a batch is drafted whatever its size) (None: no bound)."""
    max_parallel_tokens: Int(1, 4096) | None = None
    """Tokens the device drafts in one forward pass: caps a draft batch (max_batch) and splits a tree
    level wider than it into several passes (None: no cap)."""
    default_link: LinkField | None = None
    """The device's usual access link, for a draft group that gives no rtt_ms / bw_mbps: a link class of
    device_profiles/links.yaml (wifi, lte, 5g, ethernet) or {rtt_ms, bw_mbps} (None: the group must give them)."""
    storage_gb_s: Float(0, lo_open=True) | None = None
    """Storage read bandwidth, GB/s: a cold drafter loads at it (None: speculation.draft_load's)."""


class InlineDraftProfile(DraftDeviceProfile):
    """A draft device profile written in the scenario."""
    name: Str = "custom"
    """Name shown in reports."""


_PROFILE = {"a name": Str, "inline": InlineDraftProfile}


def _profile_shape(v):
    if not isinstance(v, (str, dict, Section)):
        raise ConfigError("", v, "a draft device profile name or a mapping")
    return v


DraftProfileField = _one_of(_PROFILE, lambda v: "a name" if isinstance(v, str) else "inline", _profile_shape)


class ThinkTime(Section):
    """A closed-loop user's pause between a conversation's end and the next one's start."""
    dist: Choice("lognormal", "exponential", "constant") = "exponential"
    """Distribution of the pause."""
    mean_s: Float(0, MAX_TIME_S)
    """Mean pause, s."""
    sigma: Float(0, 100) = 1.0
    """Shape of the lognormal (sigma of the underlying normal)."""


class DraftGroup(Section):
    """``count`` identical draft devices with one access link each."""
    name: Str | None = None
    """Group name, unique (None: drafts<i>, i the group's index)."""
    profile: DraftProfileField
    """A draft device profile name (phone-flagship, laptop-rtx4060, edge-orin-agx, ...) or an inline profile."""
    count: Int(1, MAX_DEVICES) = 1
    """Devices in the group."""
    rtt_ms: Float(0, MAX_MS) | None = None
    """Round-trip time of a device's access link to the gateway, ms (None: the profile's default_link)."""
    bw_mbps: Float(MIN_BW_MBPS) | None = None
    """Bandwidth of a device's access link, Mbit/s (None: the profile's default_link)."""
    cohort: Str | None = None
    """Requests whose tenant (workload mix class) equals this go to this group (None: any request)."""
    weight: Float(0, lo_open=True) | None = None
    """Capability weight of each device of the group, with cohort_assignment: capability (None: the
    device's drafting speed, batch-1 draft tokens/s of the drafter on its profile)."""
    closed_loop: Bool = False
    """A device opens its next conversation only after the previous one finished plus a think time."""
    think_time: ThinkTime | None = None
    """Pause of a closed-loop device (None: none)."""
    available: Windows("[start_s, end_s] with end after start", ordered=True) | None = None
    """Windows [start_s, end_s] the devices draft in; drafting pauses outside them (None: always)."""
    rtt_schedule: Windows("[t_s, rtt_ms]") | None = None
    """[t_s, rtt_ms] pairs: the access links' RTT from t_s on (None: rtt_ms throughout)."""
    max_batch: Int(1, 4096) = 1
    """Rounds a device drafts together (one batch per draft position)."""
    max_wait_ms: Float(0, MAX_MS) = 0.0
    """How long a device waits for a batch to fill, ms (only with max_batch > 1)."""

    @model_validator(mode="after")
    def _waits_for_a_batch(self):
        if self.max_wait_ms and self.max_batch == 1:
            raise ConfigError("max_wait_ms", self.max_wait_ms, "0 unless max_batch > 1 (nothing to wait for)")
        return self


def names(rows, prefix: str) -> list[str]:
    """Each row's ``name``, or ``<prefix><index>`` where it has none."""
    return [r.name if r.name is not None else f"{prefix}{i}" for i, r in enumerate(rows)]


def _non_empty_or_null(v, what: str):
    """A list key that is either absent (None) or holds at least one row."""
    if v is not None and (not isinstance(v, list) or not v):
        raise ConfigError("", v, f"a non-empty list of {what}")
    return v


def _unique_names(rows, prefix: str, what: str):
    seen = set()
    for i, name in enumerate(names(rows, prefix)):
        if name in seen:
            raise ConfigError(f"[{i}].name", name, f"a name used by one {what} only")
        seen.add(name)
    return rows


# ---- drafter portfolio: chosen per request by prompt length or predicted acceptance -------------------------

class PortfolioDrafter(Section):
    """One drafter of a portfolio."""
    name: Str | None = None
    """Drafter name, unique (None: drafter<i>, i its index)."""
    drafter: ModelRef
    """The drafting model: a catalogue name or {config: path/to/config.json}; must share the target's vocabulary."""
    acceptance: AcceptanceField = CurveAcceptance()
    """Its acceptance model (as speculation.acceptance)."""


class _Portfolio(Section):
    drafters: list[PortfolioDrafter]
    """At least two drafters, smallest first."""
    escalate_below: Float(0, 1) | None = None
    """Move a conversation one drafter up when its smoothed acceptance falls strictly below this
    (None: never)."""

    @field_validator("drafters", mode="before")
    @classmethod
    def _at_least_two(cls, v):
        if not isinstance(v, list) or len(v) < 2:
            raise ConfigError("", v, "a list of at least two drafters, smallest first")
        return v

    @field_validator("drafters")
    @classmethod
    def _unique(cls, v):
        return _unique_names(v, "drafter", "drafter")


class PromptTokensPortfolio(_Portfolio):
    """A conversation starts on the drafter its prompt length calls for."""
    choose: Literal["prompt_tokens"] = "prompt_tokens"
    """How a conversation's first drafter is chosen: prompt_tokens | acceptance."""
    prompt_tokens: list[Int(1)] = []
    """Ascending boundaries, one between each pair of drafters: a prompt of at most t_1 tokens gets
    the first drafter, at most t_2 the second, ..., longer ones the last."""

    @model_validator(mode="after")
    def _one_boundary_per_pair(self):
        th = list(self.prompt_tokens)
        if len(th) != len(self.drafters) - 1 or th != sorted(th):
            raise ConfigError("prompt_tokens", th, f"{len(self.drafters) - 1} ascending positive token counts "
                              "(one boundary between each pair of drafters)")
        return self


class AcceptancePortfolio(_Portfolio):
    """A conversation starts on the first drafter predicted to give enough tokens per verify step."""
    choose: Literal["acceptance"]
    """How a conversation's first drafter is chosen (see prompt_tokens)."""
    min_tokens_per_step: Float(1, MAX_SPEC_K + 1)
    """Predicted tokens per verify step (at the prompt's length and k) a drafter must reach."""
    k: K = 4
    """Drafts per round the prediction assumes."""


_PORTFOLIO = {"by prompt_tokens": PromptTokensPortfolio, "by acceptance": AcceptancePortfolio}


def _portfolio_kind(v) -> str:
    return "by " + v.get("choose", "prompt_tokens") if isinstance(v, dict) else _tag_of(_PORTFOLIO, v)


def _portfolio_shape(v):
    """base.Tagged's checks, for a choice whose tags collide with keys (see _one_of)."""
    if isinstance(v, Section):
        return v
    if not isinstance(v, dict):
        raise ConfigError("", v, "a mapping")
    if v.get("choose", "prompt_tokens") not in ("prompt_tokens", "acceptance"):
        raise ConfigError("choose", v["choose"], "one of prompt_tokens, acceptance")
    return v


PortfolioField = _one_of(_PORTFOLIO, _portfolio_kind, _portfolio_shape)


# ---- multi-level speculation: drafters chained below the top drafter ---------------------------------------

class DraftLevel(Section):
    """A drafter below the top one in a multi-level chain (docs/specdec.md, "Multi-level speculation")."""
    name: Str | None = None
    """Level name, unique (None: level<i>, i its index)."""
    drafter: ModelRef
    """The level's model: a catalogue name or {config: path/to/config.json}; must share the target's vocabulary."""
    acceptance: AcceptanceField = CurveAcceptance()
    """Its acceptance against the next level up (the last level's: against the top drafter)."""


# ---- the section --------------------------------------------------------------------------------------------

class SpeculationConfig(Section):
    """Speculative decoding (docs/specdec.md): drafts on devices (distributed), on the targets
    (fused) or either per round (hybrid); the targets verify them."""
    mode: Mode = "fused"
    """off | fused | distributed | hybrid (YAML's bare `off` is accepted)."""
    drafter: ModelRef = DEFAULT_DRAFTER
    """Model drafting on the devices (catalogue name or {config: ...}); must share the target's vocabulary."""
    fused_drafter: ModelRef | None = None
    """Model drafting on the targets (None: drafter)."""
    acceptance: AcceptanceField = CurveAcceptance()
    """Acceptance model: {curve: NAME, curves: FILE} | {geometric: RATE} | {bundle: FILE, drafter, verifier}."""
    temperature: Float(0) = 0.0
    """Sampling temperature the acceptance model is read at (a request's own, from its tenant or a
    trace column, wins)."""
    top_p: Float(0, 1, lo_open=True) = 1.0
    """Nucleus sampling: acceptance = greedy + top_p x (acceptance at the temperature - greedy)
    (docs/specdec.md; a request's own wins; 1: the curve as it is)."""
    acceptance_rules: list[AcceptanceRule] | None = None
    """Acceptance by request domain and/or verifying pool: the first rule that matches gives the
    model, else ``acceptance`` (None: ``acceptance`` for every request)."""
    replay_log: Str | None = None
    """A repro_log.jsonl (output.repro_log) whose acceptance outcomes and mode decisions this run
    takes instead of drawing and choosing them, relative to the scenario (None: none; not with levels)."""
    acceptance_draws: Choice("sample", "expectation") = "sample"
    """sample: each round's accepted drafts are drawn; expectation: each round accepts the expected
    number (carried over rounds as a remainder, so a conversation's total is the expectation's),
    with no random draw: a variance-free run for comparing settings (chain drafts only)."""
    gamma: GammaField = StaticGamma()
    """Gamma (draft length) policy and its parameters."""
    mode_switch: ModeSwitch = ModeSwitch()
    """Hybrid mode's per-round choice."""
    partial_verification: PartialVerification = PartialVerification()
    """Drafts holding KV while awaiting verification."""
    kv_admission: KvAdmission = KvAdmission()
    """Spill to fused drafting under KV pressure."""
    cold_start: ColdStart = ColdStart()
    """Fused drafter weight loading."""
    token_bytes: Float(0) = 4.0
    """Bytes per token id on the wire."""
    bundle_bytes_per_token: Float(0) = 8.0
    """Bytes per drafted token in a bundle (id + draft probability)."""
    header_bytes: Float(0) = 64.0
    """Bytes of header per message."""
    gateway: Str = "gateway"
    """Network node the draft devices' access links end at."""
    drafts: list[DraftGroup] | None = None
    """Draft device groups (required by distributed and hybrid modes)."""
    tree: TreeDrafts | None = None
    """Tree drafts (None: chains)."""
    verify_order: Choice("fcfs", "edf", "context_cohort") = "fcfs"
    """Ready rounds a step's token budget serves first: fcfs (admission order) | edf (earliest deadline)
    | context_cohort (one verify batch per power-of-two context bin, the longest-waiting round's bin
    served first)."""
    verify_attention: Choice("exact", "padded") = "exact"
    """Cost of the verify attention: exact (each round its own context) | padded (each verify batch
    padded to its longest context and chunk: one batch per step, or per cohort with context_cohort)."""
    framework: Choice("vanilla", "eagle") = "vanilla"
    """vanilla: a fused round drafts with fused_drafter; eagle: with an EAGLE head on the target (one
    decoder layer + the LM head per drafted token, costed as that share of a target decode step)."""
    levels: list[DraftLevel] | None = None
    """Drafters chained below the top drafter, smallest first: the first drafts k tokens, each next
    one verifies them and adds its own token, the target verifies the top drafter's (None: one level)."""
    draft_kv: DraftKv | None = None
    """Draft devices' drafter KV cache, reused across rounds and a session's turns (None: not modelled,
    no drafter prefill is charged)."""
    draft_load: DraftLoad | None = None
    """Draft devices load the drafter before drafting, and warm devices are preferred (None: always loaded)."""
    cohort_assignment: Choice("round_robin", "capability") = "round_robin"
    """How a request that names no draft device (draft_id) is bound to one of its pool (its cohort's
    group, else every device): round_robin (in turn) | capability (smooth weighted round robin, each
    device's share its weight: the group's weight, else its drafting speed; docs/traces.md)."""
    portfolio: PortfolioField | None = None
    """Several drafters, chosen per request and escalated mid-decode (None: one drafter)."""
    topology: AutoTopology | None = None
    """Auto-topology: which pools each draft device may send to, and the generated links (None:
    every device reaches every pool; docs/specdec.md)."""

    @field_validator("levels", mode="before")
    @classmethod
    def _some_levels(cls, v):
        return _non_empty_or_null(v, "drafters, smallest first (or null)")

    @field_validator("levels")
    @classmethod
    def _unique_levels(cls, v):
        return v if v is None else _unique_names(v, "level", "level")

    @field_validator("drafts", mode="before")
    @classmethod
    def _non_empty(cls, v):
        return _non_empty_or_null(v, "draft device groups")

    @field_validator("drafts")
    @classmethod
    def _unique(cls, v):
        return v if v is None else _unique_names(v, "drafts", "group")

    @model_validator(mode="after")
    def _weights_need_capability(self):
        if self.cohort_assignment != "capability":
            for i, g in enumerate(self.drafts or ()):
                if g.weight is not None:
                    raise ConfigError(f"drafts[{i}].weight", g.weight, "no weight unless cohort_assignment is "
                                      "capability (round_robin ignores weights)")
        return self

    @model_validator(mode="after")
    def _consistent(self):
        if self.mode_switch.policy == "gamma_policy" and self.gamma.policy != "latency_head":
            raise ConfigError("mode_switch.policy", "gamma_policy", "rtt_load unless gamma.policy is latency_head")
        if self.tree is not None or self.portfolio is not None:
            what = "tree drafts" if self.tree is not None else "a drafter portfolio"
            for i, g in enumerate(self.drafts or ()):
                if g.max_batch > 1:
                    raise ConfigError(f"drafts[{i}].max_batch", g.max_batch,
                                      f"1 with {what} (batched drafting is modelled for one drafter's chains only)")
        if self.topology is not None and not self.drafts:
            raise ConfigError("topology", None, "draft devices (drafts) to connect", show_value=False)
        if self.mode in ("distributed", "hybrid") and not self.drafts:
            raise ConfigError("drafts", None, f"draft devices: mode {self.mode} drafts on them", show_value=False)
        if self.framework == "eagle" and self.mode == "distributed":
            raise ConfigError("framework", "eagle", "vanilla with mode distributed (an EAGLE head drafts on the "
                              "target, from its hidden states: mode fused or hybrid)")
        if self.levels is not None:
            for key, val, bad in (("tree", "{...}", self.tree is not None), ("portfolio", "{...}", self.portfolio is not None),
                                  ("framework", "eagle", self.framework == "eagle"),
                                  ("acceptance_draws", "expectation", self.acceptance_draws == "expectation")):
                if bad:
                    raise ConfigError(key, val, "its default with levels (multi-level chains are modelled for "
                                      "one sampled chain of drafters)")
            if self.replay_log is not None:
                raise ConfigError("replay_log", self.replay_log, "null with levels (the log holds the target's "
                                  "verifications, not the chain's draws below it, so a replay would not be the "
                                  "recorded run)")
        if self.framework == "eagle" and self.portfolio is not None:
            raise ConfigError("framework", "eagle", "vanilla with a drafter portfolio")
        if self.draft_kv is not None:
            for i, g in enumerate(self.drafts or ()):
                if g.max_batch > 1:
                    raise ConfigError(f"drafts[{i}].max_batch", g.max_batch, "1 with draft_kv (the drafter KV "
                                      "cache is modelled for devices drafting one round at a time)")
        if self.draft_kv is not None:
            for key, bad in (("tree", self.tree), ("portfolio", self.portfolio), ("levels", self.levels)):
                if bad is not None:
                    raise ConfigError(key, None, "null with draft_kv (the drafter KV cache is modelled for one "
                                      "drafter's chains)", show_value=False)
        if self.draft_load is not None and self.draft_load.placement == "warm_first":
            for i, g in enumerate(self.drafts or ()):
                if g.closed_loop:
                    raise ConfigError(f"drafts[{i}].closed_loop", True, "false with draft_load.placement: "
                                      "warm_first (a closed-loop device is one user, it cannot be chosen)")
        if self.acceptance_rules is not None and self.portfolio is not None:
            raise ConfigError("acceptance_rules", None, "no rules with a portfolio (each drafter has its own "
                              "acceptance)", show_value=False)
        if self.acceptance_rules is not None and not self.acceptance_rules:
            raise ConfigError("acceptance_rules", [], "a non-empty list of rules (or none)")
        if self.acceptance_draws == "expectation" and self.tree is not None:
            raise ConfigError("acceptance_draws", "expectation", "sample with tree drafts (the expectation is "
                              "taken over a chain's positions)")
        return self


SpeculationField = SpeculationConfig | None
