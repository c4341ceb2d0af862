"""The op table: aten op name -> the function that writes it as circuit nodes.

A translator is called as ``translate(ctx, *args, **kwargs)`` with the op's
arguments, in which every tensor is a circuit node or a ``Const`` (a value
known at import time); it returns the node (a tuple of them for an op with
several outputs), or ``UNTRANSLATED`` when this call has no exact
translation, so that the op is kept as an aten GeneralFunction.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch


@attrs.frozen(eq=False)
class Const:
    """A tensor known at import time, and the name it gets if it becomes a node."""

    tensor: torch.Tensor
    name: str


#: What a translator returns when it cannot write this call exactly.
UNTRANSLATED = object()

#: aten op packet name (``addmm``) -> translator.
OPS: dict[str, Callable[..., Any]] = {}


def translates(*names: str) -> Callable:
    """Register the decorated function as the translator of the aten ops ``names``."""

    def register(function: Callable) -> Callable:
        for name in names:
            if name in OPS:
                raise RuntimeError(f"two translators for aten.{name}")
            OPS[name] = function
        return function

    return register
