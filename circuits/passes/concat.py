"""Concat rewrites: split a node into position pieces, fuse and undo such splits.

Splitting a node into ``Concat(Index(node, 0:1), Index(node, 1:2), ...)``
gives each position (or span) a name of its own, so an experiment can ablate
or patch one position of the residual stream by name (issue 16, after
rust_circuit's ``concat_rewrite.rs``).  ``concat_elim_split`` undoes such a
split once it is no longer needed, ``concat_fuse`` flattens nested Concats and
``pull_concat`` moves an elementwise function or an Add inside the pieces.

Like ``flatten_adds``, the whole-circuit passes rewrite every node they can
and return the circuit unchanged (the same object) when there is nothing to
do; every result keeps the value and shares every unchanged subtree.
"""

from __future__ import annotations

from typing import Any, Sequence

from circuits.errors import PassError
from circuits.nodes import Add, Circuit, Concat, GeneralFunction, Index


def _normal_axis(node: Circuit, axis: Any, rewrite: str) -> int:
    """``axis`` as a non-negative int, refusing one the node does not have."""
    rank = len(node.shape)
    if isinstance(axis, bool) or not isinstance(axis, int) or not -rank <= axis < rank:
        raise PassError(f"{rewrite}: axis {axis!r} is not an axis of {node.describe()} {list(node.shape)}")
    return axis % rank


def _section_bounds(node: Circuit, size: int, sections: Any) -> list[tuple[int, int]]:
    """(start, stop) of every piece, size-0 pieces included (the caller drops them)."""
    where = f"split_to_concat: {node.describe()} {list(node.shape)}"
    if isinstance(sections, int) and not isinstance(sections, bool):
        if sections <= 0:
            raise PassError(f"{where}: section size must be positive, got {sections}")
        return [(start, min(start + sections, size)) for start in range(0, size, sections)]
    try:
        sizes = [int(s) for s in sections]
    except (TypeError, ValueError):
        raise PassError(f"{where}: sections must be an int or a list of ints, got {sections!r}") from None
    if any(s < 0 for s in sizes) or sum(sizes) != size:
        raise PassError(
            f"{where}: section sizes {sizes} must be non-negative and sum to the axis size {size}"
        )
    bounds, start = [], 0
    for s in sizes:
        bounds.append((start, start + s))
        start += s
    return bounds


def _piece_name(node: Circuit, start: int, stop: int) -> str | None:
    if node.name is None:
        return None
    return f"{node.name}.at_pos{start}" if stop - start == 1 else f"{node.name}.at_{start}_{stop}"


def _slice_at(node: Circuit, axis: int, start: int, stop: int, name: str | None) -> Index:
    index = (slice(None, None),) * axis + (slice(start, stop),)
    return Index(node, index, name=name)


def split_to_concat(
    node: Circuit, axis: int, sections: int | Sequence[int], names: Sequence[str] | None = None
) -> Concat:
    """``node`` as a Concat of Index slices along ``axis``, so each piece can be named and rewritten.

    ``sections`` is a piece size (the last piece may be shorter) or a list of
    sizes summing to the axis size.  Size-0 pieces are dropped; ``names``, if
    given, has one name per remaining piece; otherwise a piece of ``'x'`` is
    named ``'x.at_pos3'`` (one position) or ``'x.at_2_5'`` (a span), and the
    Concat ``'x.split'``.  Raises ``PassError`` naming the node on a bad axis
    or sections.
    """
    if not isinstance(node, Circuit):
        raise PassError(f"split_to_concat: expected a circuit node, got {type(node).__name__} {node!r}")
    axis = _normal_axis(node, axis, "split_to_concat")
    bounds = [(a, b) for a, b in _section_bounds(node, node.shape[axis], sections) if b > a]
    if not bounds:
        raise PassError(f"split_to_concat: {node.describe()} has size 0 on axis {axis}; nothing to split")
    if names is None:
        names = [_piece_name(node, a, b) for a, b in bounds]
    elif isinstance(names, str) or len(names) != len(bounds):
        raise PassError(
            f"split_to_concat: {node.describe()}: got {names!r} as names for {len(bounds)} non-empty pieces"
        )
    pieces = [_slice_at(node, axis, a, b, n) for (a, b), n in zip(bounds, names)]
    return Concat(*pieces, axis=axis, name=None if node.name is None else f"{node.name}.split")


def fuse_concat(node: Circuit) -> Circuit:
    """One Concat with the Concats on the same axis directly under it inlined."""
    if not isinstance(node, Concat):
        return node
    if not any(isinstance(c, Concat) and c.axis == node.axis for c in node.children):
        return node
    operands = []
    for child in node.children:
        inline = isinstance(child, Concat) and child.axis == node.axis
        operands.extend(child.children if inline else (child,))
    return Concat(*operands, axis=node.axis, name=node.name)


def concat_fuse(circuit: Circuit, traversal: Any = True) -> Circuit:
    """Every Concat that ``traversal`` finds absorbs same-axis Concats under it (bottom-up)."""
    return circuit.update(traversal, fuse_concat)


def _slice_span(index_node: Circuit, axis: int) -> tuple[Circuit, int, int] | None:
    """(sliced node, start, stop) when ``index_node`` only slices ``axis``; else None."""
    if not isinstance(index_node, Index):
        return None
    size = index_node.node.shape[axis]
    for position, item in enumerate(index_node.index):
        if not isinstance(item, slice):
            return None
        if position != axis and (item.start is not None or item.stop is not None):
            return None
    item = index_node.index[axis]
    start = 0 if item.start is None else item.start + size if item.start < 0 else item.start
    stop = size if item.stop is None else item.stop + size if item.stop < 0 else item.stop
    return index_node.node, start, stop


def elim_split(node: Circuit) -> Circuit:
    """A Concat of in-order slices of one node covering its whole axis is that node."""
    if not isinstance(node, Concat):
        return node
    spans = [_slice_span(c, node.axis) for c in node.children]
    if any(s is None for s in spans):
        return node
    source = spans[0][0]
    expected = 0
    for sliced, start, stop in spans:
        if sliced != source or start != expected:
            return node
        expected = stop
    return source if expected == source.shape[node.axis] else node


def concat_elim_split(circuit: Circuit, traversal: Any = True) -> Circuit:
    """Every split (as ``split_to_concat`` makes) that ``traversal`` finds replaced by the node split."""
    return circuit.update(traversal, elim_split)


def _pull_function(node: GeneralFunction) -> Circuit:
    child = node.children[0]
    batch_rank = len(node.shape) - (node.spec.num_non_batchable_output_dims or 0)
    if node.spec.num_non_batchable_output_dims is None or child.axis >= batch_rank:
        return node
    if len(child.shape) != len(node.shape):
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
        operands = [piece if c is concat else _slice_at(c, axis, starts, stop, None) for c in node.children]
        pieces.append(Add(*operands))
        starts = stop
    return Concat(*pieces, axis=axis, name=node.name)


def pull_concat_once(node: Circuit) -> Circuit:
    """An elementwise one-input function of a Concat, or a same-shape Add with a Concat operand,
    as a Concat of per-piece nodes (so each piece's computation can be rewritten alone)."""
    if isinstance(node, GeneralFunction) and len(node.children) == 1 and isinstance(node.children[0], Concat):
        return _pull_function(node)
    if isinstance(node, Add) and any(isinstance(c, Concat) for c in node.children):
        return _pull_add(node)
    return node


def pull_concat(circuit: Circuit, traversal: Any = True) -> Circuit:
    """Every function or Add that ``traversal`` finds moved inside the Concat below it (bottom-up)."""
    return circuit.update(traversal, pull_concat_once)
