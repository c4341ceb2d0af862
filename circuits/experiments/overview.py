"""``overview(c)``: a model circuit at a glance, one line per component, as torch's ``print(model)``.

Read off the names of ``circuits.names``: the tokens, the embeddings, then
per layer its block, attention (heads split or not, with the weights'
shapes), MLP and norms, then the final norm, logits and loss.  Nodes
outside the convention are counted, not listed.
"""

from __future__ import annotations

from collections import defaultdict

from circuits import names
from circuits.nodes import Circuit, check_node
from circuits.shapes import format_shape
from circuits.traversal import unique_nodes

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
        return f"{count}unsplit: cc.split_heads makes a branch per head"
    count = sum(last - first + 1 for first, last in heads)
    labels = ", ".join(names.head_label(first, last) for first, last in heads)
    return f"{count} heads split into {len(heads)} branches: {labels}"


def _name(node: Circuit) -> str:
    return node.name
