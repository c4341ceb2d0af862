"""Moving an Index down through the nodes below it.

``x[...]`` over an Einsum, Add, elementwise or leading-axis function,
Rearrange, Concat or another Index is rewritten as the same operation over
indexed children, and again below those, until the Index reaches a leaf or
a node it cannot pass.  The value is unchanged; the work shrinks to what the
index selects (the loss at one position no longer computes every
position's logits).  ``split_heads`` is built on it.

Naming: the operation an Index passes through keeps its own name (or takes
the Index's name, if the Index had one); an Index that comes to rest over a
leaf is named by ``leaf_name(index_node)`` when given.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import attrs

from circuits.core.functions import GEN_INDEX_NAME, gen_index_layout, gen_index_spec
from circuits.rewriting.matching import Matcher
from circuits.core.nodes import (
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

LeafNamer = Callable[[Index], "str | None"]
FULL = slice(None, None)


def is_full(item) -> bool:
    return isinstance(item, slice) and item.start is None and item.stop is None


@attrs.frozen
class _Plan:
    """How to finish one Index: the new Index nodes below it, and a rebuild from their results."""

    pending: tuple[Index, ...]
    build: Callable[[Sequence[Circuit]], Circuit]


def push_index(
    node: Index, leaf_name: LeafNamer | None = None, *, stop_at: Iterable[Circuit] = ()
) -> Circuit:
    """``node`` with its index moved down as far as it goes (same value).

    Iterative over depth, and memoized by structure: an Index reached along
    several paths is pushed once and its result shared.  ``stop_at``: nodes
    (compared by structure) an index stays above, as over a leaf: where the
    whole node is computed anyway, an index pushed into it would compute the
    selected part a second time.
    """
    stops = {stop.hash for stop in stop_at}
    memo: dict[bytes, Circuit] = {}
    plans: dict[bytes, _Plan] = {}
    stack: list[Index] = [node]
    while stack:
        current = stack[-1]
        key = current.hash
        if key in memo:
            stack.pop()
            continue
        plan = plans.get(key)
        if plan is None:
            stopped = current.node.hash in stops
            plan = plans[key] = _Plan((), lambda _, c=current: c) if stopped else _plan(current, leaf_name)
        waiting = [p for p in plan.pending if p.hash not in memo]
        if waiting:
            stack.extend(waiting)
            continue
        stack.pop()
        memo[key] = plan.build([memo[p.hash] for p in plan.pending])
    return memo[node.hash]


def push_down_index(circuit: Circuit, matcher=True) -> Circuit:
    """Every Index that ``matcher`` finds moved down as far as it goes (same value)."""
    return circuit.update(Matcher.types(Index) & Matcher(matcher), push_index, assert_any_found=False)


# ----------------------------------------------------------------- planning


def _plan(node: Index, leaf_name: LeafNamer | None) -> _Plan:
    child, items = node.node, node.index
    if all(is_full(item) for item in items):
        return _Plan((), lambda _: child)
    name = node.name if node.name is not None else child.name
    planner = _PLANNERS.get(type(child))
    plan = planner(node, child, items, name) if planner else None
    if plan is not None:
        return plan
    if isinstance(child, (Array, Symbol)) and leaf_name is not None and node.name is None:
        return _Plan((), lambda _: node.rename(leaf_name(node)))
    return _Plan((), lambda _: node)


def _index(child: Circuit, items: Sequence) -> Circuit:
    """``Index(child, items)``, or ``child`` itself when every item is a full slice."""
    items = tuple(items)
    return child if all(is_full(i) for i in items) else Index(child, items)


def _rebuild(
    children: list[Circuit], make: Callable[[list[Circuit]], Circuit], originals: Sequence[Circuit]
) -> _Plan:
    """A plan over new children: the Indexes this push made are pushed further, the rest used as
    they are.  An Index that was already there (``originals``: the children before the push, e.g.
    grouped-query attention's pick of key heads) is not the pushed index: it stays where the
    circuit has it, shared with the unpushed circuit, rather than being pushed too (which would
    compute the keys once per query head)."""
    pushed = [isinstance(c, Index) and not any(c is o for o in originals) for c in children]
    pending = tuple(c for c, new in zip(children, pushed) if new)
    positions = [i for i, new in enumerate(pushed) if new]

    def build(results: Sequence[Circuit]) -> Circuit:
        resolved = list(children)
        for position, result in zip(positions, results):
            resolved[position] = result
        return make(resolved)

    return _Plan(pending, build)


def _plan_partial(
    node: Index,
    items: Sequence,
    pushable: Sequence[bool],
    make: Callable[[Sequence, str | None], _Plan],
    name: str | None,
) -> _Plan | None:
    """Push the items on ``pushable`` axes through ``make``; keep the others in an Index above.

    ``make(pushed, op_name)`` plans the operation over children indexed by
    ``pushed``.  With nothing left above, the operation takes ``name``;
    otherwise it keeps its own and the Index above keeps the Index's.
    """
    pushed = [item if ok else FULL for item, ok in zip(items, pushable)]
    if all(is_full(i) for i in pushed):
        return None
    remainder = tuple(
        FULL if ok else item for item, ok in zip(items, pushable) if not (ok and isinstance(item, int))
    )
    if all(is_full(i) for i in remainder):
        return make(pushed, name)
    inner = make(pushed, node.node.name)
    return _Plan(inner.pending, lambda results: Index(inner.build(results), remainder, name=node.name))


def _plan_scalar(node: Index, child: Scalar, items, name) -> _Plan:
    return _Plan((), lambda _: Scalar(child.value, shape=node.shape, name=name))


def _plan_einsum(node: Index, child: Einsum, items, name) -> _Plan | None:
    if child.repeats_output_axes:  # two output axes of one letter take different items: stays above
        return None
    by_letter = {letter: item for letter, item in zip(child.out_axes, items) if not is_full(item)}
    children, operand_axes = [], []
    for operand, axes in zip(child.children, child.operand_axes):
        operand_items = [by_letter.get(letter, FULL) for letter in axes]
        children.append(_index(operand, operand_items))
        operand_axes.append(tuple(a for a in axes if not isinstance(by_letter.get(a), int)))
    out_axes = tuple(a for a in child.out_axes if not isinstance(by_letter.get(a), int))
    return _rebuild(
        children, lambda kids: Einsum(*zip(kids, operand_axes), out_axes=out_axes, name=name), child.children
    )


def _plan_add(node: Index, child: Add, items, name) -> _Plan:
    rank = len(child.shape)
    children = []
    for operand in child.children:
        offset = rank - len(operand.shape)
        operand_items = []
        for axis, size in enumerate(operand.shape):
            item = items[offset + axis]
            if size == 1 and child.shape[offset + axis] != 1:  # a broadcast axis
                item = 0 if isinstance(item, int) else FULL
            operand_items.append(item)
        children.append(_index(operand, operand_items))
    return _rebuild(children, lambda kids: Add(*kids, name=name), child.children)


def _plan_function(node: Index, child: GeneralFunction, items, name) -> _Plan | None:
    spec = child.spec
    if GEN_INDEX_NAME.fullmatch(spec.name):
        return _plan_gen_index(child, items, name)
    fixed = spec.num_non_batchable_output_dims
    if fixed is None or spec.num_inputs != 1:
        return None
    (operand,) = child.children
    free = len(child.shape) - fixed

    def make(pushed: Sequence, op_name: str | None) -> _Plan:
        operand_items = list(pushed[:free]) + [FULL] * (len(operand.shape) - free)
        return _rebuild(
            [_index(operand, operand_items)],
            lambda kids: GeneralFunction(*kids, spec=spec, name=op_name),
            child.children,
        )

    return _plan_partial(node, items, [axis < free for axis in range(len(items))], make, name)


def _plan_gen_index(child: GeneralFunction, items, name) -> _Plan:
    """Batch items go to x and the index, lookup items to the index, the rest to x.

    The member of the gen_index family may change: the looked-up axis moves
    left when ints remove axes before it, and a ``_no_batch_index`` lookup
    whose looked-up axis an int removes becomes a plain batched lookup.
    """
    match = GEN_INDEX_NAME.fullmatch(child.spec.name)
    batch_x, batch_index = bool(match["batch_x"]), not match["no_batch_index"]
    x, index = child.children
    layout = gen_index_layout(x.shape, index.shape, int(match["dim"]), batch_x, batch_index)
    b, d = layout.batch_rank, layout.axis - layout.batch_rank
    looked = len(index.shape) - b
    items = list(items)
    batch_items = items[:b]
    if batch_index:
        lookup_items, rest_items = items[b : b + looked], items[b + looked :]
    else:
        lookup_items = items[b + d : b + d + looked]
        rest_items = items[b : b + d] + items[b + d + looked :]
    x_items = batch_items + rest_items[:d] + [FULL] + rest_items[d:]
    index_items = batch_items + lookup_items
    new_dim = d - sum(isinstance(i, int) for i in rest_items[:d])
    lookup_removed = bool(lookup_items) and all(isinstance(i, int) for i in lookup_items)
    spec = gen_index_spec(
        new_dim,
        batch_x=batch_x,
        batch_index=batch_index or (batch_x and lookup_removed),
        check_index=bool(match["check"]),
    )
    return _rebuild(
        [_index(x, x_items), _index(index, index_items)],
        lambda kids: GeneralFunction(*kids, spec=spec, name=name),
        child.children,
    )


def _plan_index(node: Index, child: Index, items, name) -> _Plan:
    """Two Indexes in a row become one over the grandchild."""
    composed, outer = [], iter(items)
    for inner, size in zip(child.index, child.node.shape):
        if isinstance(inner, int):
            composed.append(inner)
            continue
        composed.append(_compose(inner, next(outer), size))
    merged = Index(child.node, tuple(composed), name=node.name)
    return _Plan((merged,), lambda results: results[0])


def _compose(inner, outer, size: int):
    """The single item equal to applying ``inner`` then ``outer`` on one axis."""
    if isinstance(inner, slice):
        begin, end, _ = inner.indices(size)
        length = end - begin
        if isinstance(outer, int):
            return begin + outer % length
        if isinstance(outer, slice):
            start, stop, _ = outer.indices(length)
            return _canonical_slice(begin + start, begin + stop, size)
        return outer % length + begin
    tensor = inner % size
    if isinstance(outer, int):
        return int(tensor[outer])
    return tensor[outer]


def _canonical_slice(begin: int, end: int, size: int) -> slice:
    return slice(begin or None, None if end == size else end)


def _plan_concat(node: Index, child: Concat, items, name) -> _Plan | None:
    axis = child.axis
    along = items[axis]
    others = list(items)
    others[axis] = FULL
    new_axis = axis - sum(isinstance(i, int) for i in items[:axis])
    if is_full(along):
        return _rebuild(
            [_index(c, others) for c in child.children],
            lambda kids: Concat(*kids, axis=new_axis, name=name),
            child.children,
        )
    starts, offset = [], 0
    for c in child.children:
        starts.append(offset)
        offset += c.shape[axis]
    if isinstance(along, int):
        position = along % offset
        for c, start in zip(child.children, starts):
            if start <= position < start + c.shape[axis]:
                local = list(items)
                local[axis] = position - start
                picked = Index(c, tuple(local), name=name)
                return _Plan((picked,), lambda results: results[0])
    if isinstance(along, slice):
        begin, end, _ = along.indices(offset)
        parts = []
        for c, start in zip(child.children, starts):
            low, high = max(begin, start), min(end, start + c.shape[axis])
            if low < high:
                local = list(items)
                local[axis] = _canonical_slice(low - start, high - start, c.shape[axis])
                parts.append(_index(c, local))
        if not parts:  # an empty selection: an empty slice of the first part keeps the shape
            local = list(items)
            local[axis] = _canonical_slice(0, 0, child.children[0].shape[axis])
            parts.append(_index(child.children[0], local))
        if len(parts) == 1:
            only = parts[0]
            if isinstance(only, Index):
                return _Plan((only,), lambda results: results[0])
            return _Plan((), lambda _: only.rename(name) if name is not None else only)
        return _rebuild(parts, lambda kids: Concat(*kids, axis=new_axis, name=name), child.children)
    return None  # a tensor index across the joined axis stays above the Concat


def _plan_rearrange(node: Index, child: Rearrange, items, name) -> _Plan | None:
    """Items on output axes that are plain input axes (not grouped, not new) move below."""
    if "..." in child.pattern:
        return None
    left, right = (side.strip() for side in child.pattern.split("->"))
    left_groups, right_groups = pattern_groups(left), pattern_groups(right)
    plain_inputs = {group[0]: axis for axis, group in enumerate(left_groups) if len(group) == 1}
    moves = [group[0] if len(group) == 1 and group[0] in plain_inputs else None for group in right_groups]

    def make(pushed: Sequence, op_name: str | None) -> _Plan:
        operand_items = [FULL] * len(left_groups)
        for axis_name, item in zip(moves, pushed):
            if axis_name is not None:
                operand_items[plain_inputs[axis_name]] = item
        dropped = {a for a, item in zip(moves, pushed) if isinstance(item, int)}
        resized = {a for a, item in zip(moves, pushed) if a is not None and not is_full(item)}
        pattern = f"{_join(left_groups, dropped)} -> {_join(right_groups, dropped)}"
        sizes = {k: v for k, v in child.sizes if k not in resized}
        return _rebuild(
            [_index(child.node, operand_items)],
            lambda kids: Rearrange(kids[0], pattern, name=op_name, **sizes),
            child.children,
        )

    return _plan_partial(node, items, [m is not None for m in moves], make, name)


def pattern_groups(side: str) -> list[tuple[str, ...]]:
    """``"a (b c) d"`` -> ``[("a",), ("b", "c"), ("d",)]``."""
    groups, current = [], None
    for token in side.replace("(", " ( ").replace(")", " ) ").split():
        if token == "(":
            current = []
        elif token == ")":
            groups.append(tuple(current))
            current = None
        elif current is not None:
            current.append(token)
        else:
            groups.append((token,))
    return groups


def _join(groups: list[tuple[str, ...]], dropped: set[str]) -> str:
    parts = []
    for group in groups:
        if len(group) == 1 and group[0] in dropped:
            continue
        parts.append(group[0] if len(group) == 1 else "(" + " ".join(group) + ")")
    return " ".join(parts)


_PLANNERS = {
    Scalar: _plan_scalar,
    Einsum: _plan_einsum,
    Add: _plan_add,
    GeneralFunction: _plan_function,
    Index: _plan_index,
    Concat: _plan_concat,
    Rearrange: _plan_rearrange,
}
