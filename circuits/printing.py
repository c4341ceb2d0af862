"""The FORMAT.md writer.

One line per node occurrence, pre-order; a node already written in full is
written again as its reference alone.  Which nodes carry serial numbers
depends on the whole printout (a name shared by two distinct nodes needs
them), so the writer first collects the distinct nodes, then writes.
"""

from __future__ import annotations

import io
from typing import Iterable

from circuits.gcpause import gc_paused
from circuits.nodes import Array, Circuit, Index, Scalar, Symbol
from circuits.spec import format_shape
from circuits.store import TensorStore
from circuits.traversal import unique_nodes

# Variants whose shape FORMAT.md prints by default: it does not follow from children.
SHAPED_KINDS = (Array, Scalar, Symbol, Index)


def quote_name(name: str) -> str:
    """``'name'`` with quote and backslash escaped (and newline, to stay on one line)."""
    escaped = name.replace("\\", "\\\\").replace("'", "\\'").replace("\n", "\\n")
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
    first_with_name: dict[str, bytes] = {}
    shared_names: set[str] = set()  # names carried by two or more distinct nodes
    for node in unique_nodes(roots):
        if node.name is not None and first_with_name.setdefault(node.name, node.hash) != node.hash:
            shared_names.add(node.name)

    references: dict[bytes, str] = {}
    quoted: dict[str, str] = {}
    out = io.StringIO()  # measured faster than list + join when deep indents make the text huge
    write = out.write
    newline = ""
    next_serial = 0
    stack: list[tuple[Circuit, int]] = [(root, 0) for root in reversed(roots)]
    while stack:
        node, level = stack.pop()
        indent = "  " * level
        reference = references.get(node.hash)
        if reference is not None:
            write(f"{newline}{indent}{reference}")
            newline = "\n"
            continue
        name = node.name
        if name is None:
            reference = str(next_serial)
            next_serial += 1
        else:
            if name not in quoted:
                quoted[name] = quote_name(name)
            if serials or name in shared_names:
                reference = f"{next_serial} {quoted[name]}"
                next_serial += 1
            else:
                reference = quoted[name]
        references[node.hash] = reference
        shape = " " + format_shape(node.shape) if shapes or isinstance(node, SHAPED_KINDS) else ""
        extra = " " + node.extra if node.extra else ""
        write(f"{newline}{indent}{reference}{shape} {node.kind}{extra}")
        newline = "\n"
        if store is not None and isinstance(node, Array) and node.is_loaded:
            store.save(node.value, node.content_hash)
        children = node.children
        if not children:
            continue
        if depth is not None and level >= depth:
            write(f"\n{indent}  ... {len(children)} children not shown")
            continue
        below = level + 1
        stack.extend([(child, below) for child in reversed(children)])
    return out.getvalue()
