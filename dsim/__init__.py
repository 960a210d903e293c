"""dsim: a discrete-event simulator of LLM inference serving, faithful to vLLM's scheduler."""
__version__ = "0.1.0"


def load_scenario(source, overrides=None, seed=None):
    """Load and validate a scenario (path or mapping); raises dsim.ConfigError on bad input."""
    from .config.scenario import load_scenario as _load
    return _load(source, overrides, seed)


def run(scenario, out_dir=None, **kw):
    """Run a scenario and return a Result (requests, summary, manifest); see dsim.runner.run."""
    from .runner import run as _run
    return _run(scenario, out_dir, **kw)


from .config.errors import ConfigError  # noqa: E402
from .cluster.control import Controller, Rebalance, ReactiveAutoscaler, ScaleIn, ScaleOut, SetEngine  # noqa: E402
from .cluster_env import ClusterEnv  # noqa: E402

__all__ = ["__version__", "load_scenario", "run", "ConfigError", "ClusterEnv", "Controller", "ReactiveAutoscaler",
           "ScaleOut", "ScaleIn", "SetEngine", "Rebalance"]
