"""Leaves, inputs, devices and dtypes: how a call's Arrays, Scalars and Symbols get their values.

- ``device`` and ``dtype`` apply to the whole computation: an Array that
  needs moving or casting is converted once, as a step of its own placed
  where the schedule first reaches it; integer tensors keep their dtype.
- Bound inputs must already be on the computation's device.
- With no ``dtype``, Scalars take the promoted floating dtype of the Arrays,
  inputs and known values (the default dtype if there are none), so a
  float64 circuit stays float64.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Callable, Mapping

import torch

from circuits.errors import (
    CircuitError,
    EvaluationError,
    MissingTensorError,
    MissingTensorEvaluationError,
    StaleTensorError,
    StaleTensorEvaluationError,
    shown,
)
from circuits.evaluation.kernels import KERNEL_MAKERS, kernel_maker
from circuits.evaluation.plan import Steps, error_at
from circuits.core.nodes import Add, Array, Circuit, Einsum, Scalar, Symbol
from circuits.core.shapes import format_shape

__all__ = [
    "Call",
    "check_device",
    "check_options",
    "constant_value",
    "finish_leaves",
    "leaf_handler",
    "same_device",
]


def check_device(device: Any, what: str, error: type[CircuitError] = EvaluationError) -> torch.device | None:
    """``device`` (None, a ``torch.device`` or its name) as a torch.device, or ``error`` naming
    ``what``'s argument ``device``: a name torch does not know, or a CUDA device this machine lacks
    (refused before any work starts, not by the first tensor moved there)."""
    if device is None:
        return None
    try:
        checked = torch.device(device)
    except (RuntimeError, TypeError) as failure:
        raise error(f"{what}: device {shown(repr(device))} is not a torch device ({failure})") from None
    if checked.type == "cuda" and not (
        torch.cuda.is_available() and (checked.index or 0) < torch.cuda.device_count()
    ):
        raise error(
            f"{what}: device {str(checked)!r} is not available here (torch sees "
            f"{torch.cuda.device_count()} CUDA devices)"
        )
    return checked


def check_options(inputs: Any, device: Any, dtype: Any) -> torch.device | None:
    """The call's options checked (``EvaluationError`` otherwise); returns the device as a torch.device."""
    device = check_device(device, "evaluate")
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise EvaluationError(
            f"evaluate: dtype {dtype!r} is not a floating torch dtype (it casts floating tensors only; "
            "integer tensors such as token ids keep their dtype)"
        )
    if inputs is not None and not isinstance(inputs, Mapping):
        raise EvaluationError(f"evaluate: inputs must be a mapping, got {type(inputs).__name__}")
    return device


class Call:
    """What leaf handling needs to know about one call, and what it finds on the way."""

    __slots__ = (
        "by_hash",
        "by_name",
        "device",
        "dtype",
        "first_device",
        "float_dtypes",
        "kernel",
        "missing",
        "scalar_slots",
        "stale",
        "symbol_slots",
        "used_keys",
    )

    def __init__(self, device, dtype, inputs, kernel=None):
        self.device = device
        self.dtype = dtype
        self.kernel = kernel  # the caller's kernel override, for Arrays converted by a step
        self.by_hash: dict[bytes, tuple[Any, Any]] = {}
        self.by_name: dict[str, tuple[Any, Any]] = {}
        self.used_keys: set[int] = set()
        self.float_dtypes: set[torch.dtype] = set()
        self.first_device: torch.device | None = None  # of the first Array (or known value) seen
        self.scalar_slots: list[int] = []
        self.symbol_slots: list[int] = []
        self.missing: list[int] = []
        self.stale: list[int] = []
        for key, value in (inputs or {}).items():
            if isinstance(key, str):
                self.by_name[key] = (key, value)
            elif isinstance(key, Symbol):
                self.by_hash[key.hash] = (key, value)
            elif isinstance(key, Circuit):
                raise EvaluationError(
                    f"inputs binds Symbols, but key {key.describe()} {format_shape(key.shape)} is a "
                    f"{key.kind}; bind a Symbol (by node or by name)"
                )
            else:
                raise EvaluationError(
                    f"inputs keys are Symbol nodes or names (str), got {type(key).__name__} {key!r}"
                )

    def saw(self, value: torch.Tensor) -> None:
        """A tensor that counts for the Scalars' dtype and the call's device."""
        if value.is_floating_point():
            self.float_dtypes.add(value.dtype)
        if self.first_device is None:
            self.first_device = value.device


def same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _array_leaf(node: Array, slot, call: Call, values, steps: Steps):
    tensor = node.value
    if tensor is None:
        call.missing.append(slot)
        return
    if tensor._version != node.tensor_version or tensor.requires_grad != node.tensor_requires_grad:
        call.stale.append(slot)
        return
    target_dtype = call.dtype if call.dtype is not None and tensor.is_floating_point() else None
    moves = call.device is not None and not same_device(tensor.device, call.device)
    if (target_dtype is not None and target_dtype != tensor.dtype) or moves:
        # converted once, as a step just before its first consumer
        convert = functools.partial(tensor.to, device=call.device, dtype=target_dtype)
        steps.add(convert if call.kernel is None else call.kernel(node, convert), (), slot)
        if tensor.is_floating_point():
            call.float_dtypes.add(target_dtype or tensor.dtype)
        return
    call.saw(tensor)
    values[slot] = tensor


def _scalar_leaf(node: Scalar, slot, call: Call, values, steps: Steps):
    call.scalar_slots.append(slot)


def _symbol_leaf(node: Symbol, slot, call: Call, values, steps: Steps):
    call.symbol_slots.append(slot)
    by_name = call.by_name.get(node.name) if node.name is not None else None
    if by_name is not None:
        call.used_keys.add(id(by_name[0]))
    bound = call.by_hash.get(node.hash) or by_name  # a binding by node wins over one by name
    if bound is None:
        return
    key, value = bound
    call.used_keys.add(id(key))
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except Exception as error:  # noqa: BLE001 - reported by finish_leaves, with the node
            values[slot] = error
            return
    if value.is_floating_point():
        if call.dtype is not None and value.dtype != call.dtype:
            value = value.to(call.dtype)
        call.float_dtypes.add(value.dtype)
    values[slot] = value


def constant_value(node: Circuit) -> float | None:
    """The value of a node that is a constant of the call's dtype: a Scalar, ``Add()`` (an empty
    sum, 0) or an Einsum of no operands (an empty product, 1)."""
    if isinstance(node, Scalar):
        return node.value
    if node.children:
        return None
    return 0.0 if isinstance(node, Add) else 1.0 if isinstance(node, Einsum) else None


def _other_leaf(node: Circuit, slot, call: Call, values, steps: Steps):
    """Add() and Einsum() with no operands, subclasses of the leaf classes, and unknown leaf types."""
    if isinstance(node, (Add, Einsum)):  # an empty sum or product: the constant 0 or 1, made like a Scalar
        call.scalar_slots.append(slot)
        return
    kind = type(node)
    for base in kind.__mro__[1:]:
        if base in _LEAF_HANDLERS:
            return _LEAF_HANDLERS[base](node, slot, call, values, steps)
    maker = KERNEL_MAKERS.get(kind) or kernel_maker(kind)
    kernel = maker(node)
    steps.add(kernel if call.kernel is None else call.kernel(node, kernel), (), slot)


_LEAF_HANDLERS: dict[type, Callable] = {Array: _array_leaf, Scalar: _scalar_leaf, Symbol: _symbol_leaf}


def leaf_handler(kind: type) -> Callable:
    """``handler(node, slot, call, values, steps)`` for a node without children of type ``kind``."""
    return _LEAF_HANDLERS.get(kind, _other_leaf)


def finish_leaves(call: Call, order, values, steps: Steps) -> torch.dtype:
    """Arrays refused, Symbols checked and Scalars made, once the call's device and dtype are known.

    Returns the dtype Scalars take in this call (whether or not it has any).
    """
    _check_arrays(call, order, steps)
    device = call.device if call.device is not None else call.first_device
    for slot in call.symbol_slots:
        device = _check_symbol(call, slot, device, order, values, steps)
    _check_bindings_used(call, order)
    dtype = call.dtype
    if dtype is None:
        dtype = functools.reduce(torch.promote_types, call.float_dtypes) if call.float_dtypes else None
    if dtype is None:
        dtype = torch.get_default_dtype()
    _make_scalars(call, dtype, device, order, values, steps)
    return dtype


def _check_arrays(call: Call, order, steps: Steps) -> None:
    """Refuse Arrays without a tensor, or whose tensor was edited in place since they were made."""
    for slots, kind in (
        (call.missing, MissingTensorEvaluationError),
        (call.stale, StaleTensorEvaluationError),
    ):
        if not slots:
            continue
        slot = slots[0]
        node = order[slot]
        try:
            node.tensor()
        except (MissingTensorError, StaleTensorError) as error:
            found = error_at(node, slot, order, steps, f"cannot evaluate: {error}")
            raise kind(str(found), node=found.node, path=found.path) from error


def _check_symbol(call: Call, slot: int, device, order, values, steps: Steps):
    """A Symbol is bound, to a tensor of its shape, on the computation's device; returns that device."""
    node = order[slot]
    value = values[slot]
    if value is None:
        key = repr(node.name) if node.name is not None else None
        how = (
            f"inputs={{{key}: tensor}} (or the Symbol node as the key)"
            if key
            else "inputs={symbol_node: tensor}"
        )
        raise error_at(
            node, slot, order, steps, f"{node.describe()} {format_shape(node.shape)} is not bound: pass {how}"
        )
    if isinstance(value, Exception):
        raise error_at(node, slot, order, steps, f"{node.describe()}: bound value is not a tensor ({value})")
    if tuple(value.shape) != node.shape:
        raise error_at(
            node,
            slot,
            order,
            steps,
            f"{node.describe()} has shape {format_shape(node.shape)} but the tensor bound to it has "
            f"shape {format_shape(value.shape)}",
        )
    if device is None:
        return value.device
    if not same_device(value.device, device):
        source = "the device= option" if call.device is not None else "the circuit's Arrays"
        raise error_at(
            node,
            slot,
            order,
            steps,
            f"{node.describe()} is bound to a tensor on device {value.device}, but the computation "
            f"runs on {device} ({source}); move the input with .to({str(device)!r})",
        )
    return device


def _check_bindings_used(call: Call, order) -> None:
    bindings = list(call.by_hash.values()) + list(call.by_name.values())
    unused = [key for key, _ in bindings if id(key) not in call.used_keys]
    if unused:
        symbols = sorted(
            {order[s].describe() + " " + format_shape(order[s].shape) for s in call.symbol_slots}
        )
        names = [k.describe() if isinstance(k, Circuit) else repr(k) for k in unused]
        raise EvaluationError(
            f"inputs binds {', '.join(names)}, which matches no Symbol in the circuit; its Symbols are: "
            f"{', '.join(symbols) if symbols else 'none'}"
        )


def _make_scalars(call: Call, dtype, device, order, values, steps: Steps) -> None:
    """Scalars (and empty sums) as expanded 0-d tensors, one per distinct value."""
    made: dict[bytes, torch.Tensor] = {}  # by the value's bits: -0.0 and 0.0 are different Scalars
    for slot in call.scalar_slots:
        node = order[slot]
        value = constant_value(node)
        bits = struct.pack("<d", value)
        base = made.get(bits)
        if base is None:
            base = made[bits] = torch.tensor(value, dtype=dtype, device=device)
        try:
            values[slot] = base.expand(node.shape)
        except RuntimeError as error:
            raise error_at(
                node,
                slot,
                order,
                steps,
                f"{node.describe()} of shape {format_shape(node.shape)} cannot be made: {error}",
            ) from error
