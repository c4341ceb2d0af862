"""Moving a Concat through the node above it: ``pull_concat`` up, ``push_down_concat`` down.

Pulling makes every piece of a Concat (one position of the residual stream,
say) carry its own copy of the computation above it, so that a hypothesis
or a patch can name that position's computation alone; pushing down undoes
it once the per-piece nodes are no longer needed.  The semantics follow
rust_circuit's ``einsum_pull_concat``, ``add_pull_concat`` and
``generalfunction_pull_concat``; the result of either direction keeps the
name of the node rewritten, while the per-piece nodes (and the Concats
moved through) are unnamed.
"""

from __future__ import annotations

from typing import Any

from circuits.nodes import Add, Circuit, Concat, Einsum, GeneralFunction, Index
from circuits.passes.concat import slice_along


def _batch_axis(function: GeneralFunction, axis: int, input_shape: tuple) -> bool:
    """Whether ``axis`` of the one-input ``function`` is a batch axis: the output along it
    is the input along it, computed independently, so a Concat there commutes with it."""
    kept = function.spec.num_non_batchable_output_dims
    rank = len(function.shape)
    return kept is not None and axis < rank - kept and len(input_shape) == rank


def _pull_function(node: GeneralFunction) -> Circuit:
    child = node.children[0]
    if not _batch_axis(node, child.axis, child.shape):
        return node
    pieces = [GeneralFunction(piece, spec=node.spec) for piece in child.children]
    return Concat(*pieces, axis=child.axis, name=node.name)


def _pull_add(node: Add) -> Circuit:
    concat = next(c for c in node.children if isinstance(c, Concat))
    if any(c.shape != node.shape for c in node.children):
        return node  # broadcasting operands would need their own split; left alone
    axis, starts = concat.axis, 0
    pieces = []
    for piece in concat.children:
        stop = starts + piece.shape[axis]
        operands = [piece if c is concat else slice_along(c, axis, starts, stop) for c in node.children]
        pieces.append(Add(*operands))
        starts = stop
    return Concat(*pieces, axis=axis, name=node.name)


def _sizes(concat: Concat) -> list[int]:
    return [c.shape[concat.axis] for c in concat.children]


def _einsum_operand_piece(
    child: Circuit, axes: tuple, letter: int, sizes: list, i: int, start: int
) -> Circuit:
    """Operand ``child`` restricted to piece ``i`` (``start``, ``sizes[i]`` long) of ``letter``:
    itself without the letter, the aligned piece of a Concat split the same way on it, else sliced."""
    if letter not in axes:
        return child
    aligned = isinstance(child, Concat) and axes[child.axis] == letter and axes.count(letter) == 1
    if aligned and _sizes(child) == sizes:
        return child.children[i]
    index = tuple(slice(start, start + sizes[i]) if a == letter else slice(None) for a in axes)
    return Index(child, index)


def _pull_einsum(node: Einsum) -> Circuit:
    """One Einsum per piece of the first Concat operand: concatenated when its letter is kept,
    added (partial sums of the contraction) when it is summed."""
    position = next(i for i, c in enumerate(node.children) if isinstance(c, Concat))
    concat, axes = node.children[position], node.operand_axes[position]
    letter = axes[concat.axis]
    if axes.count(letter) != 1:
        return node  # a diagonal across the joined axis: the pieces are not square
    sizes, start, pieces = _sizes(concat), 0, []
    for i, size in enumerate(sizes):
        operands = [
            (_einsum_operand_piece(child, child_axes, letter, sizes, i, start), child_axes)
            for child, child_axes in zip(node.children, node.operand_axes)
        ]
        pieces.append(Einsum(*operands, out_axes=node.out_axes))
        start += size
    if letter in node.out_axes:
        return Concat(*pieces, axis=node.out_axes.index(letter), name=node.name)
    return Add(*pieces, name=node.name)


def pull_concat_once(node: Circuit) -> Circuit:
    """``node`` as a Concat (or, for a summed Einsum letter, an Add) of per-piece nodes, so each
    piece's computation can be named and rewritten alone; other nodes are returned unchanged.

    Handled: an elementwise (or batchable along the axis) one-input function
    of a Concat; an Add whose operands all have its shape and one of which is
    a Concat; an Einsum with a Concat operand.  For the Einsum, the first
    Concat operand is pulled: every other operand carrying its letter is
    sliced to each piece's span (or, if it is a Concat split the same way on
    that letter, gives its own piece).  A Concat operand whose letter repeats
    in its own axes (a diagonal) is left alone.
    """
    if isinstance(node, GeneralFunction) and len(node.children) == 1 and isinstance(node.children[0], Concat):
        return _pull_function(node)
    if isinstance(node, Add) and any(isinstance(c, Concat) for c in node.children):
        return _pull_add(node)
    if isinstance(node, Einsum) and any(isinstance(c, Concat) for c in node.children):
        return _pull_einsum(node)
    return node


def pull_concat(circuit: Circuit, traversal: Any = True) -> Circuit:
    """Every function, Add or Einsum that ``traversal`` finds moved inside the Concat below it (bottom-up)."""
    return circuit.update(traversal, pull_concat_once)
