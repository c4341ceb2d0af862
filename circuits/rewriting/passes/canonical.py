"""A canonical form: two rewrite routes to the same computation print the same.

``factor(distribute(x))`` and ``x``, or an Add and the same Add with its
operands permuted, are the same computation built in different ways.  To
compare such circuits by their structural hash, ``canonicalize`` rewrites
each into one representative: nested Adds and Einsums flattened, Add
operands and Einsum operands sorted by a key that does not depend on how
they were ordered, and einsum letters renamed in order of first appearance.
The names of Adds and Einsums are dropped by default, since they record the
route (``distribute`` names its terms, ``factor`` its inner sum), not the value.
"""

from __future__ import annotations

from circuits.core.nodes import Add, Circuit, Einsum
from circuits.rewriting.passes.algebra import flatten_add, flatten_einsum
from circuits.core.traversal import postorder


def canonicalize(circuit: Circuit, *, keep_names: bool = False) -> Circuit:
    """``circuit`` in canonical form, with the same value (up to float summation order).

    One bottom-up pass over the distinct nodes (no recursion, so any depth
    works); every node is rebuilt over its canonical children, and a node
    whose children did not change is shared, not copied.  ``keep_names``
    keeps the names of Adds and Einsums (then routes that name their
    intermediate nodes differently stay different).
    """
    done: dict[Circuit, Circuit] = {}
    for node in postorder(circuit):
        rebuilt = node.with_children([done[child] for child in node.children])
        done[node] = _canonical_node(rebuilt, keep_names)
    return done[circuit]


def _canonical_node(node: Circuit, keep_names: bool) -> Circuit:
    """One node whose children are already canonical, made canonical itself."""
    if isinstance(node, Add):
        return _canonical_add(node, keep_names)
    if isinstance(node, Einsum):
        return _canonical_einsum(node, keep_names)
    return node


def _canonical_add(add: Add, keep_names: bool) -> Circuit:
    """Flattened, operands sorted by hash: broadcasting addition is associative and commutative."""
    flat = flatten_add(add)
    children = sorted(flat.children, key=lambda child: child.hash)
    result = Add(*children, name=add.name if keep_names else None)
    return flat if result == flat else result


def _operand_key(child: Circuit, axes: tuple[int, ...], out_axes: tuple[int, ...]) -> tuple:
    """A sort key for an einsum operand that does not depend on the letters' names.

    An output letter is known by its place in the output; a summed letter only
    by being summed (so two operands that differ only in which summed letters
    they share tie, and keep their order: the sort is stable).
    """
    pattern = tuple(out_axes.index(a) if a in out_axes else -1 for a in axes)
    return (child.hash, pattern)


def _canonical_einsum(einsum: Einsum, keep_names: bool) -> Circuit:
    """Flattened, operands sorted (a product is commutative), letters renamed a, b, c, ...

    Letters are numbered in order of first appearance over the sorted
    operands and then the output, so the same product written with other
    letters or operand order gets the same einsum string.
    """
    flat = flatten_einsum(einsum)
    if not isinstance(flat, Einsum):
        return flat
    operands = sorted(
        zip(flat.children, flat.operand_axes), key=lambda op: _operand_key(op[0], op[1], flat.out_axes)
    )
    renamed: dict[int, int] = {}
    for axis in [a for _, axes in operands for a in axes] + list(flat.out_axes):
        renamed.setdefault(axis, len(renamed))
    new_operands = [(child, tuple(renamed[a] for a in axes)) for child, axes in operands]
    out_axes = tuple(renamed[a] for a in flat.out_axes)
    name = einsum.name if keep_names else None
    result = Einsum(*new_operands, out_axes=out_axes, name=name)
    return flat if result == flat else result
