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
value.  The pushed index stops at that leaf (or higher, at the stream the last layer reads), so the
last position's path still reads the patched node, and nothing below the node is recomputed (its
value is all the layers above need).
"""

from __future__ import annotations

from numbers import Real
from typing import Any, Sequence

import torch

from circuits.transformer import names
from circuits.rewriting.batching import expand
from circuits.evaluation.cache import Evaluator
from circuits.errors import ExperimentError
from circuits.experiments import causal_suffix
from circuits.experiments.metrics import Metric, find
from circuits.transformer.points import Point, resolve_points
from circuits.rewriting.matching import get
from circuits.core.nodes import Array, Circuit
from circuits.rewriting.rewrite import replace
from circuits.core.traversal import unique_nodes

__all__ = ["PatchRun", "first_change", "measure_all", "model_output"]


class PatchRun:
    """Measures patches of the node at ``key`` (a ``Point``) of one circuit.

    ``clean`` and ``corrupted`` are the model circuit on the clean and on the corrupted inputs,
    evaluated on ``device`` (None: where their Arrays are; the patched values are made there too);
    ``metric`` a ``Metric`` or a function of the logits tensor ``[B, S, V]`` (of an encoder's output,
    its root, where the circuit has no logits: ``model_output``); ``evaluator`` keeps
    what every chunk reads (the corrupted layers below the node, for instance).  On a causal
    circuit, a chunk whose patches all sit at positions ``>= p`` recomputes positions ``>= p``
    only (``causal_suffix``), and no chunk recomputes the positions before ``first_change``, the
    first at which the node's clean and corrupted values differ: a patch there writes the numbers
    already there (an IOI prompt corrupted at its repeated name changes nothing before it).
    """

    def __init__(
        self,
        clean: Circuit,
        corrupted: Circuit,
        key: tuple,
        metric: Any,
        evaluator: Evaluator,
        device: torch.device | None = None,
    ):
        self.evaluator, self.metric, self.device = evaluator, metric, device
        node = _layer_node(corrupted, key)
        self.clean_value = evaluator.evaluate(resolve_points(clean, [key])[key], device=device)
        self.corrupted_value = evaluator.evaluate(node, device=device)
        self.leaf = Array(self.corrupted_value, name=f"patch.{key[0]}")
        self.leafed = replace(corrupted, {node: self.leaf})
        self.measured = self._measured(self.leafed)
        self.shared = {n.hash for n in unique_nodes([self.measured])}
        self.prefixes = (
            _block_values(corrupted, key[1], evaluator, device)
            if causal_suffix.is_causal(corrupted)
            else None
        )
        self.first_change = first_change(self.clean_value, self.corrupted_value) if self.prefixes else 0

    def _measured(self, circuit: Circuit) -> Circuit:
        if isinstance(self.metric, Metric):
            return self.metric.circuit(circuit)
        return model_output(circuit)

    def values(self, indices: Sequence[tuple], first_position: int = 0) -> list[float]:
        """The metric with ``patched[index] = clean[index]`` for each index, evaluated as one batch.

        ``first_position``: no index patches a position before it (0: not known)."""
        if not indices:
            return []
        patched = self.corrupted_value.expand(len(indices), *self.corrupted_value.shape).clone()
        for row, index in zip(patched, indices):
            row[index] = self.clean_value[index]
        measured = self.measured
        first_position = max(first_position, self.first_change)
        if first_position > 0 and self.prefixes:
            measured = self._measured(causal_suffix.from_position(self.leafed, first_position, self.prefixes))
        batched = expand(measured, {self.leaf: Array(patched, name=self.leaf.name)})
        with torch.no_grad():
            value = self.evaluator.evaluate(batched, device=self.device, store=self._reused)
        if batched.rank == measured.rank:
            # no patch axis: the measured circuit does not read the patched node (every patch lies
            # after the measured position on a causal model), so each patch leaves the metric as it is
            return [self._number(value)] * len(indices)
        return [self._number(one) for one in value]

    def _number(self, value: torch.Tensor) -> float:
        """One patch's metric: the Metric's value, or the metric function's on the logits."""
        if isinstance(self.metric, Metric):
            return float(value)
        return _number(self.metric(value), self.metric)

    def _reused(self, node: Circuit) -> bool:
        """Keep only values every chunk reads (the unpatched part), not one chunk's batched ones."""
        return node.hash in self.shared


def model_output(circuit: Circuit) -> Circuit:
    """What a metric function reads: the logits ``'t.call'``, or in a circuit without them (an
    encoder) its root, the model's output (BERT's last hidden state or sentence embedding)."""
    if circuit.name != names.LOGITS and not circuit.are_any_found(names.LOGITS):
        return circuit
    return find(circuit, names.LOGITS, "patching grid")


def first_change(clean: torch.Tensor, corrupted: torch.Tensor) -> int:
    """The first position (axis -2, where every grid's node keeps its positions) at which the two
    values differ anywhere: before it they hold the same numbers (exactly; NaN counts as a change).
    The last position if they are equal throughout (every patch is then a no-op)."""
    if clean.shape != corrupted.shape or clean.ndim < 2:
        return 0
    differs = (clean != corrupted).movedim(-2, 0).reshape(clean.shape[-2], -1).any(dim=1)
    changed = differs.nonzero()
    return int(changed[0]) if len(changed) else clean.shape[-2] - 1


def _layer_node(circuit: Circuit, key: tuple) -> Circuit:
    try:
        return resolve_points(circuit, [key])[key]
    except ExperimentError as error:
        found = len(get(circuit, Point(key[0], key[1])))
        if found == 0:
            missing = "no MLP" if key[0].startswith("mlp") else f"no {key[0]!r} node in layer {key[1]}"
            raise ExperimentError(
                f"patching grid: {error}: the model has {missing}, so it has no {key[0]} grid"
            ) from None
        raise ExperimentError(
            f"{error}; a patching grid patches one node per layer (a head by its index on the head axis): "
            "give it the circuit before split_heads"
        ) from None


def _block_values(
    corrupted: Circuit, layer: int, evaluator: Evaluator, device: torch.device | None = None
) -> dict[str, torch.Tensor]:
    """The corrupted run's residual stream ``'b{l}'`` for every ``l >= layer`` (the stored prefixes)."""
    blocks = {}
    for node in unique_nodes([corrupted]):
        parsed = names.parse(node.name) if node.name is not None else None
        if parsed is not None and parsed.kind == "block" and parsed.layer >= layer:
            blocks[node.name] = node
    values = evaluator.evaluate_many(list(blocks.values()), device=device)
    return dict(zip(blocks, values))


def _number(value: Any, metric: Any) -> float:
    """A metric function's result as a float; anything but one number is an ExperimentError naming it."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value.item())
    if isinstance(value, Real) and not isinstance(value, bool):
        return float(value)
    shape = f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
    name = getattr(metric, "__name__", repr(metric))
    raise ExperimentError(
        f"patching grid: metric {name} gave a {type(value).__name__}{shape} for one patch's logits, not one "
        "number; return a scalar (e.g. a mean over the batch)"
    )


def runs(positions: Sequence[int], size: int, window: int) -> list[list[int]]:
    """Patch numbers grouped into runs of at most ``size`` patches spanning fewer than ``window`` positions.

    Sorted by position, so a run's patches share a high first position (a short causal suffix)."""
    grouped: list[list[int]] = []
    for number in sorted(range(len(positions)), key=positions.__getitem__):
        current = grouped[-1] if grouped else None
        if current is None or len(current) == size or positions[number] - positions[current[0]] >= window:
            grouped.append([number])
        else:
            current.append(number)
    return grouped


def measure_all(
    run: PatchRun, indices: list[tuple], positions: list[int], size: int, window: int
) -> list[float]:
    """Every index's metric (in the order given), ``size`` patches per evaluation; ``positions``:
    the first position each index patches, ``window``: how many positions one evaluation spans."""
    found: list[float] = [0.0] * len(indices)
    for numbers in runs(positions, size, window):
        first = positions[numbers[0]]
        for number, value in zip(numbers, run.values([indices[n] for n in numbers], first), strict=True):
            found[number] = value
    return found
