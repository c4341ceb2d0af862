"""The dtype each imported node evaluates to, the casts that make it torch's, and constants kept exact.

Evaluation computes each node with its torch kernel on its children's
values, and makes every Scalar in one dtype per call: the promoted floating
dtype of the circuit's Arrays (``circuits.evaluation.leaves``).  torch
gives a Python number no dtype of its own (``x.half() * 1000`` is float16,
computed in float32 and rounded once), so a translation with a Scalar can
evaluate to another dtype than torch's op: float32 where torch overflows to
``inf`` in float16.  The walk asks ``Dtypes.of`` what each op's result
evaluates to, running the node's own kernel on meta tensors (no data), and
casts it to torch's dtype where the two differ (docs/from_torch.md, "Dtypes").
"""

from __future__ import annotations

import functools
import math

import torch

from circuits.errors import ModelError
from circuits.evaluation.kernels import default_kernel
from circuits.core.functions import CAST_NAME, GEN_INDEX_NAME
from circuits.core.nodes import Add, Array, Circuit, Concat, Einsum, GeneralFunction, Index, Rearrange, Scalar
from circuits.core.traversal import unique_nodes


def promoted(dtypes) -> torch.dtype:
    """The promoted floating dtype of ``dtypes`` (their floating ones), or torch's default if none:
    the dtype evaluation gives Scalars, for a circuit whose Arrays have these dtypes."""
    floating = [dtype for dtype in dtypes if dtype.is_floating_point]
    return functools.reduce(torch.promote_types, floating) if floating else torch.get_default_dtype()


def scalar_dtype(roots: list[Circuit]) -> torch.dtype:
    """The dtype Scalars evaluate to in ``roots`` (evaluation's rule: their Arrays' promoted floating dtype)."""
    return promoted(
        node.value.dtype for node in unique_nodes(roots) if isinstance(node, Array) and node.value is not None
    )


def cast_spec(dtype: torch.dtype) -> str | None:
    """The library's cast to ``dtype`` (None if it has none: complex dtypes, say)."""
    name = str(dtype).removeprefix("torch.")
    spec = f"cast_from_{{device:None,dtype:None}}_to_{{device:None,dtype:{name}}}"
    return spec if CAST_NAME.fullmatch(spec) else None


def as_torch_computes(value: float, dtype: torch.dtype, scalar_dtype: torch.dtype) -> float:
    """``value`` as torch computes an op of ``dtype`` with it (float32 for float16 and bfloat16 ops),
    rounded to that where Scalars (``scalar_dtype``) are wider: ``0.3`` in a float32 op is
    ``float32(0.3)``, which a float64 Scalar then holds exactly (otherwise the number as written)."""
    computes = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    if torch.promote_types(computes, scalar_dtype) == computes:
        return value
    return float(torch.tensor(value, dtype=computes))


def exact_in(value: float, dtype: torch.dtype, basis: torch.dtype) -> bool:
    """Whether a Scalar of ``value``, made in ``basis``, holds what torch holds for it in ``dtype``:
    ``basis`` is at least as wide as ``dtype``, or the two round ``value`` alike."""
    if not dtype.is_floating_point or torch.promote_types(basis, dtype) == basis:
        return True
    ours, theirs = (float(torch.tensor(value, dtype=d)) for d in (basis, dtype))
    return ours == theirs or (math.isnan(ours) and math.isnan(theirs))


class Dtypes:
    """What each node evaluates to when Scalars are ``scalar_dtype``, worked out once per node."""

    def __init__(self, scalar_dtype: torch.dtype):
        self.scalar_dtype = scalar_dtype
        self.known: dict[bytes, torch.dtype] = {}

    def of(self, node: Circuit) -> torch.dtype:
        """``node``'s dtype, from its children's (each worked out once, walking down iteratively)."""
        stack = [node]
        while stack:
            top = stack[-1]
            if top.hash in self.known:
                stack.pop()
                continue
            pending = [child for child in top.children if child.hash not in self.known]
            if pending:
                stack.extend(pending)
                continue
            self.known[top.hash] = self._own(top)
            stack.pop()
        return self.known[node.hash]

    def _own(self, node: Circuit) -> torch.dtype:
        if isinstance(node, Array):
            return node.value.dtype
        if isinstance(node, (Scalar, Add, Einsum)) and not node.children:
            return self.scalar_dtype  # a Scalar, an empty sum or product: made like a Scalar
        children = [self.known[child.hash] for child in node.children]
        if isinstance(node, (Index, Rearrange)) or (
            isinstance(node, GeneralFunction) and GEN_INDEX_NAME.fullmatch(node.spec.name)
        ):
            return children[0]  # a lookup or a view keeps its input's dtype (a lookup's kernel reads values)
        if isinstance(node, (Add, Einsum, Concat)) and len(set(children)) == 1:
            return children[0]  # no promotion among operands of one dtype
        metas = [torch.empty(c.shape, dtype=d, device="meta") for c, d in zip(node.children, children)]
        try:
            return default_kernel(node)(*metas).dtype
        except Exception as error:  # noqa: BLE001 - any kernel's refusal, reported with the node
            raise ModelError(
                f"cannot tell what dtype {node.describe()} evaluates to, from children of dtypes "
                f"{[str(d) for d in children]}: {type(error).__name__}: {error}"
            ) from None
