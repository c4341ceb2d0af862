"""Cost subtotals per layer, per head or per named node, by the naming convention of ``circuits.names``.

``circuits.costs`` is core and knows no naming convention, so the
groupings that read names live here, above ``names``: each is a label
function for ``CircuitCost.grouped``/``table(label=...)``.  A node named in
the convention with a layer starts that layer's group (a head branch, its
head's); every other node joins the group of the first parent the walk from
the root reaches it through, so the residual stream of layer 0 found below
layer 1's norm still counts for layer 0.
"""

from __future__ import annotations

from typing import Callable, Iterable

from circuits import names
from circuits.costs import CircuitCost, cost
from circuits.errors import CircuitError
from circuits.nodes import Circuit

__all__ = ["GROUPINGS", "by_head", "by_layer", "by_node", "cost_table"]


def by_layer(node: Circuit) -> str | None:
    """``'layer N'`` for a node whose name (in the convention) has a layer; None otherwise."""
    name = names.parse(node.name)
    return None if name is None or name.layer is None else f"layer {name.layer}"


def by_head(node: Circuit) -> str | None:
    """``'layer N head H'`` (``heads H-K`` for a group) for a head branch, ``'layer N'`` for another layer name."""
    name = names.parse(node.name)
    if name is None or name.layer is None:
        return None
    if name.kind != "head":
        return f"layer {name.layer}"
    first, last = name.heads
    return f"layer {name.layer} head {first}" if first == last else f"layer {name.layer} heads {first}-{last}"


def by_node(node: Circuit) -> str | None:
    """A group per name (nodes sharing a name, as every head's ``a.q`` does, are one); unnamed nodes count for
    their nearest named parent."""
    return node.name


GROUPINGS: dict[str, Callable[[Circuit], str | None]] = {"layer": by_layer, "head": by_head, "node": by_node}


def cost_table(circuit: Circuit | Iterable[Circuit], depth: int = 2, by: str | None = None) -> str:
    """``cost(circuit).table``: per subtree to ``depth``, or with ``by`` ('layer', 'head', 'node') per group."""
    if by is not None and by not in GROUPINGS:
        raise CircuitError(f"cost_table: by must be one of {', '.join(GROUPINGS)} or None, got {by!r}")
    result: CircuitCost = cost(circuit)
    return result.table(depth=depth, label=None if by is None else GROUPINGS[by])
