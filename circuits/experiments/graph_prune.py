"""Pruning an attribution graph by node and edge influence, as circuit-tracer's ``prune_graph`` does.

An attribution graph is an adjacency matrix ``A[target, source]`` of direct effects over nodes
in circuit-tracer's order: ``[features, error nodes, token embeddings, logits]`` (the logits
last, the embeddings just before them).  A node's influence is how much of the logits (weighted
by their probabilities) flows through it: with ``N`` the absolute adjacency, each row normalized
to sum 1, the influence is ``w @ (N + N^2 + ...)``, the series ``w @ ((I - N)^-1 - I)`` summed
until a term is zero (``N`` is nilpotent: the graph is acyclic).  Nodes holding ``node_threshold``
of the total influence are kept, then edges holding ``edge_threshold`` of the edge influence in
the graph of kept nodes; features and error nodes left without a kept outgoing edge, and features
without a kept incoming one, are dropped until none is.  Embeddings and logits are always kept.

These are pure functions of the matrix, so they do not depend on how it was computed;
tests/test_graph_prune.py checks them against circuit-tracer 0.5.0 (tests/data/circuit_tracer).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from circuits.errors import ExperimentError

__all__ = ["PrunedGraph", "graph_scores", "node_influence", "prune_graph"]


class PrunedGraph(NamedTuple):
    """``prune_graph``'s result: circuit-tracer's ``PruneResult`` and the influences it came from."""

    node_mask: torch.Tensor  #: ``[n]`` bool, the nodes kept
    edge_mask: torch.Tensor  #: ``[n, n]`` bool, ``[target, source]``, the edges kept
    cumulative_scores: torch.Tensor  #: ``[n]``: each node's share of the influence, cumulated in rank order
    influence: torch.Tensor  #: ``[n]``: each node's influence on the weighted logits (before pruning)


def prune_graph(
    adjacency: Any,
    logit_probabilities: Any,
    *,
    n_features: int,
    n_tokens: int,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
) -> PrunedGraph:
    """The nodes and edges circuit-tracer's ``prune_graph`` keeps (its defaults: 0.8 and 0.98).

    ``adjacency``: ``[n, n]`` direct effects, ``[target, source]``, nodes ordered ``[n_features
    features, error nodes, n_tokens embeddings, logits]``; ``logit_probabilities``: one weight per
    logit node (the last ``len(logit_probabilities)`` nodes).  ``cumulative_scores[i]`` is the share
    of the total influence held by node ``i`` and every node ranked above it (what circuit-tracer's
    graph JSON shows as a node's ``influence``)."""
    matrix, weights = _checked("prune_graph", adjacency, logit_probabilities, n_features, n_tokens)
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        _check_fraction(name, value)
    influence = _series(_normalized(matrix), weights)
    node_mask = influence >= _threshold(influence, node_threshold, "node influence")
    inner = matrix.shape[0] - n_tokens - len(logit_probabilities)  # features and error nodes
    node_mask[inner:] = True
    pruned = matrix.clone()
    pruned[~node_mask] = 0
    pruned[:, ~node_mask] = 0
    normalized = _normalized(pruned)
    scores = normalized * (_series(normalized, weights) + weights)[:, None]
    edge_mask = scores >= _threshold(scores.flatten(), edge_threshold, "edge influence")
    _drop_dangling(node_mask, edge_mask, inner, n_features)
    ranked, order = torch.sort(influence, descending=True)
    cumulative = torch.zeros_like(influence)
    cumulative[order] = torch.cumsum(ranked, dim=0) / torch.sum(ranked)
    return PrunedGraph(node_mask, edge_mask, cumulative, influence)


def node_influence(adjacency: Any, logit_probabilities: Any) -> torch.Tensor:
    """Each node's influence on the logits, weighted by ``logit_probabilities`` (the last nodes):
    ``w @ (N + N^2 + ...)`` with ``N`` the row-normalized absolute adjacency."""
    matrix, weights = _checked("node_influence", adjacency, logit_probabilities, 0, 0)
    return _series(_normalized(matrix), weights)


def graph_scores(adjacency: Any, logit_probabilities: Any, *, n_features: int, n_tokens: int):
    """circuit-tracer's ``compute_graph_scores``: ``(replacement, completeness)``.

    Replacement: the embeddings' share of the influence the embeddings and error nodes have;
    completeness: the share of each node's normalized input that is not from error nodes, averaged
    with weights influence + logit probability.  Both 1 when no error node matters."""
    matrix, weights = _checked("graph_scores", adjacency, logit_probabilities, n_features, n_tokens)
    n_logits = len(logit_probabilities)
    token_start = matrix.shape[0] - n_logits - n_tokens
    normalized = _normalized(matrix)
    influence = _series(normalized, weights)
    tokens = influence[token_start : token_start + n_tokens].sum()
    errors = influence[n_features:token_start].sum()
    non_error = 1 - normalized[:, n_features:token_start].sum(dim=-1)
    output = influence + weights
    return (tokens / (tokens + errors)).item(), ((non_error * output).sum() / output.sum()).item()


def _normalized(matrix: torch.Tensor) -> torch.Tensor:
    """``|A|`` with each row divided by its sum (circuit-tracer's ``normalize_matrix``)."""
    absolute = matrix.abs()
    return absolute / absolute.sum(dim=1, keepdim=True).clamp(min=1e-10)


def _series(normalized: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``w @ N + w @ N^2 + ...`` until a term is exactly zero, as circuit-tracer sums it.  A nilpotent
    ``[n, n]`` matrix gets there within n terms; one that does not has a cycle."""
    term = weights @ normalized
    total = term.clone()
    for _ in range(normalized.shape[0]):
        if not term.any():
            return total
        term = term @ normalized
        total += term
    raise ExperimentError(
        "the adjacency has a cycle (the influence series does not end): an attribution graph's "
        "edges run from earlier nodes to later ones only"
    )


def _threshold(scores: torch.Tensor, fraction: float, what: str) -> torch.Tensor:
    """The score at which the descending scores first hold ``fraction`` of their sum (``find_threshold``)."""
    ranked = torch.sort(scores, descending=True).values
    total = torch.sum(ranked)
    if not total > 0:
        raise ExperimentError(
            f"prune_graph: the {what} is zero everywhere (no path from any node to a logit of positive "
            "probability): there is nothing to keep a fraction of"
        )
    index = int(torch.searchsorted(torch.cumsum(ranked, dim=0) / total, fraction).item())
    return ranked[min(index, len(ranked) - 1)]


def _drop_dangling(node_mask: torch.Tensor, edge_mask: torch.Tensor, inner: int, n_features: int) -> None:
    """Drop (in place) feature and error nodes with no kept outgoing edge, and features with no kept
    incoming edge, with their edges, until none is left (each drop may strand others)."""
    before = node_mask.clone()
    node_mask[:inner] &= edge_mask[:, :inner].any(0)
    node_mask[:n_features] &= edge_mask[:n_features].any(1)
    while not torch.equal(node_mask, before):
        before.copy_(node_mask)
        edge_mask[~node_mask] = False
        edge_mask[:, ~node_mask] = False
        node_mask[:inner] &= edge_mask[:, :inner].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)


def _check_fraction(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ExperimentError(f"prune_graph: {name} must be a number in [0, 1], got {value!r}")


def _checked(what: str, adjacency: Any, logit_probabilities: Any, n_features: Any, n_tokens: Any):
    """The adjacency as a float tensor and the logit weights spread over its nodes, every argument checked
    (``what``: the function, for the messages)."""
    matrix = _tensor(what, "adjacency", adjacency)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise ExperimentError(f"{what}: adjacency must be a square [n, n] matrix, got {list(matrix.shape)}")
    probabilities = _tensor(what, "logit_probabilities", logit_probabilities).to(matrix.dtype)
    if probabilities.ndim != 1 or len(probabilities) < 1:
        raise ExperimentError(
            f"{what}: logit_probabilities must be a 1-D tensor of at least one weight, got "
            f"{list(probabilities.shape)}"
        )
    if bool((probabilities < 0).any()):
        raise ExperimentError(f"{what}: logit_probabilities must not be negative")
    for name, value in (("n_features", n_features), ("n_tokens", n_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ExperimentError(f"{what}: {name} must be an int >= 0, got {value!r}")
    n = matrix.shape[0]
    if n_features + n_tokens + len(probabilities) > n:
        raise ExperimentError(
            f"{what}: n_features={n_features} + n_tokens={n_tokens} + {len(probabilities)} logits "
            f"(logit_probabilities) is more than the adjacency's {n} nodes"
        )
    weights = torch.zeros(n, dtype=matrix.dtype, device=matrix.device)
    weights[n - len(probabilities) :] = probabilities.to(matrix.device)
    return matrix, weights


def _tensor(what: str, name: str, value: Any) -> torch.Tensor:
    """``value`` as a floating tensor (float32 unless it is already floating), finite, or refused naming it."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ExperimentError(f"{what}: {name} is not a tensor of numbers: {error}") from None
    if not tensor.is_floating_point():
        if tensor.dtype == torch.bool or tensor.is_complex():
            raise ExperimentError(f"{what}: {name} must hold real numbers, got {tensor.dtype}")
        tensor = tensor.to(torch.float32)
    if not bool(torch.isfinite(tensor).all()):
        raise ExperimentError(f"{what}: {name} holds a NaN or infinite value")
    return tensor
