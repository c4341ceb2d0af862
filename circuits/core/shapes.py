"""Shape rules shared by the node classes: einsum axes, broadcasting, indices.

Kept apart from ``nodes`` so that the rules can be read (and tested) without
the node machinery, and so that the parser can reuse the einsum and index
syntax that the printer writes.
"""

from __future__ import annotations

import functools
import string
from typing import Sequence

import torch

from circuits.errors import BroadcastError, EinsumError, IndexSpecError

Shape = tuple[int, ...]

# torch.einsum accepts exactly these 52 letters; axis integer i prints as
# EINSUM_LETTERS[i], so "ih,h->ih" reads back to the same integers.
EINSUM_LETTERS = string.ascii_lowercase + string.ascii_uppercase
_LETTER_TO_AXIS = {letter: i for i, letter in enumerate(EINSUM_LETTERS)}


def describe(kind: str, name: str | None) -> str:
    """How error messages name a node: ``Einsum 'a.q'`` or ``unnamed Einsum``."""
    return f"{kind} {name!r}" if name is not None else f"unnamed {kind}"


def format_shape(shape: Sequence[int]) -> str:
    """FORMAT.md's shape syntax: ``[50259,256]``, ``[]`` for rank 0."""
    return "[" + ",".join(str(size) for size in shape) + "]"


def shape_or_type(value: object) -> str:
    """How a message names a value that should have been a tensor: ``shape [4,3]``, or its type."""
    return f"shape {format_shape(value.shape)}" if isinstance(value, torch.Tensor) else type(value).__name__


def letters_to_axes(letters: str, where: str) -> tuple[int, ...]:
    """``"qk"`` -> ``(16, 10)``; any character outside a-z, A-Z is an error."""
    try:
        return tuple(_LETTER_TO_AXIS[letter] for letter in letters)
    except KeyError as missing:
        raise EinsumError(f"{where}: einsum axis {missing.args[0]!r} is not a letter a-z or A-Z") from None


def axes_to_letters(axes: Sequence[int]) -> str:
    return "".join(EINSUM_LETTERS[axis] for axis in axes)


@functools.lru_cache(maxsize=4096)
def einsum_text(operand_axes: tuple[tuple[int, ...], ...], out_axes: tuple[int, ...]) -> str:
    """``"qc,kc,,qk->qk"`` for the given axes (cached: models reuse a few specs)."""
    return ",".join(axes_to_letters(a) for a in operand_axes) + "->" + axes_to_letters(out_axes)


def parse_einsum_string(spec: str, where: str) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    """Split ``"qc,kc,,qk->qk"`` into per-operand axes and output axes."""
    if spec.count("->") != 1:
        raise EinsumError(f"{where}: einsum string {spec!r} needs exactly one '->'")
    try:
        return _parse_einsum_string(spec)
    except KeyError as missing:
        raise EinsumError(
            f"{where}: einsum axis {missing.args[0]!r} in {spec!r} is not a letter a-z or A-Z"
        ) from None


@functools.lru_cache(maxsize=4096)
def _parse_einsum_string(spec: str) -> tuple[tuple[tuple[int, ...], ...], tuple[int, ...]]:
    inputs, output = spec.split("->")
    operands = tuple(tuple(_LETTER_TO_AXIS[c] for c in part) for part in inputs.split(","))
    return operands, tuple(_LETTER_TO_AXIS[c] for c in output)


def expand_ellipsis(spec: str, shapes: Sequence[Shape | None], where: str) -> str:
    """``spec`` with each ``...`` written out in letters of its own, as ``torch.einsum`` reads it.

    The ``...`` of each operand stands for its axes the letters leave over;
    those broadcast against each other right-aligned (a size-1 axis gets a
    letter of its own, summed away: the product repeats it), and ``...`` in
    the output is their broadcast shape; an output without ``...`` sums them.
    """
    inputs, _, output = spec.partition("->")
    parts = inputs.split(",")
    if len(parts) != len(shapes):
        raise EinsumError(
            f"{where}: einsum string {spec!r} has {len(parts)} operands but {len(shapes)} were given"
        )
    for part in parts + [output]:
        if part.count("...") > 1 or "." in part.replace("...", ""):
            raise EinsumError(f"{where}: {part!r} in einsum string {spec!r} has a '.' that is not one '...'")
    fresh = iter(letter for letter in EINSUM_LETTERS if letter not in spec)
    ranks = []
    for position, (part, shape) in enumerate(zip(parts, shapes)):
        if shape is None:
            raise EinsumError(f"{where}: operand {position} of {spec!r} is not a circuit")
        rank = len(shape) - len(part.replace("...", ""))
        if rank < 0 or (rank and "..." not in part):
            raise EinsumError(
                f"{where}: operand {position} has shape {list(shape)} (rank {len(shape)}) but {part!r} of "
                f"{spec!r} gives it {len(part.replace('...', ''))} axes"
            )
        ranks.append(rank if "..." in part else 0)
    broadcast = _ellipsis_sizes(parts, shapes, ranks, spec, where)
    try:
        shared = [next(fresh) for _ in broadcast]
        written = [
            part.replace("...", "".join(_ellipsis_letters(shape, rank, part, broadcast, shared, fresh)))
            for part, shape, rank in zip(parts, shapes, ranks)
        ]
    except StopIteration:
        raise EinsumError(
            f"{where}: einsum string {spec!r} needs more letters for its '...' axes than the "
            f"{len(EINSUM_LETTERS)} torch.einsum has"
        ) from None
    return ",".join(written) + "->" + output.replace("...", "".join(shared))


def _ellipsis_sizes(parts, shapes, ranks, spec: str, where: str) -> list[int]:
    """The broadcast shape of the operands' ``...`` axes (right-aligned; each size matches or is 1)."""
    width = max(ranks, default=0)
    sizes = [1] * width
    for position, (part, shape, rank) in enumerate(zip(parts, shapes, ranks)):
        start = part.index("...") if rank else 0
        for k, size in enumerate(shape[start : start + rank]):
            slot = width - rank + k
            if sizes[slot] == 1:
                sizes[slot] = size
            elif size not in (1, sizes[slot]):
                raise EinsumError(
                    f"{where}: the '...' axes of {spec!r} do not broadcast: operand {position} (shape "
                    f"{list(shape)}) has size {size} where another has {sizes[slot]} (axis {slot - width} of "
                    f"the '...'); operand shapes {[list(s) for s in shapes]}"
                )
    return sizes


def _ellipsis_letters(
    shape, rank: int, part: str, broadcast: list[int], shared: list[str], fresh
) -> list[str]:
    """The letters one operand's ``...`` axes get: the shared one, or a fresh one for a size-1 axis that broadcasts."""
    start = part.index("...") if "..." in part else 0
    offset = len(broadcast) - rank
    return [
        shared[offset + k] if size == broadcast[offset + k] else next(fresh)
        for k, size in enumerate(shape[start : start + rank])
    ]


def normalize_axes(axes: Sequence[int] | str, where: str) -> tuple[int, ...]:
    """Accept axes as a letter string or a sequence of ints in ``range(len(EINSUM_LETTERS))``."""
    if isinstance(axes, str):
        return letters_to_axes(axes, where)
    try:
        normalized = tuple(int(axis) for axis in axes)
    except (TypeError, ValueError):
        raise EinsumError(f"{where}: axes {axes!r} are neither letters nor integers") from None
    for axis in normalized:
        if not 0 <= axis < len(EINSUM_LETTERS):
            raise EinsumError(
                f"{where}: axis integer {axis} is outside [0, {len(EINSUM_LETTERS)}), "
                f"the {len(EINSUM_LETTERS)} letters torch.einsum accepts"
            )
    return normalized


def einsum_shape(
    operand_shapes: Sequence[Shape],
    operand_axes: Sequence[tuple[int, ...]],
    out_axes: tuple[int, ...],
    where: str,
) -> Shape:
    """Check letter sizes agree everywhere and return the output shape.

    A letter may repeat in the output (a diagonal embedding, as rust_circuit allows)."""
    spec = einsum_text(tuple(operand_axes), out_axes)
    sizes: dict[int, int] = {}
    for position, (shape, axes) in enumerate(zip(operand_shapes, operand_axes)):
        if len(shape) != len(axes):
            raise EinsumError(
                f"{where}: operand {position} has shape {list(shape)} (rank {len(shape)}) "
                f"but {spec!r} gives it {len(axes)} axes {axes_to_letters(axes)!r}"
            )
        for axis, size in zip(axes, shape):
            known = sizes.setdefault(axis, size)
            if known != size:
                raise EinsumError(
                    f"{where}: letter {EINSUM_LETTERS[axis]!r} of {spec!r} has size {known} "
                    f"in one place and {size} in operand {position} (shape {list(shape)}); "
                    f"operand shapes {[list(s) for s in operand_shapes]}"
                )
    missing = [EINSUM_LETTERS[a] for a in out_axes if a not in sizes]
    if missing:
        raise EinsumError(
            f"{where}: output letters {''.join(missing)!r} of {spec!r} appear in no operand "
            f"(operand shapes {[list(s) for s in operand_shapes]})"
        )
    return tuple(sizes[axis] for axis in out_axes)


def broadcast_shapes(shapes: Sequence[Shape], where: str) -> Shape:
    """numpy broadcasting (right-aligned); an error lists every operand shape."""
    rank = max((len(s) for s in shapes), default=0)
    result = [1] * rank
    for shape in shapes:
        offset = rank - len(shape)
        for i, size in enumerate(shape):
            current = result[offset + i]
            if current == 1:
                result[offset + i] = size
            elif size != 1 and size != current:
                raise BroadcastError(
                    f"{where}: operand shapes {[list(s) for s in shapes]} do not broadcast "
                    f"(axis {offset + i - rank} has sizes {current} and {size}); "
                    "shapes are right-aligned and each size must match or be 1"
                )
    return tuple(result)


def normalize_index(index, shape: Shape, where: str) -> tuple:
    """Check an index against ``shape`` and pad it with full slices to full rank.

    Items keep the spelling the user gave (``-2`` stays ``-2``) so that the
    printed form is what was written; only out-of-range items are refused,
    since silently clamped slices hide off-by-one mistakes.  A tensor item
    becomes a private int64 copy on the CPU: the caller editing theirs later
    changes neither the node's value nor its printed form.
    """
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > len(shape):
        raise IndexSpecError(
            f"{where}: index has {len(index)} items but the child has shape {list(shape)} (rank {len(shape)})"
        )
    items = [_convert_item(item, axis, shape, where) for axis, item in enumerate(index)]
    items.extend(slice(None, None) for _ in range(len(shape) - len(index)))
    return tuple(items)  # checked against the shape by Index._derive, on every construction


def check_index(items: Sequence, shape: Shape, where: str) -> None:
    """Refuse normalized ``items`` that do not fit ``shape``.

    Run on every construction, rewrites included: a child replaced by a
    smaller one must not turn ``[0:3]`` into a silently clamped slice.
    """
    if len(items) != len(shape):
        raise IndexSpecError(
            f"{where}: index has {len(items)} items for child shape {list(shape)} (rank {len(shape)})"
        )
    for axis, (item, size) in enumerate(zip(items, shape)):
        if isinstance(item, slice):
            problem = _slice_problem(item, size)
        elif isinstance(item, torch.Tensor):
            out = item.numel() and (int(item.min()) < -size or int(item.max()) >= size)
            problem = f"tensor index values {_values_text(item)} are out of range" if out else None
        else:
            problem = None if -size <= item < size else f"index {item} is out of range"
        if problem is not None:
            raise IndexSpecError(
                f"{where}: axis {axis} of child shape {list(shape)}: {problem} for size {size}"
            )


def _slice_problem(item: slice, size: int) -> str | None:
    start, stop = item.start, item.stop
    if start is None and stop is None:
        return None
    for bound in (start, stop):
        if bound is not None and not -size <= bound <= size:
            return f"slice {format_slice(item)} is out of range"
    begin = 0 if start is None else start % size if start < 0 else start
    end = size if stop is None else stop + size if stop < 0 else stop
    return f"slice {format_slice(item)} ends before it starts" if end < begin else None


def _values_text(tensor: torch.Tensor, limit: int = 16) -> str:
    values = tensor.tolist()
    return str(values) if len(values) <= limit else f"{values[:limit]}... ({len(values)} values)"


def _convert_item(item, axis: int, shape: Shape, where: str):
    """One index item in its canonical type: int, step-less slice of ints, or int64 CPU tensor."""
    context = f"{where}: axis {axis} of child shape {list(shape)}"
    if isinstance(item, bool):
        raise IndexSpecError(f"{context}: a bool is not an index")
    if isinstance(item, slice):
        if item.step not in (None, 1):
            raise IndexSpecError(f"{context}: slice step {item.step} is not supported")
        bounds = []
        for bound in (item.start, item.stop):
            if bound is not None and (isinstance(bound, bool) or not isinstance(bound, int)):
                raise IndexSpecError(f"{context}: slice bound {bound!r} is not an int")
            bounds.append(None if bound is None else int(bound))
        return slice(*bounds)
    if isinstance(item, (list, torch.Tensor)) or hasattr(item, "__array__"):
        return _tensor_item(item, context)
    try:
        value = int(item)  # numpy and torch integer scalars
    except (TypeError, ValueError, OverflowError):
        raise IndexSpecError(f"{context}: {item!r} is not an int, slice or 1-D int tensor") from None
    if value != item:
        raise IndexSpecError(f"{context}: {item!r} is not an integer")
    return value


def _tensor_item(item, context: str) -> torch.Tensor:
    if isinstance(item, (list, tuple)) and len(item) == 0:
        return torch.empty(0, dtype=torch.int64)  # as_tensor([]) would be float
    try:
        tensor = torch.as_tensor(item)
    except (TypeError, ValueError, RuntimeError, OverflowError) as error:
        raise IndexSpecError(f"{context}: {item!r} is not a 1-D int tensor ({error})") from None
    if tensor.is_meta or tensor.layout != torch.strided:
        raise IndexSpecError(
            f"{context}: tensor index is a {'meta' if tensor.is_meta else str(tensor.layout)} tensor, "
            "whose values cannot be read; give a dense tensor with values"
        )
    if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
        raise IndexSpecError(f"{context}: tensor index has dtype {tensor.dtype}, not integer")
    if tensor.ndim != 1:
        raise IndexSpecError(f"{context}: tensor index has shape {list(tensor.shape)}; only 1-D is supported")
    # a private copy, never a view of the caller's tensor (an edit there must not reach the node)
    return tensor.detach().to(device="cpu", dtype=torch.int64, copy=True)


def normalize_scatter_index(index, shape: Shape, where: str) -> tuple[slice, ...]:
    """A Scatter's index into ``shape``: per axis a step-less slice, in rust_circuit's canonical form.

    As rust_circuit's Scatter, only slices are allowed, each in range
    (``-size <= bound <= size``, start not after stop), the index padded
    with full slices to the rank of ``shape``; every slice becomes
    ``slice(start, stop)`` with explicit non-negative bounds, so ``[:2]``
    and ``[0:2]`` are one node and print as rust_circuit prints them.
    """
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) > len(shape):
        raise IndexSpecError(
            f"{where}: index has {len(index)} items but the output shape {list(shape)} has rank {len(shape)}"
        )
    items = []
    for axis, (item, size) in enumerate(zip(index + (slice(None),) * (len(shape) - len(index)), shape)):
        context = f"{where}: axis {axis} of output shape {list(shape)}"
        if not isinstance(item, slice):
            raise IndexSpecError(
                f"{context}: {item!r} is not a slice; a Scatter's index is slices only, as rust_circuit's"
            )
        item = _convert_item(item, axis, shape, where)
        problem = _slice_problem(item, size)
        if problem is not None:
            raise IndexSpecError(f"{context}: {problem} for size {size}")
        start, stop, _ = item.indices(size)
        items.append(slice(start, stop))
    return tuple(items)


def format_slice(item: slice) -> str:
    """A slice as the index syntax writes it, ``2:5``."""
    start = "" if item.start is None else str(item.start)
    stop = "" if item.stop is None else str(item.stop)
    return f"{start}:{stop}"


def index_shape(items: tuple, shape: Shape) -> Shape:
    """Output shape of a normalized index: ints drop axes, slices and tensors keep them."""
    result = []
    for item, size in zip(items, shape):
        if isinstance(item, slice):
            result.append(len(range(size)[item]))
        elif isinstance(item, torch.Tensor):
            result.append(item.numel())
    return tuple(result)


def format_index(items: tuple) -> str:
    """FORMAT.md's index syntax; a tensor index is written inline, ``[0,[3,1],:]``."""
    parts = []
    for item in items:
        if isinstance(item, slice):
            parts.append(format_slice(item))
        elif isinstance(item, torch.Tensor):
            parts.append("[" + ",".join(str(v) for v in item.tolist()) + "]")
        else:
            parts.append(str(item))
    return "[" + ",".join(parts) + "]"
