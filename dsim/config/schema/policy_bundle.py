"""A policy bundle file (seed 002 section 6, "policy bundles"; 5.6's ``policy_version``): the set of
policies a scenario uses, as one named and versioned object a scenario loads with
``policy_bundle: FILE``.  Each key sets one scenario key (dsim.config.policy_bundle.TARGETS); the
values are checked here with the same types as there."""
from __future__ import annotations

from ..errors import ConfigError
from ..names import SCHEDULING_POLICIES
from .base import Choice, Str, checked
from .cluster import AdmissionField, DecodeRouterField, RouterField
from .speculation import KvAdmission, ModeSwitch, PartialVerification
from .speculation_gamma import GammaField
from .base import Section


def _version(v):
    if isinstance(v, bool) or not isinstance(v, (str, int)) or (isinstance(v, str) and not v.strip()):
        raise ConfigError("", v, "a version: a non-empty string or an integer")
    return str(v)


Version = checked(str, _version, {"type": ["string", "integer"]})


class PolicyBundle(Section):
    """One versioned set of policies: routers, admission, engine scheduling and the speculation policies."""
    name: Str
    """The bundle's name (kept in manifest.json)."""
    version: Version
    """Its version: a string or an integer (kept in manifest.json)."""
    description: Str = ""
    """Free text."""
    router: RouterField | None = None
    """cluster.router: the entry router (with several clusters, the global one)."""
    cluster_router: RouterField | None = None
    """The router of every cluster of cluster.clusters."""
    decode_router: DecodeRouterField | None = None
    """The decode router of every disaggregated cluster."""
    admission: AdmissionField = None
    """cluster.admission."""
    scheduling_policy: Choice(*SCHEDULING_POLICIES) | None = None
    """engine.scheduling_policy: the order a replica's waiting queue is served in."""
    gamma: GammaField | None = None
    """speculation.gamma: the draft-length policy."""
    mode_switch: ModeSwitch | None = None
    """speculation.mode_switch: hybrid mode's per-round choice."""
    verify_order: Choice("fcfs", "edf") | None = None
    """speculation.verify_order."""
    partial_verification: PartialVerification | None = None
    """speculation.partial_verification."""
    kv_admission: KvAdmission | None = None
    """speculation.kv_admission."""
