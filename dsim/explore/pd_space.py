"""The P/D plan's space: what a ``disaggregated:`` SPACE.yaml holds, and how one candidate becomes
the scenario's ``cluster=`` override.

Why its own module: the planner (plan_pd.py) and its screen (screen_pd.py) both enumerate and encode
candidates from it; neither should import the other for that."""
from __future__ import annotations

import itertools
import json
from dataclasses import dataclass

from ..config.errors import ConfigError
from ..config.scenario import read_scenario_file

ROLES = ("prefill", "decode")
DEFAULT_ROUTER = "least_outstanding"


@dataclass
class PDSpace:
    """Candidate values per role: TP sizes, GPU types (None: the scenario's), engine knobs
    ([(key under the pool, values)]) and replica counts (None: every count the budget allows)."""
    tp: dict
    hardware: dict
    replicas: dict | None
    knobs: dict = None

    def role_knobs(self, role: str) -> list:
        return (self.knobs or {}).get(role, [])

    def keys(self) -> list:
        """The candidate table's leading columns: each role's GPU, TP, knobs (``prefill.engine.max_num_seqs``)
        and replica count, then the totals."""
        out = []
        for role in ROLES:
            out += [f"{role}_hardware", f"{role}_tp"] + [f"{role}.{k}" for k, _ in self.role_knobs(role)] \
                + [f"{role}_replicas"]
        return out + ["gpus", "usd_per_hour"]

    def role_families(self, role: str):
        """One dict per (GPU, TP, knob values) of a role, in a fixed order."""
        names = [f"{role}.{k}" for k, _ in self.role_knobs(role)]
        for hw, tp, *vals in itertools.product(self.hardware[role], self.tp[role],
                                               *(v for _, v in self.role_knobs(role))):
            yield {f"{role}_hardware": hw, f"{role}_tp": tp, **dict(zip(names, vals))}

    def families(self):
        """One dict per (prefill GPU, TP, knob values, decode GPU, TP, knob values), in a fixed order."""
        for pre in self.role_families("prefill"):
            for dec in self.role_families("decode"):
                yield {**pre, **dec}


def is_pd_space(source) -> bool:
    """True when the SPACE file (or mapping) is a P/D space (has a ``disaggregated`` key)."""
    data = source if isinstance(source, dict) else read_scenario_file(source)
    return isinstance(data, dict) and "disaggregated" in data


def _int_list(v, path: str) -> list:
    if not isinstance(v, list) or not v or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 1
                                                    for x in v):
        raise ConfigError(path, v, "a non-empty list of integers >= 1")
    return sorted(set(v))


def load_pd_space(source) -> PDSpace:
    """A P/D SPACE.yaml (or mapping)::

        disaggregated:
          prefill: {tensor_parallel_size: [1, 2], hardware: [H100-SXM, A100-80GB],
                    engine.max_num_batched_tokens: [4096, 8192]}
          decode:  {tensor_parallel_size: [1, 2], hardware: [H100-SXM], engine.max_num_seqs: [128, 256]}
          replicas: auto            # or {prefill: [1, 2], decode: [1, 2, 3]}

    A role's ``engine.*`` keys are that pool's engine knobs, searched like TP (checked against the
    scenario schema's pool engine).  Every mistake is a ConfigError naming its path in the file (``<file>: disaggregated.decode.hardware[1]``)."""
    from ..config.hardware import device_names
    where = "<space>" if isinstance(source, dict) else str(source)
    data = dict(source) if isinstance(source, dict) else read_scenario_file(source)
    if not isinstance(data, dict) or set(data) != {"disaggregated"}:
        raise ConfigError(f"{where}", sorted(data) if isinstance(data, dict) else data,
                          "only the key disaggregated (a P/D space; engine knobs go under disaggregated.prefill / "
                          ".decode as engine.KEY lists, or in --set for both pools)")
    d = data["disaggregated"]
    if not isinstance(d, dict):
        raise ConfigError(f"{where}: disaggregated", d, "a mapping with prefill, decode and replicas")
    extra = sorted(set(d) - {"prefill", "decode", "replicas"})
    if extra:
        raise ConfigError(f"{where}: disaggregated.{extra[0]}", d[extra[0]], "no such key (prefill, decode, replicas)")
    tp, hw, knobs = {}, {}, {}
    known = set(device_names())
    for role in ROLES:
        spec = d.get(role, {}) or {}
        if not isinstance(spec, dict):
            raise ConfigError(f"{where}: disaggregated.{role}", spec, "a mapping with tensor_parallel_size, hardware "
                              "and engine.KEY lists")
        bad = sorted(k for k in spec if k not in ("tensor_parallel_size", "hardware")
                     and not str(k).startswith("engine."))
        if bad:
            raise ConfigError(f"{where}: disaggregated.{role}.{bad[0]}", spec[bad[0]],
                              "no such key (tensor_parallel_size, hardware, engine.KEY)")
        knobs[role] = [(str(k), _knob_values(v, str(k), f"{where}: disaggregated.{role}.{k}"))
                       for k, v in spec.items() if str(k).startswith("engine.")]
        tp[role] = _int_list(spec.get("tensor_parallel_size", [1]), f"{where}: disaggregated.{role}.tensor_parallel_size")
        h = spec.get("hardware")
        if h is None:
            hw[role] = [None]
            continue
        if not isinstance(h, list) or not h:
            raise ConfigError(f"{where}: disaggregated.{role}.hardware", h, "a non-empty list of GPU profile names")
        for i, name in enumerate(h):
            if not isinstance(name, str) or name not in known:
                raise ConfigError(f"{where}: disaggregated.{role}.hardware[{i}]", name,
                                  "a GPU profile name (" + ", ".join(sorted(known)) + ")")
        hw[role] = list(dict.fromkeys(h))
    reps = d.get("replicas", "auto")
    if reps == "auto":
        replicas = None
    elif isinstance(reps, dict) and set(reps) == set(ROLES):
        replicas = {r: _int_list(reps[r], f"{where}: disaggregated.replicas.{r}") for r in ROLES}
    else:
        raise ConfigError(f"{where}: disaggregated.replicas", reps, "auto or {prefill: [..], decode: [..]}")
    return PDSpace(tp, hw, replicas, knobs)


def _knob_values(v, key: str, path: str) -> list:
    """A role's engine knob: a non-empty list, its key one of the pool engine's (schema/keys.py)."""
    from ..config.schema.keys import check_key
    if key == "engine.tensor_parallel_size":
        raise ConfigError(path, v, "tensor_parallel_size (one level up: the role's TP list)")
    if key in ("engine.pipeline_parallel_size", "engine.data_parallel_size") and v != [1]:
        # dsim.cluster.fleet refuses them with a role: say so before any candidate is screened
        raise ConfigError(path, v, "[1]: PP virtual engines and DP ranks are not simulated in a prefill/decode "
                          "pool yet (single-pool spaces search them; enable_expert_parallel is a P/D knob)")
    try:
        check_key(f"cluster.pools[0].{key}")
    except ConfigError as e:
        raise ConfigError(path, None, e.expected, show_value=False) from None
    if not isinstance(v, list) or not v:
        raise ConfigError(path, v, "a non-empty list of candidate values")
    return v


def base_cluster(doc: dict, where: str) -> dict:
    """The scenario's cluster section without its pools (router, affinity, disaggregation kept), and
    its pools by role (their own keys are kept on the candidates), or defaults without a cluster."""
    cl = doc.get("cluster")
    if cl is None:
        return {"router": DEFAULT_ROUTER, "disaggregation": {}, "_pools": {}}
    if not isinstance(cl, dict) or "clusters" in cl or cl.get("controllers"):
        raise ConfigError(f"{where}: cluster", None, "no cluster section, or one cluster without controllers "
                          "(the P/D planner sizes its prefill and decode pools)", show_value=False)
    out = {k: v for k, v in cl.items() if k != "pools"}
    out.setdefault("disaggregation", {})
    out["_pools"] = {p.get("role"): p for p in cl.get("pools") or [] if isinstance(p, dict)
                     and p.get("role") in ROLES}
    return out


def cluster_override(base: dict, cand: dict) -> str:
    """The ``cluster=`` override of one candidate: two pools, each with its GPU type, TP and replicas."""
    cl = {k: v for k, v in base.items() if k != "_pools"}
    pools = []
    for role in ROLES:
        p = {k: v for k, v in base["_pools"].get(role, {}).items() if k not in ("name", "role", "replicas",
                                                                                 "min_replicas", "max_replicas")}
        p.update(name=role, role=role, replicas=cand[f"{role}_replicas"])
        if cand[f"{role}_hardware"] is not None:
            p["hardware"] = cand[f"{role}_hardware"]
        p["engine"] = {**(p.get("engine") or {}), "tensor_parallel_size": cand[f"{role}_tp"]}
        for key, v in cand.items():
            if key.startswith(f"{role}.engine."):
                _set_nested(p, key[len(role) + 1:].split("."), v)
        pools.append(p)
    cl["pools"] = pools
    return "cluster=" + json.dumps(cl, sort_keys=True)


def _set_nested(doc: dict, path: list, value) -> None:
    for k in path[:-1]:
        doc[k] = dict(doc.get(k) or {})
        doc = doc[k]
    doc[path[-1]] = value


def _replica_counts(sp: PDSpace, role: str, per: int, price: float | None, gpus, usd) -> list:
    """Replica counts of one role that fit the budgets on their own (the pair is checked later)."""
    hi = MAXR = 10_000
    if gpus is not None:
        hi = min(hi, gpus // per)
    if usd is not None:
        hi = min(hi, int(usd // (per * price)) if price else MAXR)
    return [r for r in (sp.replicas[role] if sp.replicas else range(1, hi + 1)) if r <= hi]
