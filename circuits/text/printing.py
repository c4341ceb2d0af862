"""The FORMAT.md writer.

One line per node occurrence, pre-order; a node already written in full is
written again as its reference alone.  Which nodes carry serial numbers
depends on the whole printout (a name shared by two distinct nodes needs
them), so the writer first walks the circuit recording each line's node and
indent, then writes the lines.

Annotations (``comment=``, ``color=``) and the ``traversal=`` limit are for
reading: a comment is written after the line as ``  # text`` and a colour
as ANSI codes around it, both of which the parser skips, so annotated text
still reads back; text cut by ``depth`` or ``traversal`` does not.

The layout options of rust_circuit (``only_child_below``, ``arrows``,
``comment_arg_names``) are small passes over pass 1's result, each a loop
over the lines, run between the two passes only when asked for.

The options are one ``PrintOptions`` object (``print_options.py``), checked
when it is made; ``repr_many`` takes it and keywords that override its fields.

The traversal seam.  The printer asks only the small ``Traversal``
protocol (a start state and the state for each child of a node; a
falsy state means "stop"), which ``IterativeMatcher`` implements; any other
matcher form (a name, a ``Matcher``) becomes an ``IterativeMatcher`` when
the options are made (``as_traversal``): the text layer sits above the
rewriting layer.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence

from circuits.errors import PrintError
from circuits.evaluation.costs import cost
from circuits.core.gcpause import gc_paused
from circuits.core.nodes import Array, Circuit, Einsum, Index, Scalar, Scatter, Symbol
from circuits.core.shapes import EINSUM_LETTERS, format_shape
from circuits.text.print_options import NodeText, PrintOptions, Traversal, spells_out_print_options
from circuits.text.store import TensorStore

# Variants whose shape FORMAT.md prints by default: it does not follow from children.
SHAPED_KINDS = (Array, Scalar, Symbol, Index, Scatter)  # as rust_circuit prints them

#: ``color=`` names and their ANSI foreground codes.
ANSI_COLORS = {
    "black": 30,
    "red": 31,
    "green": 32,
    "yellow": 33,
    "blue": 34,
    "magenta": 35,
    "cyan": 36,
    "white": 37,
    "gray": 90,
}
ANSI_RESET = "\x1b[0m"
#: the line rust_circuit's ``only_child_below`` writes between a node and its only child
ONLY_CHILD_MARKER = "▼"

# Characters that str.splitlines (and universal newlines) treat as line breaks: a comment
# writes them as escapes so that it stays on its line.
_COMMENT_ESCAPES = str.maketrans(
    {ch: ch.encode("unicode_escape").decode("ascii") for ch in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"}
)


def quote_name(name: str) -> str:
    """``'name'`` with quote and backslash escaped, and the line breaks ``\\n`` and ``\\r``
    (a file read with universal newlines would turn a raw ``\\r`` into a line break)."""
    escaped = name.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"


@spells_out_print_options
def repr_many(circuits: Iterable[Circuit], options: PrintOptions | None = None, /, **overrides: Any) -> str:
    """Print several circuits together, sharing references and serial numbers.

    ``options`` is a ``PrintOptions`` (None: the defaults); keywords are its
    fields and override the object's (``repr_many(roots, options, depth=2)``).
    What each option does: ``PrintOptions``.  Comments and colours are for
    reading but still parse back; so does text laid out with
    ``minimal_shapes``, ``only_child_below``, ``arrows`` or ``comment_arg_names``;
    text cut by ``depth`` or ``traversal`` does not.
    """
    circuits = list(circuits)
    options = PrintOptions.resolve(options, overrides, "repr")
    comment = cost(circuits).comment if options.costs else options.comment
    with gc_paused():
        layout = _layout(circuits, options.depth, options.traversal)
        if options.comment_arg_names:
            _name_einsum_operands(layout)  # before only_child_below changes the levels
        if options.only_child_below:
            _only_children_below(layout)
        if options.arrows:
            _draw_arrows(layout)
        shown = _shape_rule(options.shapes, options.minimal_shapes, options.store)
        return _text(layout, shown, options.serials, options.store, comment, options.color)


class _Layout:
    """Pass 1's result: per line, the node written in full (None for a repeat) and its indent level."""

    def __init__(self) -> None:
        self.firsts: list[Circuit | None] = []
        self.levels: list[int] = []
        self.repeats: dict[int, int] = {}  # line -> the line where its node was written in full
        self.elided: dict[int, int] = {}  # line -> how many children are left out below it
        self.markers: set[int] = set()  # lines followed by the only-child marker ``▼``
        # with arrows=True, per line: the drawing before the node, and before lines under it
        self.indents: list[str] | None = None
        self.belows: list[str] | None = None
        self.arg_names: dict[int, str] = {}  # line -> "  # axes" for an Einsum's operand (comment_arg_names)


def _layout(roots: list[Circuit], depth: int | None, traversal: Traversal | None) -> _Layout:
    # Every line's node and indent level, in print order.  A repeat (a node already written
    # in full) is recorded by the line of its first occurrence; nodes are looked up by hash
    # once per occurrence.  The stack is three parallel lists (node, level, traversal state);
    # without a traversal the states are not kept at all, so plain printing pays nothing.
    layout = _Layout()
    firsts, levels, repeats, elided = layout.firsts, layout.levels, layout.repeats, layout.elided
    first_line: dict[bytes, int] = {}
    stack = list(reversed(roots))
    stack_levels = [0] * len(stack)
    stack_states = [] if traversal is None else [traversal.start] * len(stack)
    while stack:
        node, level = stack.pop(), stack_levels.pop()
        line = len(firsts)
        levels.append(level)
        seen_at = first_line.get(node.hash)
        if seen_at is not None:
            repeats[line] = seen_at
            firsts.append(None)
            if traversal is not None:
                stack_states.pop()
            continue
        first_line[node.hash] = line
        firsts.append(node)
        children = node.children
        if traversal is not None:
            states = _child_states(traversal, node, stack_states.pop())
            if children and not any(states):
                elided[line] = len(children)
                continue
        if not children:
            continue
        if depth is not None and level >= depth:
            elided[line] = len(children)
            continue
        stack.extend(reversed(children))
        stack_levels.extend([level + 1] * len(children))
        if traversal is not None:
            stack_states.extend(reversed(states))
    return layout


def _only_children_below(layout: _Layout) -> None:
    """Re-indent for ``only_child_below``: an only child at its parent's indent, after a marker.

    A line written in full whose node has one child, not left out, is followed
    by that child's line; the child's whole subtree moves up one level.  The
    shifts are kept on a stack of (parent level, shift inside its subtree).
    """
    firsts, levels, elided, markers = layout.firsts, layout.levels, layout.elided, layout.markers
    shifts: list[tuple[int, int]] = []
    for line, node in enumerate(firsts):
        level = levels[line]
        while shifts and shifts[-1][0] >= level:
            shifts.pop()
        shift = shifts[-1][1] if shifts else 0
        levels[line] = level - shift
        if node is not None and len(node.children) == 1 and line not in elided:
            markers.add(line)
            shifts.append((level, shift + 1))


def _name_einsum_operands(layout: _Layout) -> None:
    """``comment_arg_names``: each Einsum operand's line gets ``  # `` and its axes' letters.

    A line's parent is the last line one level up (``parents[level]``); the
    operand's position is how many of the parent's lines came before it.
    A rank-0 operand has no letters and gets no comment.
    """
    firsts, levels, arg_names = layout.firsts, layout.levels, layout.arg_names
    parents: list[int] = []
    positions: dict[int, int] = {}
    for line, level in enumerate(levels):
        del parents[level:]
        if level:
            parent = parents[-1]
            position = positions.get(parent, 0)
            positions[parent] = position + 1
            node = firsts[parent]
            if isinstance(node, Einsum) and node.operand_axes[position]:
                arg_names[line] = "  # " + "".join(
                    EINSUM_LETTERS[axis] for axis in node.operand_axes[position]
                )
        parents.append(line)


def _draw_arrows(layout: _Layout) -> None:
    """Tree drawing for ``arrows=True``, after any only-child re-indent.

    A line's drawing is its ancestors' columns (``│ `` where the ancestor has
    a later sibling, spaces where it is last) and its own elbow (``├‣`` or
    ``└‣``); an only child written below its parent has no elbow and shares
    its parent's column.  Whether a line is last is found walking backwards:
    ``later[level]`` says a sibling at that level follows.
    """
    levels, markers = layout.levels, layout.markers
    count = len(levels)
    only = [line - 1 in markers for line in range(count)]  # written below its parent
    last = [False] * count
    later: list[bool] = []
    for line in range(count - 1, -1, -1):
        level = levels[line]
        del later[level + 1 :]
        if only[line]:
            continue
        later.extend([False] * (level + 1 - len(later)))
        last[line], later[level] = not later[level], True
    indents, belows = [""] * count, [""] * count
    columns: list[str] = []
    for line in range(count):
        level = levels[line]
        if only[line]:
            last[line] = last[line - 1]
        del columns[max(level - 1, 0) :]
        if level:
            own = "  " if last[line] else "│ "
            indents[line] = "".join(columns) + (own if only[line] else "└‣" if last[line] else "├‣")
            columns.append(own)
        belows[line] = "".join(columns)
    layout.indents, layout.belows = indents, belows


def _child_states(traversal: Traversal, node: Circuit, state: Any) -> Sequence[Any]:
    """The traversal's state for each child of ``node`` (none if it stopped before ``node``)."""
    if not state or not node.children:
        return ()
    states = traversal.child_states(node, state)
    if len(states) != len(node.children):
        raise PrintError(
            f"traversal {traversal!r} gave {len(states)} child states for {_which(node)}, "
            f"which has {len(node.children)} children"
        )
    return states


def _shared_names(firsts: list[Circuit | None]) -> set[str]:
    """Names carried by two or more distinct nodes: their references need serial numbers."""
    first_with_name: dict[str, bytes] = {}
    shared: set[str] = set()
    for node in firsts:
        if node is not None and node.name is not None:
            if first_with_name.setdefault(node.name, node.hash) != node.hash:
                shared.add(node.name)
    return shared


def _shape_rule(shapes: bool, minimal_shapes: bool, store: TensorStore | None) -> Callable[[Circuit], bool]:
    """Whether a node's line writes its shape, per ``shapes=`` and ``minimal_shapes=``."""
    if shapes:
        return lambda node: True
    if minimal_shapes:
        return lambda node: shape_needed(node, store)
    return lambda node: isinstance(node, SHAPED_KINDS)


def shape_needed(node: Circuit, store: TensorStore | None) -> bool:
    """Whether ``cc.parse`` needs the node's shape to rebuild it (``minimal_shapes=True``).

    Of the ``SHAPED_KINDS``, an Index's shape follows from its child and its
    items, and an Array's from its tensor, which comes back only from the
    store the text is printed with (``store=``, which saves it): without
    one, or for a placeholder with no tensor, the shape stays.  The others
    (Scalar, Symbol, Scatter) have nothing else to say it.  Text whose
    Arrays lack their shapes needs the store to parse
    (``cc.parse(text, store=store)``) and cannot be read with ``tensors_as_random``.
    """
    if isinstance(node, Array):
        return store is None or not node.is_loaded
    return isinstance(node, SHAPED_KINDS) and not isinstance(node, Index)


def _text(
    layout: _Layout,
    shown: Callable[[Circuit], bool],
    serials: bool,
    store: TensorStore | None,
    comment: NodeText | None,
    color: NodeText | None,
) -> str:
    # Pass 2: the text.
    firsts, levels, repeats, elided = layout.firsts, layout.levels, layout.repeats, layout.elided
    markers, indents, belows, arg_names = layout.markers, layout.indents, layout.belows, layout.arg_names
    shared_names = _shared_names(firsts)
    references: list[str | None] = [None] * len(firsts)
    colours: dict[int, str] = {}  # line written in full -> its node's ANSI start code ("" for none)
    quoted: dict[str, str] = {}
    out: list[str] = []
    write = out.append
    next_serial = 0
    for line, node in enumerate(firsts):
        indent = "  " * levels[line] if indents is None else indents[line]
        if node is None:
            first = repeats[line]
            text = references[first] + arg_names.get(line, "") if arg_names else references[first]
            write(indent + (text if color is None else _coloured(text, colours[first])))
            continue
        name = node.name
        if name is None:
            reference = str(next_serial)
            next_serial += 1
        else:
            quoted_name = quoted.get(name)
            if quoted_name is None:
                quoted_name = quoted[name] = quote_name(name)
            if serials or name in shared_names:
                reference = f"{next_serial} {quoted_name}"
                next_serial += 1
            else:
                reference = quoted_name
        references[line] = reference
        shape = " " + format_shape(node.shape) if shown(node) else ""
        extra = " " + node.extra if node.extra else ""
        if comment is None and color is None and not arg_names:
            write(f"{indent}{reference}{shape} {node.kind}{extra}")
        else:
            text = f"{reference}{shape} {node.kind}{extra}" + arg_names.get(line, "")
            if comment is not None:
                text += _comment_text(node, comment)
            if color is not None:
                colours[line] = _colour_code(node, color)
                text = _coloured(text, colours[line])
            write(indent + text)
        if store is not None and isinstance(node, Array) and node.is_loaded:
            store.save(node.tensor(), node.content_hash)  # tensor() refuses one edited in place since
        if line in elided:
            write(f"{indent if belows is None else belows[line]}  ... {elided[line]} children not shown")
        elif markers and line in markers:
            write((indent if belows is None else belows[line]) + ONLY_CHILD_MARKER)
    return "\n".join(out)


def _coloured(text: str, code: str) -> str:
    return f"{code}{text}{ANSI_RESET}" if code else text


def _comment_text(node: Circuit, comment: NodeText) -> str:
    """``"  # text"`` for the node's comment, or "" for none."""
    text = comment_of(node, comment)
    return "  # " + text if text else ""


def _colour_code(node: Circuit, color: NodeText) -> str:
    """The ANSI start code of the node's colour, or "" for none."""
    name = colour_of(node, color)
    return "" if name is None else f"\x1b[{ANSI_COLORS[name]}m"


def comment_of(node: Circuit, comment: NodeText) -> str:
    """``comment(node)`` checked: text with its line breaks escaped, "" for none (None or "").

    Shared by the text and HTML writers so that both accept and refuse the same results.
    """
    text = comment(node)
    if text is None:
        return ""
    if not isinstance(text, str):
        raise PrintError(
            f"comment function returned {type(text).__name__} for {_which(node)}; expected str or None"
        )
    return text.translate(_COMMENT_ESCAPES)


def colour_of(node: Circuit, color: NodeText) -> str | None:
    """``color(node)`` checked: a lowercase key of ``ANSI_COLORS``, or None for no colour."""
    name = color(node)
    if name is None:
        return None
    key = name.lower() if isinstance(name, str) else None
    if key not in ANSI_COLORS:
        raise PrintError(
            f"color function returned {name!r} for {_which(node)}; expected None or one of "
            + ", ".join(ANSI_COLORS)
        )
    return key


def _which(node: Circuit) -> str:
    """The node as error messages name it."""
    label = quote_name(node.name) if node.name is not None else "an unnamed node"
    return f"{label} ({node.kind})"
