"""Planning: ``compile_plan`` turns circuits into a ``Plan``, one step per distinct computed node.

The schedule is an iterative post-order over distinct nodes (equal
structure, names included, is one node), so a shared subtree is computed
once per call; nothing recurses.  Each step is ``(kernel, argument slots,
output slot)`` over a flat list of value slots, and each value is released
right after its last consumer (roots are kept), so peak memory is the live
set of the schedule.  See docs/evaluation.md.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping

import torch

from circuits.errors import (
    EvaluationError,
    RandomVariableEvaluationError,
    StaleTensorError,
    StaleTensorEvaluationError,
)
from circuits.evaluation.kernels import KERNEL_MAKERS, kernel_maker
from circuits.evaluation.leaves import Call, check_options, finish_leaves, leaf_handler
from circuits.evaluation.plan import Plan, Steps
from circuits.core.nodes import Circuit, check_node
from circuits.core.shapes import format_shape, shape_or_type

__all__ = ["KnownValue", "compile_plan"]

#: ``kernel(node, default) -> kernel``: the function to run for ``node`` (``default`` is the library's).
KernelOverride = Callable[[Circuit, Callable], Callable]


class KnownValue:
    """A value known before the run, and the floating dtype it counts as for the Scalars' dtype.

    A known value stands for its node's whole subtree, which the schedule
    does not visit.  A plain tensor counts as its own dtype; a cache that
    knows which Arrays lay below the value says so with ``float_dtype``
    (None: no floating Array below), so Scalars take the dtype they would
    take if the subtree were computed.
    """

    __slots__ = ("float_dtype", "value")

    def __init__(self, value: torch.Tensor, float_dtype: torch.dtype | None):
        self.value = value
        self.float_dtype = float_dtype


Known = Callable[[Circuit], "torch.Tensor | KnownValue | None"]


def compile_plan(
    roots: Iterable[Circuit],
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
    *,
    known: Mapping[Circuit, torch.Tensor] | Known | None = None,
    kernel: KernelOverride | None = None,
) -> Plan:
    """The schedule computing ``roots``; ``plan.run(on_value=...)`` runs it.

    ``inputs``, ``device`` and ``dtype`` are ``evaluate``'s.  ``known`` gives
    values known before the run (torch.fx's ``initial_env``): a mapping from
    nodes to tensors, or a function called on each node the walk enters,
    returning a tensor, a ``KnownValue`` or None.  A known node is a leaf of
    the schedule: nothing below it is visited.  Known values are used as
    given (on the computation's device, in the dtype wanted).  ``kernel``
    overrides the function run for each step: ``kernel(node, default)``
    returns the function to call instead of ``default``.
    """
    roots = list(roots)
    for position, root in enumerate(roots):
        check_node(root, f"evaluate: root {position}")
    device = check_options(inputs, device, dtype)
    if kernel is not None and not callable(kernel):
        raise EvaluationError(
            f"evaluate: kernel must be a function (node, default) -> kernel, got {kernel!r}"
        )
    call = Call(device, dtype, inputs, kernel)
    walk = _Walk(roots, call, _known_lookup(known), kernel)
    values: list[Any] = [None] * len(walk.order)
    for slot, value in walk.leaf_values.items():
        values[slot] = value
    scalar_dtype = finish_leaves(call, walk.order, values, walk.steps)
    root_slots = [walk.slot_of[root.hash] for root in roots]
    releases, more_releases = _releases(walk.last_use, root_slots, walk.steps)
    return Plan(
        walk.order, values, walk.steps, releases, more_releases, root_slots, scalar_dtype, walk.computed
    )


def _known_lookup(known) -> Known | None:
    if known is None or callable(known):
        return known
    if not isinstance(known, Mapping):
        raise EvaluationError(
            f"evaluate: known must be a mapping from nodes to tensors or a function, got {type(known).__name__}"
        )
    by_hash = {}
    for node, value in known.items():
        if not isinstance(node, Circuit):
            raise EvaluationError(
                f"evaluate: known values are keyed by circuit nodes, got {type(node).__name__}"
            )
        by_hash[node.hash] = value
    return lambda node: by_hash.get(node.hash)


class _Walk:
    """One pass over the roots: slots, known values, leaves and steps, children before parents."""

    __slots__ = ("computed", "last_use", "leaf_values", "order", "slot_of", "steps")

    def __init__(self, roots: list[Circuit], call: Call, known: Known | None, kernel: KernelOverride | None):
        self.slot_of: dict[bytes, int] = {}
        self.order: list[Circuit] = []  # slot -> node
        self.leaf_values: dict[int, Any] = {}
        self.last_use: dict[int, int] = {}  # slot -> position of the last step that consumes it
        self.steps = Steps()
        self.computed = 0
        self._run(roots, call, known, kernel)

    def _run(self, roots, call, known, kernel) -> None:
        # Descend into the first child without a slot; when every child has
        # one, the node becomes a step and the walk returns to its parent.  A
        # node is only entered from a parent that found it missing, so no
        # visit needs an "already done?" check.
        slot_of, last_use, steps = self.slot_of, self.last_use, self.steps
        add_fn, add_out, add_first, add_second = (
            steps.fns.append,
            steps.outs.append,
            steps.firsts.append,
            steps.seconds.append,
        )
        makers, lookup, add_node = KERNEL_MAKERS, slot_of.get, self.order.append
        path: list[Circuit] = []  # the nodes whose children are being computed, innermost last
        descend, ascend = path.append, path.pop
        slot = position = computed = 0  # the next node's slot, the next step's position
        for node in roots:
            if node.hash in slot_of:
                continue
            fresh = True  # entered from above (known is asked once per node), not back from a child
            while True:
                if (
                    known is not None
                    and fresh
                    and _take_known(known, node, slot, call, self.leaf_values, path)
                ):
                    pass
                elif count := len(children := node.children):
                    first = lookup(children[0].hash)
                    if first is None:
                        descend(node)
                        node, fresh = children[0], True
                        continue
                    if count == 1:
                        last_use[first] = position
                        add_first(first)
                        add_second(-1)
                    elif count == 2:
                        second = lookup(children[1].hash)
                        if second is None:
                            descend(node)
                            node, fresh = children[1], True
                            continue
                        last_use[first] = last_use[second] = position
                        add_first(first)
                        add_second(second)
                    else:
                        missing = _many_arguments(node, children, lookup, last_use, position, steps, slot)
                        if missing is not None:
                            descend(node)
                            node, fresh = missing, True
                            continue
                    try:
                        fn = (makers.get(type(node)) or kernel_maker(type(node)))(node)
                    except StaleTensorError as error:
                        raise StaleTensorEvaluationError(
                            f"cannot evaluate: {error}", node=node, path=(*path, node)
                        ) from error
                    except RandomVariableEvaluationError as error:
                        raise RandomVariableEvaluationError(
                            str(error), node=node, path=(*path, node)
                        ) from None
                    add_fn(fn if kernel is None else _overridden(kernel, node, fn, path))
                    add_out(slot)
                    position += 1
                    computed += 1
                else:
                    leaf_handler(type(node))(node, slot, call, self.leaf_values, steps)
                    position = len(steps.fns)  # a leaf that is converted (moved or cast) is a step too
                slot_of[node.hash] = slot
                add_node(node)
                slot += 1
                if not path:
                    break
                node, fresh = ascend(), False  # back to a parent: known was asked about it already
        self.computed = computed


def _many_arguments(node, children, lookup, last_use, position, steps: Steps, slot) -> Circuit | None:
    """A step of 3+ arguments: its argument slots recorded, or the first child without a slot."""
    args = []
    for child in children:
        arg = lookup(child.hash)
        if arg is None:
            return child
        args.append(arg)
    for arg in args:
        last_use[arg] = position
    steps.firsts.append(-1)
    steps.seconds.append(-1)
    steps.many[slot] = tuple(args)
    return None


def _take_known(known: Known, node: Circuit, slot: int, call: Call, leaf_values, path) -> bool:
    """Whether ``node``'s value is known; if so it is recorded as a leaf of the schedule."""
    try:
        value = known(node)
    except Exception as error:  # noqa: BLE001 - a failing hook is named with the node it was asked about
        raise EvaluationError(
            f"evaluate: known({node.describe()}) raised {type(error).__name__}: {error}",
            node=node,
            path=(*path, node),
        ) from error
    if value is None:
        return False
    if type(value) is KnownValue:
        tensor = value.value
        if value.float_dtype is not None:
            call.float_dtypes.add(value.float_dtype)
        if call.first_device is None and isinstance(tensor, torch.Tensor):
            call.first_device = tensor.device
    else:
        tensor = value
        if isinstance(tensor, torch.Tensor):
            call.saw(tensor)
    if not isinstance(tensor, torch.Tensor) or tensor.shape != node.shape:
        raise EvaluationError(
            f"evaluate: the known value of {node.describe()} {format_shape(node.shape)} is {shape_or_type(tensor)}, "
            "not a tensor of the node's shape",
            node=node,
            path=(*path, node),
        )
    leaf_values[slot] = tensor
    return True


def _overridden(kernel: KernelOverride, node: Circuit, default: Callable, path) -> Callable:
    try:
        fn = kernel(node, default)
    except Exception as error:  # noqa: BLE001 - a failing hook is named with the node it was asked about
        raise EvaluationError(
            f"evaluate: kernel({node.describe()}) raised {type(error).__name__}: {error}",
            node=node,
            path=(*path, node),
        ) from error
    if not callable(fn):
        raise EvaluationError(
            f"evaluate: kernel({node.describe()}, default) returned {type(fn).__name__}, not a function",
            node=node,
            path=(*path, node),
        )
    return fn


def _releases(last_use: dict[int, int], root_slots: list[int], steps: Steps):
    """Per step, the slot to drop after it (-1 none, -2 several, listed by out slot); roots are kept."""
    for slot in root_slots:
        last_use.pop(slot, None)
    releases = [-1] * len(steps.fns)
    more_releases: dict[int, list[int]] = {}
    outs = steps.outs
    for slot, position in last_use.items():
        release = releases[position]
        if release == -1:
            releases[position] = slot
        elif release >= 0:
            releases[position] = -2
            more_releases[outs[position]] = [release, slot]
        else:
            more_releases[outs[position]].append(slot)
    return releases, more_releases
