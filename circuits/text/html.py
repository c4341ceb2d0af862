"""Circuits as collapsible HTML, for notebooks (``Circuit._repr_html_``).

The same walk as the FORMAT.md printer, written as nested ``<details>``:

- a node with children, the first time it is met, is a ``<details>`` whose
  ``<summary>`` shows its reference (``'name'``, ``N 'name'`` or ``N``, as
  in the text), shape, variant and extra; it is open above ``open_depth``
  and collapsed below;
- a leaf, the first time it is met, is a ``<div>`` with the same line;
- every node written in full carries an ``id``; a later occurrence of it
  is a ``<div>`` holding a link ``<a href="#id">`` to that first one
  (browsers open the collapsed ``<details>`` around a link target).

Ids are ``c{root hash prefix}-{n}``, so two different circuits on one page
do not collide.  Every name and extra is HTML-escaped.  The walk is
iterative: depth only costs nesting in the output, never Python stack.
``max_nodes`` bounds the number of nodes written in full; past it the
writer stops and says how many were left out.  ``comment``, ``color`` and
``costs`` are the text printer's annotations (``cc.PrintOptions`` fields),
checked by the same functions.

``pretty_text`` is the plain-text display (``Circuit._repr_pretty_``, for
IPython): the FORMAT.md text, whole for a circuit of at most
``PRETTY_MAX_NODES`` distinct nodes, else cut below depth ``PRETTY_DEPTH``.
"""

from __future__ import annotations

import functools
import html
import io
from collections import defaultdict
from typing import Any, Iterable

from circuits.core.nodes import Circuit
from circuits.errors import PrintError
from circuits.evaluation.costs import cost
from circuits.text.print_options import NodeText, PrintOptions, spells_out_print_options
from circuits.text.printing import colour_of, comment_of, quote_name, repr_many
from circuits.core.shapes import format_shape
from circuits.core.traversal import unique_nodes

#: Styles kept inline (notebooks drop <style> in some front ends).
_BOX = "font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12px;line-height:1.45"
_CHILDREN = "margin-left:1.4em;border-left:1px solid #ccc;padding-left:0.5em"
_LEAF = "margin-left:1.05em"  # lines up with summaries, whose disclosure triangle takes this room
_SHAPE = "color:#6a737d"
_VARIANT = "color:#005cc5"
_EXTRA = "color:#6f42c1"
_COMMENT = "color:#6a737d;font-style:italic"
#: The CSS colour shown for each ``color=`` name (darker yellow and white, readable on white).
CSS_COLORS = {
    "black": "#24292f",
    "red": "#cf222e",
    "green": "#1a7f37",
    "yellow": "#9a6700",
    "blue": "#0969da",
    "magenta": "#a626a4",
    "cyan": "#1b7c83",
    "white": "#8c959f",
    "gray": "#6a737d",
}

#: IPython shows circuits of at most this many distinct nodes in full ...
PRETTY_MAX_NODES = 500
#: ... and bigger ones down to this depth, with "... N children not shown" below.
PRETTY_DEPTH = 8


def pretty_text(circuit: Circuit) -> str:
    """The FORMAT.md text shown by IPython: whole if small, else depth-limited (see the constants)."""
    small = len(unique_nodes([circuit])) <= PRETTY_MAX_NODES
    text = repr_many([circuit], depth=None if small else PRETTY_DEPTH)
    if not small:
        text += f"\n# (depth {PRETTY_DEPTH} of a big circuit; circuit.print() shows it all)"
    return text


#: The print options a page can show: the annotations (the layout is the page's own).
HTML_OPTIONS = ("comment", "color", "costs")


@functools.partial(spells_out_print_options, fields=HTML_OPTIONS)
def to_html(
    circuits: Circuit | Iterable[Circuit],
    options: PrintOptions | None = None,
    /,
    *,
    open_depth: int = 2,
    max_nodes: int = 5000,
    **overrides: Any,
) -> str:
    """A ``<div>`` showing ``circuits`` as nested ``<details>``; see the module docstring.

    ``options`` is a ``cc.PrintOptions`` (keywords are its fields and override it) setting
    only ``comment``, ``color`` or ``costs``, read as the text printer reads them: a node's
    comment follows its line written in full, grey, after ``#``; its colour tints that line
    and the links that repeat it.  Another option set is a PrintError naming it.
    """
    roots = [circuits] if isinstance(circuits, Circuit) else list(circuits)
    comment, color = _annotations(roots, PrintOptions.resolve(options, overrides, "to_html"))
    distinct_by_name: dict[str, set[bytes]] = defaultdict(set)
    everything = unique_nodes(roots)
    for node in everything:
        if node.name is not None:
            distinct_by_name[node.name].add(node.hash)
    prefix = "c" + (roots[0].hash.hex()[:10] if roots else "empty")

    ids: dict[bytes, tuple[str, str]] = {}  # node hash -> (id, escaped reference)
    out = io.StringIO()
    write = out.write
    write(f'<div class="circuits-circuit" style="{_BOX}">')
    next_serial = 0
    written = 0
    truncated = False
    # (node, level) to write, or (None, closing html) to close an element once its children are done
    stack: list[tuple[Circuit | None, int | str]] = [(root, 0) for root in reversed(roots)]
    while stack:
        node, level = stack.pop()
        if node is None:
            write(level)  # the closing tags
            continue
        if truncated:
            continue  # only the closing tags are still written
        known = ids.get(node.hash)
        if known is not None:
            anchor, reference, tint = known
            write(f'<div style="{_LEAF}"><a href="#{anchor}"{tint}>{reference}</a></div>')
            continue
        if written >= max_nodes:
            truncated = True
            write(
                f'<div style="{_LEAF}"><i>&hellip; stopped after {max_nodes} nodes '
                f"({len(everything) - written} more not shown; pass a larger max_nodes)</i></div>"
            )
            continue
        written += 1
        if node.name is None:
            reference = str(next_serial)
            next_serial += 1
        elif len(distinct_by_name[node.name]) > 1:
            reference = f"{next_serial} {quote_name(node.name)}"
            next_serial += 1
        else:
            reference = quote_name(node.name)
        reference = html.escape(reference)
        anchor = f"{prefix}-{written}"
        colour = None if color is None else colour_of(node, color)
        tint = "" if colour is None else f' style="color:{CSS_COLORS[colour]}"'
        ids[node.hash] = (anchor, reference, tint)
        line = _line(node, reference, "" if comment is None else comment_of(node, comment), tint)
        if not node.children:
            write(f'<div id="{anchor}" style="{_LEAF}">{line}</div>')
            continue
        is_open = " open" if level < open_depth else ""
        write(f'<details id="{anchor}"{is_open}><summary>{line}</summary><div style="{_CHILDREN}">')
        stack.append((None, "</div></details>"))
        stack.extend((child, level + 1) for child in reversed(node.children))
    write("</div>")
    return out.getvalue()


def _annotations(roots: list[Circuit], options: PrintOptions) -> tuple[NodeText | None, NodeText | None]:
    """``(comment, color)`` of ``options``; a PrintError naming an option a page does not show."""
    unused = [name for name in options.changed() if name not in HTML_OPTIONS]
    if unused:
        raise PrintError(
            f"to_html: the print option {unused[0]} is not shown on a page (it takes {', '.join(HTML_OPTIONS)})",
            unused[0],
        )
    return (cost(roots).comment if options.costs else options.comment), options.color


def _line(node: Circuit, reference: str, comment: str, tint: str) -> str:
    """A node's line: reference (tinted by its colour), shape, variant, extra, comment."""
    line = (
        f'<b{tint}>{reference}</b> <span style="{_SHAPE}">{format_shape(node.shape)}</span> '
        f'<span style="{_VARIANT}">{node.kind}</span>'
    )
    if node.extra:
        line += f' <span style="{_EXTRA}">{html.escape(node.extra)}</span>'
    if comment:
        line += f' <span style="{_COMMENT}"># {html.escape(comment)}</span>'
    return line
