"""``memory_bytes``: the most memory an experiment's values may take, checked before anything runs.

The weights and inputs the caller holds are not counted (they exist before and after); what is
counted is what the experiment allocates: its cache, each evaluation's values (``cc.cost``'s
``peak_value_bytes``), the float32 scratch of reduced-precision contractions, and the batches it
stacks.  Given a budget, an experiment sizes its cache and its batches to fit it, from the cost
model (exact to a few percent on a forward: bench/memory_peak.py), and refuses with a
``CacheError`` before running when even its smallest plan (one target per evaluation, no cache)
does not fit: an error to read, not an out-of-memory kill halfway.

The split: an evaluation must fit whole, so the cache gets at most half of what the largest
single evaluation leaves (``split``), and batches get the rest.  Plans use 95% of the budget
(``usable``): the rest is kept back for what the cost model leaves out (a metric's arithmetic on
the logits, small tensors made on the way), measured at 0.1% of a sweep's peak.
"""

from __future__ import annotations

from typing import Any

from circuits.core.nodes import Einsum
from circuits.core.functions import REDUCED_DTYPES
from circuits.errors import CacheError
from circuits.evaluation.costs import CircuitCost, format_bytes

__all__ = ["check_memory_bytes", "evaluation_bytes", "refuse", "split", "tracked_bytes", "usable"]


def check_memory_bytes(memory_bytes: Any, what: str) -> int | None:
    """``memory_bytes`` as given: None (no budget) or a positive int of bytes (``CacheError`` otherwise)."""
    if memory_bytes is None:
        return None
    if isinstance(memory_bytes, bool) or not isinstance(memory_bytes, int) or memory_bytes <= 0:
        raise CacheError(f"{what}: memory_bytes must be a positive int (bytes) or None, got {memory_bytes!r}")
    return memory_bytes


def usable(memory_bytes: int) -> int:
    """The part of a budget plans may fill: 95% (see the module docstring)."""
    return memory_bytes - memory_bytes // 20


def evaluation_bytes(costed: CircuitCost, held_bytes: int) -> int:
    """What one evaluation allocates: its values' peak, the float32 scratch, and the inputs it
    holds beyond ``held_bytes`` (the caller's weights and inputs: a batch bound to a Symbol counts)."""
    return costed.peak_bytes - min(held_bytes, costed.held_bytes)


def refuse(what: str, memory_bytes: int, needed: int, for_what: str) -> CacheError:
    """The error for a budget below what the smallest plan needs."""
    return CacheError(
        f"{what}: memory_bytes={memory_bytes} ({format_bytes(memory_bytes)}) is below the "
        f"{format_bytes(needed)} that {for_what} needs (cc.cost's prediction; plans fill 95% of the "
        "budget); nothing was run",
        memory_bytes=memory_bytes,
        needed_bytes=needed,
    )


def split(
    what: str, memory_bytes: int, single_bytes: int, cache_bytes: int, for_what: str
) -> tuple[int, int]:
    """``(cache_bytes, batch_bytes)`` within ``usable(memory_bytes)``, where one unbatched evaluation takes
    ``single_bytes``: the cache at most ``cache_bytes`` and half of what that evaluation leaves,
    batches the rest.  ``CacheError`` (``refuse``) when ``single_bytes`` does not fit."""
    room = usable(memory_bytes)
    if single_bytes > room:
        raise refuse(what, memory_bytes, single_bytes, for_what)
    cache = min(cache_bytes, (room - single_bytes) // 2)
    return cache, room - cache


def tracked_bytes(costed: CircuitCost) -> int:
    """At most what an evaluation under autograd keeps for its backward: every computed value (autograd
    keeps those each op's backward reads; views keep their base) and, where bfloat16 or float16 is
    contracted in float32 (``workspace_bytes``), the float32 copies of both operands, which the
    product's backward reads.  An upper bound: the gradients' own buffers are not in it."""
    total = 0
    for own in costed.nodes:
        if not own.node.children or own.view:
            continue
        total += own.allocated_bytes
        if isinstance(own.node, Einsum) and own.dtype in REDUCED_DTYPES and own.workspace_bytes:
            total += 4 * sum(costed[child].out_elements for child in own.node.children)
    return total
