"""Scenario files: YAML (JSON accepted), ``--set`` overrides, and validation of every key."""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .cluster import FleetSpec, check_tp, load_fleet, single_pool
from .engine import EngineConfig, load_engine
from .errors import ConfigError
from .files import load_value, load_yaml, parse_json, read_text, recording_reads
from .limits import MAX_SCENARIO_BYTES
from .hardware import DeviceProfile, load_device
from .model import ModelSpec, load_model


@dataclass
class Scenario:
    """A validated scenario.  ``raw`` keeps the resolved mapping (for hashing and re-runs)."""
    raw: dict
    base_dir: Path | None
    seed: int
    name: str
    model: ModelSpec
    device: DeviceProfile
    engine: EngineConfig
    slo_ttft_ms: float | None
    slo_tpot_ms: float | None
    horizon_s: float | None
    drain: bool
    plots: bool = True
    timeline: bool = False
    source: str = ""
    fleet: FleetSpec | None = None
    slo_tvt_ms: float | None = None
    spec: object = None              # dsim.specdec.config.SpecConfig when speculation is configured
    percentiles: tuple = (50, 90, 95, 99)   # output.percentiles: reported in summary.json
    slo_classes: dict = field(default_factory=dict)   # slo.classes: name -> (ttft_ms, tpot_ms), None = no bound
    overrides: tuple = ()            # the --set strings applied to the file (recorded in manifest.json)
    config: object = None            # the validated ScenarioConfig (dsim.config.schema): typed sections
    data_files: frozenset = frozenset()   # resolved paths of the data files loading read (manifest hashes)
    seeds: dict | None = None        # seeds: per-group master seeds (workload / simulation / jitter), dsim.core.rng
    policy_bundle: dict | None = None    # the applied policy bundle (dsim.config.policy_bundle), for manifest.json

    @property
    def digest(self) -> str:
        blob = json.dumps(self.raw, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(blob.encode()).hexdigest()


def read_scenario_file(path) -> dict:
    p = Path(path)
    if not p.is_file():
        raise ConfigError(str(path), None, "an existing scenario file (YAML or JSON)", show_value=False)
    text = read_text(p, str(path), MAX_SCENARIO_BYTES, "a scenario file (data such as traces goes in files "
                     "the scenario names)")
    try:
        data = parse_json(text, str(path), unique_keys=True) if p.suffix == ".json" else load_yaml(text, str(path))
    except ConfigError:                     # parse_json's and load_yaml's own, already path-qualified
        raise
    except (RecursionError, ValueError) as e:
        raise ConfigError(str(path), None, f"a scenario nested less deeply, with ordinary numbers ({type(e).__name__})",
                          show_value=False) from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        raise ConfigError(where, None, f"valid YAML: {getattr(e, 'problem', e)}", show_value=False) from None
    if not isinstance(data, dict):
        raise ConfigError(str(path), data, "a mapping of scenario keys at the top level")
    return data


# a key (names may hold '-': pools and devices are often called prefill-0) and list indices, negative
# ones counting from the end as in Python
_SEG = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)((?:\[-?\d+\])*)$")


def _unshared(node):
    """A copy in which no two places share one object (copy.deepcopy keeps a YAML alias shared)."""
    if isinstance(node, dict):
        return {k: _unshared(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_unshared(v) for v in node]
    return copy.deepcopy(node)


def apply_overrides(data: dict, overrides) -> dict:
    """Apply ``a.b[1].c=value`` strings; the value is parsed as YAML (``1`` int, ``true`` bool)."""
    data = _unshared(data)            # a YAML alias (*len) is a copy here, so --set changes one place
    if overrides is not None and (isinstance(overrides, (str, bytes, dict)) or not hasattr(overrides, "__iter__")):
        raise ConfigError("overrides", overrides, "a list of 'KEY=VALUE' strings")
    for ov in overrides or ():
        if not isinstance(ov, str):
            raise ConfigError("overrides", ov, "a 'KEY=VALUE' string, e.g. 'engine.max_num_seqs=128'")
        if "=" not in ov:
            raise ConfigError(f"--set {ov}", ov, "KEY=VALUE, e.g. engine.max_num_seqs=128")
        key, _, sval = ov.partition("=")
        val = load_value(sval)
        parts = key.strip().split(".")
        node = data
        for j, part in enumerate(parts):
            m = _SEG.match(part)
            if not m:
                raise ConfigError(f"--set {key}", part, "dotted keys with optional [index]")
            name, idx = m.group(1), [int(x) for x in re.findall(r"\[(-?\d+)\]", m.group(2))]
            last = j == len(parts) - 1
            if not isinstance(node, dict):
                raise ConfigError(f"--set {key}", node, "a mapping to set a key in")
            if last and not idx:
                node[name] = val
                break
            if name not in node or node[name] is None:
                node[name] = [] if idx else {}
            node = node[name]
            for k, ix in enumerate(idx):
                if not isinstance(node, list) or not -len(node) <= ix < len(node):
                    raise ConfigError(f"--set {key}", ix, "an index of an existing list item")
                if last and k == len(idx) - 1:
                    node[ix] = val
                else:
                    node = node[ix]
    return data


def load_scenario(source, overrides=None, seed: int | None = None, base_dir=None) -> Scenario:
    """Load and validate a scenario from a path or a mapping (raises ConfigError); a mapping's file
    paths are relative to ``base_dir`` when given (else to the working directory)."""
    if isinstance(source, dict):
        data, shown = copy.deepcopy(source), "<dict>"
        base_dir = Path(base_dir) if base_dir is not None else None
    elif not isinstance(source, (str, os.PathLike)):
        raise ConfigError("scenario", source, "a YAML/JSON path or a mapping of scenario keys")
    else:
        data, base_dir, shown = read_scenario_file(source), Path(source).resolve().parent, str(source)
    data = apply_overrides(data, overrides)
    bundle = None
    if data.get("policy_bundle") is not None:
        from .policy_bundle import apply_bundle
        data, bundle = apply_bundle(data, base_dir)
        data = apply_overrides(data, overrides)      # --set wins over the bundle
    if seed is not None:
        data["seed"] = seed
    from .schema.scenario import parse_scenario
    with recording_reads() as read:
        scn = _build(data, cfg := parse_scenario(data), shown, base_dir, overrides)
    scn.data_files = frozenset(read)
    scn.policy_bundle = bundle
    return scn


def _build(data: dict, cfg, shown: str, base_dir, overrides) -> Scenario:
    name = cfg.name if cfg.name is not None else (Path(shown).stem if shown != "<dict>" else "scenario")
    if cfg.cluster is None:
        model = load_model(cfg.model, "model", base_dir)
        device = load_device(cfg.hardware, "hardware")
        engine = load_engine(cfg.engine, "engine")
        check_tp(model, engine, "engine", device)
        model = model.with_kv_cache_dtype(engine.kv_cache_dtype)
        fleet = single_pool(model, device, engine, cfg.latency)
    else:
        top = {"model": cfg.model, "hardware": cfg.hardware, "engine": cfg.engine, "latency": cfg.latency}
        fleet = load_fleet(cfg.cluster, top, base_dir)
        first = fleet.pools[0]
        model, device, engine = first.model, first.device, first.engine
    spec = None
    if cfg.speculation is not None:
        from ..specdec.config import check_targets, load_spec
        spec = load_spec(cfg.speculation, "speculation", base_dir, model)
        check_targets(spec, fleet.pools)
        if cfg.speculation.topology is not None:
            from ..specdec.topology import plan
            spec.connectivity = plan(cfg.speculation.topology, spec.groups, fleet, cfg.network, spec.gateway)
    slo = cfg.slo
    return Scenario(raw=data, base_dir=base_dir, seed=cfg.seed, seeds=cfg.seeds.model_dump() if cfg.seeds else None,
                    name=name, model=model, device=device,
                    engine=engine, slo_ttft_ms=slo.ttft_ms, slo_tpot_ms=slo.tpot_ms, horizon_s=cfg.horizon_s,
                    drain=cfg.drain, plots=cfg.output.plots, timeline=cfg.output.timeline, source=shown,
                    fleet=fleet, slo_tvt_ms=slo.tvt_ms, spec=spec, percentiles=cfg.output.percentiles,
                    overrides=tuple(overrides or ()), config=cfg,
                    slo_classes={k: (c.ttft_ms, c.tpot_ms) for k, c in slo.classes.items()})
