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

from circuits.core.nodes import Add, Circuit, Concat, Einsum, GeneralFunction, Index
from circuits.rewriting.passes.concat import slice_along


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
    if axes.count(letter) != 1 or node.out_axes.count(letter) > 1:
        return node  # a diagonal across the joined axis: the pieces are not square (nor blocks of a Concat)
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
    in its own axes or in the output (a diagonal) is left alone.
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
    return circuit.update(traversal, pull_concat_once, assert_any_found=False)


def _concatenable(nodes: list[Circuit], axis: int) -> bool:
    """Whether ``nodes`` agree on every axis but ``axis`` (a Concat of them is well formed)."""
    first = nodes[0].shape
    return all(
        len(n.shape) == len(first)
        and all(a == b for i, (a, b) in enumerate(zip(n.shape, first)) if i != axis)
        for n in nodes
    )


def _push_function(node: Concat) -> Circuit:
    first = node.children[0]
    if not all(len(k.children) == 1 and k.spec == first.spec for k in node.children):
        return node
    inputs = [k.children[0] for k in node.children]
    if not _batch_axis(first, node.axis, inputs[0].shape) or not _concatenable(inputs, node.axis):
        return node
    return GeneralFunction(Concat(*inputs, axis=node.axis), spec=first.spec, name=node.name)


def _push_add(node: Concat) -> Circuit:
    count = len(node.children[0].children)
    if any(len(k.children) != count or any(c.shape != k.shape for c in k.children) for k in node.children):
        return node  # broadcasting operands: the pieces would need their own explicit broadcast
    columns = [[k.children[i] for k in node.children] for i in range(count)]
    return Add(*[Concat(*column, axis=node.axis) for column in columns], name=node.name)


def _push_einsum(node: Concat) -> Circuit:
    """The pieces' common Einsum over a Concat of each operand that carries the joined letter;
    every operand without it must be the same node in every piece."""
    first = node.children[0]
    if any(k.operand_axes != first.operand_axes or k.out_axes != first.out_axes for k in node.children):
        return node
    letter = first.out_axes[node.axis]
    if first.out_axes.count(letter) > 1:
        return node  # pieces of a diagonal embedding along the joined letter: blocks, not one einsum
    operands = []
    for position, axes in enumerate(first.operand_axes):
        column = [k.children[position] for k in node.children]
        if letter not in axes:
            if any(c != column[0] for c in column):
                return node
            operands.append((column[0], axes))
        elif axes.count(letter) > 1 or not _concatenable(column, axes.index(letter)):
            return node  # a diagonal block is not a Concat; a summed letter's size may differ
        else:
            operands.append((Concat(*column, axis=axes.index(letter)), axes))
    return Einsum(*operands, out_axes=first.out_axes, name=node.name)


_PUSH_DOWN = {GeneralFunction: _push_function, Add: _push_add, Einsum: _push_einsum}


def push_down_concat_once(node: Circuit) -> Circuit:
    """A Concat of pieces that all compute the same thing, as that computation over Concats of
    their inputs: the inverse of ``pull_concat_once`` where one exists, so that the per-piece
    copies a position split made can be merged again.  Other nodes are returned unchanged.

    Handled: pieces that are the same batchable one-input function (spec) of
    one child each, with the joined axis a batch axis; same-shape Adds with as
    many operands each (no broadcasting); Einsums with the same einsum string
    whose operands without the joined letter are the same node in every piece
    (the operands carrying it, once each, are concatenated).  The result keeps
    the Concat's name; the pieces' names are lost.
    """
    if not isinstance(node, Concat):
        return node
    kinds = {type(k) for k in node.children}
    push = _PUSH_DOWN.get(kinds.pop()) if len(kinds) == 1 else None
    return node if push is None else push(node)


def push_down_concat(circuit: Circuit, traversal: Any = True) -> Circuit:
    """Every Concat that ``traversal`` finds replaced by its pieces' common computation over
    Concats of their inputs (bottom-up), where ``push_down_concat_once`` can."""
    return circuit.update(traversal, push_down_concat_once, assert_any_found=False)
