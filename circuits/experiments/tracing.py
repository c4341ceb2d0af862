"""Circuit tracing in one namespace (``ex.tracing``): circuit-tracer's attribution graphs on circuits.

``frozen_replacement(c, transcoders)`` is the local replacement model (attention patterns and
norm scales frozen at the clean run, a transcoder per layer, errors constant), a circuit like any
other (``freeze_attention_and_norms(c)``: the freezing alone, for interventions);
``attribution_graph(c, transcoders)`` measures the direct effects between its features,
errors, token embeddings and logits (``AttributionGraph``: circuit-tracer's ``Graph``).
docs/features.md has the method and what is checked.
"""

from circuits.experiments.attribution_freeze import (
    FrozenReplacement,
    check_linear,
    freeze_attention_and_norms,
    frozen_replacement,
)
from circuits.experiments.attribution_graph import AttributionGraph, attribution_graph

__all__ = [
    "AttributionGraph",
    "FrozenReplacement",
    "attribution_graph",
    "check_linear",
    "freeze_attention_and_norms",
    "frozen_replacement",
]
