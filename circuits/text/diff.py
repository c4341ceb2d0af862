"""``diff(new, old)``: what a rewrite changed, from the printed text of both circuits.

A rewrite returns a new circuit that shares every unchanged subtree, so the
printed forms of the circuit before and after differ only where it acted;
showing only those lines (with a little context) is the quickest way to
check that a rewrite did what was meant.  Core layer: only the printer.

Two views of the same ``difflib.SequenceMatcher`` comparison:

- ``view="unified"`` (the default): ``difflib.unified_diff``, ``-``/``+`` lines
  and ``@@`` hunk headers, as ``git diff`` prints it;
- ``view="side"``: two columns, old on the left and new on the right, one
  row per line, with a mark between them (``|`` changed, ``<`` only in old,
  ``>`` only in new); runs of unchanged lines longer than ``context`` are
  collapsed into one ``... N unchanged lines`` row.

Both are kept as data (lines or rows), so one diff prints plainly, with
ANSI colours (``colored()``), or as HTML in a notebook (``_repr_html_``)
without being computed again.
"""

from __future__ import annotations

import difflib
import html
import itertools
from typing import NamedTuple

from circuits.errors import PrintError
from circuits.core.nodes import Circuit

_GREEN, _RED, _CYAN, _RESET = "\x1b[32m", "\x1b[31m", "\x1b[36m", "\x1b[0m"
_HTML_COLOURS = {"+": "#1a7f37", "-": "#cf222e", "@": "#0969da"}
_HTML_BACKGROUNDS = {"old": "#ffebe9", "new": "#dafbe1"}
#: The views ``circuit_diff`` and ``diff`` offer.
VIEWS = ("unified", "side")
#: A narrower ``width`` leaves no room to read either column.
MIN_WIDTH = 20


class CircuitDiff:
    """The unified diff lines of two circuits; ``str`` is plain text, notebooks show it coloured.

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


class Row(NamedTuple):
    """One row of a side-by-side diff.

    ``mark`` is ``" "`` (the same line on both sides), ``"|"`` (changed),
    ``"<"`` (only in old), ``">"`` (only in new) or ``"..."`` (``skipped``
    unchanged lines collapsed); ``old`` and ``new`` are the texts (None on
    the side that has no line, and on both for a collapsed row).
    """

    mark: str
    old: str | None
    new: str | None
    skipped: int = 0


class SideBySideDiff:
    """A side-by-side diff: old | new, one ``Row`` per line; falsy when nothing changed.

    ``width`` (if given) is the width of the printed text: each column gets
    ``(width - 3) // 2`` characters and longer lines are cut, ending in
    ``…``.  Without it the left column is as wide as its longest line and
    nothing is cut.
    """

    def __init__(self, rows: list[Row], width: int | None = None):
        self.rows = rows
        self.width = width

    def __bool__(self) -> bool:
        return any(row.mark in "|<>" for row in self.rows)

    def __str__(self) -> str:
        return "\n".join(self._lines(colour=False))

    def __repr__(self) -> str:
        return str(self)

    def colored(self) -> str:
        """The text with ANSI colours: old sides of changes red, new sides green, collapsed rows cyan."""
        return "\n".join(self._lines(colour=True))

    def _column(self) -> int:
        if self.width is not None:
            return (self.width - 3) // 2
        return max((len(row.old) for row in self.rows if row.old is not None), default=0)

    def _lines(self, colour: bool) -> list[str]:
        if not self:
            return []
        column = self._column()
        lines = [f"{'old':<{column}}   new"]
        for row in self.rows:
            if row.mark == "...":
                text = f"... {row.skipped} unchanged line{'s' if row.skipped != 1 else ''}"
                lines.append(f"{_CYAN}{text}{_RESET}" if colour else text)
                continue
            old, new = row.old or "", row.new or ""
            if self.width is not None:
                old, new = _fit(old, column), _fit(new, column)
            old = old.ljust(column)
            if colour and row.old is not None and row.mark != " ":
                old = f"{_RED}{old}{_RESET}"
            if colour and row.new is not None and row.mark != " ":
                new = f"{_GREEN}{new}{_RESET}"
            lines.append(f"{old} {row.mark} {new}".rstrip())
        return lines

    def _repr_html_(self) -> str:
        """The diff as a two-column HTML table, changed cells tinted, for Jupyter."""
        cell = "padding:0 0.6em;white-space:pre;text-align:left;vertical-align:top"
        out = [
            '<table style="font-family:monospace;border-collapse:collapse">',
            f'<tr><th style="{cell}">old</th><th></th><th style="{cell}">new</th></tr>',
        ]
        for row in self.rows:
            if row.mark == "...":
                out.append(
                    f'<tr><td colspan="3" style="{cell};color:{_HTML_COLOURS["@"]}">'
                    f"&hellip; {row.skipped} unchanged lines</td></tr>"
                )
                continue
            cells = []
            for side, text in (("old", row.old), ("new", row.new)):
                tint = (
                    f";background:{_HTML_BACKGROUNDS[side]}" if row.mark != " " and text is not None else ""
                )
                cells.append(f'<td style="{cell}{tint}">{html.escape(text or "")}</td>')
            out.append(f"<tr>{cells[0]}<td>{html.escape(row.mark.strip())}</td>{cells[1]}</tr>")
        out.append("</table>")
        return "".join(out)


def _fit(text: str, column: int) -> str:
    """``text`` cut to ``column`` characters, its last one ``…`` when cut."""
    return text if len(text) <= column else text[: column - 1] + "…"


def side_by_side_rows(old: list[str], new: list[str], context: int = 3) -> list[Row]:
    """The rows of a side-by-side diff of two lists of lines (``difflib`` opcodes).

    A changed block pairs its old and new lines in order (``|``); the longer
    side's extra lines stand alone (``<`` or ``>``).  Unchanged lines more
    than ``context`` away from a change are collapsed into ``...`` rows, at
    the start and end too.
    """
    matcher = difflib.SequenceMatcher(None, old, new)
    if all(tag == "equal" for tag, *_ in matcher.get_opcodes()):
        return []
    rows: list[Row] = []
    shown = 0  # old lines before this one are shown or collapsed already
    for group in matcher.get_grouped_opcodes(context):
        if group[0][1] > shown:
            rows.append(Row("...", None, None, group[0][1] - shown))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                rows.extend(Row(" ", line, line) for line in old[i1:i2])
                continue
            for left, right in itertools.zip_longest(old[i1:i2], new[j1:j2]):
                mark = "|" if left is not None and right is not None else "<" if right is None else ">"
                rows.append(Row(mark, left, right))
        shown = group[-1][2]
    if shown < len(old):
        rows.append(Row("...", None, None, len(old) - shown))
    return rows


def _check_options(view: str, context: int, width: int | None) -> None:
    if view not in VIEWS:
        raise PrintError(f"diff view {view!r}: expected one of {', '.join(map(repr, VIEWS))}")
    if not isinstance(context, int) or isinstance(context, bool) or context < 0:
        raise PrintError(f"diff context={context!r}: expected a number of lines, 0 or more")
    if width is not None:
        if view != "side":
            raise PrintError("diff width= sets the columns of view='side'; the unified view has none")
        if not isinstance(width, int) or isinstance(width, bool) or width < MIN_WIDTH:
            raise PrintError(f"diff width={width!r}: expected a number of characters, {MIN_WIDTH} or more")


def circuit_diff(
    new: Circuit, old: Circuit, *, context: int = 3, view: str = "unified", width: int | None = None
) -> CircuitDiff | SideBySideDiff:
    """The diff from ``old``'s printed text to ``new``'s: a ``CircuitDiff`` (``view="unified"``)
    or a ``SideBySideDiff`` (``view="side"``, columns cut to ``width`` if given)."""
    _check_options(view, context, width)
    old_lines, new_lines = old.repr().split("\n"), new.repr().split("\n")
    if view == "side":
        return SideBySideDiff(side_by_side_rows(old_lines, new_lines, context), width)
    lines = difflib.unified_diff(old_lines, new_lines, "old", "new", n=context, lineterm="")
    return CircuitDiff(list(lines))


def diff(
    new: Circuit,
    old: Circuit,
    *,
    color: bool = False,
    context: int = 3,
    view: str = "unified",
    width: int | None = None,
) -> str:
    """What changed from ``old`` to ``new``, as text ("" if they print the same).

    ``view="unified"`` is a unified diff; ``view="side"`` puts old and new
    side by side (see ``SideBySideDiff``; ``width`` cuts its columns).
    ``color=True`` adds ANSI colours for a terminal (removed red, added
    green).  For a notebook, display ``circuit_diff(new, old, view=...)``,
    which renders as HTML.
    """
    result = circuit_diff(new, old, context=context, view=view, width=width)
    return result.colored() if color else str(result)
