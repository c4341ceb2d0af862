"""Printing hypotheses and scrubbed circuits with what was sampled for each part.

``InterpNode.print`` writes the interpretation tree, one node a line, each with its samplers and
the datum they drew (``# cond_sampler=FuncSampler(d=..., f(d)=3)``).  ``ScrubbedExperiment.print``
writes the scrubbed circuit in the circuit text format, expanded down to the nodes the
correspondence maps (and no further below a mapped leaf), each mapped node commented with its
interpretation node and samplers and each input array with the interpretation nodes whose data it
is; both through the annotated printer (``comment=``, ``color=``, ``traversal=``), so the circuit
text still parses.  Colours follow the interpretation node (or, with ``color_by_data``, the data:
the same dataset, the same colour), as rust_circuit's printer does.

Both take rust_circuit's print options as their first argument: None, a ``cc.PrintOptions``
or a mapping of its keywords (``print_options`` reads and checks it, in that one place).
``ScrubbedExperiment.print`` takes ``Circuit.repr``'s keywords: ``comment`` is written before the
scrubbing comment, ``color`` replaces the colours when ``color_by_data=False`` (with
``color_by_data=True`` the colours are the data's, so giving ``color`` too is an error), and
``traversal`` stops the printout where either it or the mapped nodes do.  ``InterpNode.print``
takes ``comment`` and ``color``, functions of an InterpNode, on the same terms.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.hypothesis import InterpNode, SampledInputs
from circuits.errors import PrintError, shown
from circuits.rewriting.matching import get
from circuits.core.nodes import Circuit
from circuits.text.print_options import FIELD_NAMES, PrintOptions, as_traversal
from circuits.text.printing import ANSI_COLORS
from circuits.core.traversal import postorder

__all__ = ["interp_repr", "print_options", "scrubbed_repr"]

_PALETTE = ("cyan", "green", "yellow", "magenta", "blue", "red")


class _Colours:
    """One colour per distinct key, in order of first use, cycling through the palette."""

    def __init__(self):
        self._given: dict[Any, str] = {}

    def __call__(self, key: Any) -> str:
        return self._given.setdefault(key, _PALETTE[len(self._given) % len(_PALETTE)])


#: The keywords ``ScrubbedExperiment.print``'s options may set: ``Circuit.repr``'s, every ``PrintOptions`` field.
SCRUBBED_OPTIONS = FIELD_NAMES
#: The keywords ``InterpNode.print``'s options may set.
INTERP_OPTIONS = ("comment", "color")


def print_options(options: Any, allowed: tuple[str, ...], where: str) -> dict[str, Any]:
    """``options`` (None, a ``PrintOptions`` or a mapping of keywords among ``allowed``) as a dict
    of the options set, or a PrintError naming ``options`` and what is wrong.  Of a PrintOptions,
    the fields set to other than their defaults count, and must be among ``allowed``."""
    if options is None:
        return {}
    if isinstance(options, PrintOptions):
        options = options.changed()
    elif not isinstance(options, Mapping):
        raise PrintError(
            f"{where}: options (the first argument, as rust_circuit's print options) must be None, a "
            f"cc.PrintOptions or a mapping of keywords {list(allowed)}, got {type(options).__name__} "
            f"{shown(repr(options), 80)}",
            "options",
        )
    unknown = sorted(str(key) for key in options if key not in allowed)
    if unknown:
        raise PrintError(f"{where}: options {unknown} are not among {list(allowed)}", unknown[0])
    return dict(options)


def _user_colour(options: dict[str, Any], color_by_data: bool, where: str) -> Callable | None:
    """The ``color`` option, refused alongside ``color_by_data=True`` (the data's colours)."""
    colour = options.get("color")
    if colour is not None and color_by_data:
        raise PrintError(f"{where}: options['color'] is used with color_by_data=False only")
    return colour


def _joined(*texts: str | None) -> str | None:
    """The non-empty texts joined by ``; `` (None if none); a comment that is not text is an error."""
    for text in texts:
        if text is not None and not isinstance(text, str):
            raise PrintError(f"options['comment'] must return a str or None, got {type(text).__name__}")
    return "; ".join(text for text in texts if text) or None


def interp_repr(
    root: InterpNode,
    options: PrintOptions | Mapping[str, Any] | None = None,
    sampled_inputs: SampledInputs = SampledInputs(),
    *,
    print_data: bool = True,
    color_by_data: bool = True,
    datum_idx: int = 0,
    color: bool = True,
) -> str:
    """The interpretation tree rooted at ``root``, one line a node (see the module)."""
    options = print_options(options, INTERP_OPTIONS, "InterpNode.print")
    user_colour = _user_colour(options, color_by_data, "InterpNode.print")
    comment = options.get("comment")
    colours = _Colours()
    lines = []
    depth = {id(root): 0}
    for parent, node in [(None, root), *root.get_descendants_with_parents()]:
        if parent is not None:
            depth[id(node)] = depth[id(parent)] + 1
        line = "  " * depth[id(node)] + node.name
        said = _joined(
            comment(node) if comment is not None else None,
            node.str_samplers(sampled_inputs, datum_idx) if print_data else None,
        )
        if said:
            line += "  # " + said
        if user_colour is not None:
            line = _ansi(line, user_colour(node))
        elif color:
            line = _ansi(line, colours(sampled_inputs.datasets.get(node) if color_by_data else node))
        lines.append(line)
    return "\n".join(lines)


def _ansi(text: str, colour: str | None) -> str:
    if colour is None:
        return text
    if colour not in ANSI_COLORS:
        raise PrintError(
            f"InterpNode.print: colour {shown(repr(colour))} is not one of {sorted(ANSI_COLORS)}"
        )
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


class _BothState(tuple):
    """A pair of traversal states, truthy while both are."""

    def __bool__(self) -> bool:
        return bool(self[0]) and bool(self[1])


class _Both:
    """Two traversals at once: the printout stops where either stops."""

    def __init__(self, first: Any, second: Any):
        self._first, self._second = first, second
        self.start = _BothState((first.start, second.start))

    def child_states(self, node: Circuit, state: _BothState) -> list[_BothState]:
        if not state:
            return [_BothState((False, False))] * len(node.children)
        pairs = zip(self._first.child_states(node, state[0]), self._second.child_states(node, state[1]))
        return [_BothState(pair) for pair in pairs]


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
    options: PrintOptions | Mapping[str, Any] | None = None,
    *,
    print_data: bool = True,
    color_by_data: bool = True,
    datum_idx: int = 0,
    color: bool = True,
    show_inputs: bool = False,
) -> str:
    """The scrubbed circuit, annotated (see the module); ``color=False``: no ANSI codes of ours;
    ``show_inputs``: also every route to an input array outside the mapped leaves' branches."""
    options = print_options(options, SCRUBBED_OPTIONS, "ScrubbedExperiment.print")
    user_colour = _user_colour(options, color_by_data, "ScrubbedExperiment.print")
    user_comment = options.pop("comment", None)
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

    visible, leaves = _shown(scrubbed.circuit, claims, set(owners) if show_inputs else set())
    traversal = _Mapped(visible, leaves)
    if options.get("traversal") is not None:
        traversal = _Both(as_traversal(options["traversal"]), traversal)
    options.update(
        traversal=traversal,
        comment=comment if user_comment is None else lambda node: _joined(user_comment(node), comment(node)),
        color=user_colour if user_colour is not None else colour if color else None,
    )
    return scrubbed.circuit.repr(**options)


def _all_data(sampled: SampledInputs) -> list[Dataset]:
    return [*sampled.datasets.values(), *sampled.other_inputs_datasets.values()]
