"""GeneralFunctions that call one aten op, named by the call: ``aten.OP.OVERLOAD(ARGS)[OUT]``.

``models.from_torch`` turns every op it has no translation for into one of
these, so an imported circuit still computes what the module computes.  The
name carries the whole call, so it prints, and parses back in a fresh
process with nothing registered: ``aten.avg_pool2d.default(_,[2,2],[2,2])``.
Each ``_`` is a tensor argument, a child of the node in order of
appearance; ``_int64`` (``_bool``, ...) is one of that dtype (floating
tensors are ``_``).  Other arguments are Python literals (numbers, ``True``,
``None``, ``"strings"``, lists) or ``torch.DTYPE`` / ``torch.LAYOUT`` /
``torch.MEMORY_FORMAT``; ``key=value`` are keyword arguments; ``[i]``
picks output ``i`` of an op that returns several.  The text is read with
``ast`` and never evaluated: only ``aten`` ops can be named.
"""

from __future__ import annotations

import ast
import math
import re
from typing import Any, Callable, Sequence

import torch

#: The family's names (the parser needs only that the name holds no ``#``).
ATEN_NAME = re.compile(
    r"aten\.(?P<op>[A-Za-z_][A-Za-z0-9_]*)\.(?P<overload>[A-Za-z_][A-Za-z0-9_]*)"
    r"\((?P<args>[^#]*)\)(?:\[(?P<out>\d+)\])?"
)
_FLOAT_NAMES = {"inf": math.inf, "nan": math.nan}
_CONSTANTS = {"None": None, "True": True, "False": False}
#: ``torch.NAME`` values an argument may name: dtypes, layouts, memory formats.
_TORCH_VALUES = (torch.dtype, torch.layout, torch.memory_format)


class TensorSlot:
    """Where a tensor argument goes, and its dtype (used to infer the output shape)."""

    __slots__ = ("dtype",)

    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype


def slot_text(dtype: torch.dtype) -> str:
    """``_`` for a floating tensor, ``_int64`` for an int64 one (what the name writes)."""
    return "_" if dtype.is_floating_point else "_" + str(dtype).removeprefix("torch.")


def encode(value: Any, tensor_dtype: Callable[[Any], torch.dtype | None]) -> str:
    """``value`` (one argument) as the name writes it; ``tensor_dtype(value)`` is the dtype of a
    tensor argument and None for any other value.  Raises ValueError for what has no text."""
    dtype = tensor_dtype(value)
    if dtype is not None:
        return slot_text(dtype)
    if value is None or isinstance(value, bool):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        if "#" in value or '"' in value or "\\" in value:
            raise ValueError(f"string argument {value!r} holds '#', a quote or a backslash")
        return f'"{value}"'
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode(item, tensor_dtype) for item in value) + "]"
    if isinstance(value, _TORCH_VALUES):
        text = str(value)
        if _torch_value(text.removeprefix("torch.")) is not value:
            raise ValueError(f"{value!r} has no torch.NAME spelling")
        return text if text.startswith("torch.") else "torch." + text
    if isinstance(value, torch.device):
        return f'"{value}"'
    raise ValueError(f"a {type(value).__name__} argument ({value!r}) has no text form")


def call_name(
    op: torch._ops.OpOverload, args: Sequence[Any], kwargs: dict, out: int | None, tensor_dtype
) -> str:
    """The family name of ``op(*args, **kwargs)`` (output ``out`` of several, or the only one)."""
    packet = op.overloadpacket.__name__
    parts = [encode(arg, tensor_dtype) for arg in args]
    parts += [f"{key}={encode(value, tensor_dtype)}" for key, value in kwargs.items()]
    name = f"aten.{packet}.{op._overloadname}({','.join(parts)})" + ("" if out is None else f"[{out}]")
    if not ATEN_NAME.fullmatch(name):
        raise ValueError(f"{name!r} does not read back as an aten call")
    return name


def _torch_value(name: str) -> Any:
    value = getattr(torch, name, None)
    return value if isinstance(value, _TORCH_VALUES) else None


def _literal(node: ast.AST) -> Any:
    """One argument of the name, from its syntax tree: literals, slots and ``torch.NAME`` only."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float, str)):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        value = _literal(node.operand)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return -value
    if isinstance(node, ast.Name):
        if node.id in _CONSTANTS:
            return _CONSTANTS[node.id]
        if node.id in _FLOAT_NAMES:
            return _FLOAT_NAMES[node.id]
        if node.id == "_":
            return TensorSlot(torch.float32)
        if node.id.startswith("_"):
            dtype = _torch_value(node.id[1:])
            if isinstance(dtype, torch.dtype):
                return TensorSlot(dtype)
    if isinstance(node, (ast.List, ast.Tuple)):
        return [_literal(item) for item in node.elts]
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
        value = _torch_value(node.attr)
        if value is not None:
            return value
    raise ValueError(f"argument {ast.unparse(node)!r} is not a literal, a tensor slot or torch.NAME")


def _fill(value: Any, tensors: list, position: list[int]) -> Any:
    """``value`` with each slot replaced by the next of ``tensors`` (``position`` counts them)."""
    if isinstance(value, TensorSlot):
        position[0] += 1
        return tensors[position[0] - 1]
    if isinstance(value, list):
        return [_fill(item, tensors, position) for item in value]
    return value


def _slots(value: Any) -> list[TensorSlot]:
    if isinstance(value, TensorSlot):
        return [value]
    if isinstance(value, list):
        return [slot for item in value for slot in _slots(item)]
    return []


def aten_parts(name: str) -> tuple[int, Callable, Callable]:
    """``(num_inputs, shape_fn, function)`` of the family member ``name`` (ValueError if none)."""
    match = ATEN_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not aten.OP.OVERLOAD(ARGS)")
    packet = getattr(torch.ops.aten, match["op"], None)
    op = getattr(packet, match["overload"], None) if packet is not None else None
    if not isinstance(op, torch._ops.OpOverload):
        raise ValueError(f"torch has no op aten.{match['op']}.{match['overload']}")
    try:
        call = ast.parse(f"f({match['args']})", mode="eval").body
    except SyntaxError as error:
        raise ValueError(f"the arguments of {name!r} do not read: {error.msg}") from None
    if not isinstance(call, ast.Call):
        raise ValueError(f"the arguments of {name!r} are not a call's")
    args = [_literal(arg) for arg in call.args]
    kwargs = {keyword.arg: _literal(keyword.value) for keyword in call.keywords}
    slots = _slots([args, list(kwargs.values())])
    out = None if match["out"] is None else int(match["out"])

    def function(*tensors: torch.Tensor) -> torch.Tensor:
        position = [0]
        result = op(
            *_fill(args, list(tensors), position),
            **{k: _fill(v, list(tensors), position) for k, v in kwargs.items()},
        )
        return result if out is None else result[out]

    def shape_fn(shapes: Sequence[tuple[int, ...]]) -> tuple[int, ...]:
        metas = [torch.empty(shape, dtype=slot.dtype, device="meta") for shape, slot in zip(shapes, slots)]
        try:
            result = function(*metas)
        except Exception as error:  # noqa: BLE001 - torch's shape checks raise several types
            raise ValueError(" ".join(str(error).split("Exception raised from")[0].split())) from None
        if not isinstance(result, torch.Tensor):
            raise ValueError(
                f"{name} gives a {type(result).__name__}, not a tensor (pick an output with [i])"
            )
        return tuple(result.shape)

    return len(slots), shape_fn, function
