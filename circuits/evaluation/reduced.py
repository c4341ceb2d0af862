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

import torch

from circuits.core.functions import REDUCED_DTYPES

__all__ = ["CHUNK_BYTES", "REDUCED", "contract_in_float32", "native_reduced_matmul", "worth_float32"]

REDUCED = REDUCED_DTYPES

#: The most bytes of float32 copies (operands and result) one chunk of a contraction makes.
CHUNK_BYTES = 16 << 20

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
    dtype = first.dtype
    if dtype not in REDUCED or first.device.type != "cpu" or native_reduced_matmul(dtype):
        return False
    elements = sum(t.numel() for t in tensors) + out_size
    return 2 * math.prod(sizes.values()) >= _MIN_FLOPS_PER_ELEMENT * elements


def contract_in_float32(
    equation: str, operands: list[str], out: str, tensors: tuple[torch.Tensor, ...], sizes: dict[str, int]
) -> torch.Tensor:
    """``torch.einsum(equation)`` of ``tensors`` computed in float32 and rounded once to their dtype,
    chunked along the output's longest axis when the float32 copies would exceed ``CHUNK_BYTES``."""
    dtype = tensors[0].dtype
    out_shape = [sizes[letter] for letter in out]
    out_size = math.prod(out_shape)
    whole = 4 * (sum(t.numel() for t in tensors) + out_size)
    if whole <= CHUNK_BYTES or not out or any(len(set(op)) != len(op) for op in operands):
        return torch.einsum(equation, *[t.float() for t in tensors]).to(dtype)
    letter = max(out, key=sizes.__getitem__)
    size = sizes[letter]
    split = [letter in op for op in operands]
    per_unit = 4 * (sum(t.numel() for t, s in zip(tensors, split) if s) + out_size) // size
    fixed = [None if s else t.float() for t, s in zip(tensors, split)]  # upcast once, beside the chunks
    step = max(1, CHUNK_BYTES // max(per_unit, 1))
    result = torch.empty(out_shape, dtype=dtype, device=tensors[0].device)
    axis = out.index(letter)
    for start in range(0, size, step):
        length = min(step, size - start)
        parts = [
            f if f is not None else t.narrow(op.index(letter), start, length).float()
            for t, f, op in zip(tensors, fixed, operands)
        ]
        result.narrow(axis, start, length).copy_(torch.einsum(equation, *parts))
    return result
