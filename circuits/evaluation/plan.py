"""A compiled schedule (``Plan``) and the one loop that runs it."""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from circuits.errors import EvaluationError
from circuits.core.nodes import Add, Circuit, Einsum, GeneralFunction, Scalar
from circuits.core.shapes import format_shape

__all__ = ["Plan", "Steps", "error_at"]

#: ``on_value(node, value)``: called with every value a run computes.
OnValue = Callable[[Circuit, torch.Tensor], None]


class Steps:
    """The schedule as parallel lists of plain ints, not an object per step (fewer objects to build and free).

    A step with one or two arguments has them in ``firsts``/``seconds`` (-1
    when absent); any other arity (0 or 3+) keeps its argument tuple in
    ``many[out]``.
    """

    __slots__ = ("firsts", "fns", "many", "outs", "seconds")

    def __init__(self):
        self.fns: list[Callable] = []
        self.firsts: list[int] = []
        self.seconds: list[int] = []
        self.outs: list[int] = []
        self.many: dict[int, tuple[int, ...]] = {}  # out slot -> args, for arities 0 and 3+

    def add(self, fn: Callable, args: tuple[int, ...], out: int) -> None:
        self.fns.append(fn)
        self.outs.append(out)
        if 1 <= len(args) <= 2:
            self.firsts.append(args[0])
            self.seconds.append(args[1] if len(args) == 2 else -1)
        else:
            self.firsts.append(-1)
            self.seconds.append(-1)
            self.many[out] = tuple(args)

    def args(self, position: int) -> tuple[int, ...]:
        first, second = self.firsts[position], self.seconds[position]
        if first < 0:
            return self.many[self.outs[position]]
        return (first, second) if second >= 0 else (first,)


class Plan:
    """A schedule ready to run: leaf and known values pre-filled, then one step per computed value.

    Made by ``compile_plan``.  ``nodes`` lists every node of the schedule
    (leaves, known values and computed nodes, children before parents);
    ``computed`` counts the nodes with children that the run computes;
    ``scalar_dtype`` is the dtype Scalars take (or would take) in this call.
    A plan runs once: its values are released as it goes.
    """

    __slots__ = (
        "_more_releases",
        "_releases",
        "_root_slots",
        "_steps",
        "_values",
        "computed",
        "nodes",
        "scalar_dtype",
    )

    def __init__(
        self, nodes, values, steps: Steps, releases, more_releases, root_slots, scalar_dtype, computed
    ):
        self.nodes: list[Circuit] = nodes  # slot -> node
        self.scalar_dtype: torch.dtype = scalar_dtype
        self.computed: int = computed
        self._values = values  # slot -> tensor (leaves, known values) or None (computed)
        self._steps = steps
        self._releases = releases  # per step: the one slot to drop after it, -1 none, -2 several
        self._more_releases = more_releases  # out slot -> slots to drop, where several
        self._root_slots = root_slots

    def initial_values(self) -> Iterator[tuple[Circuit, torch.Tensor]]:
        """``(node, value)`` for every value known before the run: leaves and known values."""
        values = self._values
        if values is None:
            raise EvaluationError("this plan has run already: a plan runs once (compile another)")
        for slot, node in enumerate(self.nodes):
            if values[slot] is not None:
                yield node, values[slot]

    def run(self, on_value: OnValue | None = None) -> list[torch.Tensor]:
        """The roots' values; ``on_value(node, value)``, if given, sees each value as it is computed.

        That includes Arrays converted to the call's device or dtype.  An
        exception raised by ``on_value`` propagates as it is; one raised by a
        step becomes an ``EvaluationError`` naming the node and its path.
        """
        values = self._values
        if values is None:
            raise EvaluationError("this plan has run already: a plan runs once (compile another)")
        self._values = None
        steps, nodes = self._steps, self.nodes
        many, more_releases = steps.many, self._more_releases
        notify = on_value is not None
        in_callback = False
        out = -1
        try:
            for fn, first, second, out, release in zip(
                steps.fns, steps.firsts, steps.seconds, steps.outs, self._releases
            ):
                # unrolled for the common arities: this loop is the per-node cost of running
                if second >= 0:
                    values[out] = fn(values[first], values[second])
                elif first >= 0:
                    values[out] = fn(values[first])
                else:
                    values[out] = fn(*[values[arg] for arg in many[out]])
                if notify:
                    in_callback = True
                    on_value(nodes[out], values[out])
                    in_callback = False
                if release >= 0:
                    values[release] = None
                elif release == -2:
                    for slot in more_releases[out]:
                        values[slot] = None
        except Exception as error:  # noqa: BLE001 - every failing step is reported with its node
            if in_callback:
                raise
            node = nodes[out]
            raise error_at(node, out, nodes, steps, failure_text(node, error)) from error
        return [self._root_value(slot, values[slot]) for slot in self._root_slots]

    def _root_value(self, slot: int, value: torch.Tensor) -> torch.Tensor:
        node = self.nodes[slot]
        if node.children or not isinstance(node, (Scalar, Add, Einsum)):
            return value
        try:  # constants run as stride-0 views of one shared 0-d tensor; a root gets its own memory
            return value.clone(memory_format=torch.contiguous_format)
        except RuntimeError as error:  # too big to hold
            raise error_at(node, slot, self.nodes, self._steps, failure_text(node, error)) from error


def failure_text(node: Circuit, error: Exception) -> str:
    what = node.describe()
    if isinstance(node, GeneralFunction):
        what += f" (function {node.spec.name})"
    child_shapes = ", ".join(format_shape(c.shape) for c in node.children)
    return (
        f"evaluating {what} {format_shape(node.shape)} on children of shapes [{child_shapes}] "
        f"failed: {type(error).__name__}: {error}"
    )


_PATH_HEAD, _PATH_TAIL = 4, 8


def error_at(node: Circuit, slot: int, order: list[Circuit], steps: Steps, message: str) -> EvaluationError:
    """An EvaluationError naming ``node`` and its path from a root (found iteratively)."""
    parent: dict[int, int] = {}  # slot -> the slot of its first consumer
    for position, out in enumerate(steps.outs):
        for arg in steps.args(position):
            parent.setdefault(arg, out)
    chain = [slot]
    seen = {slot}
    while chain[-1] in parent and parent[chain[-1]] not in seen:
        chain.append(parent[chain[-1]])
        seen.add(chain[-1])
    path = [order[s] for s in reversed(chain)]
    described = [n.describe() for n in path]
    if len(described) > _PATH_HEAD + _PATH_TAIL + 1:
        skipped = len(described) - _PATH_HEAD - _PATH_TAIL
        described = described[:_PATH_HEAD] + [f"... ({skipped} more) ..."] + described[-_PATH_TAIL:]
    text = f"{message}\n  at {node.describe()}, path from the root: {' > '.join(described)}"
    return EvaluationError(text, node=node, path=tuple(path))
