"""GeneralFunction specs: what a function computes, and the shape it gives.

A spec is looked up by its registered name, which is what the text format
prints; so a user's own function round-trips through text once registered.
The ``gen_index_at_D[_batch_x][_no_batch_index][_c]``,
``explicit_index_at_D_x_non_b_N[_c]``, ``cast_from_{...}_to_{...}``,
``multinomial[_no_replace]_[sizes]`` and ``aten.OP.OVERLOAD(ARGS)[OUT]``
(circuits/core/aten_functions.py) and ``top_k_K[_normalized]`` families are infinite sets of names,
so they are built on demand from the name instead of listed.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Callable, Sequence

import attrs
import torch

from circuits.core.aten_functions import ATEN_NAME, aten_parts
from circuits.errors import FunctionSpecError

Shape = tuple[int, ...]

_SPEC_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*")
GEN_INDEX_NAME = re.compile(
    r"gen_index_at_(?P<dim>-?\d+)(?P<batch_x>_batch_x)?(?P<no_batch_index>_no_batch_index)?(?P<check>_c)?"
)
# rust_circuit's explicit index: axis D of x's last N axes looked up per batch element.
EXPLICIT_INDEX_NAME = re.compile(r"explicit_index_at_(?P<dim>-?\d+)_x_non_b_(?P<non_batch>\d+)(?P<check>_c)?")
# rust_circuit's sampler: ``multinomial[_no_replace]_[3, 4]`` draws that many indices per row.
MULTINOMIAL_NAME = re.compile(
    r"multinomial(?P<no_replace>_no_replace)?_\[\s*(?P<shape>(?:\d+\s*,\s*)*(?:\d+\s*)?)\]"
)
# Top-k routing (mixture of experts): ``top_k_2`` keeps the 2 largest entries of the last axis,
# ``top_k_2_normalized`` divides them by their sum; both zero the rest.
TOP_K_NAME = re.compile(r"top_k_(?P<k>[1-9][0-9]*)(?P<normalized>_normalized)?")
# rust_circuit's casts: ``cast_from_{device:D,dtype:T}_to_{device:D,dtype:T}``, each D
# and T a name or None (None: no requirement on the input, or left as it is).
_CAST_DTYPES = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_CAST_PART = r"\{device:(?P<%s_device>None|cpu|cuda(?::\d+)?),dtype:(?P<%s_dtype>None|%s)\}"
CAST_NAME = re.compile(
    "cast_from_"
    + _CAST_PART % ("in", "in", "|".join(_CAST_DTYPES))
    + "_to_"
    + _CAST_PART % ("out", "out", "|".join(_CAST_DTYPES))
)


@attrs.frozen
class FunctionSpec:
    """A named function of ``num_inputs`` tensors.

    ``shape_fn`` maps the input shapes to the output shape and raises
    ``ValueError`` with a readable reason when they do not fit; ``function``
    computes the value with torch.
    """

    name: str
    num_inputs: int
    shape_fn: Callable[[Sequence[Shape]], Shape]
    function: Callable[..., torch.Tensor]
    # For one-input functions: the output's leading ``rank - k`` axes are the
    # input's leading axes, computed independently (k = 0 elementwise, 1 for
    # softmax).  Passes use it to move an Index below the function or to add
    # batch axes; None means nothing is known and they leave the node alone.
    num_non_batchable_output_dims: int | None = None
    # For functions of several inputs with num_non_batchable_output_dims set:
    # which inputs may carry the extra leading (batch) axes, all sharing them
    # (None: all may).  ``circuits.expand`` repeats an unbatched batchable
    # input over the batch and refuses a batched non-batchable one; the
    # gen_index family batches by its own rules (circuits/rewriting/batching.py).
    input_batchability: tuple[bool, ...] | None = None
    # The output's dtype from the inputs' dtypes, for what predicts it without running
    # (``circuits.evaluation.costs``); None: the inputs' promoted dtype, as most functions give.
    dtype_fn: Callable[[Sequence[torch.dtype]], torch.dtype] | None = None

    def __reduce__(self):
        """Pickled by name when the name gives this spec back (registered, or of a family),
        since specs hold functions that pickle cannot carry (closures, lambdas)."""
        if _is_family_name(self.name) or _REGISTRY.get(self.name) is self:
            return get_function, (self.name,)
        return super().__reduce__()

    def __attrs_post_init__(self):
        if not (
            _SPEC_NAME.fullmatch(self.name)
            or CAST_NAME.fullmatch(self.name)
            or MULTINOMIAL_NAME.fullmatch(self.name)
            or ATEN_NAME.fullmatch(self.name)
        ):
            raise FunctionSpecError(
                f"function name {self.name!r} must be letters, digits, '_', '.' or '-' "
                "(it is printed bare in the text format)"
            )


def _is_family_name(name: str) -> bool:
    """Whether ``name`` belongs to a family built on demand from the name (indexes, casts, samplers)."""
    return any(
        family.fullmatch(name)
        for family in (
            GEN_INDEX_NAME,
            EXPLICIT_INDEX_NAME,
            CAST_NAME,
            MULTINOMIAL_NAME,
            ATEN_NAME,
            TOP_K_NAME,
        )
    )


_REGISTRY: dict[str, FunctionSpec] = {}
# The specs this module defines, by id (the dict keeps them alive, so an id is never reused):
# their shape_fns are known to agree with their functions, so evaluation need not check them.
_LIBRARY_SPECS: dict[int, FunctionSpec] = {}


def is_library_function(spec: FunctionSpec) -> bool:
    """Whether ``spec`` is one of the library's own functions (not user code, nor a replacement)."""
    return id(spec) in _LIBRARY_SPECS


def _library(spec: FunctionSpec) -> FunctionSpec:
    _LIBRARY_SPECS[id(spec)] = spec
    return spec


def register_function(spec: FunctionSpec, *, replace: bool = False) -> FunctionSpec:
    """Make ``spec`` printable and parseable by its name."""
    existing = _REGISTRY.get(spec.name)
    if existing is not None and existing != spec and not replace:
        raise FunctionSpecError(
            f"a different function is already registered as {spec.name!r}; pass replace=True to override it"
        )
    if _is_family_name(spec.name):
        raise FunctionSpecError(
            f"{spec.name!r} is reserved for the gen_index, explicit_index, cast, multinomial, aten or top_k family"
        )
    _REGISTRY[spec.name] = spec
    return spec


def get_function(name: str) -> FunctionSpec:
    """The spec registered as ``name`` (gen_index names are built on demand)."""
    spec = _REGISTRY.get(name)
    if spec is not None:
        return spec
    match = GEN_INDEX_NAME.fullmatch(name)
    if match:
        return gen_index_spec(
            int(match["dim"]),
            batch_x=bool(match["batch_x"]),
            batch_index=not match["no_batch_index"],
            check_index=bool(match["check"]),
        )
    match = EXPLICIT_INDEX_NAME.fullmatch(name)
    if match:
        return explicit_index_spec(
            int(match["dim"]), int(match["non_batch"]), check_index=bool(match["check"])
        )
    if CAST_NAME.fullmatch(name):
        return cast_spec(name)
    match = MULTINOMIAL_NAME.fullmatch(name)
    if match:
        shape = tuple(int(size) for size in match["shape"].replace(",", " ").split())
        return multinomial_spec(shape, replacement=not match["no_replace"])
    if ATEN_NAME.fullmatch(name):
        return aten_spec(name)
    match = TOP_K_NAME.fullmatch(name)
    if match:
        return top_k_spec(int(match["k"]), normalized=bool(match["normalized"]))
    if " at " in name:
        raise FunctionSpecError(
            f"{name!r} is rust_circuit's 'NAME at PYTHON_PATH' spelling, which imports and runs a class "
            "from a module or file; that is not supported: register the function with cc.register_function "
            "and refer to it by name"
        )
    raise FunctionSpecError(
        f"no GeneralFunction named {name!r}; registered: {', '.join(sorted(_REGISTRY))}, "
        "gen_index_at_D[_batch_x][_no_batch_index][_c], explicit_index_at_D_x_non_b_N[_c], "
        "cast_from_{device:D,dtype:T}_to_{device:D,dtype:T}, multinomial[_no_replace]_[sizes], "
        "top_k_K[_normalized] and aten.OP.OVERLOAD(ARGS)[OUT]"
    )


def registered_names() -> list[str]:
    return sorted(_REGISTRY)


# ----------------------------------------------------------------- elementwise


def _same_shape(shapes: Sequence[Shape]) -> Shape:
    return shapes[0]


def _last_axis(shapes: Sequence[Shape]) -> Shape:
    if len(shapes[0]) == 0:
        raise ValueError("works over the last axis, but the input is rank 0")
    return shapes[0]


def _drop_last_axis(shapes: Sequence[Shape]) -> Shape:
    if len(shapes[0]) == 0:
        raise ValueError("drops the last axis, but the input is rank 0")
    return shapes[0][:-1]


def _last_dim_size(x: torch.Tensor) -> torch.Tensor:
    dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    return torch.full(x.shape[:-1], x.shape[-1], dtype=dtype, device=x.device)


def _gelu_new(x: torch.Tensor) -> torch.Tensor:
    """GPT-2's tanh approximation of gelu (``gelu_new`` in transformers).

    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``, computed by torch's
    fused kernel (``gelu(approximate="tanh")``: the same formula, one pass
    instead of seven, within float rounding of writing it out).
    """
    return torch.nn.functional.gelu(x, approximate="tanh")


def _step(x: torch.Tensor) -> torch.Tensor:
    """1 where ``x > 0``, else 0 (0 at 0 and at NaN), in x's dtype: rust_circuit's ``step``."""
    return (x > 0).to(x.dtype)


def _log_exp_p_1(x: torch.Tensor) -> torch.Tensor:
    """``log(1 + exp(x))`` (softplus), rust_circuit's ``log_exp_p_1``.

    ``logaddexp(x, 0)`` is stable at both ends and, unlike torch's
    ``softplus``, has no threshold above which it returns ``x`` unchanged.
    """
    return torch.logaddexp(x, torch.zeros((), dtype=x.dtype, device=x.device))


def _gaussian_pdf(x: torch.Tensor) -> torch.Tensor:
    """The standard normal density ``exp(-x^2/2) / sqrt(2 pi)``."""
    return torch.exp(-0.5 * x * x) * (1.0 / math.sqrt(2.0 * math.pi))


def _last_axis_min(x: torch.Tensor) -> torch.Tensor:
    """The minimum over the last axis.  ``min(dim=-1)`` rather than ``amin`` because,
    like rust_circuit, its gradient goes to one of tied entries, not split between them."""
    return torch.min(x, dim=-1).values


def _last_axis_max(x: torch.Tensor) -> torch.Tensor:
    """The maximum over the last axis (gradient to one of tied entries, as rust_circuit's)."""
    return torch.max(x, dim=-1).values


def _reduce_last_axis(shapes: Sequence[Shape]) -> Shape:
    """min/max drop the last axis, which must have entries: an empty one has no extreme."""
    shape = _drop_last_axis(shapes)
    if shapes[0][-1] == 0:
        raise ValueError("reduces the last axis, but it has size 0, so there is no value")
    return shape


_ELEMENTWISE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "rsqrt": torch.rsqrt,
    "reciprocal": torch.reciprocal,
    "gelu": torch.nn.functional.gelu,
    "gelu_new": _gelu_new,
    "relu": torch.relu,
    "silu": torch.nn.functional.silu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "exp": torch.exp,
    "log": torch.log,
    "sqrt": torch.sqrt,
    "sin": torch.sin,
    "cos": torch.cos,
    "abs": torch.abs,
    # rust_circuit's other elementwise functions, under its names
    "step": _step,
    "logit": torch.logit,
    "log_exp_p_1": _log_exp_p_1,
    "gaussian_pdf": _gaussian_pdf,
    "gaussian_cdf": torch.special.ndtr,
}

for _name, _fn in _ELEMENTWISE.items():
    register_function(_library(FunctionSpec(_name, 1, _same_shape, _fn, num_non_batchable_output_dims=0)))
#: The floating dtypes narrower than float32, which Hugging Face's models upcast where precision matters.
REDUCED_DTYPES = (torch.bfloat16, torch.float16)


def _softmax(x: torch.Tensor) -> torch.Tensor:
    """Over the last axis; a bfloat16 or float16 input in float32, rounded once (Hugging Face's
    ``softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)``, on every device alike)."""
    if x.dtype in REDUCED_DTYPES:
        return torch.softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)
    return torch.softmax(x, dim=-1)


def _log_softmax(x: torch.Tensor) -> torch.Tensor:
    """Over the last axis; a bfloat16 or float16 input in float32, rounded once (as ``_softmax``)."""
    if x.dtype in REDUCED_DTYPES:
        return torch.log_softmax(x, dim=-1, dtype=torch.float32).to(x.dtype)
    return torch.log_softmax(x, dim=-1)


for _name, _fn in (("softmax", _softmax), ("log_softmax", _log_softmax)):
    register_function(_library(FunctionSpec(_name, 1, _last_axis, _fn, num_non_batchable_output_dims=1)))
register_function(
    _library(
        FunctionSpec("last_dim_size", 1, _drop_last_axis, _last_dim_size, num_non_batchable_output_dims=0)
    )
)
for _name, _fn in (("min", _last_axis_min), ("max", _last_axis_max)):
    register_function(
        _library(FunctionSpec(_name, 1, _reduce_last_axis, _fn, num_non_batchable_output_dims=0))
    )


def _broadcast(shapes: Sequence[Shape]) -> Shape:
    """numpy broadcasting (shapes aligned on the right), as rust_circuit's ``pow``."""
    try:
        return tuple(torch.broadcast_shapes(*shapes))
    except RuntimeError:
        raise ValueError(f"shapes {[list(s) for s in shapes]} do not broadcast") from None


# pow(base, exponent).  Which axes are batch axes depends on the two shapes
# (rust_circuit works it out per node), which a FunctionSpec cannot say, so
# it declares no batching: expand and push-down leave pow nodes alone.
register_function(_library(FunctionSpec("pow", 2, _broadcast, torch.pow)))

# ------------------------------------------------------------------- precision


def _upcast_float32(x: torch.Tensor) -> torch.Tensor:
    """A bfloat16 or float16 tensor in float32; any other as it is (float64 stays float64)."""
    return x.float() if x.dtype in REDUCED_DTYPES else x


def _upcast_dtype(dtypes: Sequence[torch.dtype]) -> torch.dtype:
    return torch.float32 if dtypes[0] in REDUCED_DTYPES else dtypes[0]


def _same_two_shapes(shapes: Sequence[Shape]) -> Shape:
    if tuple(shapes[0]) != tuple(shapes[1]):
        raise ValueError(
            f"casts a {list(shapes[0])} to the dtype of a {list(shapes[1])}: the shapes must match"
        )
    return shapes[0]


# Where a model computes in float32 inside a bfloat16 or float16 forward (Hugging Face's norms:
# ``x.to(torch.float32)`` ... ``.to(input_dtype)``), its circuit says so with these two: the
# upcast, and ``type_as(y, x)``, y in x's dtype (torch's ``y.type_as(x)``), the way back.
register_function(
    _library(
        FunctionSpec(
            "upcast_float32",
            1,
            _same_shape,
            _upcast_float32,
            num_non_batchable_output_dims=0,
            dtype_fn=_upcast_dtype,
        )
    )
)
register_function(
    _library(
        FunctionSpec(
            "type_as",
            2,
            _same_two_shapes,
            lambda x, like: x.to(like.dtype),
            num_non_batchable_output_dims=0,
            dtype_fn=lambda dtypes: dtypes[1],
        )
    )
)

# ------------------------------------------------------------------------ cast


def _device_matches(device: torch.device, name: str) -> bool:
    """Whether ``device`` is the one rust_circuit names ``name`` (``cuda`` is any GPU)."""
    wanted = torch.device(name)
    return device.type == wanted.type and (wanted.index is None or device.index == wanted.index)


@functools.lru_cache(maxsize=None)  # one object per name, like the gen_index family
def cast_spec(name: str) -> FunctionSpec:
    """rust_circuit's cast (its ``GeneralFunctionSetDDSpec``) named ``name``.

    The ``from`` part is a requirement on the input, checked at evaluation
    (rust_circuit checks it on construction, from device and dtype it tracks
    and we do not); the ``to`` part is what ``tensor.to`` is given.
    """
    match = CAST_NAME.fullmatch(name)
    need_device, need_dtype, device, dtype = match.group("in_device", "in_dtype", "out_device", "out_dtype")

    def function(x: torch.Tensor) -> torch.Tensor:
        if need_dtype != "None" and x.dtype != _CAST_DTYPES[need_dtype]:
            raise ValueError(f"{name} needs a {need_dtype} input, got {x.dtype}")
        if need_device != "None" and not _device_matches(x.device, need_device):
            raise ValueError(f"{name} needs an input on {need_device}, got one on {x.device}")
        return x.to(
            device=None if device == "None" else device,
            dtype=None if dtype == "None" else _CAST_DTYPES[dtype],
        )

    return _library(FunctionSpec(name, 1, _same_shape, function, num_non_batchable_output_dims=0))


# ------------------------------------------------------------------------ aten


@functools.lru_cache(maxsize=None)
def aten_spec(name: str) -> FunctionSpec:
    """The call of one aten op that ``name`` spells out (``circuits.core.aten_functions``)."""
    try:
        return _library(FunctionSpec(name, *aten_parts(name)))
    except ValueError as error:
        raise FunctionSpecError(f"GeneralFunction {name!r}: {error}") from None


# ----------------------------------------------------------------- multinomial


def _multinomial_shape(shapes: Sequence[Shape], shape: Shape) -> Shape:
    probs, seed = shapes
    if len(seed) != 0:
        raise ValueError(f"the seed must be rank 0, got shape {list(seed)}")
    if len(probs) == 0:
        raise ValueError("the probabilities must have rank >= 1 (their last axis is sampled)")
    return tuple(probs[:-1]) + shape


@functools.lru_cache(maxsize=None)
def multinomial_spec(shape: Shape, replacement: bool) -> FunctionSpec:
    """rust_circuit's ``multinomial[_no_replace]_[sizes]`` over ``(probs, seed)``.

    Each row of ``probs`` (its last axis) gives ``prod(sizes)`` int64 indices,
    laid out as ``sizes``, drawn by ``torch.multinomial`` from a generator
    seeded with ``seed``: rust_circuit's very call, so the same seed gives the
    same draws.  The draws of a row depend on the rows before it, so it
    declares no batching.  The name is printed as rust_circuit prints it.
    """
    name = f"multinomial{'' if replacement else '_no_replace'}_[{', '.join(map(str, shape))}]"

    def function(probs: torch.Tensor, seed: torch.Tensor) -> torch.Tensor:
        generator = torch.Generator(device=probs.device).manual_seed(int(seed))
        rows = probs.reshape(math.prod(probs.shape[:-1]), probs.shape[-1])
        draws = torch.multinomial(rows, math.prod(shape), replacement=replacement, generator=generator)
        return draws.reshape(tuple(probs.shape[:-1]) + shape)

    return _library(FunctionSpec(name, 2, functools.partial(_multinomial_shape, shape=shape), function))


# ------------------------------------------------------------------------ top_k


def _top_k_shape(shapes: Sequence[Shape], k: int) -> Shape:
    shape = _last_axis(shapes)
    if shape[-1] < k:
        raise ValueError(f"keeps the {k} largest entries of the last axis, which has only {shape[-1]}")
    return shape


@functools.lru_cache(maxsize=None)
def top_k_spec(k: int, normalized: bool) -> FunctionSpec:
    """``top_k_K[_normalized]``: the ``k`` largest entries of the last axis, the others zero.

    The entries kept are ``torch.topk``'s own choice (so ties break as they do in a
    Hugging Face mixture-of-experts router, which calls it); ``_normalized`` divides them
    by their sum first, as Mixtral's router does.  Applied to a softmax of router logits,
    it gives each expert's routing weight, zero for the experts a token is not sent to.
    """
    name = f"top_k_{k}{'_normalized' if normalized else ''}"

    def function(x: torch.Tensor) -> torch.Tensor:
        values, indices = torch.topk(x, k, dim=-1)
        if normalized:
            values = values / values.sum(dim=-1, keepdim=True)
        return torch.zeros_like(x).scatter(-1, indices, values)

    shape_fn = functools.partial(_top_k_shape, k=k)
    return _library(FunctionSpec(name, 1, shape_fn, function, num_non_batchable_output_dims=1))


# ------------------------------------------------------------------- gen_index


@attrs.frozen
class GenIndexLayout:
    """Where a gen_index's axes go, worked out once from the input shapes.

    ``x`` is ``batch + rest``; axis ``dim`` of ``rest`` is looked up.  With
    ``batch_index`` the looked-up index axes come first in the output (after
    the batch); without it they replace the looked-up axis in place.
    """

    batch_rank: int
    axis: int  # absolute axis of x that is indexed
    out_shape: Shape


def gen_index_layout(
    x_shape: Shape, index_shape: Shape, dim: int, batch_x: bool, batch_index: bool
) -> GenIndexLayout:
    if batch_x:
        batch_rank = len(index_shape) if batch_index else len(index_shape) - 1
        if batch_rank < 0:
            raise ValueError("_batch_x_no_batch_index needs an index of rank >= 1")
        if tuple(x_shape[:batch_rank]) != tuple(index_shape[:batch_rank]):
            raise ValueError(
                f"_batch_x needs x's leading axes {list(x_shape[:batch_rank])} "
                f"to equal the index's batch axes {list(index_shape[:batch_rank])}"
            )
    else:
        batch_rank = 0
    rest = tuple(x_shape[batch_rank:])
    if not -len(rest) <= dim < len(rest):
        raise ValueError(
            f"axis {dim} is out of range for x's {'non-batch ' if batch_x else ''}axes {list(rest)}"
        )
    d = dim % len(rest)
    batch = tuple(x_shape[:batch_rank])
    looked_up = tuple(index_shape[batch_rank:])
    if batch_index:
        out = batch + looked_up + rest[:d] + rest[d + 1 :]
    else:
        out = batch + rest[:d] + looked_up + rest[d + 1 :]
    return GenIndexLayout(batch_rank, batch_rank + d, out)


@functools.lru_cache(maxsize=None)  # a handful of members in practice; one object each
def gen_index_spec(dim: int, batch_x: bool, batch_index: bool, check_index: bool) -> FunctionSpec:
    """The spec for one member of the gen_index family (see FORMAT.md)."""
    name = (
        f"gen_index_at_{dim}"
        + ("_batch_x" if batch_x else "")
        + ("" if batch_index else "_no_batch_index")
        + ("_c" if check_index else "")
    )

    def shape_fn(shapes: Sequence[Shape]) -> Shape:
        x_shape, index_shape = shapes
        return gen_index_layout(x_shape, index_shape, dim, batch_x, batch_index).out_shape

    def function(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        layout = gen_index_layout(tuple(x.shape), tuple(index.shape), dim, batch_x, batch_index)
        size = x.shape[layout.axis]
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ValueError(f"index tensor has dtype {index.dtype}, not an integer type")
        index = index.long()
        if check_index:
            bad = (index < 0) | (index >= size)
            if bool(bad.any()):
                raise ValueError(f"index values {index[bad][:8].tolist()} are out of range [0, {size})")
        else:
            index = torch.where(index < 0, index + size, index)
        return _gather(x, index, layout, batch_index)

    return _library(FunctionSpec(name, 2, shape_fn, function))


def _gather(x: torch.Tensor, index: torch.Tensor, layout: GenIndexLayout, batch_index: bool):
    b, axis = layout.batch_rank, layout.axis
    if b == 0:
        picked = torch.index_select(x, axis, index.reshape(-1))
        picked = picked.reshape(x.shape[:axis] + index.shape + x.shape[axis + 1 :])
        if batch_index:
            picked = picked.movedim(tuple(range(axis, axis + index.ndim)), tuple(range(index.ndim)))
        return picked
    looked_up = index.shape[b:]  # () with batch_index, (k,) without
    view = list(index.shape[:b]) + [1] * (x.ndim - b)
    expand = list(x.shape)
    if looked_up:
        view[axis] = looked_up[0]
        expand[axis] = looked_up[0]
    else:
        expand[axis] = 1
    gathered = torch.gather(x, axis, index.reshape(view).expand(expand))
    return gathered if looked_up else gathered.squeeze(axis)


# -------------------------------------------------------------- explicit_index


def explicit_index_layout(x_shape: Shape, index_shape: Shape, dim: int, non_batch: int) -> GenIndexLayout:
    """``explicit_index_at_D_x_non_b_N(x, index)``: x's axes before its last N are a batch
    that the index's leading axes must equal; axis D of the last N is looked up, and the
    output is ``index.shape`` followed by x's other non-batch axes (rust_circuit's rule)."""
    if non_batch < 1:
        raise ValueError("x_non_b must be at least 1: the looked-up axis is one of them")
    if len(x_shape) < non_batch:
        raise ValueError(f"x has rank {len(x_shape)}, fewer than its {non_batch} non-batch axes")
    if not -non_batch <= dim < non_batch:
        raise ValueError(f"axis {dim} is out of range for x's {non_batch} non-batch axes")
    batch_rank = len(x_shape) - non_batch
    if tuple(index_shape[:batch_rank]) != tuple(x_shape[:batch_rank]):
        raise ValueError(
            f"the index's leading axes {list(index_shape[:batch_rank])} must equal "
            f"x's batch axes {list(x_shape[:batch_rank])}"
        )
    axis = batch_rank + dim % non_batch
    out = tuple(index_shape) + tuple(x_shape[batch_rank:axis]) + tuple(x_shape[axis + 1 :])
    return GenIndexLayout(batch_rank, axis, out)


@functools.lru_cache(maxsize=None)
def explicit_index_spec(dim: int, non_batch: int, check_index: bool) -> FunctionSpec:
    """The spec for one member of the explicit_index family.

    ``_c`` checks indices as gen_index's does (out of ``[0, size)`` is an
    error); without it negative indices count from the end.  Which output
    axes are batch axes depends on the index's rank, which a FunctionSpec
    cannot say, so it declares no batching.
    """
    name = f"explicit_index_at_{dim}_x_non_b_{non_batch}" + ("_c" if check_index else "")

    def shape_fn(shapes: Sequence[Shape]) -> Shape:
        x_shape, index_shape = shapes
        return explicit_index_layout(x_shape, index_shape, dim, non_batch).out_shape

    def function(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        layout = explicit_index_layout(tuple(x.shape), tuple(index.shape), dim, non_batch)
        b, size = layout.batch_rank, x.shape[layout.axis]
        if index.dtype.is_floating_point or index.dtype == torch.bool:
            raise ValueError(f"index tensor has dtype {index.dtype}, not an integer type")
        index = index.long()
        if check_index:
            bad = (index < 0) | (index >= size)
            if bool(bad.any()):
                raise ValueError(f"index values {index[bad][:8].tolist()} are out of range [0, {size})")
        moved = x.movedim(layout.axis, b)  # batch, looked-up axis, the other non-batch axes
        rest = moved.shape[b + 1 :]
        batch = math.prod(x.shape[:b])
        looked_up = math.prod(index.shape[b:])
        flat = moved.reshape((batch, size) + tuple(rest))
        rows = torch.arange(batch, device=x.device)[:, None]
        picked = flat[rows, index.reshape(batch, looked_up)]
        return picked.reshape(tuple(index.shape) + tuple(rest))

    return _library(FunctionSpec(name, 2, shape_fn, function))
