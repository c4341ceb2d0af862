"""``edge_roc``: how well an edge scoring separates a circuit's true edges from the rest.

Circuit discovery is checked against models whose circuit is known (tracr's compiled programs,
docs/discovery.md "Ground truth"): every edge gets a score (``EdgeScores`` of ``edge_attribution``,
or any mapping from edge name to a number: ACDC's kept edges as 1 and 0, a patching effect), the
true edges are the positives, every other scored edge a negative, and the area under the ROC curve
is the probability that a true edge outscores a false one, ties counting one half (the
Mann-Whitney U statistic over the number of pairs).  Scores are compared by absolute value by
default (``absolute=False``: as given): an edge that lowers the metric matters as much as one
that raises it.  ``atol``: scores of at most that size count as 0 (tied), so that float dust
(an EAP score of 1e-34 through a saturated softmax) does not rank a true edge above the exact
zeros of the edges that carry nothing.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from circuits.errors import ExperimentError

__all__ = ["EdgeROC", "edge_roc", "edge_roc_auc"]


@dataclasses.dataclass(frozen=True)
class EdgeROC:
    """``auc``; ``ranks``: each true edge's rank among all scored edges (1 is the highest score,
    tied edges share the mean of their ranks); ``fpr``/``tpr``: the curve, one point per distinct
    score from the highest down, from (0, 0) to (1, 1); ``n_true``, ``n_false``."""

    auc: float
    ranks: dict[str, float]
    fpr: tuple[float, ...]
    tpr: tuple[float, ...]
    n_true: int
    n_false: int


def edge_roc(scores: Any, true_edges: Iterable[str], *, absolute: bool = True, atol: float = 0.0) -> EdgeROC:
    """The ROC of ``scores`` (``EdgeScores``, per-position scores summed, or ``{edge name: score}``)
    against ``true_edges`` (edge names).  A true edge that is not scored, a score that is not a
    finite number, a negative ``atol``, or no true or no false edge is an ``ExperimentError``."""
    if isinstance(atol, bool) or not isinstance(atol, (int, float)) or not 0 <= atol < math.inf:
        raise ExperimentError(f"edge_roc: atol must be a finite number >= 0, got {atol!r}")
    values = {name: 0.0 if abs(v) <= atol else v for name, v in _values(scores).items()}
    truth = [true_edges] if isinstance(true_edges, str) else list(true_edges)
    missing = [edge for edge in truth if edge not in values]
    if missing:
        raise ExperimentError(f"edge_roc: true_edges {missing[:4]} are not among the scored edges")
    positive = set(truth)
    n_true, n_false = len(positive), len(values) - len(positive)
    if not n_true or not n_false:
        raise ExperimentError(
            f"edge_roc: {n_true} true and {n_false} false edges; the ROC needs at least one of each"
        )
    keyed = {name: abs(v) if absolute else v for name, v in values.items()}
    ranks = _mid_ranks(keyed)  # ascending: 1 is the lowest score
    u = sum(ranks[name] for name in positive) - n_true * (n_true + 1) / 2
    fpr, tpr = _curve(keyed, positive, n_true, n_false)
    n = len(values)
    return EdgeROC(
        u / (n_true * n_false),
        {name: n + 1 - ranks[name] for name in truth},
        fpr,
        tpr,
        n_true,
        n_false,
    )


def edge_roc_auc(
    scores: Any, true_edges: Iterable[str], *, absolute: bool = True, atol: float = 0.0
) -> float:
    """``edge_roc(scores, true_edges, ...).auc``."""
    return edge_roc(scores, true_edges, absolute=absolute, atol=atol).auc


def _values(scores: Any) -> dict[str, float]:
    """``{edge name: score}`` from ``EdgeScores`` (summed over positions) or a mapping."""
    if hasattr(scores, "edges") and isinstance(getattr(scores, "scores", None), torch.Tensor):
        total = scores.scores.reshape(len(scores.edges), -1).sum(-1)
        pairs = [(edge.name, float(v)) for edge, v in zip(scores.edges, total.tolist())]
    elif isinstance(scores, Mapping):
        pairs = []
        for name, value in scores.items():
            try:
                pairs.append((name, float(value)))
            except (TypeError, ValueError):
                raise ExperimentError(f"edge_roc: scores[{name!r}] = {value!r} is not a number") from None
    else:
        raise ExperimentError(
            f"edge_roc: scores must be EdgeScores or a mapping from edge name to score, got {type(scores).__name__}"
        )
    bad = [name for name, value in pairs if not math.isfinite(value)]
    if bad:
        raise ExperimentError(f"edge_roc: the scores of {bad[:4]} are not finite")
    return dict(pairs)


def _mid_ranks(values: Mapping[str, float]) -> dict[str, float]:
    """Ascending ranks from 1, each group of equal values at the mean of the ranks it spans."""
    order = sorted(values, key=values.__getitem__)
    ranks: dict[str, float] = {}
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        for name in order[start : end + 1]:
            ranks[name] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _curve(values: Mapping[str, float], positive: set, n_true: int, n_false: int):
    """The ROC points, thresholds from the highest score down (tied edges enter together)."""
    fpr, tpr = [0.0], [0.0]
    tp = fp = 0
    order = sorted(values, key=values.__getitem__, reverse=True)
    for i, name in enumerate(order):
        tp, fp = (tp + 1, fp) if name in positive else (tp, fp + 1)
        if i + 1 == len(order) or values[order[i + 1]] != values[name]:
            fpr.append(fp / n_false)
            tpr.append(tp / n_true)
    return tuple(fpr), tuple(tpr)
