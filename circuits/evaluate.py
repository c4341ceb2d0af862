"""Torch evaluation of circuits.

``evaluate(c)`` compiles the circuit into a flat schedule and runs it:

- The schedule is an iterative post-order over *distinct* nodes (equal
  structure, names included, is one node), so a shared subtree is computed
  once per call, however many parents or roots use it.  Nothing recurses,
  so a circuit may be any depth.
- Compilation turns every computed node into one step ``(fn, argument
  slots, output slot)``, with ``fn`` chosen once per node (a dict lookup by
  node type, not an isinstance chain) and the values held in a flat list of
  slots.  Each step also lists the slots whose last consumer it is; those
  are dropped right after it runs, so peak memory is the live set of the
  schedule, not the sum over all nodes.  Roots are kept.
- ``device`` and ``dtype`` apply to the whole computation: an Array that
  needs moving or casting is converted once, as a step of its own placed
  where the post-order first reaches it (and released after its last
  consumer), not all up front; integer tensors (token ids, indices) keep
  their dtype.  Bound inputs must already be on the computation's device.
  With no ``dtype``, Scalars take the promoted floating dtype of the Arrays
  and inputs (the default dtype if there are none), so a float64 circuit
  stays float64.
- Errors raised while compiling or running (an unbound or mis-shaped
  Symbol, an Array without its tensor, a device mismatch, an out-of-range
  ``gen_index..._c`` index, any exception from a torch op or a function
  spec) become ``EvaluationError`` naming the node at fault and its path
  from a root.

Autograd is untouched: tensors are used as given, so gradients flow back to
the tensors inside Arrays and to bound inputs.  Like torch indexing, a
result may share storage with an Array's tensor (``evaluate`` of an Array
returns that tensor; an Index of one is a view of it).

``circuits.cache.Evaluator`` runs this same schedule with a cache: its walk
asks a probe for each node's cached value (a hit becomes a pre-filled leaf,
not descended into), and its run hands each computed value to the cache.
Plain ``evaluate`` passes neither, and pays one ``is None`` test per node.
"""

from __future__ import annotations

import functools
import struct
from typing import Any, Callable, Iterable, Mapping

import einops
import torch

from circuits.errors import (
    EvaluationError,
    MissingTensorError,
    MissingTensorEvaluationError,
    NodeTypeError,
    StaleTensorError,
    StaleTensorEvaluationError,
)
from circuits.functions import FunctionSpec, is_library_function
from circuits.nodes import (
    Add,
    Array,
    Circuit,
    Concat,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    Scalar,
    Symbol,
)
from circuits.spec import format_shape

__all__ = ["evaluate", "evaluate_many", "MissingTensorEvaluationError", "StaleTensorEvaluationError"]


Inputs = Mapping["Circuit | str", Any]


def evaluate(
    circuit: Circuit,
    inputs: Inputs | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The value of ``circuit`` as a torch.Tensor.

    ``inputs`` binds Symbols to tensors, keyed by the Symbol node or by its
    name.  ``device`` and ``dtype`` (a floating dtype) apply to the whole
    computation; see the module docstring.
    """
    return evaluate_many([circuit], inputs=inputs, device=device, dtype=dtype)[0]


def evaluate_many(
    circuits: Iterable[Circuit],
    inputs: Inputs | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> list[torch.Tensor]:
    """The values of several circuits, computing their common subtrees once."""
    roots = list(circuits)
    for position, root in enumerate(roots):
        if not isinstance(root, Circuit):
            raise NodeTypeError(f"evaluate: root {position} is a {type(root).__name__}, not a circuit node")
    plan = _compile(roots, inputs, device, dtype)
    return plan.run()


# --------------------------------------------------------------------- plan


class _Plan:
    """A compiled schedule: leaf values pre-filled, then one step per computed node.

    Steps are parallel lists of plain ints rather than an object per step:
    fewer objects to build, track and free.  A step with one or two
    arguments has them in ``firsts``/``seconds`` (-1 when absent); any other
    arity (0 or 3+) keeps its argument tuple in ``many[out]``.  ``releases``
    is the one slot to drop after the step, -1 for none, or -2 for several,
    listed in ``more_releases[out]``.
    """

    __slots__ = ("order", "values", "steps", "releases", "more_releases", "root_slots", "scalar_dtype")

    def __init__(self, order, values, steps, releases, more_releases, root_slots, scalar_dtype=None):
        self.order = order  # slot -> node
        self.values = values  # slot -> tensor (leaves) or None (computed)
        self.steps = steps
        self.releases = releases
        self.more_releases = more_releases
        self.root_slots = root_slots
        self.scalar_dtype = scalar_dtype  # the dtype Scalars took (or would take) in this call

    def run(self, store: Callable[[int, torch.Tensor], None] | None = None) -> list[torch.Tensor]:
        """Run the steps; ``store(out_slot, value)``, if given, sees every computed value."""
        values = self.values
        self.values = None  # a plan runs once; its slots are released as it goes
        steps = self.steps
        many, more_releases = steps.many, self.more_releases
        out = None
        if store is not None:
            try:
                self._run_storing(values, store)
            except _StepFailure as failure:  # a failing store() is not blamed on a node: it propagates
                out, error = failure.out, failure.error
                node = self.order[out]
                raise _error_at(node, out, self.order, steps, _failure_text(node, error)) from error
        else:
            try:
                for fn, first, second, out, release in zip(
                    steps.fns, steps.firsts, steps.seconds, steps.outs, self.releases
                ):
                    # unrolled for the common arities: this loop is the per-node cost of running
                    if second >= 0:
                        values[out] = fn(values[first], values[second])
                    elif first >= 0:
                        values[out] = fn(values[first])
                    else:
                        values[out] = fn(*[values[arg] for arg in many[out]])
                    if release >= 0:
                        values[release] = None
                    elif release == -2:
                        for slot in more_releases[out]:
                            values[slot] = None
            except Exception as error:  # noqa: BLE001 - every failure is reported with its node
                node = self.order[out]
                raise _error_at(node, out, self.order, steps, _failure_text(node, error)) from error
        results = []
        for slot in self.root_slots:
            value = values[slot]
            node = self.order[slot]
            if type(node) is Scalar:  # Scalars run as stride-0 views of one shared 0-d tensor
                try:
                    value = torch.full(node.shape, node.value, dtype=value.dtype, device=value.device)
                except RuntimeError as error:  # too big to hold
                    raise _error_at(node, slot, self.order, steps, _failure_text(node, error)) from error
            results.append(value)
        return results

    def _run_storing(self, values: list, store: Callable[[int, torch.Tensor], None]) -> None:
        """The loop of ``run``, handing each computed value to ``store`` (``circuits.cache``)."""
        steps = self.steps
        many, more_releases = steps.many, self.more_releases
        out = -1
        for fn, first, second, out, release in zip(
            steps.fns, steps.firsts, steps.seconds, steps.outs, self.releases
        ):
            try:
                if second >= 0:
                    value = fn(values[first], values[second])
                elif first >= 0:
                    value = fn(values[first])
                else:
                    value = fn(*[values[arg] for arg in many[out]])
            except Exception as error:  # noqa: BLE001 - reported by run, with the node
                raise _StepFailure(out, error) from error
            values[out] = value
            store(out, value)
            if release >= 0:
                values[release] = None
            elif release == -2:
                for slot in more_releases[out]:
                    values[slot] = None


class _StepFailure(Exception):
    """A step of a storing run failed (so that a failing ``store`` is not blamed on the node)."""

    def __init__(self, out: int, error: Exception):
        super().__init__(out, error)
        self.out = out
        self.error = error


def _failure_text(node: Circuit, error: Exception) -> str:
    what = node.describe()
    if isinstance(node, GeneralFunction):
        what += f" (function {node.spec.name})"
    child_shapes = ", ".join(format_shape(c.shape) for c in node.children)
    return (
        f"evaluating {what} {format_shape(node.shape)} on children of shapes [{child_shapes}] "
        f"failed: {type(error).__name__}: {error}"
    )


# ------------------------------------------------------------- compilation


class _Context:
    """What leaf handling needs to know about the call."""

    __slots__ = (
        "device",
        "dtype",
        "by_hash",
        "by_name",
        "used_keys",
        "float_dtypes",
        "first_device",
        "scalar_slots",
        "symbol_slots",
        "missing",
        "stale",
    )

    def __init__(self, device, dtype, inputs):
        self.device = device
        self.dtype = dtype
        self.by_hash: dict[bytes, tuple[Any, Any]] = {}
        self.by_name: dict[str, tuple[Any, Any]] = {}
        self.used_keys: set[int] = set()
        self.float_dtypes: set[torch.dtype] = set()
        self.first_device: torch.device | None = None  # of the first Array seen
        self.scalar_slots: list[int] = []
        self.symbol_slots: list[int] = []
        self.missing: list[int] = []
        self.stale: list[int] = []
        for key, value in (inputs or {}).items():
            if isinstance(key, str):
                self.by_name[key] = (key, value)
            elif isinstance(key, Symbol):
                self.by_hash[key.hash] = (key, value)
            elif isinstance(key, Circuit):
                raise EvaluationError(
                    f"inputs binds Symbols, but key {key.describe()} {format_shape(key.shape)} is a "
                    f"{key.kind}; bind a Symbol (by node or by name)"
                )
            else:
                raise EvaluationError(
                    f"inputs keys are Symbol nodes or names (str), got {type(key).__name__} {key!r}"
                )


def _compile(roots, inputs, device, dtype, probe=None) -> _Plan:
    """The schedule for ``roots``.

    ``probe`` (used by ``circuits.cache.Evaluator``) is called on every node
    the walk enters (a node not yet in the schedule): it returns a value
    already known for the node, which then becomes a pre-filled leaf and is
    not descended into, or None.  It also has ``float_dtypes`` (the floating
    dtypes of Arrays below the known values, which count for the Scalars'
    dtype as if the walk had reached them) and ``first_device``.
    """
    if device is not None:
        try:
            device = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise EvaluationError(f"evaluate: device {device!r} is not a torch device ({error})") from None
    if dtype is not None and not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise EvaluationError(
            f"evaluate: dtype {dtype!r} is not a floating torch dtype (it casts floating tensors only; "
            "integer tensors such as token ids keep their dtype)"
        )
    if inputs is not None and not isinstance(inputs, Mapping):
        raise EvaluationError(f"evaluate: inputs must be a mapping, got {type(inputs).__name__}")
    ctx = _Context(device, dtype, inputs)

    # One pass: an iterative post-order over distinct nodes that assigns each
    # node a slot and turns it into a step as soon as its children have slots.
    # (Unrolled for one and two children, the common cases: this loop is
    # most of the per-node cost of a call.)
    slot_of: dict[bytes, int] = {}
    order: list[Circuit] = []
    leaf_values: dict[int, Any] = {}
    last_use: dict[int, int] = {}  # slot -> position of the last step that consumes it
    steps = _Steps()
    fns, many = steps.fns, steps.many
    add_fn, add_out = fns.append, steps.outs.append
    add_first, add_second = steps.firsts.append, steps.seconds.append
    step_fns = _STEP_FNS
    path: list[Circuit] = []  # the nodes whose children are being computed, innermost last
    descend, ascend = path.append, path.pop
    lookup = slot_of.get
    add_node = order.append
    slot = position = 0  # the next node's slot, the next step's position
    for root in roots:
        if root.hash in slot_of:
            continue
        node = root
        while True:
            if probe is not None:
                known = probe(node)
                if known is not None:  # a value known already (cached): a leaf of this schedule
                    leaf_values[slot] = known
                    slot_of[node.hash] = slot
                    add_node(node)
                    slot += 1
                    if not path:
                        break
                    node = ascend()
                    continue
            # Descend into the first child without a slot; when every child
            # has one, the node becomes a step and we return to its parent.
            # A node is only ever entered from a parent that found it
            # missing, so no visit needs a separate "already done?" check.
            children = node.children
            count = len(children)
            if count == 2:
                first = lookup(children[0].hash)
                if first is None:
                    descend(node)
                    node = children[0]
                    continue
                second = lookup(children[1].hash)
                if second is None:
                    descend(node)
                    node = children[1]
                    continue
                last_use[first] = last_use[second] = position
                add_first(first)
                add_second(second)
            elif count == 1:
                first = lookup(children[0].hash)
                if first is None:
                    descend(node)
                    node = children[0]
                    continue
                last_use[first] = position
                add_first(first)
                add_second(-1)
            elif count:
                args = []
                for child in children:
                    arg = lookup(child.hash)
                    if arg is None:
                        descend(node)
                        node = child
                        break
                    args.append(arg)
                else:
                    for arg in args:
                        last_use[arg] = position
                    add_first(-1)
                    add_second(-1)
                    many[slot] = tuple(args)
                if arg is None:
                    continue
            if count:
                kind = type(node)
                try:
                    maker = step_fns[kind]
                except KeyError:
                    maker = _maker_for(kind)
                try:
                    add_fn(maker(node))
                except StaleTensorError as error:
                    raise StaleTensorEvaluationError(
                        f"cannot evaluate: {error}", node=node, path=(*path, node)
                    ) from error
                add_out(slot)
                position += 1
            else:
                _LEAF_HANDLERS.get(type(node), _leaf_without_children)(node, slot, ctx, leaf_values, steps)
                position = len(fns)  # a leaf that is converted (moved or cast) is a step too
            slot_of[node.hash] = slot
            add_node(node)
            slot += 1
            if not path:
                break
            node = ascend()

    root_slots = [slot_of[root.hash] for root in roots]
    _check_arrays(ctx, order, steps)
    values: list[Any] = [None] * len(order)
    for slot, value in leaf_values.items():
        values[slot] = value
    if probe is not None:
        ctx.float_dtypes.update(probe.float_dtypes)
        if ctx.first_device is None:
            ctx.first_device = probe.first_device
    scalar_dtype = _finish_leaves(ctx, order, values, steps)

    # Release every value right after its last consumer; roots are kept.
    for slot in root_slots:
        last_use.pop(slot, None)
    releases = [-1] * len(fns)
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
    return _Plan(order, values, steps, releases, more_releases, root_slots, scalar_dtype)


def _check_arrays(ctx: _Context, order, steps) -> None:
    """Refuse Arrays without a tensor, or whose tensor was edited in place since they were made."""
    for slots, kind in ((ctx.missing, MissingTensorEvaluationError), (ctx.stale, StaleTensorEvaluationError)):
        if not slots:
            continue
        slot = slots[0]
        node = order[slot]
        try:
            node.tensor()
        except (MissingTensorError, StaleTensorError) as error:
            found = _error_at(node, slot, order, steps, f"cannot evaluate: {error}")
            raise kind(str(found), node=found.node, path=found.path) from error


class _Steps:
    """The schedule, as parallel lists (see ``_Plan``)."""

    __slots__ = ("fns", "firsts", "seconds", "outs", "many")

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


# ---------------------------------------------------------------- leaves


def _array_leaf(node: Array, slot, ctx: _Context, values, steps):
    tensor = node.value
    if tensor is None:
        ctx.missing.append(slot)
        return
    if tensor._version != node.tensor_version or tensor.requires_grad != node.tensor_requires_grad:
        ctx.stale.append(slot)
        return
    target_dtype = ctx.dtype if ctx.dtype is not None and tensor.is_floating_point() else None
    moves = ctx.device is not None and not _same_device(tensor.device, ctx.device)
    if (target_dtype is not None and target_dtype != tensor.dtype) or moves:
        # converted once, as a step just before its first consumer
        steps.add(functools.partial(tensor.to, device=ctx.device, dtype=target_dtype), (), slot)
        if tensor.is_floating_point():
            ctx.float_dtypes.add(target_dtype or tensor.dtype)
        return
    if tensor.is_floating_point():
        ctx.float_dtypes.add(tensor.dtype)
    if ctx.first_device is None:
        ctx.first_device = tensor.device
    values[slot] = tensor


def _scalar_leaf(node: Scalar, slot, ctx: _Context, values, steps):
    ctx.scalar_slots.append(slot)


def _symbol_leaf(node: Symbol, slot, ctx: _Context, values, steps):
    ctx.symbol_slots.append(slot)
    by_name = ctx.by_name.get(node.name) if node.name is not None else None
    if by_name is not None:
        ctx.used_keys.add(id(by_name[0]))
    bound = ctx.by_hash.get(node.hash) or by_name  # a binding by node wins over one by name
    if bound is None:
        return
    key, value = bound
    ctx.used_keys.add(id(key))
    if not isinstance(value, torch.Tensor):
        try:
            value = torch.as_tensor(value)
        except Exception as error:  # noqa: BLE001 - reported by _finish_leaves, with the node
            values[slot] = error
            return
    if value.is_floating_point():
        if ctx.dtype is not None and value.dtype != ctx.dtype:
            value = value.to(ctx.dtype)
        ctx.float_dtypes.add(value.dtype)
    values[slot] = value


def _leaf_without_children(node: Circuit, slot, ctx: _Context, values, steps):
    """Add() with no operands, subclasses of the leaf classes, and unknown leaf types."""
    kind = type(node)
    for base in kind.__mro__[1:]:
        if base in _LEAF_HANDLERS:
            return _LEAF_HANDLERS[base](node, slot, ctx, values, steps)
    maker = _STEP_FNS.get(kind) or _maker_for(kind)
    steps.add(maker(node), (), slot)


_LEAF_HANDLERS: dict[type, Callable] = {Array: _array_leaf, Scalar: _scalar_leaf, Symbol: _symbol_leaf}


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


def _finish_leaves(ctx: _Context, order, values, steps) -> torch.dtype:
    """Scalars and bound Symbols, once the call's device and dtype are known.

    Returns the dtype Scalars take in this call (whether or not it has any).
    """
    device = ctx.device if ctx.device is not None else ctx.first_device
    # Symbols: bound, the right shape, on the computation's device.
    for slot in ctx.symbol_slots:
        node = order[slot]
        value = values[slot]
        if value is None:
            raise _error_at(
                node,
                slot,
                order,
                steps,
                f"{node.describe()} {format_shape(node.shape)} is not bound: pass "
                f"inputs={{{node.name!r}: tensor}} (or the Symbol node as the key)"
                if node.name is not None
                else f"{node.describe()} {format_shape(node.shape)} is not bound: pass "
                "inputs={symbol_node: tensor}",
            )
        if isinstance(value, Exception):
            raise _error_at(
                node, slot, order, steps, f"{node.describe()}: bound value is not a tensor ({value})"
            )
        if tuple(value.shape) != node.shape:
            raise _error_at(
                node,
                slot,
                order,
                steps,
                f"{node.describe()} has shape {format_shape(node.shape)} but the tensor bound to it has "
                f"shape {format_shape(value.shape)}",
            )
        if device is None:
            device = value.device
        elif not _same_device(value.device, device):
            source = "the device= option" if ctx.device is not None else "the circuit's Arrays"
            raise _error_at(
                node,
                slot,
                order,
                steps,
                f"{node.describe()} is bound to a tensor on device {value.device}, but the computation "
                f"runs on {device} ({source}); move the input with .to({str(device)!r})",
            )
    bindings = list(ctx.by_hash.values()) + list(ctx.by_name.values())
    unused = [key for key, _ in bindings if id(key) not in ctx.used_keys]
    if unused:
        symbols = sorted({order[s].describe() + " " + format_shape(order[s].shape) for s in ctx.symbol_slots})
        names = [k.describe() if isinstance(k, Circuit) else repr(k) for k in unused]
        raise EvaluationError(
            f"inputs binds {', '.join(names)}, which matches no Symbol in the circuit; its Symbols are: "
            f"{', '.join(symbols) if symbols else 'none'}"
        )
    # Scalars: full tensors of their shape, as an expanded 0-d tensor (no
    # memory per element), in the promoted floating dtype of the call.
    dtype = ctx.dtype
    if dtype is None:
        dtype = functools.reduce(torch.promote_types, ctx.float_dtypes) if ctx.float_dtypes else None
    if dtype is None:
        dtype = torch.get_default_dtype()
    if ctx.scalar_slots:
        made: dict[bytes, torch.Tensor] = {}  # by the value's bits: -0.0 and 0.0 are different Scalars
        for slot in ctx.scalar_slots:
            node = order[slot]
            bits = struct.pack("<d", node.value)
            base = made.get(bits)
            if base is None:
                base = made[bits] = torch.tensor(node.value, dtype=dtype, device=device)
            try:
                values[slot] = base.expand(node.shape)
            except RuntimeError as error:
                raise _error_at(
                    node,
                    slot,
                    order,
                    steps,
                    f"{node.describe()} of shape {format_shape(node.shape)} cannot be made: {error}",
                ) from error
    return dtype


# ----------------------------------------------------------------- steps


@functools.lru_cache(maxsize=4096)
def _einsum_fn(equation: str) -> Callable:
    """The function computing an einsum, planned once per equation.

    ``torch.einsum`` turns every pairwise contraction into a batched matrix
    product, which is slow in two common shapes: a product of operands that
    only scale the result (a Scalar, a mask, a layer norm's ``1/d``), and a
    "batched dot" whose operands have the same letters (a layer norm's
    variance ``bih,bih->bi``, 7x slower than ``(x*x).sum(-1)``).  So:

    - with three or more operands, those whose (distinct) letters all
      appear in the output are *multipliers*: the others are contracted by
      ``torch.einsum`` and the multipliers applied after, broadcast;
    - two operands with the same distinct letters (at least one summed) are
      multiplied and summed.

    Everything else is ``torch.einsum`` as written.  The values agree with
    ``torch.einsum`` up to float rounding (products are associated
    differently).  Operands of different dtypes go to ``torch.einsum`` too,
    which refuses them as before.
    """
    inputs, out = equation.split("->")
    operands = inputs.split(",")
    if any(len(set(op)) != len(op) for op in operands) or len(set(out)) != len(out):
        return functools.partial(torch.einsum, equation)  # diagonals: leave to torch
    plain = functools.partial(torch.einsum, equation)
    if len(operands) >= 3:
        out_letters = set(out)
        multipliers = [i for i, op in enumerate(operands) if set(op) <= out_letters]
        core = [i for i in range(len(operands)) if i not in multipliers]
        if not multipliers:
            return plain
        if not core:  # only multipliers: the first one is the core
            core, multipliers = multipliers[:1], multipliers[1:]
        core_letters = set("".join(operands[i] for i in core))
        core_out = "".join(letter for letter in out if letter in core_letters)
        core_fn = _einsum_fn(",".join(operands[i] for i in core) + "->" + core_out)
        core_view = _aligner(core_out, out)
        views = [(i, _aligner(operands[i], out)) for i in multipliers]
        core_positions = tuple(core)

        def with_multipliers(*tensors: torch.Tensor) -> torch.Tensor:
            dtype = tensors[0].dtype
            if any(t.dtype != dtype for t in tensors):
                return plain(*tensors)
            result = core_view(core_fn(*[tensors[i] for i in core_positions]))
            for i, view in views:
                result = result * view(tensors[i])
            return result

        return with_multipliers
    if len(operands) == 2 and set(operands[0]) == set(operands[1]) and len(out) < len(operands[0]):
        first, second = operands
        order = out + "".join(letter for letter in first if letter not in out)
        permute_first = tuple(first.index(letter) for letter in order)
        permute_second = tuple(second.index(letter) for letter in order)
        summed = tuple(range(len(out), len(order)))

        def batched_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
            if a.dtype != b.dtype:
                return plain(a, b)
            return (a.permute(permute_first) * b.permute(permute_second)).sum(dim=summed)

        return batched_dot
    return plain


def _aligner(letters: str, out: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """A view of a tensor with axes ``letters`` (all in ``out``) in ``out``'s order, unit axes elsewhere."""
    ordered = sorted(letters, key=out.index)
    permutation = tuple(letters.index(letter) for letter in ordered)
    index = tuple(slice(None) if letter in letters else None for letter in out)
    identity = permutation == tuple(range(len(letters)))

    def align(tensor: torch.Tensor) -> torch.Tensor:
        return (tensor if identity else tensor.permute(permutation))[index]

    return align


def _einsum_step(node: Einsum) -> Callable:
    if not node.children:
        return functools.partial(torch.ones, ())
    return _einsum_fn(node.extra)  # extra is the einsum string, computed at construction


def _add_many(*tensors: torch.Tensor) -> torch.Tensor:
    """Left to right; into the first sum in place where that changes nothing but allocations."""
    result = tensors[0] + tensors[1]  # a fresh tensor, ours to add into
    for tensor in tensors[2:]:
        if (
            tensor.shape == result.shape
            and tensor.dtype == result.dtype
            and not (result.requires_grad or tensor.requires_grad)
        ):
            result.add_(tensor)
        else:
            result = result + tensor
    return result


def _identity(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _add_step(node: Add) -> Callable:
    count = len(node.children)
    if count == 2:
        return torch.add
    if count == 1:
        return _identity
    if count == 0:
        return functools.partial(torch.zeros, ())
    return _add_many


def _function_step(node: GeneralFunction) -> Callable:
    """The spec's function; a user's is checked against the shape its ``shape_fn`` declared.

    A user's function returning another shape would otherwise flow on, be
    broadcast, and give a wrong number that looks right.  The library's own
    functions are run as they are (their shapes are right by construction).
    """
    spec = node.spec
    if is_library_function(spec):
        return spec.function
    return _shape_checked(spec, node.shape)


@functools.lru_cache(maxsize=1024)  # one wrapper per spec and shape, not per node
def _shape_checked(spec: FunctionSpec, shape: tuple[int, ...]) -> Callable:
    function = spec.function

    def checked(*tensors: torch.Tensor) -> torch.Tensor:
        value = function(*tensors)
        if not isinstance(value, torch.Tensor) or value.shape != shape:
            got = (
                f"shape {format_shape(value.shape)}"
                if isinstance(value, torch.Tensor)
                else type(value).__name__
            )
            raise ValueError(
                f"function {spec.name!r} returned {got}, but its shape_fn declared {format_shape(shape)}"
            )
        return value

    return checked


def _index_step(node: Index) -> Callable:
    """Outer (orthogonal) indexing: each tensor index picks along its own axis."""
    items = node.index
    child_shape = node.children[0].shape
    basic = []
    selects = []  # (axis in the basic-indexed result, non-negative int64 index)
    kept_axes = 0
    for item, size in zip(items, child_shape):
        if isinstance(item, torch.Tensor):
            if item._version:  # a private copy (see spec.normalize_index): only an edit bumps it
                raise StaleTensorError(
                    f"{node.describe()}: its index tensor was modified in place after the Index was made, "
                    f"so it no longer matches the printed index {node.extra}"
                )
            basic.append(slice(None))
            selects.append((kept_axes, torch.where(item < 0, item + size, item)))
            kept_axes += 1
        elif isinstance(item, slice):
            basic.append(item)
            kept_axes += 1
        else:
            basic.append(item)
    basic_index = tuple(basic)
    trivial = all(isinstance(item, slice) and item.start is None and item.stop is None for item in basic)
    moved: dict[torch.device, list] = {}

    def index(tensor: torch.Tensor) -> torch.Tensor:
        result = tensor if trivial else tensor[basic_index]
        if selects:
            device = tensor.device
            picks = moved.get(device)
            if picks is None:
                picks = moved[device] = [(axis, idx.to(device)) for axis, idx in selects]
            for axis, idx in picks:
                result = torch.index_select(result, axis, idx)
        return result

    return index


def _rearrange_step(node: Rearrange) -> Callable:
    return functools.partial(einops.repeat, pattern=node.pattern, **dict(node.sizes))


def _concat_step(node: Concat) -> Callable:
    axis = node.axis

    def concat(*tensors: torch.Tensor) -> torch.Tensor:
        return torch.cat(tensors, dim=axis)

    return concat


_STEP_FNS: dict[type, Callable[[Any], Callable]] = {
    Einsum: _einsum_step,
    Add: _add_step,
    GeneralFunction: _function_step,
    Index: _index_step,
    Rearrange: _rearrange_step,
    Concat: _concat_step,
}


def _maker_for(kind: type) -> Callable:
    """Subclasses of the node classes evaluate as their base; anything else is an error."""
    for base in kind.__mro__[1:]:
        if base in _STEP_FNS:
            return _STEP_FNS[base]

    def unknown(node: Circuit) -> Callable:
        def fail(*_):
            raise TypeError(f"no evaluation rule for node type {kind.__name__}")

        return fail

    return unknown


# ---------------------------------------------------------------- errors

_PATH_HEAD, _PATH_TAIL = 4, 8


def _error_at(node: Circuit, slot: int, order, steps: _Steps, message: str) -> EvaluationError:
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
