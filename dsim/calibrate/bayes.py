"""Stage 2 by Bayesian optimisation (``dsim calibrate --optimizer bayesian``, the default for
``--latency-model blackbox``): seed 000's "Approach 1", BLIS's blackbox coefficients trained by
Bayesian optimisation of the simulated-vs-real loss.

optuna's tree-structured Parzen estimator (multivariate, seeded by ``--seed``: the same runs and seed
give the same search) proposes each parameter uniformly within its range; the stage-2 start is told to
it as a finished trial (it costs no second simulation), the first few proposals are random, the rest
model where the loss is low.  optuna is optional (``pip install dsim[calibrate]``) and imported only here.
"""
from __future__ import annotations

import math
import warnings

import numpy as np

from ..config.errors import ConfigError


def _optuna():
    try:
        import optuna
    except ImportError:
        raise ConfigError("--optimizer", "bayesian", "optuna installed (pip install 'dsim[calibrate]')") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def startup_trials(max_evals: int) -> int:
    """Random proposals before the Parzen estimators take over: a third of the budget, 4 to 10."""
    return int(min(10, max(4, max_evals // 3)))


def tpe_search(g, space, value, position, x0, hist: list, max_evals: int, seed: int) -> None:
    """Minimise ``g`` (a function of the parameters' logistic positions) with optuna's TPE over each
    parameter's value range (log-uniform for a ``log`` one) until ``hist``, the losses simulated so far,
    holds ``max_evals``.  ``x0``: the start's positions, already simulated (``hist[0]``)."""
    loss0 = hist[0]
    optuna = _optuna()
    with warnings.catch_warnings():         # multivariate TPE is marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        sampler = optuna.samplers.TPESampler(seed=seed, multivariate=True, n_startup_trials=startup_trials(max_evals))
    study = optuna.create_study(direction="minimize", sampler=sampler)
    if math.isfinite(loss0):
        dists = {p.name: optuna.distributions.FloatDistribution(p.lo, p.hi, log=p.log) for p in space}
        start = {p.name: min(max(value(p, xi), p.lo), p.hi) for p, xi in zip(space, x0)}
        study.add_trial(optuna.trial.create_trial(params=start, distributions=dists, value=loss0))

    def objective(trial):
        return g(np.array([position(p, trial.suggest_float(p.name, p.lo, p.hi, log=p.log)) for p in space]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        for _ in range(3 * max_evals):      # bounded: a point simulated before costs no simulation
            if len(hist) >= max_evals:
                break
            study.optimize(objective, n_trials=1)
