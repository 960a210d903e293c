"""Policy bundles (seed 002 section 6 "policy bundles", 5.6 ``policy_version``): ``policy_bundle: FILE``
loads one versioned set of policies into a scenario.

The file holds ``policy_bundle: {name, version, description, <policy>: <value>, ...}``.  Each policy
sets the scenario keys of TARGETS, over what the scenario file says; ``--set`` overrides still win
(they are applied again after the bundle).  A policy for a section the scenario does not have (a
decode router without P/D, a gamma policy without speculation) is an error, not a silent no-op.
The applied bundle (name, version, file hash, policies) goes to manifest.json.
"""
from __future__ import annotations

import copy
import hashlib
from pathlib import Path

from .errors import ConfigError
from .files import load_yaml, read_text

# bundle key -> the scenario key(s) it sets (_slots finds them in a scenario mapping)
TARGETS = {
    "router": "cluster.router",
    "cluster_router": "the router of every cluster of cluster.clusters",
    "decode_router": "the disaggregation.decode_router of every disaggregated cluster",
    "admission": "cluster.admission",
    "scheduling_policy": "engine.scheduling_policy",
    "gamma": "speculation.gamma",
    "mode_switch": "speculation.mode_switch",
    "verify_order": "speculation.verify_order",
    "partial_verification": "speculation.partial_verification",
    "kv_admission": "speculation.kv_admission",
}
_META = ("name", "version", "description")


def _slots(data: dict, key: str) -> list:
    """The (mapping, key) pairs the bundle's ``key`` sets in the scenario mapping ``data``; empty
    when the scenario lacks the section."""
    cluster = data.get("cluster")
    spec = data.get("speculation")
    if key in ("router", "admission"):
        return [(cluster, key)] if isinstance(cluster, dict) else []
    if key == "cluster_router":
        cl = cluster.get("clusters") if isinstance(cluster, dict) else None
        return [(c, "router") for c in cl if isinstance(c, dict)] if isinstance(cl, list) else []
    if key == "decode_router":
        owners = [cluster] if isinstance(cluster, dict) else []
        if isinstance(cluster, dict) and isinstance(cluster.get("clusters"), list):
            owners += [c for c in cluster["clusters"] if isinstance(c, dict)]
        return [(o["disaggregation"], "decode_router") for o in owners if isinstance(o.get("disaggregation"), dict)]
    if key == "scheduling_policy":
        if data.get("engine") is None:
            data["engine"] = {}
        return [(data["engine"], key)] if isinstance(data["engine"], dict) else []
    return [(spec, key)] if isinstance(spec, dict) else []


def load_bundle(path: Path, shown: str) -> tuple[dict, object]:
    """(the raw policy_bundle mapping, the validated PolicyBundle) of a bundle file."""
    from .schema.base import parse
    from .schema.policy_bundle import PolicyBundle
    if not path.is_file():
        raise ConfigError("policy_bundle", shown, "an existing policy bundle file (YAML)")
    text = read_text(path, shown, what="a policy bundle file")
    doc = load_yaml(text, shown)
    if not isinstance(doc, dict) or set(doc) != {"policy_bundle"} or not isinstance(doc["policy_bundle"], dict):
        raise ConfigError(shown, None, "a file holding one mapping, policy_bundle: {name, version, ...}",
                          show_value=False)
    raw = doc["policy_bundle"]
    return raw, parse(PolicyBundle, raw, f"policy_bundle({shown})")


def apply_bundle(data: dict, base_dir) -> tuple[dict, dict | None]:
    """The scenario mapping with its bundle's policies written in, and the manifest's record of the
    bundle (None without ``policy_bundle``)."""
    f = data.get("policy_bundle")
    if f is None:
        return data, None
    if not isinstance(f, str) or not f.strip():
        raise ConfigError("policy_bundle", f, "the path of a policy bundle file")
    p = Path(f) if Path(f).is_absolute() or base_dir is None else Path(base_dir) / f
    raw, _ = load_bundle(p, f)
    out = copy.deepcopy(data)
    policies = {k: v for k, v in raw.items() if k not in _META and v is not None}
    for key, value in policies.items():
        slots = _slots(out, key)
        if not slots:
            raise ConfigError(f"policy_bundle({f}).{key}", None, f"a scenario with the section it sets "
                              f"({TARGETS[key]})", show_value=False)
        for owner, k in slots:
            owner[k] = copy.deepcopy(value)
    record = {"file": f, "name": str(raw["name"]), "version": str(raw["version"]),
              "sha256": hashlib.sha256(p.read_bytes()).hexdigest(), "policies": policies,
              "sets": {k: TARGETS[k] for k in policies}}
    return out, record
