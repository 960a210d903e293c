"""The controllers a scenario declares (``cluster.controllers``), built from their typed specs.

Why its own module: the planners (dsim.cluster.planner, dsim.cluster.interpolate) are controllers
built on dsim.cluster.control's actions and windows; the builder that picks one by its spec sits
above all three, so none of them imports another that imports it back.
"""
from __future__ import annotations

from ..core.invariant import check


def build_controllers(specs, fleet, session=None, path: str = "cluster.controllers") -> list:
    """The controllers of typed ``schema.cluster.ControllerField`` specs (``controllers: [{type:
    autoscaler, pool: h100, interval_s: 5, ...}]``; their pools were checked with the section).  A
    planner (dsim.cluster.planner) also needs the run's ``session``: it forks it."""
    out = []
    for i, s in enumerate(specs):
        if s.type == "planner":
            if s.kind == "interpolate":             # imported when used: most runs have no planner
                from .interpolate import InterpolatingPlanner as Planner
            else:
                from .planner import SimulationPlanner as Planner
            out.append(Planner(s, fleet, session, f"{path}[{i}]"))
            continue
        check(s.type == "autoscaler" and s.pool in fleet.pools, f"{path}: a controller of an unknown kind or pool")
        from .control import ReactiveAutoscaler        # imported when used: ~15 M instructions of start-up
        out.append(ReactiveAutoscaler(s.pool, s.interval_s, s.scale_out_waiting, s.scale_out_kv, s.scale_in_kv,
                                      s.scale_in_busy, s.cooldown_s))
    return out
