"""The torch kernel of each node type: ``default_kernel(node)`` is the function a step calls.

A kernel is chosen once per node when the schedule is planned (a dict
lookup by node type), then called with the children's values.  Subclasses
of the node classes run as their base.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import einops
import torch

from circuits.errors import StaleTensorError
from circuits.evaluation.einsum import einsum_kernel
from circuits.core.functions import FunctionSpec, is_library_function
from circuits.errors import RandomVariableEvaluationError
from circuits.core.nodes import (
    Add,
    Circuit,
    Concat,
    Cumulant,
    DiscreteVar,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    Scatter,
    StoredCumulantVar,
    Tag,
)
from circuits.core.shapes import format_shape, shape_or_type

__all__ = ["KERNEL_MAKERS", "default_kernel", "kernel_maker"]


def _einsum_step(node: Einsum) -> Callable:
    if not node.children:  # the empty product; evaluation makes it as a constant (leaves.constant_value)
        return functools.partial(torch.ones, ())
    return einsum_kernel(node.extra)  # extra is the einsum string, computed at construction


def _add_many(*tensors: torch.Tensor) -> torch.Tensor:
    """Left to right; into the first sum in place where that changes nothing but allocations."""
    result = tensors[0] + tensors[1]  # a fresh tensor, ours to add into
    for tensor in tensors[2:]:
        if (
            tensor.shape == result.shape
            and tensor.dtype == result.dtype
            and not (result.requires_grad or tensor.requires_grad)
        ):
            result.add_(tensor)
        else:
            result = result + tensor
    return result


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _add_step(node: Add) -> Callable:
    count = len(node.children)
    if count == 2:
        return torch.add
    if count == 1:
        return _identity
    if count == 0:
        return functools.partial(torch.zeros, ())
    return _add_many


def _function_step(node: GeneralFunction) -> Callable:
    """The spec's function; a user's is checked against the shape its ``shape_fn`` declared.

    A user's function returning another shape would otherwise flow on, be
    broadcast, and give a wrong number that looks right.  The library's own
    functions are run as they are (their shapes are right by construction).
    """
    spec = node.spec
    if is_library_function(spec):
        return spec.function
    return _shape_checked(spec, node.shape)


@functools.lru_cache(maxsize=1024)  # one wrapper per spec and shape, not per node
def _shape_checked(spec: FunctionSpec, shape: tuple[int, ...]) -> Callable:
    function = spec.function

    def checked(*tensors: torch.Tensor) -> torch.Tensor:
        value = function(*tensors)
        if not isinstance(value, torch.Tensor) or value.shape != shape:
            raise ValueError(
                f"function {spec.name!r} returned {shape_or_type(value)}, but its shape_fn declared {format_shape(shape)}"
            )
        return value

    return checked


def _index_step(node: Index) -> Callable:
    """Outer (orthogonal) indexing: each tensor index picks along its own axis."""
    items = node.index
    child_shape = node.children[0].shape
    basic = []
    selects = []  # (axis in the basic-indexed result, non-negative int64 index)
    kept_axes = 0
    for item, size in zip(items, child_shape):
        if isinstance(item, torch.Tensor):
            if item._version:  # a private copy (see spec.normalize_index): only an edit bumps it
                raise StaleTensorError(
                    f"{node.describe()}: its index tensor was modified in place after the Index was made, "
                    f"so it no longer matches the printed index {node.extra}",
                    node=node,
                )
            basic.append(slice(None))
            selects.append((kept_axes, torch.where(item < 0, item + size, item)))
            kept_axes += 1
        elif isinstance(item, slice):
            basic.append(item)
            kept_axes += 1
        else:
            basic.append(item)
    basic_index = tuple(basic)
    trivial = all(isinstance(item, slice) and item.start is None and item.stop is None for item in basic)
    moved: dict[torch.device, list] = {}

    def index(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor if trivial else tensor[basic_index]
        if selects:
            device = tensor.device
            picks = moved.get(device)
            if picks is None:
                picks = moved[device] = [(axis, idx.to(device)) for axis, idx in selects]
            for axis, idx in picks:
                result = torch.index_select(result, axis, idx)
        return result

    return index


def _rearrange_step(node: Rearrange) -> Callable:
    return functools.partial(einops.repeat, pattern=node.pattern, **dict(node.sizes))


def _concat_step(node: Concat) -> Callable:
    axis = node.axis

    def concat(*tensors: torch.Tensor) -> torch.Tensor:
        return torch.cat(tensors, dim=axis)

    return concat


def _tag_step(node: Tag) -> Callable:
    return _identity


def _scatter_step(node: Scatter) -> Callable:
    """Zeros around the child: ``torch.nn.functional.pad`` by the room each slice leaves on either side."""
    pads: list[int] = []
    for item, size in zip(reversed(node.index), reversed(node.shape)):  # pad lists the last axis first
        pads += [item.start, size - item.stop]
    if not any(pads):
        return _identity
    return functools.partial(torch.nn.functional.pad, pad=tuple(pads))


def _random_variable_step(node: Circuit) -> Callable:
    """None: a random variable has no value to compute (rust_circuit samples it; this library does not)."""
    raise RandomVariableEvaluationError(
        f"cannot evaluate {node.describe()}: a {node.kind} is one of rust_circuit's random-variable nodes, which it "
        "samples (or expands into expectations) and this library does not; it has no deterministic value",
        node=node,
    )


KERNEL_MAKERS: dict[type, Callable[[Any], Callable]] = {
    Einsum: _einsum_step,
    Add: _add_step,
    GeneralFunction: _function_step,
    Index: _index_step,
    Rearrange: _rearrange_step,
    Concat: _concat_step,
    Tag: _tag_step,
    Scatter: _scatter_step,
    DiscreteVar: _random_variable_step,
    StoredCumulantVar: _random_variable_step,
    Cumulant: _random_variable_step,
}


def kernel_maker(kind: type) -> Callable:
    """Subclasses of the node classes evaluate as their base; anything else is an error."""
    for base in kind.__mro__[1:]:
        if base in KERNEL_MAKERS:
            return KERNEL_MAKERS[base]

    def unknown(node: Circuit) -> Callable:
        def fail(*_):
            raise TypeError(f"no evaluation rule for node type {kind.__name__}")

        return fail

    return unknown


def default_kernel(node: Circuit) -> Callable:
    """The function that computes ``node`` from its children's values (what a kernel override replaces)."""
    kind = type(node)
    maker = KERNEL_MAKERS.get(kind) or kernel_maker(kind)
    return maker(node)
