"""The transformer naming convention's hints for the matcher: where a node sits, and ``split_heads`` first.

``placement`` tells the layer (and head) a node belongs to, from its name or
the names above it, for ``get_unique``'s messages; ``split_heads_hint``
says, for a head's name that finds nothing, that the layer is not split
into heads yet.  ``circuits.transformer`` registers both with the matcher
(``circuits.rewriting.hints``) when imported; ``layer_of`` is also an
attention pass's helper (``circuits.passes.layer_of``).
"""

from __future__ import annotations

from typing import Any, Sequence

from circuits.core.nodes import Array, Circuit, Einsum
from circuits.core.traversal import unique_nodes
from circuits.errors import PassError
from circuits.transformer import names

__all__ = ["ATTENTION_INSIDE", "COMPONENTS", "layer_of", "placement", "split_heads_hint"]

# The kinds of named node whose layer (and head) a node below them takes, on its path from the root.
COMPONENTS = ("attn_out", "head", "mlp_out", "attn_norm", "mlp_norm")
# Attention nodes named alike in every layer, below which the layer's own weights are the
# shallowest attention weights (``layer_of`` tells their layer); not the query input, whose
# shallowest weights are the previous layer's.
ATTENTION_INSIDE = frozenset(
    [names.Q, names.K, names.V, names.Q_NOBIAS, names.K_NOBIAS, names.V_NOBIAS, names.Q_UNROTATED]
    + [names.K_UNROTATED, names.K_KV, names.V_KV, names.SCORES, names.RAW_SCORES, names.PROBS]
    + [names.COMB_V, names.Q_NORM, names.K_NORM]
)


def layer_of(node: Circuit) -> int:
    """The layer of an attention node: from the shallowest ``a{L}.w.*`` array below it
    (a head's slice ``a{L}.w.q.head{h}`` counts too); ``PassError`` if there is none.

    (Also ``circuits.passes.layer_of``; ``placement`` uses it for the matcher's messages.)
    """
    frontier, seen = [node], set()
    while frontier:
        following = []
        for current in frontier:
            weight = names.parse_attn_weight(current.name)
            if weight is not None and isinstance(current, Array):
                return weight[0]
            for child in current.children:
                if child.hash not in seen:
                    seen.add(child.hash)
                    following.append(child)
        frontier = following
    raise PassError(f"cannot tell the layer of {node.describe()}: no 'a{{L}}.w.*' array below it")


def placement(node: Circuit, path: Sequence[Circuit]) -> tuple[int, tuple[int, int] | None] | None:
    """(layer, heads or None) where the naming convention tells which layer ``node`` belongs to,
    else None (``circuits.rewriting.matching.layer_text`` writes it).

    From, in turn: its own name (``'b1.a'``, ``'a1.w.q.head2'``); the nearest named node of the
    convention above it on ``path`` (the node's path from the root, the node last), if that is a
    layer's attention, head, MLP or norm (not a residual sum such as ``'b0'``, which every later
    layer reads); for a node inside attention named alike in every layer (``'a.attn_probs'``),
    ``layer_of``.
    """
    parsed = names.parse(node.name)
    if parsed is None or parsed.layer is None:
        parsed = None
        for above in reversed(path[:-1]):
            candidate = names.parse(above.name)
            if candidate is not None and candidate.layer is not None:
                parsed = candidate if candidate.kind in COMPONENTS else None
                break
    if parsed is not None:
        return parsed.layer, parsed.heads
    if node.name in ATTENTION_INSIDE:
        try:
            return layer_of(node), None
        except PassError:
            return None
    return None


def split_heads_hint(circuit: Circuit, form: Any) -> str:
    """For a head's name (``'b1.a.head2'``, ``'b1.a.head0-3'``) on a layer that is not split into
    heads: that ``split_heads`` makes them; ``''`` otherwise."""
    group = names.parse_head_group(form) if isinstance(form, str) else None
    if group is None:
        return ""
    layer, first, last = group
    attention = names.attn_out(layer)
    if not any(isinstance(n, Einsum) and n.name == attention for n in unique_nodes(circuit)):
        return ""  # no such layer, or split already (an Add of head branches)
    text = (
        f"layer {layer} is not split into heads ({attention!r} is one Einsum over them): heads are "
        f"nodes only after cc.passes.split_heads(c), or cc.passes.split_heads(c, layers=[{layer}])"
    )
    if first != last:
        text += f" with heads= listing every head in contiguous groups, one of them {list(range(first, last + 1))}"
    return text
