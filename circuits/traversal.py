"""Iterative walks over a circuit DAG.

Circuits are thousands of nodes deep once a model is written out, so no
walk recurses: each keeps its own explicit stack.
"""

from __future__ import annotations

from typing import Iterable

from circuits.nodes import Circuit


def unique_nodes(roots: Iterable[Circuit]) -> list[Circuit]:
    """Every distinct node (by structure) reachable from ``roots``, in pre-order."""
    seen: set[bytes] = set()
    order: list[Circuit] = []
    stack = list(reversed(list(roots)))
    while stack:
        node = stack.pop()
        if node.hash in seen:
            continue
        seen.add(node.hash)
        order.append(node)
        stack.extend(reversed(node.children))
    return order


def postorder(roots: Iterable[Circuit]) -> list[Circuit]:
    """Distinct nodes, every child before its parents (a topological order)."""
    done: set[bytes] = set()
    order: list[Circuit] = []
    stack: list[tuple[Circuit, bool]] = [(root, False) for root in reversed(list(roots))]
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
