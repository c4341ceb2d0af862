"""Einsum kernels, planned once per equation (as einops caches a parsed pattern)."""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch

from circuits.evaluation.reduced import (
    REDUCED,
    contract_in_float32,
    float32_workspace,
    pairable,
    takes_float32,
    worth_float32,
)

__all__ = ["einsum_kernel", "einsum_workspace", "is_batched_dot", "split_multipliers"]


@functools.lru_cache(maxsize=4096)
def einsum_kernel(equation: str) -> Callable:
    """The function computing an einsum, planned once per equation (see ``_planned``).

    Operands of different dtypes are promoted to one (``torch.promote_types``, as
    ``*`` and ``+`` promote; ``torch.einsum`` refuses them), so that a bfloat16
    value can meet a float32 one where a model upcasts (a norm computed in float32).
    """
    kernel = _planned(equation)

    def promoting(*tensors: torch.Tensor) -> torch.Tensor:
        dtype = tensors[0].dtype
        for tensor in tensors:
            if tensor.dtype != dtype:
                common = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
                return kernel(*[t.to(common) for t in tensors])
        return kernel(*tensors)

    return promoting


def _planned(equation: str) -> Callable:
    """The function computing an einsum of operands of one dtype.

    ``torch.einsum`` turns every pairwise contraction into a batched matrix
    product, which is slow in two common shapes: a product of operands that
    only scale the result (a Scalar, a mask, a layer norm's ``1/d``), and a
    "batched dot" whose operands have the same letters (a layer norm's
    variance ``bih,bih->bi``, 7x slower than ``(x*x).sum(-1)``).  So:

    - with three or more operands, those whose (distinct) letters all
      appear in the output are *multipliers*: the others are contracted by
      ``torch.einsum`` and the multipliers applied after, broadcast;
    - two operands with the same distinct letters (at least one summed) are
      multiplied and summed;
    - any other two operands with a letter summed are one ``matmul`` of views
      (``_pair``), their summed letters in the larger operand's memory order.

    Everything else is ``torch.einsum`` as written.  A contraction (a letter
    summed) of bfloat16 or float16 operands on a CPU without a native kernel
    for them is computed in float32 and rounded once (``reduced``).  The
    values agree with ``torch.einsum`` up to float rounding (products are
    associated differently).
    """
    inputs, out = equation.split("->")
    operands = inputs.split(",")
    if len(set(out)) != len(out):
        return _diagonal_embedding(inputs, out)
    plain = _contraction(equation, operands, out)
    if any(len(set(op)) != len(op) for op in operands):
        return plain  # diagonals: leave to torch
    if len(operands) >= 3:
        core, multipliers = split_multipliers(operands, out)
        if not multipliers:
            return plain
        core_letters = set("".join(operands[i] for i in core))
        core_out = "".join(letter for letter in out if letter in core_letters)
        core_fn = _planned(",".join(operands[i] for i in core) + "->" + core_out)
        core_view = _aligner(core_out, out)
        views = [(i, _aligner(operands[i], out)) for i in multipliers]
        core_positions = tuple(core)

        def with_multipliers(*tensors: torch.Tensor) -> torch.Tensor:
            result = core_view(core_fn(*[tensors[i] for i in core_positions]))
            for i, view in views:
                result = result * view(tensors[i])
            return result

        return with_multipliers
    if is_batched_dot(operands, out):
        first, second = operands
        order = out + "".join(letter for letter in first if letter not in out)
        permute_first = tuple(first.index(letter) for letter in order)
        permute_second = tuple(second.index(letter) for letter in order)
        summed = tuple(range(len(out), len(order)))

        def batched_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            return (a.permute(permute_first) * b.permute(permute_second)).sum(dim=summed)

        return batched_dot
    return plain


def _contraction(equation: str, operands: list[str], out: str) -> Callable:
    """A contraction: two operands as one matrix product of views (``_pair``), others by
    ``torch.einsum``; in float32 for bfloat16 or float16 operands on a CPU without a native kernel
    for them (``reduced.worth_float32``)."""
    plain = functools.partial(torch.einsum, equation)
    if not set("".join(operands)) - set(out):
        return plain  # nothing summed: products and copies, as fast in the operands' dtype
    native = _pair(operands, out) if len(operands) == 2 and pairable(operands, out) else plain

    def contract(*tensors: torch.Tensor) -> torch.Tensor:
        if tensors[0].dtype not in REDUCED:
            return native(*tensors)
        sizes: dict[str, int] = {}
        for letters, tensor in zip(operands, tensors):
            sizes.update(zip(letters, tensor.shape))
        if not worth_float32(tensors, sizes, math.prod(sizes[letter] for letter in out)):
            return native(*tensors)
        return contract_in_float32(equation, operands, out, tensors, sizes)

    return contract


def _pair(operands: list[str], out: str) -> Callable:
    """Two operands' product as ``matmul`` of ``[batch, free, summed]`` views, the summed letters in
    the larger operand's memory order, so that a weight is reshaped, not copied.

    ``torch.einsum`` orders the summed letters by their codes (upper case first), so the heads'
    output ``bhsV,hdV->bsd`` of a weight stored ``[d_model, heads * d_head]`` copied the whole
    weight into ``[V, h, d]`` at every call (15% of a 1B Llama's float32 forward)."""
    a, b = operands
    batch = [x for x in out if x in a and x in b]
    free = [[x for x in op if x in out and x not in batch] for op in operands]
    summed = [x for x in a if x not in out]

    def product(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        strides = [dict(zip(a, x.stride())), dict(zip(b, y.stride()))]
        big = strides[0] if x.numel() >= y.numel() else strides[1]
        k = sorted(summed, key=big.__getitem__, reverse=True)
        frees = [sorted(f, key=st.__getitem__, reverse=True) for f, st in zip(free, strides)]
        left, right = _matrix(x, a, batch, frees[0], k), _matrix(y, b, batch, frees[1], k)
        result = torch.matmul(left, right.transpose(-1, -2))
        sizes = dict(zip(a, x.shape)) | dict(zip(b, y.shape))
        axes = batch + frees[0] + frees[1]  # the product's
        return result.view([sizes[x] for x in axes]).permute([axes.index(x) for x in out])

    return product


def _matrix(tensor: torch.Tensor, letters: str, batch: list[str], free: list[str], summed: list[str]):
    """``tensor`` as ``[batch, free, summed]``, each group merged: a view where its strides allow."""
    axes = [letters.index(x) for x in batch + free + summed]
    sizes = [math.prod(tensor.shape[letters.index(x)] for x in group) for group in (batch, free, summed)]
    return tensor.permute(axes).reshape(sizes)


def _diagonal_embedding(inputs: str, out: str) -> Callable:
    """An output that repeats a letter (``ab->abaa``), which ``torch.einsum`` refuses.

    As rust_circuit does: the einsum into each letter once (``ab->ab``),
    written into zeros of the full output along its diagonal, a strided view
    whose stride for a letter is the sum of the strides of the output axes
    it names (``torch.as_strided_scatter``, which autograd follows).
    """
    distinct = "".join(dict.fromkeys(out))
    contract = _planned(f"{inputs}->{distinct}")
    positions = [[i for i, letter in enumerate(out) if letter == d] for d in distinct]

    def embed(*tensors: torch.Tensor) -> torch.Tensor:
        core = contract(*tensors)
        size = dict(zip(distinct, core.shape))
        result = core.new_zeros([size[letter] for letter in out])
        strides = result.stride()
        diagonal_strides = [sum(strides[i] for i in axes) for axes in positions]
        return torch.as_strided_scatter(result, core, core.shape, diagonal_strides)

    return embed


def split_multipliers(operands: list[str], out: str) -> tuple[list[int], list[int]]:
    """``(core, multipliers)``: the operand positions ``einsum_kernel`` contracts, and those it multiplies in after.

    Public so that ``circuits.evaluation.costs`` counts the operations this kernel
    actually runs (for three or more operands, without repeated letters).
    """
    out_letters = set(out)
    multipliers = [i for i, op in enumerate(operands) if set(op) <= out_letters]
    core = [i for i in range(len(operands)) if i not in multipliers]
    if multipliers and not core:  # only multipliers: the first one is the core
        core, multipliers = multipliers[:1], multipliers[1:]
    return core, multipliers


def einsum_workspace(
    equation: str,
    shapes: tuple[tuple[int, ...], ...],
    dtypes: tuple[torch.dtype, ...],
    device: torch.device,
) -> tuple[int, int]:
    """``(transient, scratch)`` bytes ``einsum_kernel(equation)`` allocates beside its result on
    operands of ``shapes`` and ``dtypes`` on ``device``, without gradients, for ``costs``: copies of
    operands promoted to a common dtype, the core before its multipliers (or before its diagonal
    embedding), a batched dot's product, and ``reduced.float32_workspace`` where the contraction runs
    in float32.  ``torch.einsum``'s and ``reshape``'s own copies are not counted."""
    if not shapes:
        return 0, 0  # no operand: a constant, nothing to copy
    common = functools.reduce(torch.promote_types, dtypes)
    size = common.itemsize
    transient = sum(math.prod(shape) * size for shape, dtype in zip(shapes, dtypes) if dtype != common)
    inputs, out = equation.split("->")
    operands = inputs.split(",")
    sizes = {letter: n for op, shape in zip(operands, shapes) for letter, n in zip(op, shape)}
    if len(set(out)) != len(out):
        distinct = "".join(dict.fromkeys(out))
        inner = einsum_workspace(f"{inputs}->{distinct}", shapes, (common,) * len(shapes), device)
        return transient + math.prod(sizes[x] for x in distinct) * size + inner[0], inner[1]
    core = list(range(len(operands)))
    if all(len(set(op)) == len(op) for op in operands):
        if len(operands) >= 3:
            core, multipliers = split_multipliers(operands, out)
            if multipliers:
                letters = set("".join(operands[i] for i in core))
                transient += math.prod(sizes[x] for x in out if x in letters) * size
        elif is_batched_dot(operands, out):
            return transient + math.prod(sizes[x] for x in operands[0]) * size, 0
    core_operands = [operands[i] for i in core]
    core_letters = set("".join(core_operands))
    core_out = "".join(x for x in out if x in core_letters)
    core_sizes = {x: sizes[x] for x in core_letters}
    elements = sum(math.prod(shapes[i]) for i in core)
    if not core_letters - set(core_out) or not takes_float32(
        common, device, elements, core_sizes, math.prod(sizes[x] for x in core_out)
    ):
        return transient, 0
    extra, scratch = float32_workspace(core_operands, core_out, [shapes[i] for i in core])
    return transient + extra, scratch


def is_batched_dot(operands: list[str], out: str) -> bool:
    """Whether ``einsum_kernel`` runs two operands as a product then a sum (see there), not ``torch.einsum``."""
    return len(operands) == 2 and set(operands[0]) == set(operands[1]) and len(out) < len(operands[0])


def _aligner(letters: str, out: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """A view of a tensor with axes ``letters`` (all in ``out``) in ``out``'s order, unit axes elsewhere."""
    ordered = sorted(letters, key=out.index)
    permutation = tuple(letters.index(letter) for letter in ordered)
    index = tuple(slice(None) if letter in letters else None for letter in out)
    identity = permutation == tuple(range(len(letters)))

    def align(tensor: torch.Tensor) -> torch.Tensor:
        return (tensor if identity else tensor.permute(permutation))[index]

    return align
