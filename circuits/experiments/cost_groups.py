"""Cost subtotals per layer, per head, per named node or per module, by the names models give.

``circuits.evaluation.costs`` and ``circuits.evaluation.profiling`` know no
naming convention, so the groupings that read names live here, above
``circuits.transformer.names`` and the importer's naming
(``circuits.models.torch_import.naming``): each is a label function for
``CircuitCost.grouped``/``table(label=...)`` and ``Profile.grouped``.  A
node named in the convention with a layer starts that layer's group (a head
branch, its head's); every other node joins the group of the first parent the
walk from the root reaches it through, so the residual stream of layer 0
found below layer 1's norm still counts for layer 0.  ``by_module`` groups an
import (``models.from_torch``) by the module that computed each node (by its name), and
``module_table`` nests those groups by module path, as torch.profiler's
module view does.
"""

from __future__ import annotations

import re
from typing import Callable, Iterable

from circuits.transformer import names
from circuits.evaluation.costs import CircuitCost, Totals, cost, format_bytes
from circuits.errors import CircuitError
from circuits.core.nodes import Circuit
from circuits.evaluation.profiling import Profile
from circuits.core.traversal import unique_nodes

__all__ = ["GROUPINGS", "by_head", "by_layer", "by_module", "by_node", "cost_table", "module_table"]

#: The group of the nodes no module's output reaches: the top module's own ops.
TOP = "(top module)"


def by_layer(node: Circuit) -> str | None:
    """``'layer N'`` for a node whose name (in the convention) has a layer; None otherwise."""
    name = names.parse(node.name)
    return None if name is None or name.layer is None else f"layer {name.layer}"


def by_head(node: Circuit) -> str | None:
    """``'layer N head H'`` (``heads H-K`` for a group) for a head branch, ``'layer N'`` for another layer name."""
    name = names.parse(node.name)
    if name is None or name.layer is None:
        return None
    if name.kind != "head":
        return f"layer {name.layer}"
    first, last = name.heads
    return f"layer {name.layer} head {first}" if first == last else f"layer {name.layer} heads {first}-{last}"


def by_node(node: Circuit) -> str | None:
    """A group per name (nodes sharing a name, as every head's ``a.q`` does, are one); unnamed nodes count for
    their nearest named parent."""
    return node.name


GROUPINGS: dict[str, Callable[[Circuit], str | None]] = {"layer": by_layer, "head": by_head, "node": by_node}


def by_module(roots: Circuit | Iterable[Circuit]) -> Callable[[Circuit], str]:
    """The label of an import's nodes by the module that computed each (``models.from_torch``): the
    longest module path (a node named after a module, ``transformer.h.1.mlp``) that its name
    (``transformer.h.1.mlp.c_fc.addmm``) starts with; ``(top module)`` for a name under none."""
    modules = {_module_of(name) for name in _module_nodes(roots)}

    def label(node: Circuit) -> str:
        name = node.name or ""
        while name:
            if name in modules:
                return name
            name = name.rpartition(".")[0]
        return TOP

    return label


def cost_table(circuit: Circuit | Iterable[Circuit], depth: int = 2, by: str | None = None) -> str:
    """``cost(circuit).table``: per subtree to ``depth``, or with ``by`` ('layer', 'head', 'node') per
    group; ``by='module'`` is ``module_table`` of an import, its modules nested to ``depth``."""
    if by is not None and by not in GROUPINGS and by != "module":
        raise CircuitError(
            f"cost_table: by must be one of {', '.join(GROUPINGS)}, module or None, got {by!r}"
        )
    result: CircuitCost = cost(circuit)
    if by == "module":
        return module_table(result, depth=depth)
    return result.table(depth=depth, label=None if by is None else GROUPINGS[by])


# ------------------------------------------------------------- the module view

_CALL = re.compile(r"(?:@\d+)?(?:\.out\d+)?$")  # a module's call N, a module's output N


def _module_of(group: str) -> str:
    """``transformer.h.0`` for a group named after its call (``h.0@1``) or one of its outputs (``.out1``)."""
    return group if group == TOP else _CALL.sub("", group)


def _module_nodes(roots: Circuit | Iterable[Circuit]) -> dict[str, Circuit]:
    """The nodes an import names after modules (``models.torch_import.naming``), by name."""
    # imported here: ``import circuits`` does not load the models (nor torch.export) until asked
    from circuits.models.torch_import.naming import module_output_name

    return {name: node for node in unique_nodes(roots) if (name := module_output_name(node)) is not None}


def _calls(roots: list[Circuit]) -> dict[str, set[str]]:
    """Each module's calls (``lin``, ``lin@1``), from the nodes named after them."""
    calls: dict[str, set[str]] = {}
    for name in _module_nodes(roots):
        calls.setdefault(_module_of(name), set()).add(re.sub(r"\.out\d+$", "", name))
    return calls


def _tree(paths: Iterable[str]) -> list[tuple[str, int]]:
    """Every module path and its ancestors, ``(path, depth)`` in the order a nested listing shows them."""
    children: dict[str, set[str]] = {}
    for path in paths:
        parts = path.split(".")
        for end in range(1, len(parts) + 1):
            children.setdefault(".".join(parts[: end - 1]), set()).add(".".join(parts[:end]))
    rows, stack = [], [("", 0)]
    while stack:
        path, depth = stack.pop()
        if path:
            rows.append((path, depth))
        ordered = sorted(children.get(path, ()), key=_natural, reverse=True)
        stack.extend((child, depth + 1) for child in ordered)
    return rows


def _natural(text: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", text)]


def module_table(result: CircuitCost | Profile, depth: int | None = None) -> str:
    """torch.profiler's module view of an import's cost or profile: one row per module, nested by path
    (``├──``) down to ``depth``, with its own cost or time (of the nodes it computed and no inner
    module did: "self", ``by_module``), its whole subtree's, and its calls (``lin`` and ``lin@1``: 2);
    ``(top module)`` is what no module's output reaches (the top module's own ops)."""
    roots = result.roots if isinstance(result, CircuitCost) else [result.root]
    own = result.grouped(by_module(roots), rest=TOP)
    calls = _calls(roots)
    if isinstance(result, Profile):
        own = {module: seconds for module, (seconds, _) in own.items()}
        header = ["Self CPU total", "CPU total"]

        def cells(value):
            return [f"{value * 1e3:.3f}ms"]

        zero = 0.0
    else:
        header = ["Self FLOPs", "FLOPs", "read", "written"]

        def cells(value):
            return [value.flops_text, format_bytes(value.read_bytes), format_bytes(value.written_bytes)]

        zero = Totals()
    rows = [(TOP, 0)] if TOP in own and not _nothing(own[TOP]) else []
    rows += [
        (path, level) for path, level in _tree(m for m in own if m != TOP) if depth is None or level <= depth
    ]
    table = [["Module"] + header + ["Number of Calls"]]
    for path, level in rows:
        whole = sum((v for m, v in own.items() if m == path or m.startswith(path + ".")), zero)
        mine = cells(own[path])[:1] if path in own else [""]
        count = str(len(calls[path])) if path in calls else ""
        table.append([_label(path, level)] + mine + cells(whole) + [count])
    return _aligned(table)


def _nothing(value: float | Totals) -> bool:
    """Whether a group took no time, or cost nothing (a Totals of no FLOPs, bytes or unknowns)."""
    if isinstance(value, float):
        return value == 0.0
    return not (value.flop_count or value.read_bytes or value.unknown_nodes)


def _label(path: str, level: int) -> str:
    """``transformer`` at the first level, then ``│├── ln_1``: the last part, after a branch per level."""
    if level <= 1:
        return ("├── " if level else "") + path
    return "│" * (level - 1) + "├── " + path.rsplit(".", 1)[-1]


def _aligned(table: list[list[str]]) -> str:
    """Rows as ``|``-separated columns: the first left-aligned, the others right-aligned."""
    widths = [max(len(row[k]) for row in table) for k in range(len(table[0]))]
    lines = []
    for position, row in enumerate(table):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(width) for cell, width in zip(row[1:], widths[1:])]
        lines.append(" | ".join(cells))
        if position == 0:
            lines.append("-|-".join("-" * width for width in widths))
    return "\n".join(lines)
