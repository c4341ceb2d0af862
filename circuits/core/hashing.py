"""Content hashes: of tensors (dtype, shape, bytes) and of node structure.

One place decides how bytes are fed to blake2b, so that the printed hex
prefix of an Array (``PRINTED_HEX_DIGITS``), the store's file names (the
full ``FULL_HEX_DIGITS``) and structural node hashes all agree.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

DIGEST_SIZE = 32
NODE_DIGEST_SIZE = 16  # 128 bits: no collision in any real circuit, and half the bytes to compare
#: A tensor's content hash in full, as the store names its file: 64 hex digits.
FULL_HEX_DIGITS = 2 * DIGEST_SIZE
#: The prefix of it that the text format prints after ``Array`` (and that a store resolves).
PRINTED_HEX_DIGITS = 24


def tensor_bytes(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor's elements as a flat uint8 tensor on the CPU.

    ``contiguous()`` is not enough: it keeps a size-1 axis's stride (``x[:, 5]`` of a ``[1, 32]``
    tensor has stride 32 and counts as contiguous), which a byte view refuses."""
    flat = tensor.detach().to("cpu").reshape(-1)
    if flat.numel() and flat.stride(0) != 1:
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


#: A tensor whose bytes are not at hand as they are (one on another device, or a transposed
#: view) is hashed by blocks of rows of about this size, each copied in turn, never all at once.
HASH_BLOCK_BYTES = 64 << 20


def tensor_content_hash(tensor: torch.Tensor) -> str:
    """Hex digest of a tensor's dtype, shape and bytes (device-independent)."""
    hasher = hashlib.blake2b(digest_size=DIGEST_SIZE)
    hasher.update(f"{tensor.dtype}|{list(tensor.shape)}|".encode())
    for block in _row_blocks(tensor):
        hasher.update(tensor_bytes(block).numpy().data)
    return hasher.hexdigest()


def _row_blocks(tensor: torch.Tensor) -> list[torch.Tensor]:
    """``tensor`` as consecutive slices of its first axis whose row-major bytes, one after the
    other, are its own: itself where they need no copy, else slices of ``HASH_BLOCK_BYTES``."""
    tensor = tensor.detach()
    if not tensor.numel():
        return []
    if tensor.dim() == 0 or (tensor.device.type == "cpu" and tensor.is_contiguous()):
        return [tensor]
    row_bytes = tensor[0].numel() * tensor.element_size()
    return list(tensor.split(max(1, HASH_BLOCK_BYTES // row_bytes)))


def content_hashes(tensors: Sequence[torch.Tensor]) -> list[str]:
    """``tensor_content_hash`` of each tensor, several at once in threads.

    blake2b releases the GIL while it reads a large buffer, so a model's
    weights hash on as many cores as torch computes with
    (``torch.get_num_threads()``); the largest go first, so that one big
    tensor does not end the run alone.
    """
    workers = min(len(tensors), torch.get_num_threads())
    if workers < 2:
        return [tensor_content_hash(t) for t in tensors]
    largest_first = sorted(range(len(tensors)), key=lambda i: -tensors[i].numel() * tensors[i].element_size())
    with ThreadPoolExecutor(workers, thread_name_prefix="content-hash") as pool:
        digests = dict(zip(largest_first, pool.map(tensor_content_hash, [tensors[i] for i in largest_first])))
    return [digests[i] for i in range(len(tensors))]


def node_hash(kind: str, name: str | None, shape: tuple, extra: str, children, identity: str = "") -> bytes:
    """Structural hash: everything the printed line says, plus the children.

    Two nodes hash alike exactly when they print alike (same variant, name,
    shape and EXTRA) and their children hash alike, so ``parse(c.repr())``
    equals ``c`` even when array tensors are not at hand.  The one exception
    is ``identity``: an Array whose tensor requires grad is a distinct
    variable, told apart from an equal-valued one by its tensor object.

    The bytes hashed are ``kind, len(named), named, shape, len(extra), extra,
    len(children)`` joined by ``\\x1f`` (``named`` is ``\\x00`` for no name, else
    ``\\x01`` and the name), then each child's hash.  Every stored hash depends
    on them: they must never change.
    """
    return node_hash_of_digests(kind, name, shape, extra, [child.hash for child in children], identity)


def node_hash_of_digests(
    kind: str, name: str | None, shape: tuple, extra: str, digests: Sequence[bytes], identity: str = ""
) -> bytes:
    """``node_hash`` given the children's hashes rather than the children."""
    if name is None:
        header = kind + "\x1f1\x1f\x00" + _header_tail(shape, extra, len(digests))
    else:
        header = f"{kind}\x1f{len(name) + 1}\x1f\x01{name}{_header_tail(shape, extra, len(digests))}"
    if identity:
        header += f"\x1f{identity}"
    hasher = _EMPTY_NODE_HASHER.copy()
    hasher.update(header.encode("utf-8", "surrogatepass"))
    for digest in digests:
        hasher.update(digest)
    return hasher.digest()


# copied for each node, the same digests as a new blake2b(digest_size=...) but a sixth less
# of node_hash's time: reading that keyword is the slow part of making one
_EMPTY_NODE_HASHER = hashlib.blake2b(digest_size=NODE_DIGEST_SIZE)


@functools.lru_cache(maxsize=4096)
def _header_tail(shape: tuple, extra: str, num_children: int) -> str:
    """The header after the name (cached: many nodes share shape, extra and arity)."""
    return f"\x1f{shape}\x1f{len(extra)}\x1f{extra}\x1f{num_children}"
