"""Printing hypotheses and scrubbed circuits with what was sampled for each part.

``InterpNode.print`` writes the interpretation tree, one node a line, each with its samplers and
the datum they drew (``# cond_sampler=FuncSampler(d=..., f(d)=3)``).  ``ScrubbedExperiment.print``
writes the scrubbed circuit in the circuit text format, expanded down to the nodes the
correspondence maps (and no further below a mapped leaf), each mapped node commented with its
interpretation node and samplers and each input array with the interpretation nodes whose data it
is; both through the annotated printer (``comment=``, ``color=``, ``traversal=``), so the circuit
text still parses.  Colours follow the interpretation node (or, with ``color_by_data``, the data:
the same dataset, the same colour), as rust_circuit's printer does.
"""

from __future__ import annotations

from typing import Any

from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.hypothesis import InterpNode, SampledInputs
from circuits.matching import get
from circuits.nodes import Circuit
from circuits.printing import ANSI_COLORS
from circuits.traversal import postorder

__all__ = ["interp_repr", "scrubbed_repr"]

_PALETTE = ("cyan", "green", "yellow", "magenta", "blue", "red")


class _Colours:
    """One colour per distinct key, in order of first use, cycling through the palette."""

    def __init__(self):
        self._given: dict[Any, str] = {}

    def __call__(self, key: Any) -> str:
        return self._given.setdefault(key, _PALETTE[len(self._given) % len(_PALETTE)])


def interp_repr(
    root: InterpNode,
    sampled_inputs: SampledInputs = SampledInputs(),
    *,
    print_data: bool = True,
    color_by_data: bool = True,
    datum_idx: int = 0,
    color: bool = True,
) -> str:
    """The interpretation tree rooted at ``root``, one line a node (see the module)."""
    colours = _Colours()
    lines = []
    depth = {id(root): 0}
    for parent, node in [(None, root), *root.get_descendants_with_parents()]:
        if parent is not None:
            depth[id(node)] = depth[id(parent)] + 1
        line = "  " * depth[id(node)] + node.name
        if print_data:
            line += "  # " + node.str_samplers(sampled_inputs, datum_idx)
        key = sampled_inputs.datasets.get(node) if color_by_data else node
        if color:
            line = _ansi(line, colours(key))
        lines.append(line)
    return "\n".join(lines)


def _ansi(text: str, colour: str) -> str:
    return f"\x1b[{ANSI_COLORS[colour]}m{text}\x1b[0m"


class _Mapped:
    """Traversal for the printer: a node is written while a mapped node lies at or below it, and
    nothing below a node only leaf interpretation nodes map."""

    start = True

    def __init__(self, shown: set[bytes], leaves: set[bytes]):
        self._shown, self._leaves = shown, leaves

    def child_states(self, node: Circuit, state: Any) -> list[bool]:
        if node.hash in self._leaves:
            return [False] * len(node.children)
        return [child.hash in self._shown for child in node.children]


def _claims(scrubbed) -> dict[bytes, list[InterpNode]]:
    """Scrubbed circuit node hash -> the interpretation nodes whose branch finds it."""
    claims: dict[bytes, list[InterpNode]] = {}
    for node, matcher in scrubbed.nodes.in_dfs_order():
        for found in get(scrubbed.circuit, matcher):
            claims.setdefault(found.hash, []).append(node)
    return claims


def _shown(circuit: Circuit, claims: dict, targets: set[bytes]) -> tuple[set[bytes], set[bytes]]:
    """Hashes of the nodes at or above a claimed node (or one of ``targets``), and of those only
    leaf interpretation nodes claim."""
    holds: dict[bytes, bool] = {}
    for node in postorder([circuit]):
        holds[node.hash] = (
            node.hash in claims or node.hash in targets or any(holds[c.hash] for c in node.children)
        )
    leaves = {h for h, nodes in claims.items() if all(n.is_leaf() for n in nodes)}
    return {h for h, held in holds.items() if held}, leaves


def _data_owners(sampled: SampledInputs) -> dict[bytes, list[str]]:
    """Input array hash -> the names of the interpretation nodes it was drawn for."""
    owners: dict[bytes, list[str]] = {}
    for kind, datasets in (("", sampled.datasets), ("other inputs of ", sampled.other_inputs_datasets)):
        for node, data in datasets.items():
            for array in data.arrs.values():
                owners.setdefault(array.hash, []).append(kind + node.name)
    return owners


def scrubbed_repr(
    scrubbed,
    *,
    print_data: bool = True,
    color_by_data: bool = True,
    datum_idx: int = 0,
    color: bool = True,
    show_inputs: bool = False,
) -> str:
    """The scrubbed circuit, annotated (see the module); ``color=False``: no ANSI codes;
    ``show_inputs``: also every route to an input array outside the mapped leaves' branches."""
    sampled = scrubbed.sampled_inputs
    claims = _claims(scrubbed)
    owners = _data_owners(sampled)
    by_hash = {array.hash: data for data in _all_data(sampled) for array in data.arrs.values()}
    colours = _Colours()

    def comment(node: Circuit) -> str | None:
        if node.hash in claims:
            said = [i.str_samplers(sampled, datum_idx) if print_data else "" for i in claims[node.hash]]
            return "; ".join(
                f"{i.name}: {text}" if text else i.name for i, text in zip(claims[node.hash], said)
            )
        if node.hash in owners:
            datum = f" {by_hash[node.hash][datum_idx]}" if print_data else ""
            return f"data of {', '.join(owners[node.hash])}{datum}"
        return None

    def colour(node: Circuit) -> str | None:
        if node.hash in owners:
            return colours(by_hash[node.hash] if color_by_data else owners[node.hash][0])
        if node.hash in claims:
            claimant = claims[node.hash][0]
            return colours(sampled.get(claimant) if color_by_data else claimant.name)
        return None

    shown, leaves = _shown(scrubbed.circuit, claims, set(owners) if show_inputs else set())
    return scrubbed.circuit.repr(
        traversal=_Mapped(shown, leaves), comment=comment, color=colour if color else None
    )


def _all_data(sampled: SampledInputs) -> list[Dataset]:
    return [*sampled.datasets.values(), *sampled.other_inputs_datasets.values()]
