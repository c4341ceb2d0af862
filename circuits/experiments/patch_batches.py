"""Evaluating many activation patches of one node at once: the engine under the patching grids.

A grid patches one node (one layer's ``resid_pre``, ``q``, ``attn_probs``, ...) in many ways: at
each position, each head, each (head, position).  Every way reads the same two values, the node on
the clean inputs and on the corrupted ones, so ``PatchRun`` evaluates them once and then, for a
chunk of patches, builds the patched values in torch (``corrupted.clone(); patched[index] =
clean[index]``, as TransformerLens's patch setters do) and stacks them on a new leading *patch*
axis.  The measured circuit, with the patched node made a leaf, is ``expand``-ed over that axis:
element ``i`` of the result is the metric with patch ``i``, and one evaluation runs every patch of
the chunk as one batch (big matmuls instead of many small runs).

Why a leaf: the metric is built, and its index pushed down (``logit_diff`` unembeds one
position), over the corrupted circuit in which the patched node is an Array of its corrupted
value.  The pushed index stops at that leaf, so the last position's path still reads the patched
node, and nothing below the node is recomputed (its value is all the layers above need).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from circuits import names
from circuits.batching import expand
from circuits.cache import Evaluator
from circuits.experiments.metrics import Metric, find
from circuits.experiments.points import resolve_points
from circuits.nodes import Array, Circuit
from circuits.rewrite import replace
from circuits.traversal import unique_nodes

__all__ = ["PatchRun", "measure_all"]


class PatchRun:
    """Measures patches of the node at ``key`` (a ``(kind, layer, head)`` point) of one circuit.

    ``clean`` and ``corrupted`` are the model circuit on the clean and on the corrupted inputs;
    ``metric`` a ``Metric`` or a function of the logits tensor ``[B, S, V]``; ``evaluator`` keeps
    what every chunk reads (the corrupted layers below the node, for instance).
    """

    def __init__(self, clean: Circuit, corrupted: Circuit, key: tuple, metric: Any, evaluator: Evaluator):
        self.evaluator = evaluator
        node = resolve_points(corrupted, [key])[key]
        self.clean_value = evaluator.evaluate(resolve_points(clean, [key])[key])
        self.corrupted_value = evaluator.evaluate(node)
        self.leaf = Array(self.corrupted_value, name=f"patch.{key[0]}")
        leafed = replace(corrupted, {node: self.leaf})
        if isinstance(metric, Metric):
            self.measured, self.reduce = metric.circuit(leafed), None
        else:
            self.measured, self.reduce = find(leafed, names.LOGITS, "patching grid"), metric
        self.shared = {n.hash for n in unique_nodes([self.measured])}

    def values(self, indices: Sequence[tuple]) -> list[float]:
        """The metric with ``patched[index] = clean[index]`` for each index, evaluated as one batch."""
        if not indices:
            return []
        patched = self.corrupted_value.expand(len(indices), *self.corrupted_value.shape).clone()
        for row, index in zip(patched, indices):
            row[index] = self.clean_value[index]
        batched = expand(self.measured, {self.leaf: Array(patched, name=self.leaf.name)})
        with torch.no_grad():
            value = self.evaluator.evaluate(batched, store=self._reused)
        if self.reduce is None:
            return [float(v) for v in value]
        return [_number(self.reduce(logits)) for logits in value]

    def _reused(self, node: Circuit) -> bool:
        """Keep only values every chunk reads (the unpatched part), not one chunk's batched ones."""
        return node.hash in self.shared


def _number(value: Any) -> float:
    return float(value.item() if isinstance(value, torch.Tensor) else value)


def measure_all(run: PatchRun, indices: list[tuple], chunk: int) -> list[float]:
    """Every index's metric, ``chunk`` patches per evaluation."""
    found: list[float] = []
    for start in range(0, len(indices), chunk):
        found.extend(run.values(indices[start : start + chunk]))
    return found
