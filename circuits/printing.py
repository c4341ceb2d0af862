"""The FORMAT.md writer.

One line per node occurrence, pre-order; a node already written in full is
written again as its reference alone.  Which nodes carry serial numbers
depends on the whole printout (a name shared by two distinct nodes needs
them), so the writer first walks the circuit recording each line's node and
indent, then writes the lines.
"""

from __future__ import annotations

from typing import Iterable

from circuits.gcpause import gc_paused
from circuits.nodes import Array, Circuit, Index, Scalar, Symbol
from circuits.shapes import format_shape
from circuits.store import TensorStore

# Variants whose shape FORMAT.md prints by default: it does not follow from children.
SHAPED_KINDS = (Array, Scalar, Symbol, Index)


def quote_name(name: str) -> str:
    """``'name'`` with quote and backslash escaped, and the line breaks ``\\n`` and ``\\r``
    (a file read with universal newlines would turn a raw ``\\r`` into a line break)."""
    escaped = name.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n").replace("\r", "\\r")
    return f"'{escaped}'"


def repr_many(
    circuits: Iterable[Circuit],
    *,
    depth: int | None = None,
    shapes: bool = False,
    serials: bool = False,
    store: TensorStore | None = None,
) -> str:
    """Print several circuits together, sharing references and serial numbers.

    ``depth`` stops below that depth, writing ``...`` where children were left
    out (such text is for reading, not parsing); ``shapes`` writes every
    node's shape; ``serials`` gives every node a serial number; ``store``
    saves the tensor of every array written.
    """
    with gc_paused():
        return _write(list(circuits), depth, shapes, serials, store)


def _write(
    roots: list[Circuit], depth: int | None, shapes: bool, serials: bool, store: TensorStore | None
) -> str:
    # Pass 1: every line's node and indent level, in print order.  A repeat
    # (a node already written in full) is recorded by the line of its first
    # occurrence; nodes are looked up by hash once per occurrence.
    first_line: dict[bytes, int] = {}
    firsts: list[Circuit | None] = []  # per line: the node written in full, or None for a repeat
    levels: list[int] = []
    repeats: dict[int, int] = {}  # line -> the line where its node was written in full
    elided: dict[int, int] = {}  # line -> how many children the depth limit leaves out below it
    stack = list(reversed(roots))
    stack_levels = [0] * len(stack)
    while stack:
        node, level = stack.pop(), stack_levels.pop()
        line = len(firsts)
        levels.append(level)
        seen_at = first_line.get(node.hash)
        if seen_at is not None:
            repeats[line] = seen_at
            firsts.append(None)
            continue
        first_line[node.hash] = line
        firsts.append(node)
        children = node.children
        if not children:
            continue
        if depth is not None and level >= depth:
            elided[line] = len(children)
            continue
        stack.extend(reversed(children))
        stack_levels.extend([level + 1] * len(children))

    # Names carried by two or more distinct nodes: their references need serial numbers.
    first_with_name: dict[str, bytes] = {}
    shared_names: set[str] = set()
    for node in firsts:
        if node is not None and node.name is not None:
            if first_with_name.setdefault(node.name, node.hash) != node.hash:
                shared_names.add(node.name)

    # Pass 2: the text.
    references: list[str | None] = [None] * len(firsts)
    quoted: dict[str, str] = {}
    out: list[str] = []
    write = out.append
    next_serial = 0
    for line, node in enumerate(firsts):
        indent = "  " * levels[line]
        if node is None:
            write(indent + references[repeats[line]])
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
        shape = " " + format_shape(node.shape) if shapes or isinstance(node, SHAPED_KINDS) else ""
        extra = " " + node.extra if node.extra else ""
        write(f"{indent}{reference}{shape} {node.kind}{extra}")
        if store is not None and isinstance(node, Array) and node.is_loaded:
            store.save(node.tensor(), node.content_hash)  # tensor() refuses one edited in place since
        if line in elided:
            write(f"{indent}  ... {elided[line]} children not shown")
    return "\n".join(out)
