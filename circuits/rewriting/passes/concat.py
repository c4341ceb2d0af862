"""Concat rewrites: split a node into position pieces, fuse and undo such splits.

Splitting a node into ``Concat(Index(node, 0:1), Index(node, 1:2), ...)``
gives each position (or span) a name of its own, so an experiment can ablate
or patch one position of the residual stream by name (issue 16, after
rust_circuit's ``concat_rewrite.rs``).  ``concat_elim_split`` undoes such a
split once it is no longer needed, ``concat_fuse`` flattens nested Concats
and ``concat_drop_size_zero`` drops empty pieces;
``circuits.rewriting.passes.concat_pull`` moves the nodes above a Concat
inside its pieces and back.

Like ``flatten_adds``, the whole-circuit passes rewrite every node they can
and return the circuit unchanged (the same object) when there is nothing to
do; every result keeps the value and shares every unchanged subtree.
"""

from __future__ import annotations

from typing import Any, Sequence

from circuits.errors import PassError
from circuits.core.nodes import Circuit, Concat, Index


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


def slice_along(node: Circuit, axis: int, start: int, stop: int, name: str | None = None) -> Index:
    """``node[..., start:stop]`` on ``axis``, every other axis whole: the piece form that
    ``concat_elim_split`` recognizes."""
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
    pieces = [slice_along(node, axis, a, b, n) for (a, b), n in zip(bounds, names)]
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
    return circuit.update(traversal, fuse_concat, assert_any_found=False)


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
    return circuit.update(traversal, elim_split, assert_any_found=False)


def drop_size_zero(node: Circuit) -> Circuit:
    """A Concat without its pieces of size 0 on its axis (they add nothing but nodes to walk).

    A Concat left with one piece stays a Concat of one, so both its name and
    the piece's still find it; if every piece is empty, the first is kept.
    """
    if not isinstance(node, Concat):
        return node
    kept = [c for c in node.children if c.shape[node.axis] > 0] or [node.children[0]]
    if len(kept) == len(node.children):
        return node
    return Concat(*kept, axis=node.axis, name=node.name)


def concat_drop_size_zero(circuit: Circuit, traversal: Any = True) -> Circuit:
    """Every Concat that ``traversal`` finds without its size-0 pieces."""
    return circuit.update(traversal, drop_size_zero, assert_any_found=False)
