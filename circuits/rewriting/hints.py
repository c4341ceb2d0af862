"""Where a node sits in a model, why a name finds nothing, and what else names a spot: what a naming
convention teaches the matcher.

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
- ``MATCHER_FORMS``: ``{type: to_matcher}``, values that are matcher forms
  besides the generic ones: ``to_matcher(value)`` returns the Matcher or
  IterativeMatcher the value stands for (the transformer convention's
  ``Point(kind, layer, head)``).  ``Matcher(form)`` and ``as_iterative``
  convert them through ``matcher_form``, so every function that takes a
  matcher takes them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

from circuits.core.nodes import Circuit

__all__ = [
    "MATCHER_FORMS",
    "NO_MATCH_HINTS",
    "PLACERS",
    "Placement",
    "matcher_form",
    "no_match_hints",
    "placement",
    "register",
]

#: ``(layer, (first head, last head))``, or ``(layer, None)`` for a node of the whole layer.
Placement = Tuple[int, Optional[Tuple[int, int]]]

PLACERS: list[Callable[[Circuit, Sequence[Circuit]], "Placement | None"]] = []
NO_MATCH_HINTS: list[Callable[[Circuit, str], str]] = []
MATCHER_FORMS: dict[type, Callable[[Any], Any]] = {}


def register(
    *,
    placer: Callable[[Circuit, Sequence[Circuit]], Placement | None] | None = None,
    no_match: Callable[[Circuit, str], str] | None = None,
    matcher_form: tuple[type, Callable[[Any], Any]] | None = None,
) -> None:
    """Add a placer, a no-match hint and/or a matcher form ``(type, to_matcher)`` (each once,
    however often its layer registers it)."""
    if placer is not None and placer not in PLACERS:
        PLACERS.append(placer)
    if no_match is not None and no_match not in NO_MATCH_HINTS:
        NO_MATCH_HINTS.append(no_match)
    if matcher_form is not None:
        form_type, to_matcher = matcher_form
        MATCHER_FORMS[form_type] = to_matcher


def matcher_form(form: Any) -> Any:
    """The matcher a registered form stands for (``MATCHER_FORMS``), or ``form`` as it is."""
    for form_type, to_matcher in MATCHER_FORMS.items():
        if isinstance(form, form_type):
            return to_matcher(form)
    return form


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
