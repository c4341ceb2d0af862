"""Where a node sits in a model, and why a name finds nothing: hints a naming convention gives.

The matcher knows no naming convention, yet its messages read better with
one: ``get_unique`` says which layer and head each of several found nodes
belongs to (and lists them in that order), and a name that finds nothing
may only need ``split_heads`` first.  A higher layer that gives nodes such
names teaches the matcher here, when it is imported, as evaluation learns
kernels through ``KERNEL_MAKERS``: ``circuits.transformer`` registers the
transformer naming convention's hints (``import circuits`` imports it).

- ``PLACERS``: each ``placer(node, path)`` returns ``(layer, heads)`` for a
  node it can place, ``heads`` being ``(first, last)`` or None for the whole
  layer, else None; ``path`` is the node's path from the root, the node
  last.  The first answer wins.
- ``NO_MATCH_HINTS``: each ``hint(circuit, name)`` returns a sentence for
  a name that finds nothing in ``circuit`` (``''`` for none).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

from circuits.core.nodes import Circuit

__all__ = ["NO_MATCH_HINTS", "PLACERS", "Placement", "no_match_hints", "placement", "register"]

#: ``(layer, (first head, last head))``, or ``(layer, None)`` for a node of the whole layer.
Placement = Tuple[int, Optional[Tuple[int, int]]]

PLACERS: list[Callable[[Circuit, Sequence[Circuit]], "Placement | None"]] = []
NO_MATCH_HINTS: list[Callable[[Circuit, str], str]] = []


def register(
    *,
    placer: Callable[[Circuit, Sequence[Circuit]], Placement | None] | None = None,
    no_match: Callable[[Circuit, str], str] | None = None,
) -> None:
    """Add a placer and/or a no-match hint (each once, however often its layer registers it)."""
    if placer is not None and placer not in PLACERS:
        PLACERS.append(placer)
    if no_match is not None and no_match not in NO_MATCH_HINTS:
        NO_MATCH_HINTS.append(no_match)


def placement(node: Circuit, path: Sequence[Circuit] = ()) -> Placement | None:
    """The first registered placer's answer for ``node`` reached by ``path``, or None."""
    for placer in PLACERS:
        placed = placer(node, path)
        if placed is not None:
            return placed
    return None


def no_match_hints(circuit: Circuit, name: str) -> list[str]:
    """Every registered hint for ``name`` finding nothing in ``circuit`` (the empty ones left out)."""
    return [text for hint in NO_MATCH_HINTS if (text := hint(circuit, name))]
