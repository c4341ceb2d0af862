"""Functions and network layers: the library's GeneralFunctions, norms and attention written out.

Layer norm and RMS norm are written as the builders write them
(``circuits.models.common``); ``scaled_dot_product_attention`` becomes
scores, mask, softmax and the value product, so its heads are Einsum axes
that passes and experiments can reach.
"""

from __future__ import annotations

import math

import torch

from circuits.models.torch_import import shaping
from circuits.models.torch_import.registry import UNTRANSLATED, Const, translates
from circuits.core.nodes import Add, Array, Circuit, Einsum, GeneralFunction, Rearrange

#: aten op -> the library's GeneralFunction computing it.
_ELEMENTWISE = {
    name: name
    for name in (
        "relu",
        "silu",
        "sigmoid",
        "tanh",
        "exp",
        "log",
        "sqrt",
        "rsqrt",
        "sin",
        "cos",
        "abs",
        "reciprocal",
    )
}


def _function(ctx, spec: str, *nodes: Circuit, part: str | None = None) -> GeneralFunction:
    return GeneralFunction(*nodes, spec=spec, name=ctx.name(part))


@translates(*_ELEMENTWISE)
def elementwise(ctx, x):
    return _function(ctx, _ELEMENTWISE[ctx.op], ctx.node(x)) if ctx.all_float(x) else UNTRANSLATED


@translates("gelu")
def gelu(ctx, x, approximate="none"):
    """Exact gelu, or ``gelu_new`` (the library's name for the tanh approximation)."""
    if not ctx.all_float(x):
        return UNTRANSLATED
    return _function(ctx, "gelu_new" if approximate == "tanh" else "gelu", ctx.node(x))


@translates("pow")
def pow_(ctx, x, exponent):
    """A square as an Einsum ``x * x``; another number exponent stays a number
    (``aten.pow.Tensor_Scalar(_,3.0)``: torch's kernel for a tensor exponent, the library ``pow``'s,
    is several times slower); a tensor exponent the library's ``pow``."""
    if not ctx.all_float(x, exponent) or isinstance(x, (int, float)):
        return UNTRANSLATED
    if exponent == 2 and not isinstance(exponent, bool):  # a square is a product (torch computes x * x)
        x = ctx.node(x)
        axes = tuple(range(x.rank))
        return Einsum((x, axes), (x, axes), out_axes=axes, name=ctx.name())
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
        spec = f"aten.pow.Tensor_Scalar(_,{float(exponent)!r})"
        return GeneralFunction(ctx.node(x), spec=spec, name=ctx.name())
    return _function(ctx, "pow", ctx.node(x), ctx.node(exponent))


def _over_last_axis(ctx, x: Circuit, dim: int, spec: str) -> Circuit:
    """``spec`` (a function of the last axis) applied along ``dim``: moved last and back if needed."""
    dim = dim % x.rank
    if dim == x.rank - 1:
        return _function(ctx, spec, x)
    order = [k for k in range(x.rank) if k != dim] + [dim]
    moved = shaping.permuted(x, order, ctx.name("moved"))
    result = _function(ctx, spec, moved, part=spec)
    back = [order.index(k) for k in range(x.rank)]
    return shaping.permuted(result, back, ctx.name())


@translates("softmax", "_softmax", "log_softmax", "_log_softmax")
def softmax(ctx, x, dim, half_to_float=False, dtype=None):
    if not ctx.all_float(x) or half_to_float is True or dtype is not None or ctx.node(x).rank == 0:
        return UNTRANSLATED
    spec = "log_softmax" if "log" in ctx.op else "softmax"
    return _over_last_axis(ctx, ctx.node(x), dim, spec)


@translates("amax")
def amax(ctx, x, dim=(), keepdim=False):
    x = ctx.node(x)
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not ctx.all_float(x) or keepdim or x.rank == 0 or [d % x.rank for d in dims] != [x.rank - 1]:
        return UNTRANSLATED
    return _function(ctx, "max", x)


# --------------------------------------------------------------------- norms


def _normalized(ctx, x: Circuit, eps: float, center: bool) -> Circuit:
    """``(x - mean) * rsqrt(var + eps)`` over the last axis (``center=False``: ``x * rsqrt(mean(x^2) + eps)``)."""
    batch = tuple(range(x.rank - 1))
    h, z = x.rank - 1, x.rank
    size = _function(ctx, "last_dim_size", x, part="hidden_size")
    recip = _function(ctx, "reciprocal", size, part="recip_hidden_size")
    if center:
        neg = ctx.constant(-1.0, "neg", (1,))
        neg_mean = Einsum(
            (x, batch + (h,)), (neg, (z,)), (recip, batch), out_axes=batch + (z,), name=ctx.name("neg_mean")
        )
        x = Add(x, neg_mean, name=ctx.name("mean_subbed"))
    var = Einsum((x, batch + (h,)), (x, batch + (h,)), (recip, batch), out_axes=batch, name=ctx.name("var"))
    var_p_eps = Add(ctx.constant(eps, "eps"), var, name=ctx.name("var_p_eps"))
    rsqrt = _function(ctx, "rsqrt", var_p_eps, part="rsqrt")
    return Einsum((x, batch + (h,)), (rsqrt, batch), out_axes=batch + (h,), name=ctx.name("y"))


def _affine(ctx, y: Circuit, weight, bias) -> Circuit:
    batch, h = tuple(range(y.rank - 1)), y.rank - 1
    if weight is not None:
        name = ctx.name("y_scaled" if bias is not None else None)
        y = Einsum((y, batch + (h,)), (ctx.node(weight), (h,)), out_axes=batch + (h,), name=name)
    return y if bias is None else Add(ctx.node(bias), y, name=ctx.name())


@translates("layer_norm")
def layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    if len(normalized_shape) != 1 or not ctx.all_float(x, weight, bias) or ctx.node(x).rank == 0:
        return UNTRANSLATED
    y = _normalized(ctx, ctx.node(x), eps, center=True)
    if weight is None and bias is None:
        return Einsum((y, tuple(range(y.rank))), out_axes=tuple(range(y.rank)), name=ctx.name())
    return _affine(ctx, y, weight, bias)


@translates("rms_norm")
def rms_norm(ctx, x, normalized_shape, weight=None, eps=None):
    if len(normalized_shape) != 1 or not ctx.all_float(x, weight) or ctx.node(x).rank == 0:
        return UNTRANSLATED
    eps = torch.finfo(ctx.out_dtype).eps if eps is None else eps
    y = _normalized(ctx, ctx.node(x), eps, center=False)
    if weight is None:
        return Einsum((y, tuple(range(y.rank))), out_axes=tuple(range(y.rank)), name=ctx.name())
    return _affine(ctx, y, weight, None)


# ----------------------------------------------------------------- attention


def _mask_bias(ctx, mask, scores_rank: int) -> Circuit | None:
    """What the mask adds to the scores: a float mask itself, a bool one as 0 / -inf."""
    if mask is None:
        return None
    dtype = ctx.dtype_of(mask)
    if dtype == torch.bool:
        if isinstance(mask, Const):  # known at import: the bias is a constant
            bias = torch.zeros(mask.tensor.shape, dtype=ctx.out_dtype).masked_fill(~mask.tensor, -math.inf)
            return Array(bias, name=ctx.name("mask_bias"))
        return GeneralFunction(
            ctx.node(mask), spec="aten.where.Scalar(_bool,0.0,-inf)", name=ctx.name("mask_bias")
        )
    return ctx.node(mask) if dtype == ctx.out_dtype else None


@translates("scaled_dot_product_attention")
def attention(ctx, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, *, scale=None, enable_gqa=False):
    """``softmax(q k^T * scale + mask) v`` as Einsums: ``.scores``, ``.probs``, then the op's name."""
    if dropout_p or not ctx.all_float(q, k, v):
        return UNTRANSLATED
    q, k, v = ctx.node(q), ctx.node(k), ctx.node(v)
    if min(q.rank, k.rank, v.rank) < 3 and (enable_gqa or q.rank != k.rank):
        return UNTRANSLATED
    if enable_gqa and q.shape[-3] != k.shape[-3]:
        k, v = (
            _repeat_heads(ctx, t, q.shape[-3] // t.shape[-3], part)
            for t, part in ((k, "k_rep"), (v, "v_rep"))
        )
    if not (q.shape[:-2] == k.shape[:-2] == v.shape[:-2]):
        return UNTRANSLATED
    bias = _mask_bias(ctx, attn_mask, q.rank)
    if attn_mask is not None and bias is None:
        return UNTRANSLATED
    if is_causal:
        queries, keys = q.shape[-2], k.shape[-2]
        allowed = torch.ones(queries, keys, dtype=torch.bool).tril()
        causal = torch.zeros(queries, keys, dtype=ctx.out_dtype).masked_fill(~allowed, -math.inf)
        bias = Array(causal, name=ctx.name("causal_bias"))
    batch = tuple(range(q.rank - 2))
    query, key, e, ev = (q.rank - 2, q.rank - 1, q.rank, q.rank + 1)
    factor = ctx.constant(float(scale) if scale is not None else 1.0 / math.sqrt(q.shape[-1]), "scale")
    scores = Einsum(
        (q, batch + (query, e)),
        (k, batch + (key, e)),
        (factor, ()),
        out_axes=batch + (query, key),
        name=ctx.name("scores"),
    )
    if bias is not None:
        scores = Add(scores, bias, name=ctx.name("masked_scores"))
    probs = GeneralFunction(scores, spec="softmax", name=ctx.name("probs"))
    return Einsum(
        (probs, batch + (query, key)), (v, batch + (key, ev)), out_axes=batch + (query, ev), name=ctx.name()
    )


def _repeat_heads(ctx, x: Circuit, groups: int, part: str) -> Circuit:
    """Each key/value head repeated for its ``groups`` query heads (torch's ``enable_gqa``)."""
    names = shaping.AxisNames()
    axes = [names.take() for _ in range(x.rank)]
    out = axes[:-3] + [f"({axes[-3]} grp)"] + axes[-2:]
    return Rearrange(x, f"{' '.join(axes)} -> {' '.join(out)}", name=ctx.name(part), grp=groups)


@translates("_native_batch_norm_legit_no_training")
def batch_norm(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
    """Eval-mode batch norm over axis 1, from running statistics known at import:
    ``(x + .neg_mean) * .inv_std * weight + bias`` (the op's other two outputs are empty)."""
    if not (isinstance(running_mean, Const) and isinstance(running_var, Const)) or not ctx.all_float(x):
        return UNTRANSLATED
    x = ctx.node(x)
    if x.rank < 2:
        return UNTRANSLATED
    per_channel = (x.shape[1],) + (1,) * (x.rank - 2)  # broadcast against x's axes after the batch
    mean, var = running_mean.tensor, running_var.tensor
    neg_mean = Array((-mean).reshape(per_channel).to(ctx.out_dtype), name=ctx.name("neg_mean"))
    inv_std = Array(torch.rsqrt(var + eps).to(ctx.out_dtype), name=ctx.name("inv_std"))
    centered = Add(x, neg_mean, name=ctx.name("centered"))
    axes = tuple(range(x.rank))
    operands = [(centered, axes), (inv_std, (1,))]
    if weight is not None:
        operands.append((ctx.node(weight), (1,)))
    scaled = Einsum(*operands, out_axes=axes, name=ctx.name("scaled" if bias is not None else None))
    if bias is None:
        return scaled, None, None
    names = shaping.AxisNames()
    channel = names.take()
    bias_node = Rearrange(
        ctx.node(bias), f"{channel} -> {channel}" + " 1" * (x.rank - 2), name=ctx.name("bias")
    )
    return Add(scaled, bias_node, name=ctx.name()), None, None
