"""A patching grid within ``memory_bytes`` (``memory_budget``): its cache and patches per run.

What a grid's layer holds besides the cache: the patched node's clean and corrupted values, the
corrupted residual stream of every layer from it up (``PatchRun``'s prefixes, on a causal model),
and one run's batch: per patch, the patched value and the values of the circuit above the node
(``cc.cost`` of the measured circuit with the node a leaf).  The smallest plan, one patch per run
and no cache, must fit before anything runs; then the cache gets at most half of what it leaves.
"""

from __future__ import annotations

from typing import Any, Iterable

import attrs
import torch

from circuits.core.nodes import Circuit
from circuits.core.traversal import unique_nodes
from circuits.evaluation.costs import cost
from circuits.experiments.memory_budget import evaluation_bytes, split
from circuits.experiments.metrics import Metric
from circuits.experiments.patch_batches import PatchRun, model_output
from circuits.transformer import names
from circuits.transformer.points import Point, resolve_points

__all__ = ["GridBudget", "grid_budget", "patches_that_fit"]


@attrs.frozen
class GridBudget:
    """``cache_bytes`` for the grid's Evaluator, ``batch_bytes`` for one run's patches,
    ``held_bytes``: the weights and inputs (the caller's, not counted), and the ``device`` it runs on."""

    cache_bytes: int
    batch_bytes: int
    held_bytes: int
    device: torch.device | None = None


def grid_budget(
    what: str,
    corrupted: Circuit,
    metric: Any,
    kind: str,
    layers: Iterable[int],
    budget: tuple[int, int],
    device: torch.device | None = None,
) -> GridBudget:
    """The budget of a grid of ``kind`` over ``layers`` of ``corrupted`` run on ``device``;
    ``budget``: ``(memory_bytes, cache_bytes)``.  ``CacheError`` when one patch per run does not
    fit in ``memory_bytes``."""
    memory_bytes, cache_bytes = budget
    measured = metric.circuit(corrupted) if isinstance(metric, Metric) else model_output(corrupted)
    costed, whole = cost(measured, device), cost(corrupted, device)
    held = costed.held_bytes
    points = [Point(kind, layer) for layer in layers]
    nodes = resolve_points(corrupted, points)
    node_bytes = max(whole[nodes[point]].out_bytes for point in points)
    first = min(point.layer for point in points)
    prefixes = sum(
        whole[node].out_bytes
        for node in unique_nodes([corrupted])
        if _block_layer(node) is not None and _block_layer(node) >= first
    )
    fixed = 2 * node_bytes + prefixes  # the node's two values, the stored residual streams
    single = evaluation_bytes(costed, held) + node_bytes  # one patch: its value and the run above
    for_what = "one evaluation of the circuit with one patch (and the patched node's values)"
    cache, rest = split(what, memory_bytes, single + fixed, cache_bytes, for_what)
    return GridBudget(cache, rest - fixed, held, device)


def patches_that_fit(run: PatchRun, budget: GridBudget, most: int) -> int:
    """How many of ``run``'s patches one evaluation can take within ``budget`` (at least 1, at most ``most``)."""
    per_patch = evaluation_bytes(
        cost(run.measured, budget.device), budget.held_bytes
    )  # the leaf counts: not held
    return max(1, min(most, budget.batch_bytes // max(1, per_patch)))


def _block_layer(node: Circuit) -> int | None:
    parsed = names.parse(node.name) if node.name is not None else None
    return parsed.layer if parsed is not None and parsed.kind == "block" else None
