"""dsim: a discrete-event simulator of LLM inference serving, faithful to vLLM's scheduler."""
from ._version import __version__


def load_scenario(source, overrides=None, seed=None):
    """Load and validate a scenario.

    source: a YAML/JSON path or a mapping with the same keys (docs: README, "Scenario keys").
    overrides: ``["workload.rate=40", ...]`` applied first, as ``dsim run --set``.
    seed: replaces the scenario's seed.
    Raises ``dsim.ConfigError`` (path-qualified message) on any invalid key or value.
    """
    from .config.scenario import load_scenario as _load
    return _load(source, overrides, seed)


def run(scenario, out_dir=None, *, overrides=None, seed=None, check_invariants=False, progress=False,
        plots=None, controllers=(), vllm_traces=None, compare_models=False):
    """Run a scenario; return a ``Result`` (``.metrics``, ``.summary``, ``.to_pandas()``, ``.requests``,
    ``.manifest``), writing the report to ``out_dir`` when given.

    scenario: path, mapping or ``dsim.load_scenario(...)``; overrides/seed: as ``load_scenario``;
    check_invariants: check scheduler and KV invariants every step (slow); progress: a progress
    meter on stderr; plots: write plots/*.png (default: the scenario's ``output.plots``);
    controllers: extra ``dsim.Controller`` objects; vllm_traces: True or {step_rate, rich_rate} to
    record vLLM's tracing streams; compare_models: also run under every other latency model
    validated on the GPU (summary.json ``model_spread``).
    """
    from .runner import run as _run
    return _run(scenario, out_dir, overrides=overrides, seed=seed, check_invariants=check_invariants,
                progress=progress, plots=plots, controllers=controllers, vllm_traces=vllm_traces,
                compare_models=compare_models)


def sweep(scenario, grid=(), **kw):
    """A grid (or random sample) of overrides, each a run; rows of flat metrics.  See dsim.explore.sweep."""
    from .explore.sweep import sweep as _sweep
    return _sweep(scenario, grid, **kw)


def capacity(scenario, slos, **kw):
    """Max load within SLOs, or min replicas for a target rate.  See dsim.explore.capacity."""
    from .explore.capacity import capacity as _capacity
    return _capacity(scenario, slos, **kw)


def plan(scenario, space, **kw):
    """The deployment meeting the SLOs on the fewest GPUs of a budget.  See dsim.explore.plan."""
    from .explore.plan import plan as _plan
    return _plan(scenario, space, **kw)


from .config.errors import ConfigError  # noqa: E402

# The control-plane classes load on first use (PEP 562), so `import dsim` stays cheap.
_LAZY = {"Controller": "cluster.control", "Rebalance": "cluster.control", "ReactiveAutoscaler": "cluster.control",
         "ScaleIn": "cluster.control", "ScaleOut": "cluster.control", "SetEngine": "cluster.control",
         "SetSpeculation": "cluster.control", "SetDrafter": "cluster.control", "ClusterEnv": "cluster_env"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dsim' has no attribute {name!r}")

__all__ = ["__version__", "load_scenario", "run", "sweep", "capacity", "plan", "ConfigError", "ClusterEnv", "Controller", "ReactiveAutoscaler",
           "ScaleOut", "ScaleIn", "SetEngine", "SetSpeculation", "SetDrafter", "Rebalance"]
