"""``overview(c)``: a model circuit at a glance, one line per component, as torch's ``print(model)``.

Read off the names of ``circuits.transformer.names``: the tokens, the embeddings, then
per layer its block, attention (heads split or not, with the weights'
shapes), MLP and norms, then the final norm, logits and loss.  Nodes
outside the convention are counted, not listed.  A circuit with no name of
the convention but nodes named after modules (``models.from_torch``) is
read off those: its layers are the modules of the longest numbered list
(``transformer.h.0``, ``transformer.h.1``, ...), each with its inner
modules, between the modules outside the layers.
"""

from __future__ import annotations

from collections import defaultdict

import re

from circuits.transformer import names
from circuits.core.nodes import Circuit, check_node
from circuits.core.shapes import format_shape
from circuits.core.traversal import postorder, unique_nodes

__all__ = ["overview"]

_MODEL_WIDE = (
    ("tokens", names.TOKENS),
    ("embeddings", names.TOKEN_EMBEDS),
    ("positions", names.POS_EMBEDS),
    ("embeddings sum", names.EMBEDS),
)
_HEAD = (("final norm", names.FINAL_NORM), ("logits", names.LOGITS), ("loss", names.LOSS))
_LAYER_PARTS = (
    ("block", "block"),
    ("attention norm", "attn_norm"),
    ("attention", "attn_out"),
    ("residual mid", "resid_mid"),
    ("MLP norm", "mlp_norm"),
    ("MLP", "mlp_out"),
)


def overview(circuit: Circuit) -> str:
    """The circuit's model structure as text: ``print(ex.overview(c))``."""
    check_node(circuit, "overview: the circuit")
    nodes = unique_nodes([circuit])
    by_name = {node.name: node for node in nodes if node.name is not None}
    layers: dict[int, dict[str, list[Circuit]]] = defaultdict(lambda: defaultdict(list))
    for node in nodes:
        parsed = names.parse(node.name)
        if parsed is not None and parsed.layer is not None:
            layers[parsed.layer][parsed.kind].append(node)
    outside = sum(1 for node in nodes if names.parse(node.name) is None)
    if not layers:
        return _modules_overview(circuit, nodes)
    lines = [
        f"{circuit.describe()} {format_shape(circuit.shape)}: {len(layers)} layers, {len(nodes)} distinct nodes "
        f"({outside} outside the model naming convention)"
    ]
    lines += [_line(label, by_name[name], 1) for label, name in _MODEL_WIDE if name in by_name]
    for layer in sorted(layers):
        lines += _layer_lines(layer, layers[layer])
    lines += [_line(label, by_name[name], 1) for label, name in _HEAD if name in by_name]
    return "\n".join(lines)


def _line(label: str, node: Circuit, depth: int, note: str = "") -> str:
    text = f"{'  ' * depth}{label}: '{node.name}' {format_shape(node.shape)} {node.kind}"
    return text + (f"  ({note})" if note else "")


def _layer_lines(layer: int, kinds: dict[str, list[Circuit]]) -> list[str]:
    lines = [f"  ({layer})"]
    for label, kind in _LAYER_PARTS:
        for node in kinds.get(kind, ()):
            note = _attention_note(layer, kinds) if kind == "attn_out" else ""
            lines.append(_line(label, node, 2, note))
    for kind, label in (("attn_weight", "attention weights"), ("mlp_weight", "MLP weights")):
        whole = sorted((n for n in kinds.get(kind, ()) if names.parse(n.name).heads is None), key=_name)
        if whole:
            shown = ", ".join(f"{n.name.rsplit('.', 1)[-1]} {format_shape(n.shape)}" for n in whole)
            lines.append(f"    {label}: {shown}")
    return lines


def _attention_note(layer: int, kinds: dict[str, list[Circuit]]) -> str:
    heads = sorted(names.parse(node.name).heads for node in kinds.get("head", ()))
    if not heads:
        query = [n for n in kinds.get("attn_weight", ()) if n.name == names.attn_weight(layer, "q")]
        count = f"{query[0].shape[0]} heads, " if query and query[0].shape else ""
        return f"{count}unsplit: cc.passes.split_heads makes a branch per head"
    count = sum(last - first + 1 for first, last in heads)
    labels = ", ".join(names.head_label(first, last) for first, last in heads)
    return f"{count} heads split into {len(heads)} branches: {labels}"


def _name(node: Circuit) -> str:
    return node.name


_NUMBERED = re.compile(r"(?P<list>.+)\.(?P<index>\d+)")


def _modules_overview(circuit: Circuit, nodes: list[Circuit]) -> str:
    """The overview of a circuit named by module path (an import), or one saying why it has no layers."""
    # imported here: ``import circuits`` does not load the models (nor torch.export) until asked
    from circuits.models.torch_import.naming import module_output_name

    modules = {name: node for node in nodes if (name := module_output_name(node)) is not None}
    lists: dict[str, list[int]] = defaultdict(list)
    for name in modules:
        match = _NUMBERED.fullmatch(name)
        if match:
            lists[match["list"]].append(int(match["index"]))
    head = f"{circuit.describe()} {format_shape(circuit.shape)}"
    if not lists:
        why = "no node is named in the model naming convention ('b0', 'b0.a', ...) " + (
            "nor after a numbered module ('transformer.h.0')"
            if modules
            else "nor after a module (from_torch)"
        )
        return f"{head}: 0 layers: {why}; {len(nodes)} distinct nodes"
    stack = max(lists, key=lambda name: (len(lists[name]), -name.count(".")))
    indices = sorted(lists[stack])
    lines = [
        f"{head}: {len(indices)} layers (modules {stack}.{indices[0]} to {stack}.{indices[-1]}), "
        f"{len(nodes)} distinct nodes (named by module path: an import)"
    ]
    inside = [name for name in modules if name.startswith(stack + ".")]
    order = {node.hash: position for position, node in enumerate(postorder([circuit]))}
    before, after = _around(order, modules, stack, inside)
    lines += [_line(name, modules[name], 1) for name in before]
    for index in indices:
        layer = f"{stack}.{index}"
        lines.append(f"  ({index}) {layer!r} {format_shape(modules[layer].shape)} {modules[layer].kind}")
        children = sorted(
            (name for name in inside if name.rpartition(".")[0] == layer),
            key=lambda n: order[modules[n].hash],
        )
        lines += [_line(name.rpartition(".")[2], modules[name], 2) for name in children]
    lines += [_line(name, modules[name], 1) for name in after]
    return "\n".join(lines)


def _around(order: dict[bytes, int], modules: dict[str, Circuit], stack: str, inside: list[str]):
    """The modules outside the layers (at most one level below the layers' list's parent) that the
    evaluator runs (``order``) before the first layer, and those it runs after."""
    first = min(order[modules[name].hash] for name in inside)
    depth = stack.count(".") + 1
    outside = [name for name in modules if name not in inside and name.count(".") <= depth]
    outside.sort(key=lambda name: order[modules[name].hash])
    before = [name for name in outside if order[modules[name].hash] < first]
    return before, [name for name in outside if order[modules[name].hash] > first]
