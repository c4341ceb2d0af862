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


def _parsed(name: str) -> tuple[str, str, list, dict]:
    """``(op, overload, args, kwargs)`` of the family member ``name``, tensors as ``TensorSlot`` (ValueError if none)."""
    match = ATEN_NAME.fullmatch(name)
    if match is None:
        raise ValueError(f"{name!r} is not aten.OP.OVERLOAD(ARGS)")
    call = ast.parse(f"f({match['args']})", mode="eval").body
    args = [_literal(arg) for arg in call.args]
    kwargs = {keyword.arg: _literal(keyword.value) for keyword in call.keywords}
    return match["op"], match["overload"], args, kwargs


#: FLOPs per output element of elementwise aten ops, by kind
#: (as ``circuits.evaluation.costs.FUNCTION_FLOPS``).
ELEMENTWISE_FLOPS: dict[str, dict[str, int]] = {
    **{op: {"add": 1} for op in ("add", "sub", "rsub")},
    **{op: {"mul": 1} for op in ("mul", "neg", "square")},
    **{op: {"div": 1} for op in ("div", "reciprocal", "remainder", "fmod", "floor_divide")},
    "pow": {"pow": 1},
    **{op: {op: 1} for op in ("exp", "log", "tanh", "sqrt", "sin", "cos", "erf")},
    "expm1": {"exp": 1, "add": 1},
    "exp2": {"exp": 1},
    **{op: {"log": 1, "add": 1} for op in ("log1p",)},
    **{op: {"log": 1, "div": 1} for op in ("log2", "log10")},
    "rsqrt": {"sqrt": 1, "div": 1},
    "sigmoid": {"exp": 1, "add": 1, "div": 1},
    "silu": {"exp": 1, "add": 1, "div": 1, "mul": 1},
    "gelu": {"erf": 1, "mul": 3, "add": 1},
    "softplus": {"compare": 1, "exp": 1, "log": 1, "add": 2},
    **{
        op: {"compare": 1}
        for op in """relu abs sign gt lt ge le eq ne maximum minimum clamp_min clamp_max __and__ __or__
        __xor__ logical_and logical_or logical_not bitwise_and bitwise_or bitwise_not isnan isinf""".split()
    },
    "clamp": {"compare": 2},
    "hardtanh": {"compare": 2},
}
#: aten ops that move, select or fill values and do no arithmetic: 0 FLOPs, known.
NO_FLOPS = frozenset(
    """alias arange as_strided cat clone contiguous copy detach embedding empty_like expand fill flip
    full full_like gather index index_select lift_fresh_copy masked_fill narrow new_empty new_full
    new_ones new_zeros ones_like permute repeat reshape roll select slice split split_with_sizes squeeze
    stack t transpose tril triu unbind unsqueeze view _unsafe_view where zeros_like _to_copy to""".split()
)
#: Reductions: FLOPs per input element, by kind (mean's division is per output element).
_REDUCTIONS = {
    "sum": {"add": 1},
    "cumsum": {"add": 1},
    "prod": {"mul": 1},
    "cumprod": {"mul": 1},
    **{op: {"compare": 1} for op in ("amax", "amin", "max", "min", "argmax", "argmin")},
}

#: softmax and log_softmax, per input element (their row-wise log aside), as the library's.
_ROW_FUNCTIONS = {
    **{op: {"compare": 1, "add": 2, "exp": 1, "div": 1} for op in ("softmax", "_softmax")},
    **{op: {"compare": 1, "add": 3, "exp": 1} for op in ("log_softmax", "_log_softmax")},
}


def _kernel_positions(op: str, args: list, kwargs: dict) -> int | None:
    """How many input positions each output element of a pooling op reads (its kernel's size)."""
    kernel = kwargs.get("kernel_size", args[1] if len(args) > 1 else None)
    if isinstance(kernel, int):
        return kernel ** (2 if op.endswith("2d") else 3 if op.endswith("3d") else 1)
    if isinstance(kernel, list) and all(isinstance(size, int) for size in kernel):
        return math.prod(kernel)
    return None


def flops(name: str, inputs: Sequence[tuple[int, ...]], output: tuple[int, ...]) -> dict[str, int] | None:
    """FLOPs by kind of the aten call ``name`` on inputs of these shapes giving ``output``'s shape,
    where the count is clear (elementwise ops, reductions, matrix products, convolutions, pooling,
    moves); None where it is not (the op is then listed as unknown, never counted as 0)."""
    op, overload, args, kwargs = _parsed(name)
    out = math.prod(output)
    if op in NO_FLOPS:
        return {}
    if op in ("max", "min") and overload == "other":
        return {"compare": out}
    if op == "gelu" and kwargs.get("approximate") == "tanh":
        return {"tanh": out, "mul": 6 * out, "add": 2 * out}
    if op in ELEMENTWISE_FLOPS:
        return {kind: count * out for kind, count in ELEMENTWISE_FLOPS[op].items()}
    if op in _REDUCTIONS and inputs:
        return {kind: count * math.prod(inputs[0]) for kind, count in _REDUCTIONS[op].items()}
    if op == "mean" and inputs:
        return {"add": math.prod(inputs[0]), "div": out}
    if op in _ROW_FUNCTIONS and inputs and isinstance(args[1] if len(args) > 1 else None, int):
        result = {kind: count * math.prod(inputs[0]) for kind, count in _ROW_FUNCTIONS[op].items()}
        if "log" in op:  # the log of each row's sum
            result["log"] = math.prod(inputs[0]) // max(1, inputs[0][args[1]] if inputs[0] else 1)
        return result
    if op in ("mm", "bmm", "matmul", "addmm", "baddbmm", "linear") and len(inputs) >= 2:
        first = inputs[1] if op in ("addmm", "baddbmm") else inputs[0]
        result = {"matmul": 2 * out * (first[-1] if first else 1)}
        has_bias = op in ("addmm", "baddbmm") or (op == "linear" and len(inputs) == 3)
        return result | ({"add": out} if has_bias else {})
    if op in ("conv1d", "conv2d", "conv3d", "convolution") and len(inputs) >= 2:
        weight = inputs[1]  # [out_channels, in_channels / groups, *kernel]
        result = {"matmul": 2 * out * math.prod(weight[1:])}
        return result | ({"add": out} if len(inputs) >= 3 else {})
    if "pool" in op and op.startswith(("max_pool", "avg_pool")):
        positions = _kernel_positions(op, args, kwargs)
        if positions is None:
            return None
        if op.startswith("max_pool"):
            return {"compare": out * positions}
        return {"add": out * positions, "div": out}
    return None
