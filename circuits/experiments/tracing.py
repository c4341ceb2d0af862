"""Circuit tracing in one namespace (``ex.tracing``): circuit-tracer's attribution graphs on circuits.

``frozen_replacement(c, transcoders)`` is the local replacement model (attention patterns and
norm scales frozen at the clean run, a transcoder per layer, errors constant), a circuit like any
other (``freeze_attention_and_norms(c)``: the freezing alone, for interventions);
``attribution_graph(c, transcoders)`` measures the direct effects between its features,
errors, token embeddings and logits (``AttributionGraph``: circuit-tracer's ``Graph``);
``prune_graph`` (``graph.prune()``) keeps the nodes and edges circuit-tracer's pruning keeps
(``node_influence``, ``graph_scores``); ``graph_json`` (``graph.to_json()``) and
``write_graph_files`` write it as the JSON circuit-tracer's viewer reads.
docs/features.md has the method and what is checked.
"""

from circuits.experiments.attribution_freeze import (
    FrozenReplacement,
    check_linear,
    freeze_attention_and_norms,
    frozen_replacement,
)
from circuits.experiments.attribution_graph import AttributionGraph, attribution_graph
from circuits.experiments.graph_json import GraphNode, graph_json, write_graph_files
from circuits.experiments.graph_prune import PrunedGraph, graph_scores, node_influence, prune_graph

__all__ = [
    "AttributionGraph",
    "FrozenReplacement",
    "GraphNode",
    "PrunedGraph",
    "attribution_graph",
    "check_linear",
    "freeze_attention_and_norms",
    "frozen_replacement",
    "graph_json",
    "graph_scores",
    "node_influence",
    "prune_graph",
    "write_graph_files",
]
