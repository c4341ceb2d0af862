"""Torch evaluation of circuits: a schedule is planned once, then run by one loop.

- ``evaluate``/``evaluate_many``: the value(s) of circuits; shared subtrees
  are computed once, values are released after their last consumer.
- ``compile_plan`` and ``Plan.run`` are the seams analyses build on: values
  known before the run (``known=``, torch.fx's ``initial_env``), a callback
  per computed value (``run(on_value=...)``), and a per-node kernel override
  (``kernel=``).  ``circuits.evaluation.cache.Evaluator`` is built on these alone.

Errors raised while planning or running (an unbound or mis-shaped Symbol,
an Array without its tensor, a device mismatch, any exception from a torch
op or a function spec) become ``EvaluationError`` naming the node at fault
and its path from a root.  Autograd is untouched: gradients flow back to
the tensors inside Arrays and to bound inputs, and a result may share
storage with an Array's tensor.  The design is in docs/evaluation.md.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

import torch

from circuits.evaluation.kernels import default_kernel
from circuits.evaluation.plan import Plan
from circuits.evaluation.schedule import KnownValue, compile_plan
from circuits.core.nodes import Circuit

__all__ = ["KnownValue", "Plan", "compile_plan", "default_kernel", "evaluate", "evaluate_many"]


def evaluate(
    circuit: Circuit,
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The value of ``circuit`` as a torch.Tensor.

    ``inputs`` binds Symbols to tensors, keyed by the Symbol node or by its
    name.  ``device`` and ``dtype`` (a floating dtype) apply to the whole
    computation: Arrays are moved or cast once, integer tensors (token ids)
    keep their dtype, and with no ``dtype`` Scalars take the promoted
    floating dtype of the Arrays and inputs.
    """
    return compile_plan([circuit], inputs, device, dtype).run()[0]


def evaluate_many(
    circuits: Iterable[Circuit],
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """The values of several circuits, computing their common subtrees once."""
    return compile_plan(circuits, inputs, device, dtype).run()
