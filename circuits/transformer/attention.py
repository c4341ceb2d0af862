"""Attention passes: causal (or any) masking, and splitting heads into branches.

Both work on the attention the model builders write, with the names of
../shared/golden/attn_only_2l.circ (``circuits.transformer.names``): score nodes
``'a.attn_scores'`` (an Einsum over query, key and scale whose output ends in
head, query, key axes), and per layer ``'b{L}.a'``, an Einsum that sums the
heads' outputs (its operands carry a head axis that is not in its output).
The mask nodes themselves are written by ``circuits.transformer.masks``.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Sequence, Union

import torch

from circuits.transformer import names
from circuits.errors import PassError
from circuits.transformer.masks import NEG_INF, causal_mask_array, neg_inf_bias
from circuits.rewriting.matching import Matcher
from circuits.core.nodes import Add, Array, Circuit, Einsum, Index
from circuits.rewriting.passes.push_down import push_index
from circuits.core.traversal import unique_nodes
from circuits.transformer.layer_hints import layer_of


MaskSpec = Union[None, torch.Tensor, Callable[[int, int], torch.Tensor]]


# ------------------------------------------------------------------ masking


def causal_mask(
    circuit: Circuit, mask: MaskSpec = None, neg_inf: float = NEG_INF, scores: Any = names.SCORES
) -> Circuit:
    """Every ``'a.attn_scores'`` rewritten into the masked form of the golden file.

    ``scores`` becomes ``Add('a.attn_scores_raw', 'a.score_neg_inf_bias')``:
    the raw scores take the mask as one more Einsum operand (masked pairs
    score 0) and the bias adds ``neg_inf`` where the mask is 0.  ``mask`` is
    None for the causal mask, a ``[query, key]`` 0/1 tensor shared by every
    layer and head, or a function ``mask(layer, head) -> [query, key]``
    tensor (attention knockout of chosen pairs).  Scores already masked get
    the new mask instead.  ``scores`` (a matcher form) finds the score
    Einsums of circuits not named by the builders, e.g. an import's
    ``cc.Matcher.regex("attention.scores$")``; a node
    ``'x'`` becomes ``Add('x_raw', ...)`` named ``'x'``.
    """
    if not circuit.are_any_found(scores):
        raise PassError(
            f"causal_mask: the circuit has no {scores!r} node to mask (scores= finds other score nodes)"
        )

    def masked(node: Circuit) -> Circuit:
        raw = _unmasked(node)
        heads, queries, keys = raw.shape[-3:]
        if mask is None:
            _check_only_causal(node, queries, keys)
        mask_node = _mask_node(mask, node, heads, queries, keys)
        letters = raw.out_axes[-3:] if mask_node.rank == 3 else raw.out_axes[-2:]
        with_mask = Einsum(
            *zip(raw.children, raw.operand_axes),
            (mask_node, letters),
            out_axes=raw.out_axes,
            name=_raw_name(node),
        )
        return Add(with_mask, neg_inf_bias(mask_node, neg_inf), name=node.name)

    # update works bottom-up, so a later layer's scores are rebuilt over the earlier, masked ones
    return circuit.update(scores, masked)


def _raw_name(scores: Circuit) -> str | None:
    """``'a.attn_scores_raw'`` for the builders' scores, ``'x_raw'`` for a node ``'x'``."""
    return None if scores.name is None else f"{scores.name}_raw"


def _check_only_causal(scores: Circuit, queries: int, keys: int) -> None:
    """Replacing a mask by the causal one is a no-op unless the mask was something else (a
    sliding window, a knockout): refused then, rather than silently changing the model."""
    if not (isinstance(scores, Add) and scores.children and scores.children[0].name == _raw_name(scores)):
        return
    existing = scores.children[0].children[-1]
    if not isinstance(existing, Array) or existing.value is None or existing.rank != 2:
        return
    if not torch.equal(existing.value.bool(), torch.ones(queries, keys, dtype=torch.bool).tril()):
        raise PassError(
            f"causal_mask: {scores.describe()} is already masked with {existing.describe()}, which is not "
            "the causal mask (a sliding window or a knockout); pass mask= to replace it on purpose"
        )


def _unmasked(scores: Circuit) -> Einsum:
    """The score Einsum without a mask, whether ``scores`` is masked already or not."""
    if isinstance(scores, Einsum) and scores.repeats_output_axes:
        raise PassError(
            f"causal_mask: {scores.describe()} ({scores.einsum_string}) repeats an output letter (a diagonal "
            "embedding), so its query and key axes cannot take a mask"
        )
    if isinstance(scores, Einsum) and len(scores.out_axes) >= 3:
        return scores
    if isinstance(scores, Add) and scores.children and scores.children[0].name == _raw_name(scores):
        raw = scores.children[0]
        return Einsum(*zip(raw.children[:-1], raw.operand_axes[:-1]), out_axes=raw.out_axes, name=raw.name)
    raise PassError(
        f"causal_mask: {scores.describe()} is neither an Einsum ending in head, query, key axes "
        f"nor an already masked Add of {_raw_name(scores)!r}"
    )


def _mask_node(mask: MaskSpec, scores: Circuit, heads: int, queries: int, keys: int) -> Array:
    if mask is None:
        if queries != keys:
            raise PassError(
                f"causal_mask: {scores.describe()} has {queries} queries but {keys} keys; pass a mask"
            )
        return causal_mask_array(queries)
    if callable(mask) and not isinstance(mask, torch.Tensor):
        layer = layer_of(scores)
        tensor = torch.stack([torch.as_tensor(mask(layer, head)) for head in range(heads)])
        name = names.layer_mask(layer)
    else:
        tensor, name = torch.as_tensor(mask), names.CAUSAL_MASK
    expected = (heads, queries, keys) if tensor.ndim == 3 else (queries, keys)
    if tuple(tensor.shape) != expected:
        raise PassError(
            f"causal_mask: mask for {scores.describe()} {list(scores.shape)} has shape "
            f"{list(tensor.shape)}, expected {list(expected)} (0/1, 1 = attend)"
        )
    if not bool(((tensor == 0) | (tensor == 1)).all()):
        raise PassError(
            f"causal_mask: mask values must be 0 or 1 (1 = attend), got {tensor.unique().tolist()[:6]}"
        )
    return Array(tensor.to(torch.get_default_dtype()), name=name)


# ------------------------------------------------------------- head splitting

HeadGroups = Union[None, Iterable[int], Iterable[Sequence[int]]]


def split_heads(circuit: Circuit, layers: Iterable[int] | None = None, heads: HeadGroups = None) -> Circuit:
    """Each layer's ``'b{L}.a'`` rewritten as an Add of one branch per head.

    Branch ``'b{L}.a.head{h}'`` is the layer's head-summing Einsum over head
    ``h`` alone: an Index ``[h]`` pushed down through the attention (see
    ``push_down``) until it rests on the layer's weights, which become
    ``'a{L}.w.q.head{h}'`` and so on.  ``layers`` picks layers (default all);
    ``heads`` picks heads (default all), or groups them: ``[[0, 1, 2, 3],
    [4, 5, 6, 7]]`` gives branches ``'b{L}.a.head0-3'`` and ``'b{L}.a.head4-7'``
    (a group must be a contiguous range).  Heads left out of ``heads`` are
    dropped from the sum only if you ask for that by listing the rest: every
    head must belong to exactly one group.
    """
    targets = {node.name: layer for layer, node in _layer_outputs(circuit, layers).items()}

    def split(node: Circuit) -> Circuit:
        return split_layer(node, targets[node.name], heads)

    # update works bottom-up, so a later layer is split over the earlier, already split ones
    return circuit.update(Matcher(set(targets)) & Einsum, split)


def split_layer(node: Einsum, layer: int, heads: HeadGroups = None, *, push_down: bool = True) -> Add:
    """One layer's head-summing Einsum ``'b{L}.a'`` as the Add of its head branches, which is what
    ``split_heads`` makes of it in a circuit (``heads`` as there).

    With ``push_down=False`` a branch is the Einsum over its operands' ``Index`` at its heads,
    not pushed down toward the weights: a few nodes per head instead of a copy of the attention,
    of the same value (up to float rounding), for a caller that needs only the branches' values
    (``ex.sweep`` zero-ablating heads: ``circuits.experiments.sweep_batches``).
    """
    head_axis = _head_axis(node)
    groups = _head_groups(heads, _head_count(node), layer)
    return Add(*(_head_branch(node, layer, head_axis, group, push_down) for group in groups), name=node.name)


def unsplit_head_counts(circuit: Circuit) -> dict[int, int]:
    """``{layer: number of heads}`` for each layer whose ``'b{L}.a'`` is still one Einsum (not split).

    An Einsum of that name that sums no axis of all its operands has no
    head axis, hence no heads to count: it is left out (``split_heads``
    refuses it).
    """
    counts = {}
    for layer, node in sorted(unsplit_layers(circuit).items()):
        try:
            counts[layer] = _head_count(node)
        except PassError:
            continue
    return counts


def unsplit_layers(circuit: Circuit) -> dict[int, Einsum]:
    """``{layer: its 'b{L}.a' Einsum}`` for each layer whose head-summing Einsum is not split."""
    found = {}
    for node in unique_nodes([circuit]):
        layer = names.parse_attn_out(node.name)
        if layer is not None and isinstance(node, Einsum):
            found[layer] = node
    return found


def _layer_outputs(circuit: Circuit, layers: Iterable[int] | None) -> dict[int, Einsum]:
    found = unsplit_layers(circuit)
    if layers is None:
        if not found:
            raise PassError("split_heads: no unsplit 'b{L}.a' Einsum in the circuit")
        return dict(sorted(found.items()))
    chosen = {}
    for layer in layers:
        if layer not in found:
            raise PassError(
                f"split_heads: layer {layer} has no unsplit 'b{layer}.a' Einsum; unsplit layers: {sorted(found)}"
            )
        chosen[layer] = found[layer]
    return chosen


def _head_axis(node: Einsum) -> int:
    summed = [
        a for a in node.operand_axes[0] if a not in node.out_axes and all(a in ax for ax in node.operand_axes)
    ]
    if not summed:
        raise PassError(f"split_heads: {node.describe()} sums no axis shared by its operands (no head axis)")
    return summed[0]


def _head_count(node: Einsum) -> int:
    return node.children[0].shape[node.operand_axes[0].index(_head_axis(node))]


def _head_groups(heads: HeadGroups, count: int, layer: int) -> list[list[int]]:
    if heads is None:
        return [[h] for h in range(count)]
    groups = [[int(h)] if isinstance(h, int) else [int(x) for x in h] for h in heads]
    flat = [h for group in groups for h in group]
    if sorted(flat) != list(range(count)):
        raise PassError(
            f"split_heads: layer {layer} has heads 0-{count - 1}; the groups {groups} must cover each exactly once"
        )
    for group in groups:
        if group != list(range(group[0], group[0] + len(group))):
            raise PassError(f"split_heads: head group {group} is not a contiguous range")
    return groups


def _head_branch(node: Einsum, layer: int, head_axis: int, group: list[int], push_down: bool) -> Circuit:
    item = group[0] if len(group) == 1 else slice(group[0], group[-1] + 1)

    def leaf_name(index: Index) -> str | None:
        return names.head_weight(index.node.name, group[0], group[-1]) if index.node.name else None

    operands, axes = [], []
    for child, child_axes in zip(node.children, node.operand_axes):
        items = tuple(item if a == head_axis else slice(None) for a in child_axes)
        if head_axis not in child_axes:
            operands.append(child)
        else:
            operands.append(push_index(Index(child, items), leaf_name) if push_down else Index(child, items))
        axes.append(tuple(a for a in child_axes if not (a == head_axis and isinstance(item, int))))
    return Einsum(*zip(operands, axes), out_axes=node.out_axes, name=names.head(layer, group[0], group[-1]))
