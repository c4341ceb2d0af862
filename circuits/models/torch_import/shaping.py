"""Views as einops Rearranges: reshape, permute, expand, unsqueeze, squeeze.

A reshape is read as blocks of axes whose sizes multiply to the same
number: ``[2,5,36] -> [10,36]`` is ``a b c -> (a b) c``; ``[2,5,12] ->
[2,5,3,4]`` is ``a b (c d) -> a b c d, d=4``; size-1 axes are ``1``.  A
block that both merges and splits (``[6,4] -> [4,6]``) goes through one
flat axis, as two Rearranges.
"""

from __future__ import annotations

import string
from typing import Sequence

from circuits.core.nodes import Circuit, Rearrange


class AxisNames:
    """einops axis names in order: a, b, ..., z, a1, b1, ..."""

    def __init__(self):
        self.count = 0

    def take(self) -> str:
        letter, round_ = string.ascii_lowercase[self.count % 26], self.count // 26
        self.count += 1
        return letter if round_ == 0 else f"{letter}{round_}"


def _blocks(in_shape: Sequence[int], out_shape: Sequence[int]) -> list[tuple[list[int], list[int]]]:
    """Pairs (input axes, output axes), sizes other than 1, whose products are equal."""
    ins = [k for k, size in enumerate(in_shape) if size != 1]
    outs = [k for k, size in enumerate(out_shape) if size != 1]
    blocks, p, q = [], 0, 0
    while p < len(ins):
        group_in, group_out = [ins[p]], [outs[q]]
        size_in, size_out = in_shape[ins[p]], out_shape[outs[q]]
        while size_in != size_out:
            if size_in < size_out:
                p += 1
                group_in.append(ins[p])
                size_in *= in_shape[ins[p]]
            else:
                q += 1
                group_out.append(outs[q])
                size_out *= out_shape[outs[q]]
        blocks.append((group_in, group_out))
        p, q = p + 1, q + 1
    return blocks


def reshaped(node: Circuit, shape: Sequence[int], name: str) -> Circuit | None:
    """``node`` viewed as ``shape`` (itself if it has that shape; None for size-0 axes)."""
    shape = tuple(shape)
    if node.shape == shape:
        return node
    if 0 in node.shape or 0 in shape:
        return None
    blocks = _blocks(node.shape, shape)
    if any(len(i) > 1 and len(o) > 1 for i, o in blocks):
        flat = reshaped(node, (max(1, _product(node.shape)),), f"{name}.flat")
        return reshaped(flat, shape, name)
    names = AxisNames()
    in_tokens = ["1"] * node.rank
    out_tokens = ["1"] * len(shape)
    sizes: dict[str, int] = {}
    for group_in, group_out in blocks:
        if len(group_out) == 1:
            axes = [names.take() for _ in group_in]
            for k, axis in zip(group_in, axes):
                in_tokens[k] = axis
            out_tokens[group_out[0]] = axes[0] if len(axes) == 1 else f"({' '.join(axes)})"
        else:
            axes = [names.take() for _ in group_out]
            for k, axis in zip(group_out, axes):
                out_tokens[k] = axis
                sizes[axis] = shape[k]
            del sizes[axes[0]]  # einops infers one
            in_tokens[group_in[0]] = f"({' '.join(axes)})"
    return Rearrange(node, f"{' '.join(in_tokens)} -> {' '.join(out_tokens)}", name=name, sizes=sizes)


def _product(shape: Sequence[int]) -> int:
    result = 1
    for size in shape:
        result *= size
    return result


def permuted(node: Circuit, order: Sequence[int], name: str) -> Circuit:
    order = [axis % node.rank for axis in order] if node.rank else []
    if order == list(range(node.rank)):
        return node
    names = AxisNames()
    axes = [names.take() for _ in range(node.rank)]
    return Rearrange(node, f"{' '.join(axes)} -> {' '.join(axes[k] for k in order)}", name=name)


def expanded(node: Circuit, sizes: Sequence[int], name: str) -> Circuit:
    """torch's ``expand``: size-1 axes repeated, new leading axes added (``-1`` keeps a size)."""
    new = len(sizes) - node.rank
    target = [node.shape[k - new] if size == -1 else size for k, size in enumerate(sizes)]
    if tuple(target) == node.shape:
        return node
    names = AxisNames()
    in_tokens, out_tokens, given = [], [], {}
    for k, size in enumerate(target):
        if k < new or node.shape[k - new] != size:
            axis = names.take()
            given[axis] = size
            out_tokens.append(axis)
            if k >= new:
                in_tokens.append("1")
        elif size == 1:
            in_tokens.append("1")
            out_tokens.append("1")
        else:
            axis = names.take()
            in_tokens.append(axis)
            out_tokens.append(axis)
    return Rearrange(node, f"{' '.join(in_tokens)} -> {' '.join(out_tokens)}", name=name, sizes=given)


def unsqueezed(node: Circuit, dims: Sequence[int], name: str) -> Circuit:
    """``node`` with size-1 axes at output positions ``dims``."""
    rank = node.rank + len(dims)
    dims = {d % rank for d in dims}
    names = AxisNames()
    in_tokens = [names.take() for _ in range(node.rank)]
    tokens = iter(in_tokens)
    out_tokens = ["1" if k in dims else next(tokens) for k in range(rank)]
    return Rearrange(node, f"{' '.join(in_tokens)} -> {' '.join(out_tokens)}", name=name)


def squeezed(node: Circuit, dims: Sequence[int], name: str) -> Circuit:
    """``node`` without its size-1 axes among ``dims`` (others are kept, as torch does)."""
    dims = {d % node.rank for d in dims if node.shape[d % node.rank] == 1} if node.rank else set()
    if not dims:
        return node
    names = AxisNames()
    in_tokens = ["1" if k in dims else names.take() for k in range(node.rank)]
    out_tokens = [token for token in in_tokens if token != "1"]
    return Rearrange(node, f"{' '.join(in_tokens)} -> {' '.join(out_tokens)}", name=name)
