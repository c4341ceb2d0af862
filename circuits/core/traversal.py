"""Iterative walks over a circuit DAG.

Circuits are thousands of nodes deep once a model is written out, so no
walk recurses: each keeps its own explicit stack.
"""

from __future__ import annotations

from typing import Iterable, Union

from circuits.errors import NodeTypeError, shown
from circuits.core.nodes import Circuit, check_node

#: One circuit, or an iterable of them.
Roots = Union[Circuit, Iterable[Circuit]]


def _roots(roots: Roots, what: str) -> list[Circuit]:
    """``roots`` as a list of nodes: one circuit, or an iterable of them; ``NodeTypeError`` otherwise."""
    if isinstance(roots, Circuit):
        return [roots]
    if isinstance(roots, (str, bytes)) or not isinstance(roots, Iterable):
        raise NodeTypeError(
            f"{what}: takes a circuit or an iterable of circuits, got {type(roots).__name__} "
            f"{shown(repr(roots))}"
        )
    listed = list(roots)
    for position, root in enumerate(listed):
        check_node(root, f"{what}: root {position}")
    return listed


def unique_nodes(roots: Roots) -> list[Circuit]:
    """Every distinct node (by structure) reachable from ``roots`` (one circuit, or an iterable of
    them), in pre-order."""
    seen: set[bytes] = set()
    order: list[Circuit] = []
    stack = list(reversed(_roots(roots, "unique_nodes")))
    while stack:
        node = stack.pop()
        if node.hash in seen:
            continue
        seen.add(node.hash)
        order.append(node)
        stack.extend(reversed(node.children))
    return order


def postorder(roots: Roots) -> list[Circuit]:
    """Distinct nodes, every child before its parents (a topological order); ``roots`` as in
    ``unique_nodes``."""
    done: set[bytes] = set()
    order: list[Circuit] = []
    stack: list[tuple[Circuit, bool]] = [(root, False) for root in reversed(_roots(roots, "postorder"))]
    while stack:
        node, children_done = stack.pop()
        if node.hash in done:
            continue
        if children_done:
            done.add(node.hash)
            order.append(node)
            continue
        stack.append((node, True))
        stack.extend((child, False) for child in reversed(node.children) if child.hash not in done)
    return order
