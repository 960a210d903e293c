"""``speculation.framework: eagle``: the fused drafter is an EAGLE head on the target GPU.

An EAGLE head (EAGLE-1/2/3) drafts from the target's own hidden states: one extra decoder layer
plus the target's LM head, run once per drafted token.  So its cost is not a separate small model's
step but a slice of the target's: per draft step, the fraction

    f = (1 + V H / (P / L)) / L

of one target decode step at the same batch and contexts, where L is the target's layer count, P
its active parameters (LM head included), V x H the LM head's parameters: one layer's weights plus
the LM head's, in layer units, over L layers.  This is the formula of
``experiments/eagle3_batch_crossover.py`` (which imports it from here); its weights are f x P
parameters, which is what a cold start of the head loads.

The head needs the target's hidden states, so it drafts only where the target runs: fused rounds
(and the fused rounds of hybrid mode); a distributed round still drafts on its device.
"""
from __future__ import annotations


def head_fraction(model) -> float:
    """f above: one EAGLE draft step as a share of one target decode step (``model``: the target's
    ModelSpec)."""
    L = model.num_layers
    lm_share = model.vocab_size * model.hidden_size / (model.active_params / L)
    return (1.0 + lm_share) / L


class EagleHead:
    """A step-time model for the head: ``f`` x the target's step time for the same batch shape
    (``target``: a step-time model of the target model on the target's GPU and TP)."""

    def __init__(self, model, target):
        self.model = model
        self.target = target
        self.frac = head_fraction(model)
        self.weight_bytes = self.frac * model.active_params * model.bytes_per_param

    def step_time(self, shape) -> float:
        return self.frac * self.target.step_time(shape)
