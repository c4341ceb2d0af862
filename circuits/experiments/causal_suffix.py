"""Recomputing only the positions a patch can change: the causal suffix.

Under a causal mask, position ``i`` of every layer reads positions ``<= i`` only, so a patch at
positions ``>= p`` leaves positions ``< p`` of every layer as they were on the unpatched run.
``from_position(circuit, p, blocks, values)`` rewrites each residual-stream node ``'b{l}'`` of
``blocks`` into ``Concat(Array(its unpatched value[..., :p, :]), b{l}[..., p:, :])`` with the
index pushed down (``circuits.passes.push_index``): the MLP, the queries, the attention output and
the norms run for positions ``>= p`` only, while keys and values still see every position (the
earlier ones from the stored prefix).  The value is unchanged, exactly.
"""

from __future__ import annotations

from typing import Mapping

import torch

from circuits.transformer import names
from circuits.core.nodes import Add, Array, Circuit, Concat, Index
from circuits.passes import push_index
from circuits.rewriting.rewrite import update
from circuits.core.traversal import unique_nodes

__all__ = ["from_position", "is_causal"]


def is_causal(circuit: Circuit) -> bool:
    """Whether every attention of ``circuit`` is masked with a mask that hides later positions.

    Reads the masked form ``causal_mask`` and the builders make: each ``'a.attn_scores'`` an Add
    over ``'a.attn_scores_raw'``, whose Array operands of rank >= 2 are the masks."""
    scores = [node for node in unique_nodes([circuit]) if node.name == names.SCORES]
    if not scores:
        return False
    for node in scores:
        raw = (
            [child for child in node.children if child.name == names.RAW_SCORES]
            if isinstance(node, Add)
            else []
        )
        masks = (
            [child for child in raw[0].children if isinstance(child, Array) and child.rank >= 2]
            if raw
            else []
        )
        if not masks or any(bool(torch.triu(mask.value, diagonal=1).any()) for mask in masks):
            return False
    return True


def from_position(circuit: Circuit, position: int, prefixes: Mapping[str, torch.Tensor]) -> Circuit:
    """``circuit`` with each block named in ``prefixes`` computed for positions ``>= position`` only.

    ``prefixes`` maps a block's name (``'b3'``) to its value on the unpatched run (``[..., S, D]``);
    the rewritten block reads positions ``< position`` from it.
    """

    below = _blocks_below(circuit, prefixes)

    def suffixed(block: Circuit) -> Circuit:
        rank = block.rank
        head = Array(prefixes[block.name][..., :position, :].contiguous(), name=f"{block.name}.prefix")
        items = (slice(None),) * (rank - 2) + (slice(position, None), slice(None))
        tail = push_index(Index(block, items, name=f"{block.name}.suffix"), stop_at=below)
        return Concat(head, tail, axis=rank - 2, name=block.name)

    return update(circuit, set(prefixes), suffixed)


def _blocks_below(circuit: Circuit, prefixes: Mapping[str, torch.Tensor]) -> list[Circuit]:
    """The residual-stream nodes ``'b{l}'`` not in ``prefixes`` (the layers below the patch): the
    suffix index stops at them.  They are computed whole anyway (for the keys and values above),
    so an index pushed into them would compute positions ``>= p`` a second time, down to layer 0."""
    found = []
    for node in unique_nodes([circuit]):
        parsed = names.parse(node.name) if node.name is not None else None
        if parsed is not None and parsed.kind == "block" and node.name not in prefixes:
            found.append(node)
    return found
