"""Contractions of bfloat16 and float16 tensors on CPUs without a native kernel for them: in float32.

torch multiplies bfloat16 or float16 matrices on a CPU with oneDNN where the CPU has instructions
for them (AVX-512 BF16 or FP16, AMX: ``torch.ops.mkldnn._is_mkldnn_bf16_supported()``).  Elsewhere
(an AVX2 CPU) it falls back to a portable kernel, measured on 2 AVX2 cores at 5-6x the time of
float32's MKL product in its best layout (both operands contiguous along the summed axis, as
``nn.Linear`` holds them) and 25x in the others (a ``[in, out]`` weight, small batched products).
Hugging Face's forward runs its linear layers in that best layout; an einsum's operands come in
whatever layout the circuit has.  There, each contraction is computed in float32 and rounded to the
operands' dtype once: the same arithmetic (the product of two bfloat16 or float16 numbers is exact
in float32, and both the portable kernel and oneDNN accumulate in float32), with the float32
additions in another order.

The float32 copies are made in chunks of one output axis, at most ``CHUNK_BYTES`` at a time (a 1B
model's unembedding would need 1 GiB at once).  A contraction with few operations per element
(a single token's matrix-vector product) stays native: converting the weight would cost more than
the portable kernel saves.
"""

from __future__ import annotations

import functools
import math
import threading

import torch

from circuits.core.functions import REDUCED_DTYPES

__all__ = [
    "CHUNK_BYTES",
    "REDUCED",
    "contract_in_float32",
    "float32_workspace",
    "native_reduced_matmul",
    "pairable",
    "scratch_bytes",
    "takes_float32",
    "worth_float32",
]

REDUCED = REDUCED_DTYPES

#: The most bytes of float32 copies (the larger operand's and the result's) one chunk of a contraction makes.
CHUNK_BYTES = 64 << 20

#: Operations per converted element below which the native kernel is kept (about 4 rows of a product).
_MIN_FLOPS_PER_ELEMENT = 8

_PROBES = {torch.bfloat16: "_is_mkldnn_bf16_supported", torch.float16: "_is_mkldnn_fp16_supported"}


@functools.lru_cache(maxsize=None)
def native_reduced_matmul(dtype: torch.dtype) -> bool:
    """Whether this CPU multiplies ``dtype`` (bfloat16, float16) matrices natively (oneDNN), as torch decides."""
    try:
        return bool(getattr(torch.ops.mkldnn, _PROBES[dtype])())
    except (AttributeError, RuntimeError):  # a torch without the probe: assume the portable kernel
        return False


def worth_float32(tensors: tuple[torch.Tensor, ...], sizes: dict[str, int], out_size: int) -> bool:
    """Whether a contraction of ``tensors`` (one dtype) over letters of ``sizes`` is computed in float32 here."""
    first = tensors[0]
    elements = sum(t.numel() for t in tensors)
    return takes_float32(first.dtype, first.device, elements, sizes, out_size)


def takes_float32(
    dtype: torch.dtype, device: torch.device, elements: int, sizes: dict[str, int], out_size: int
) -> bool:
    """``worth_float32`` from shapes alone (for the cost model): operands of ``dtype`` on ``device``
    with ``elements`` in all, over letters of ``sizes``, into ``out_size`` elements."""
    if dtype not in REDUCED or device.type != "cpu" or native_reduced_matmul(dtype):
        return False
    flops = 2 * math.prod(sizes.values())
    return flops > 0 and flops >= _MIN_FLOPS_PER_ELEMENT * (elements + out_size)


def float32_workspace(operands: list[str], out: str, shapes: list[tuple[int, ...]]) -> tuple[int, int]:
    """``(transient, scratch)`` bytes that ``contract_in_float32`` allocates beyond its result, without
    gradients: transient, freed when it returns (``_pair``'s float32 copy of the smaller operand and
    one chunk's product; otherwise float32 copies of every operand and of the result); scratch, the
    buffer it keeps between calls (``_pair``'s chunk of the larger operand, ``_scratch``)."""
    sizes = {letter: size for op, shape in zip(operands, shapes) for letter, size in zip(op, shape)}
    numels = [math.prod(shape) for shape in shapes]
    out_numel = math.prod(sizes[letter] for letter in out)
    if len(operands) != 2 or not pairable(operands, out):
        return 4 * (sum(numels) + out_numel), 0
    big = 0 if numels[0] >= numels[1] else 1
    free = [x for x in operands[big] if x in out and x not in operands[1 - big]]
    letter, step = _chunking(free, sizes, numels[big], out_numel)
    share = 1.0 if letter is None else step / sizes[letter]
    return 4 * (numels[1 - big] + round(out_numel * share)), 4 * round(numels[big] * share)


def _chunking(
    free: list[str], sizes: dict[str, int], big_numel: int, out_numel: int
) -> tuple[str | None, int]:
    """``(letter, step)``: ``_pair`` copies the larger operand in chunks of ``step`` along ``letter``
    (its longest free letter), so that a chunk's float32 copy and product take at most ``CHUNK_BYTES``."""
    if not free:
        return None, 0
    letter = max(free, key=sizes.__getitem__)
    per_unit = 4 * (big_numel + out_numel) // sizes[letter]
    count = -(-sizes[letter] * per_unit // CHUNK_BYTES)  # as few chunks as fit, of equal lengths
    return letter, max(1, -(-sizes[letter] // max(count, 1)))


def contract_in_float32(
    equation: str, operands: list[str], out: str, tensors: tuple[torch.Tensor, ...], sizes: dict[str, int]
) -> torch.Tensor:
    """``torch.einsum(equation)`` of ``tensors`` computed in float32 and rounded once to their dtype.

    Two operands (what the models contract) go through ``_pair``: copied into float32 in their own
    memory order and multiplied as matrices, the larger one in chunks.  Anything else (three or more
    operands, a letter repeated or summed within one operand) is ``torch.einsum`` of float32 copies.
    """
    dtype = tensors[0].dtype
    if len(tensors) == 2 and pairable(operands, out):
        return _pair(operands, out, tensors, sizes)
    return torch.einsum(equation, *[t.float() for t in tensors]).to(dtype)


def pairable(operands: list[str], out: str) -> bool:
    """Whether two operands are a plain product: no letter repeated in one, none summed within one alone."""
    a, b = operands
    distinct = len(set(a)) == len(a) and len(set(b)) == len(b)
    return distinct and all(
        letter in out or letter in other for op, other in ((a, b), (b, a)) for letter in op
    )


def _pair(
    operands: list[str], out: str, tensors: tuple[torch.Tensor, ...], sizes: dict[str, int]
) -> torch.Tensor:
    """The product of two operands: batch letters (in both and the output), free letters (in one
    and the output) and summed letters (in both only), as ``bmm`` of ``[batch, free, summed]``
    matrices.  The larger operand (a weight) is chunked along its longest free letter so that its
    float32 copy and the chunk's result take at most ``CHUNK_BYTES``; its copies go to a buffer
    kept between calls where no gradient is needed (fresh memory costs page faults: 5x the copy)."""
    big = 0 if tensors[0].numel() >= tensors[1].numel() else 1
    letters = operands[big], operands[1 - big]
    batch = [x for x in out if x in letters[0] and x in letters[1]]
    free = [[x for x in op if x in out and x not in batch] for op in letters]
    stride = dict(zip(letters[0], tensors[big].stride()))
    summed = sorted((x for x in letters[0] if x not in out), key=stride.__getitem__, reverse=True)
    free[0].sort(key=stride.__getitem__, reverse=True)
    result = torch.empty([sizes[x] for x in out], dtype=tensors[0].dtype, device=tensors[0].device)
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    small = _as_matrix(tensors[1 - big], letters[1], batch, free[1], summed, None)
    letter, step = _chunking(free[0], sizes, tensors[big].numel(), result.numel())
    if letter is None:
        chunks = [(None, 0, 0)]
    else:
        chunks = [
            (letter, start, min(step, sizes[letter] - start)) for start in range(0, sizes[letter], step)
        ]
    order = batch + free[1] + free[0] if big == 1 else batch + free[0] + free[1]  # the product's axes
    permutation = [order.index(x) for x in out]
    for letter, start, length in chunks:
        part = (
            tensors[big] if letter is None else tensors[big].narrow(letters[0].index(letter), start, length)
        )
        matrix = _as_matrix(part, letters[0], batch, free[0], summed, None if grad else _scratch(part))
        product = (
            torch.bmm(small, matrix.transpose(1, 2)) if big == 1 else torch.bmm(matrix, small.transpose(1, 2))
        )
        shape = [part.shape[letters[0].index(x)] if x in letters[0] else sizes[x] for x in order]
        target = result if letter is None else result.narrow(out.index(letter), start, length)
        target.copy_(product.view(shape).permute(permutation))
        del matrix, product  # before the next chunk's: one chunk's copies at a time
    return result


def _as_matrix(
    tensor: torch.Tensor, letters: str, batch: list[str], free: list[str], summed: list[str], buffer
) -> torch.Tensor:
    """``tensor`` in float32 as ``[batch, free, summed]`` (each group merged), copied in its own memory
    order: where its summed letters lie outside its free ones, a transposed view of ``[batch, summed, free]``."""
    stride = dict(zip(letters, tensor.stride()))
    outer = max((stride[x] for x in free), default=0) >= max((stride[x] for x in summed), default=0)
    inner = free + summed if outer else summed + free
    axes = [letters.index(x) for x in batch + inner]
    shape = [tensor.shape[axis] for axis in axes]
    if buffer is None:
        copy = torch.empty(shape, dtype=torch.float32, device=tensor.device)
    else:
        copy = buffer[: math.prod(shape)].view(shape)
    copy.copy_(tensor.permute(axes))
    counts = [math.prod(tensor.shape[letters.index(x)] for x in group) for group in (batch, free, summed)]
    if outer:
        return copy.view(counts)
    return copy.view(counts[0], counts[2], counts[1]).transpose(1, 2)


_SCRATCH = threading.local()


def scratch_bytes() -> int:
    """The bytes of this thread's kept float32 buffers (``_scratch``), over devices and modes."""
    buffers = getattr(_SCRATCH, "buffers", None) or {}
    return sum(4 * buffer.numel() for buffer in buffers.values())


def _scratch(like: torch.Tensor) -> torch.Tensor:
    """A float32 buffer of at least ``like.numel()`` elements, kept per thread, device and inference
    mode between calls (its pages are touched once, not at every chunk of every forward)."""
    key = (like.device, torch.is_inference_mode_enabled())
    buffers = getattr(_SCRATCH, "buffers", None)
    if buffers is None:
        buffers = _SCRATCH.buffers = {}
    buffer = buffers.get(key)
    if buffer is None or buffer.numel() < like.numel():
        buffer = buffers[key] = torch.empty(like.numel(), dtype=torch.float32, device=like.device)
    return buffer
