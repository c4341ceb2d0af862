"""Sums and products: add/sub as Add, mul/div/neg and the matmul family as Einsum, sum/mean too.

Broadcasting is written out: an operand's size-1 axis against a larger
output axis gets a letter of its own, summed over (a sum of one term), so
the Einsum multiplies it into every entry as torch broadcasts it.
"""

from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

from circuits.errors import EinsumError
from circuits.models.torch_import.registry import UNTRANSLATED, translates
from circuits.models.torch_import.shaping import unsqueezed
from circuits.core.nodes import Add, Circuit, Einsum, GeneralFunction


class Letters:
    """Fresh einsum axes (ints, printed a, b, c, ...)."""

    def __init__(self):
        self._next = itertools.count()

    def take(self, count: int = 1) -> list[int]:
        return [next(self._next) for _ in range(count)]


def aligned(
    shape: Sequence[int], out: Sequence[int], out_shape: Sequence[int], letters: Letters
) -> list[int]:
    """Axes of an operand of ``shape`` broadcast (right-aligned) to output axes ``out``."""
    offset = len(out) - len(shape)
    axes = []
    for i, size in enumerate(shape):
        j = offset + i
        if j >= 0 and size == out_shape[j]:
            axes.append(out[j])
        elif size == 1:
            axes.append(letters.take()[0])  # broadcast: a size-1 axis summed away
        else:
            raise ValueError(f"shape {list(shape)} does not broadcast to {list(out_shape)}")
    return axes


def scaled(ctx, node: Circuit, factor: float, part: str | None = None, name: str | None = None) -> Circuit:
    """``node * factor`` as an Einsum with a Scalar (``node`` itself for a factor of 1)."""
    if factor == 1:
        return node
    axes = tuple(range(node.rank))
    return Einsum((node, axes), (ctx.constant(factor), ()), out_axes=axes, name=name or ctx.name(part))


def elementwise_product(ctx, values: Sequence[Any], name: str) -> Circuit:
    """The broadcast product of ``values`` (nodes, Consts or numbers) with the op's output shape."""
    letters = Letters()
    out = letters.take(len(ctx.out_shape))
    operands = []
    for value in values:
        node = ctx.node(value)
        operands.append((node, tuple(aligned(node.shape, out, ctx.out_shape, letters))))
    return Einsum(*operands, out_axes=tuple(out), name=name)


def _number(value: Any) -> bool:
    """A Python number (a bool too: torch reads ``x * True`` as ``x * 1``)."""
    return isinstance(value, (int, float))


@translates("add")
def add(ctx, a, b, alpha=1):
    if not ctx.all_float(a, b) or not _number(alpha):
        return UNTRANSLATED
    if _number(b):
        return Add(ctx.node(a), ctx.node(float(b * alpha)), name=ctx.name())
    return Add(ctx.node(a), scaled(ctx, ctx.node(b), alpha, "scaled"), name=ctx.name())


@translates("sub")
def sub(ctx, a, b, alpha=1):
    if not ctx.all_float(a, b) or not _number(alpha):
        return UNTRANSLATED
    if _number(b):
        return Add(ctx.node(a), ctx.node(float(-b * alpha)), name=ctx.name())
    return Add(ctx.node(a), scaled(ctx, ctx.node(b), -alpha, "neg"), name=ctx.name())


@translates("rsub")
def rsub(ctx, a, b, alpha=1):
    """``b - alpha * a``."""
    if not ctx.all_float(a, b) or not _number(alpha):
        return UNTRANSLATED
    return Add(ctx.node(b), scaled(ctx, ctx.node(a), -alpha, "neg"), name=ctx.name())


@translates("neg")
def neg(ctx, x):
    return scaled(ctx, ctx.node(x), -1.0, name=ctx.name()) if ctx.all_float(x) else UNTRANSLATED


@translates("mul")
def mul(ctx, a, b):
    if not ctx.all_float(a, b):
        return UNTRANSLATED
    return elementwise_product(ctx, [a, b], ctx.name())


@translates("div")
def div(ctx, a, b, rounding_mode=None):
    """``a / b`` as ``a * (1/b)``: a Scalar ``1/b``, or the ``reciprocal`` of a tensor ``b``."""
    if rounding_mode is not None or not ctx.all_float(a, b):
        return UNTRANSLATED
    if _number(b) and b == 0:
        return UNTRANSLATED  # the aten op gives inf and nan as torch does
    if _number(b):
        return elementwise_product(ctx, [a, 1.0 / b], ctx.name())
    recip = GeneralFunction(ctx.node(b), spec="reciprocal", name=ctx.name("reciprocal"))
    return elementwise_product(ctx, [a, recip], ctx.name())


# ------------------------------------------------------------------ matmuls


def _matmul(ctx, a: Circuit, b: Circuit, alpha: float = 1.0, name: str | None = None) -> Circuit:
    """torch.matmul's product (1-D operands, broadcast batch axes) as one Einsum."""
    letters = Letters()
    batch_a = a.shape[:-2] if a.rank >= 2 else ()
    batch_b = b.shape[:-2] if b.rank >= 2 else ()
    pairs = itertools.zip_longest(batch_a[::-1], batch_b[::-1], fillvalue=1)
    batch_shape = tuple(max(sizes) for sizes in pairs)[::-1]
    batch = letters.take(len(batch_shape))
    n, k, m = letters.take(3)
    axes_a = aligned(batch_a, batch, batch_shape, letters) + ([n] if a.rank >= 2 else []) + [k]
    axes_b = aligned(batch_b, batch, batch_shape, letters) + [k] + ([m] if b.rank >= 2 else [])
    out = batch + ([n] if a.rank >= 2 else []) + ([m] if b.rank >= 2 else [])
    operands = [(a, tuple(axes_a)), (b, tuple(axes_b))]
    if alpha != 1:
        operands.append((ctx.node(float(alpha)), ()))
    return Einsum(*operands, out_axes=tuple(out), name=name or ctx.name())


@translates("mm", "bmm", "matmul")
def matmul(ctx, a, b):
    if not ctx.all_float(a, b):
        return UNTRANSLATED
    return _matmul(ctx, ctx.node(a), ctx.node(b))


@translates("addmm", "baddbmm", "addmv", "addbmm")
def addmm(ctx, bias, a, b, *, beta=1, alpha=1):
    """``beta * bias + alpha * (a @ b)`` (addbmm also sums over the batch)."""
    if not ctx.all_float(bias, a, b) or not (_number(alpha) and _number(beta)):
        return UNTRANSLATED
    product = _matmul(ctx, ctx.node(a), ctx.node(b), alpha, name=ctx.name("product"))
    if ctx.op == "addbmm":
        product = Einsum((product, (0, 1, 2)), out_axes=(1, 2), name=ctx.name("batch_sum"))
    if beta == 0:
        return product
    return Add(scaled(ctx, ctx.node(bias), beta, "bias_scaled"), product, name=ctx.name())


@translates("linear")
def linear(ctx, x, weight, bias=None):
    """``x @ weight.T + bias``: an Einsum over ``weight [out, in]`` as stored, then the Add."""
    if not ctx.all_float(x, weight, bias) or ctx.node(weight).rank != 2:
        return UNTRANSLATED
    x, weight = ctx.node(x), ctx.node(weight)
    axes = tuple(range(x.rank - 1))
    k, o = x.rank - 1, x.rank
    product_name = ctx.name("product" if bias is not None else None)
    product = Einsum((x, axes + (k,)), (weight, (o, k)), out_axes=axes + (o,), name=product_name)
    return product if bias is None else Add(product, ctx.node(bias), name=ctx.name())


@translates("einsum")
def einsum(ctx, equation, operands, path=None):
    """torch.einsum as the Einsum of its equation (``...`` read as torch reads it); one torch runs by
    broadcasting a letter's size-1 axis, or without ``->``, is kept as the aten op."""
    if "->" not in equation or not ctx.all_float(*operands):
        return UNTRANSLATED
    nodes = [ctx.node(operand) for operand in operands]
    try:
        return Einsum.from_einsum_string(equation, *nodes, name=ctx.name())
    except EinsumError:
        return UNTRANSLATED


# ---------------------------------------------------------------- reductions


def _dims(dims: Any, rank: int) -> list[int]:
    if dims is None or dims == []:
        return list(range(rank))
    dims = [dims] if isinstance(dims, int) else dims
    return sorted({d % rank for d in dims})


@translates("sum", "mean")
def reduce_sum(ctx, x, dims=None, keepdim=False, *, dtype=None):
    """A sum over ``dims`` as an Einsum (``mean`` with a Scalar ``1/n``); ``keepdim`` adds the 1s back."""
    if dtype is not None or not ctx.all_float(x):
        return UNTRANSLATED
    x = ctx.node(x)
    if x.rank == 0:
        return UNTRANSLATED
    reduced = _dims(dims, x.rank)
    kept = tuple(axis for axis in range(x.rank) if axis not in reduced)
    operands = [(x, tuple(range(x.rank)))]
    if ctx.op == "mean":
        operands.append((ctx.node(1.0 / math.prod(x.shape[d] for d in reduced)), ()))
    summed = Einsum(*operands, out_axes=kept, name=ctx.name("summed" if keepdim else None))
    return unsqueezed(summed, reduced, ctx.name()) if keepdim else summed
