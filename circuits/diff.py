"""``diff(new, old)``: what a rewrite changed, as a unified diff of the printed text.

A rewrite returns a new circuit that shares every unchanged subtree, so the
printed forms of the circuit before and after differ only where it acted;
showing only those lines (with a little context) is the quickest way to
check that a rewrite did what was meant.  Core layer: only the printer.
"""

from __future__ import annotations

import difflib
import html

from circuits.nodes import Circuit

_GREEN, _RED, _CYAN, _RESET = "\x1b[32m", "\x1b[31m", "\x1b[36m", "\x1b[0m"
_HTML_COLOURS = {"+": "#1a7f37", "-": "#cf222e", "@": "#0969da"}


class CircuitDiff:
    """The diff lines of two circuits; ``str`` is plain text, notebooks show it coloured.

    Kept as lines so that the same diff can be printed plainly, with ANSI
    colours, or as HTML without recomputing it.  Empty (falsy) when the
    printed circuits are the same.
    """

    def __init__(self, lines: list[str]):
        self.lines = lines

    def __bool__(self) -> bool:
        return bool(self.lines)

    def __str__(self) -> str:
        return "\n".join(self.lines)

    def __repr__(self) -> str:
        return str(self)

    def colored(self) -> str:
        """The text with ANSI colours: added lines green, removed red, hunk headers cyan."""
        colours = {"+": _GREEN, "-": _RED, "@": _CYAN}
        out = []
        for line in self.lines:
            colour = colours.get(line[:1]) if not line.startswith(("+++", "---")) else None
            out.append(f"{colour}{line}{_RESET}" if colour else line)
        return "\n".join(out)

    def _repr_html_(self) -> str:
        """The diff as a coloured ``<pre>`` block, for Jupyter."""
        rows = []
        for line in self.lines:
            colour = _HTML_COLOURS.get(line[:1]) if not line.startswith(("+++", "---")) else None
            text = html.escape(line)
            rows.append(f'<span style="color:{colour}">{text}</span>' if colour else text)
        return '<pre style="font-family:monospace">' + "\n".join(rows) + "</pre>"


def circuit_diff(new: Circuit, old: Circuit, *, context: int = 3) -> CircuitDiff:
    """The unified diff from ``old``'s printed text to ``new``'s, as a ``CircuitDiff``."""
    lines = difflib.unified_diff(
        old.repr().splitlines(), new.repr().splitlines(), "old", "new", n=context, lineterm=""
    )
    return CircuitDiff(list(lines))


def diff(new: Circuit, old: Circuit, *, color: bool = False, context: int = 3) -> str:
    """What changed from ``old`` to ``new``: a unified diff of their printed text ("" if none).

    ``color=True`` adds ANSI colours for a terminal (+ green, - red).  For a
    notebook, display ``circuit_diff(new, old)``, which renders as HTML.
    """
    result = circuit_diff(new, old, context=context)
    return result.colored() if color else str(result)
