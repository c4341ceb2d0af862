"""``discovered_circuit``: a set of kept edges as a plain circuit whose other edges are ablated.

The kept edges come from a list of names, from ``EdgeScores`` (the ``top`` n by absolute score, or
those whose absolute score reaches ``threshold``) or from an ``ACDCResult``.  The circuit is the
edge circuit with every receiver's mask set (1: kept, 0: ablated, reading the sender's zero, mean
or corrupted value as the edge circuit's ``ablation`` says), so it prints, saves and loads like any
circuit, and evaluates to the metric it states::

    found = ex.discovered_circuit(edges, scores, top=50, metric="kl", position=-1)
    found.metric                     # its KL from the full model
    found.save("circuit.circ")       # the circuit and its metric circuit
    circuit, metric = cc.load_many("circuit.circ")
    metric.evaluate()                # == found.metric
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable

import torch

from circuits.core.nodes import Circuit
from circuits.errors import ExperimentError
from circuits.evaluation import evaluate
from circuits.evaluation.cache import Evaluator
from circuits.experiments.discovery_metric import DiscoveryMetric, check_threshold
from circuits.experiments.edge_attribution import EdgeScores
from circuits.experiments.edges import EdgeCircuit
from circuits.text.saving import save

__all__ = ["DiscoveredCircuit", "discovered_circuit", "kept_edges"]


@dataclasses.dataclass(frozen=True)
class DiscoveredCircuit:
    """``circuit``: the model's root over the masked edge circuit; ``edges``: that ``EdgeCircuit``;
    ``kept``: the kept edge names (in ``EdgeCircuit.edges`` order) of ``n_edges``; ``metric``: its
    value of the metric ``metric_name``; ``metric_circuit``: that metric as a circuit over
    ``circuit`` (None for a function of the logits)."""

    circuit: Circuit
    edges: EdgeCircuit
    kept: tuple[str, ...]
    n_edges: int
    metric_name: str | None
    metric: float | None
    metric_circuit: Circuit | None

    def __repr__(self) -> str:
        shown = "" if self.metric is None else f", {self.metric_name} {self.metric:.6g}"
        return (
            f"DiscoveredCircuit({len(self.kept)} of {self.n_edges} edges, {self.edges.ablation} ablation"
            f"{shown})"
        )

    def print(self, **options: Any) -> None:
        """``circuit.print`` with each receiver's input annotated with its kept senders."""
        options.setdefault("comment", self.comment)
        self.circuit.print(**options)

    def comment(self, node: Circuit) -> str | None:
        """On ``'edges->r'``: ``'kept: b0.a.head1, embeds'`` (for ``print(comment=...)``)."""
        if node.name is None or not node.name.startswith("edges->"):
            return None
        receiver = node.name.removeprefix("edges->")
        mine = [name.partition("->")[0] for name in self.kept if name.partition("->")[2] == receiver]
        return f"kept: {', '.join(mine)}" if mine else "kept: none"

    def save(self, path) -> Any:
        """Write the circuit and (where there is one) its metric circuit to ``path``
        (``cc.load_many(path)`` gives them back, in that order)."""
        roots = [self.circuit] + ([] if self.metric_circuit is None else [self.metric_circuit])
        return save(roots, path)


def kept_edges(
    edges: EdgeCircuit, kept: Any, *, top: int | None = None, threshold: float | None = None
) -> tuple[str, ...]:
    """The names of the kept edges, in ``edges.edges`` order: ``kept`` is an iterable of edge names or
    an ``EdgeScores`` (with ``top=`` or ``threshold=``, by absolute score); every name must exist."""
    what = "discovered_circuit"
    if isinstance(kept, EdgeScores):
        names = _selected(kept, top, threshold, what)
    else:
        if top is not None or threshold is not None:
            raise ExperimentError(
                f"{what}: top= and threshold= select from EdgeScores, and kept is a {type(kept).__name__}"
            )
        if isinstance(kept, str) or not isinstance(kept, Iterable):
            raise ExperimentError(
                f"{what}: kept must be edge names, EdgeScores or an ACDCResult, got {kept!r}"
            )
        names = list(kept)
    chosen = set()
    for name in names:
        try:
            chosen.add(edges.edge(name).name)
        except ExperimentError as error:
            raise ExperimentError(f"{what}: kept names an edge that does not exist: {error}") from None
    return tuple(e.name for e in edges.edges if e.name in chosen)


def _selected(scores: EdgeScores, top: Any, threshold: Any, what: str) -> list[str]:
    if (top is None) == (threshold is None):
        raise ExperimentError(
            f"{what}: from EdgeScores, give one of top= (a count) or threshold= (an |score|)"
        )
    total = scores.scores.reshape(len(scores), -1).sum(-1).abs()
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or not 0 < top <= len(scores):
            raise ExperimentError(f"{what}: top must be an int in [1, {len(scores)}], got {top!r}")
        order = torch.argsort(total, descending=True, stable=True)[:top]
        return [scores.edges[i].name for i in order.tolist()]
    threshold = check_threshold(threshold, what)
    return [edge.name for edge, value in zip(scores.edges, total.tolist()) if value >= threshold]


def discovered_circuit(
    edges: Any,
    kept: Any = None,
    *,
    top: int | None = None,
    threshold: float | None = None,
    metric: Any = None,
    position: int | None = None,
    evaluator: Evaluator | None = None,
) -> DiscoveredCircuit:
    """The circuit of the ``kept`` edges of ``edges`` (an ``EdgeCircuit``, whose ``ablation`` the
    pruned edges read), every other edge ablated; see the module docstring.  ``edges`` may be an
    ``ACDCResult`` alone (its edges, kept set and metric).  ``metric`` (``"kl"`` with its
    ``position``, a ``Metric`` or a function of the logits; None: none stated) is evaluated on it.
    An empty selection is an ``ExperimentError``: no circuit is presented for it."""
    from circuits.experiments.acdc import ACDCResult

    if isinstance(edges, ACDCResult):
        result = edges
        if kept is not None or top is not None or threshold is not None:
            raise ExperimentError("discovered_circuit: an ACDCResult gives its own kept edges")
        edges, names = result.edges, result.kept
        spec = (
            result.metric_spec
            if metric is None
            else DiscoveryMetric(metric, edges, position=position, what="discovered_circuit")
        )
    elif isinstance(edges, EdgeCircuit):
        names = kept_edges(edges, kept, top=top, threshold=threshold)
        spec = (
            None
            if metric is None
            else DiscoveryMetric(metric, edges, position=position, what="discovered_circuit")
        )
    else:
        raise ExperimentError(
            f"discovered_circuit: edges must be an EdgeCircuit or an ACDCResult, got {type(edges).__name__}"
        )
    if not names:
        raise ExperimentError("discovered_circuit: kept selects no edge: an empty circuit is no result")
    masked = masked_edges(edges, names)
    value, metric_circuit = None, None
    if spec is not None:
        root = spec.root(masked.circuit)
        with torch.no_grad():  # as cc.evaluate (or the given evaluator) gives it
            value = spec.value(evaluate(root) if evaluator is None else evaluator.evaluate(root))
        metric_circuit = spec.saved_root(masked.circuit)
    return DiscoveredCircuit(
        masked.circuit,
        masked,
        names,
        len(edges.edges),
        None if spec is None else spec.name,
        value,
        metric_circuit,
    )


def masked_edges(edges: EdgeCircuit, kept: Iterable[str]) -> EdgeCircuit:
    """``edges`` with exactly the ``kept`` edges' mask entries at 1, every other at 0."""
    masks = {r.name: torch.zeros_like(r.mask.value) for r in edges.receivers}
    for name in kept:
        edge = edges.edge(name)
        masks[edge.receiver][edge.index] = 1
    return edges.with_masks(masks)
