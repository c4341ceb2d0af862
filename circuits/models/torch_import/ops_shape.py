"""Views, copies, slices and lookups: Rearrange, Index, Concat, gen_index, or nothing at all.

Copies that change nothing the circuit tracks (``clone``, ``contiguous``,
``alias``, ``detach``, eval-mode ``dropout``, a ``to`` of the same dtype)
are the input itself.
"""

from __future__ import annotations

import torch

from circuits.models.torch_import import dtypes, shaping
from circuits.models.torch_import.registry import UNTRANSLATED, Const, translates
from circuits.core.nodes import Circuit, Concat, GeneralFunction, Index


@translates("view", "reshape", "_unsafe_view")
def view(ctx, x, shape):
    result = shaping.reshaped(ctx.node(x), ctx.out_shape, ctx.name())
    return UNTRANSLATED if result is None else result


@translates("flatten", "unflatten")
def flatten(ctx, x, *args):
    return view(ctx, x, ctx.out_shape)


@translates("permute")
def permute(ctx, x, dims):
    return shaping.permuted(ctx.node(x), dims, ctx.name())


@translates("transpose", "swapaxes", "t", "numpy_T")
def transpose(ctx, x, dim0=0, dim1=1):
    x = ctx.node(x)
    if x.rank < 2:
        return x
    order = list(range(x.rank))
    a, b = dim0 % x.rank, dim1 % x.rank
    order[a], order[b] = order[b], order[a]
    return shaping.permuted(x, order, ctx.name())


@translates("movedim")
def movedim(ctx, x, source, destination):
    x = ctx.node(x)
    source = [source] if isinstance(source, int) else list(source)
    destination = [destination] if isinstance(destination, int) else list(destination)
    axes = list(range(x.rank))
    moved = [axes[s % x.rank] for s in source]
    rest = [a for a in axes if a not in moved]
    result = [None] * x.rank
    for s, d in zip(moved, destination):
        result[d % x.rank] = s
    fill = iter(rest)
    return shaping.permuted(x, [a if a is not None else next(fill) for a in result], ctx.name())


@translates("expand")
def expand(ctx, x, sizes, implicit=False):
    return shaping.expanded(ctx.node(x), sizes, ctx.name())


@translates("unsqueeze")
def unsqueeze(ctx, x, dim):
    return shaping.unsqueezed(ctx.node(x), [dim], ctx.name())


@translates("squeeze")
def squeeze(ctx, x, dims=None):
    x = ctx.node(x)
    dims = range(x.rank) if dims is None else ([dims] if isinstance(dims, int) else dims)
    return shaping.squeezed(x, list(dims), ctx.name())


@translates("clone", "contiguous", "alias", "detach", "lift_fresh_copy")
def same(ctx, x, *args, **kwargs):
    return ctx.node(x)


@translates("dropout", "feature_dropout", "alpha_dropout")
def dropout(ctx, x, p, train):
    """Identity when not training; a training-mode dropout is random: kept as the aten op."""
    return UNTRANSLATED if train and p > 0 else ctx.node(x)


@translates("_to_copy", "to", "type_as")
def to(ctx, x, *args, **kwargs):
    """Same dtype: the input; another: the library's cast (``cast_from_..._to_{...dtype:float16}``)."""
    source, target = ctx.dtype_of(x), ctx.out_dtype
    if source == target:
        return ctx.node(x)
    spec = None if source is None or target is None else dtypes.cast_spec(target)
    return UNTRANSLATED if spec is None else GeneralFunction(ctx.node(x), spec=spec, name=ctx.name())


# ------------------------------------------------------------------- slicing


def _axis_index(x: Circuit, dim: int, item) -> tuple:
    return (slice(None),) * (dim % x.rank) + (item,)


def sliced(x: Circuit, dim: int, start, end, step, name: str) -> Circuit:
    """``x[..., start:end:step]`` along ``dim`` (bounds clamped as torch clamps them)."""
    size = x.shape[dim % x.rank]
    start, end, _ = slice(start, end).indices(size)
    end = max(start, end)
    if (start, end, step) == (0, size, 1):
        return x
    item = slice(start, end) if step == 1 else torch.arange(start, end, step)
    return Index(x, _axis_index(x, dim, item), name=name)


@translates("slice")
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    return sliced(ctx.node(x), dim, start, end, step, ctx.name())


@translates("narrow")
def narrow(ctx, x, dim, start, length):
    return sliced(ctx.node(x), dim, start, start + length, 1, ctx.name())


@translates("select")
def select(ctx, x, dim, index):
    x = ctx.node(x)
    return Index(x, _axis_index(x, dim, index % x.shape[dim % x.rank]), name=ctx.name())


def _pieces(ctx, x: Circuit, dim: int, sizes: list[int]) -> tuple:
    start, pieces = 0, []
    for size in sizes:
        pieces.append(sliced(x, dim, start, start + size, 1, ctx.name(str(len(pieces)))))
        start += size
    return tuple(pieces)


@translates("split", "split_with_sizes", "chunk", "tensor_split")
def split(ctx, x, sizes, dim=0):
    """Each piece an Index (named ``MODULE.split.0``, ...), sized as torch sized them."""
    val = ctx.fx_node.meta["val"]
    x = ctx.node(x)
    return _pieces(ctx, x, dim, [int(piece.shape[dim % x.rank]) for piece in val])


@translates("unbind")
def unbind(ctx, x, dim=0):
    x = ctx.node(x)
    return tuple(
        Index(x, _axis_index(x, dim, i), name=ctx.name(str(i))) for i in range(x.shape[dim % x.rank])
    )


@translates("index")
def index(ctx, x, indices):
    """``x[..., idx]`` with one index tensor: a constant 1-D one is an Index, a computed one a gen_index."""
    given = [(axis, item) for axis, item in enumerate(indices) if item is not None]
    if len(given) != 1:
        return UNTRANSLATED
    axis, item = given[0]
    dtype = ctx.dtype_of(item)
    if dtype is None or dtype.is_floating_point or dtype == torch.bool:
        return UNTRANSLATED
    x = ctx.node(x)
    if isinstance(item, Const) and item.tensor.ndim == 1:
        values = item.tensor.long() % max(1, x.shape[axis])
        return Index(x, _axis_index(x, axis, values), name=ctx.name())
    return GeneralFunction(x, ctx.node(item), spec=f"gen_index_at_{axis}_no_batch_index", name=ctx.name())


@translates("index_select")
def index_select(ctx, x, dim, item):
    return index(ctx, x, [None] * (dim % ctx.node(x).rank) + [item])


@translates("embedding")
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    """The rows of ``weight`` at ``indices``: ``gen_index_at_0_c`` (indices checked), as the builders write it."""
    dtype = ctx.dtype_of(indices)
    if dtype is None or dtype.is_floating_point or dtype == torch.bool:
        return UNTRANSLATED
    return GeneralFunction(ctx.node(weight), ctx.node(indices), spec="gen_index_at_0_c", name=ctx.name())


@translates("cat", "concat", "concatenate")
def cat(ctx, tensors, dim=0):
    nodes = [ctx.node(t) for t in tensors]
    nodes = [n for n in nodes if not (n.rank == 1 and n.shape == (0,) and len(ctx.out_shape) != 1)]
    if len(nodes) == 1:
        return nodes[0]
    return Concat(*nodes, axis=dim % len(ctx.out_shape), name=ctx.name())


@translates("stack")
def stack(ctx, tensors, dim=0):
    rank = len(ctx.out_shape)
    parts = [shaping.unsqueezed(ctx.node(t), [dim % rank], ctx.name("unsqueeze")) for t in tensors]
    return Concat(*parts, axis=dim % rank, name=ctx.name())


@translates("_assert_tensor_metadata", "_assert_scalar", "_assert_async", "sym_constrain_range_for_size")
def checks(ctx, *args, **kwargs):
    """The exporter's checks of a value's dtype, device or range: nothing to compute (no output)."""
    return None


@translates("gather")
def gather(ctx, x, dim, item, sparse_grad=False):
    """Along the last axis, with the index's other axes those of ``x``: ``gen_index_at_0_batch_x_no_batch_index_c``
    (each row looks up its own entries; out-of-range indices are errors, as in torch)."""
    x, dtype = ctx.node(x), ctx.dtype_of(item)
    if dtype is None or dtype.is_floating_point or dtype == torch.bool or x.rank == 0:
        return UNTRANSLATED
    index_node = ctx.node(item)
    if dim % x.rank != x.rank - 1 or index_node.shape[:-1] != x.shape[:-1]:
        return UNTRANSLATED
    return GeneralFunction(x, index_node, spec="gen_index_at_0_batch_x_no_batch_index_c", name=ctx.name())
