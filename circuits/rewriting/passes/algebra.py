"""Algebraic rewrites: distribute products over sums, factor, regroup and flatten.

These are the moves that turn a model's output into named path terms
(issue 16): ``Einsum(w, Add(a, b))`` becomes ``Add(Einsum(w, a), Einsum(w, b))``
so that each route through the residual stream is a node of its own.  Every
function here keeps the value, returns a new circuit that shares every
unchanged subtree, and raises ``PassError`` naming the node when its input
lacks the structure it rewrites (so a rewrite that would do nothing is an
error, never a silent no-op).
"""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any, Iterable, Sequence

from circuits.errors import BroadcastError, PassError
from circuits.rewriting.matching import Matcher
from circuits.core.nodes import Add, Circuit, Einsum, Index, Scalar
from circuits.core.shapes import EINSUM_LETTERS, broadcast_shapes

Operand = tuple[Circuit, tuple[int, ...]]


def _check_kind(node: Any, kind: type, rewrite: str) -> None:
    if not isinstance(node, kind):
        what = node.describe() if isinstance(node, Circuit) else f"{type(node).__name__} {node!r}"
        raise PassError(f"{rewrite}: expected {kind.__name__}, got {what}")


# --- flattening ---------------------------------------------------------------


def flatten_add(node: Circuit) -> Circuit:
    """One Add with the Adds directly under it inlined (broadcasting is associative)."""
    if not isinstance(node, Add) or not any(isinstance(c, Add) for c in node.children):
        return node
    operands = []
    for child in node.children:
        operands.extend(child.children if isinstance(child, Add) else (child,))
    return Add(*operands, name=node.name)


def _inlinable(child: Circuit) -> bool:
    """An Einsum operand that is a product of its own operands: not a diagonal embedding (``a->aa``),
    whose zeros off the diagonal no product of its operands has."""
    return isinstance(child, Einsum) and not child.repeats_output_axes


def flatten_einsum(node: Circuit) -> Circuit:
    """One Einsum with its Einsum operands inlined; their summed letters get fresh letters.

    An operand that repeats an output letter (a diagonal embedding) stays an operand."""
    if not isinstance(node, Einsum) or not any(_inlinable(c) for c in node.children):
        return node
    used = {a for axes in node.operand_axes for a in axes} | set(node.out_axes)
    for child in node.children:
        if _inlinable(child):
            used |= {a for axes in child.operand_axes for a in axes}
    fresh = iter(a for a in range(len(EINSUM_LETTERS)) if a not in used)
    operands = []
    for child, axes in zip(node.children, node.operand_axes):
        if not _inlinable(child):
            operands.append((child, axes))
            continue
        mapping = dict(zip(child.out_axes, axes))
        inner = {a for ax in child.operand_axes for a in ax} - set(child.out_axes)
        try:
            mapping.update({a: next(fresh) for a in sorted(inner)})
        except StopIteration:
            return node  # more letters than einsum has: leave it nested
        operands.extend(
            (op, tuple(mapping[a] for a in ax)) for op, ax in zip(child.children, child.operand_axes)
        )
    return Einsum(*operands, out_axes=node.out_axes, name=node.name)


def flatten_adds(circuit: Circuit, traversal: Any = True) -> Circuit:
    """Every Add that ``traversal`` (a matcher form) finds absorbs the Adds directly under it.

    Bottom-up, so with the default every nest of Adds becomes one Add.
    """
    return circuit.update(traversal, flatten_add, assert_any_found=False)


def flatten_einsums(circuit: Circuit, traversal: Any = True) -> Circuit:
    """Every Einsum that ``traversal`` finds absorbs the Einsums directly under it."""
    return circuit.update(traversal, flatten_einsum, assert_any_found=False)


# --- distributing -------------------------------------------------------------


def _letter_sizes(operands: Iterable[Operand]) -> dict[int, int]:
    return {a: size for node, axes in operands for a, size in zip(axes, node.shape)}


def _placed(summand: Circuit, slot: Operand) -> tuple[Circuit, tuple[int, ...]]:
    """``summand`` as an operand in ``slot`` (the Add's place): broadcast axes dropped.

    numpy broadcasting aligns the summand to the right; an axis it lacks or
    has as 1 where the Add is larger is not one of its letters in the term.
    """
    add, axes = slot
    own_axes = axes[len(axes) - summand.rank :]
    full_shape = add.shape[len(axes) - summand.rank :]
    broadcast = [i for i, (s, n) in enumerate(zip(summand.shape, full_shape)) if s == 1 and n != 1]
    if not broadcast:
        return summand, own_axes
    index = tuple(0 if i in broadcast else slice(None) for i in range(summand.rank))
    kept = tuple(a for i, a in enumerate(own_axes) if i not in broadcast)
    return Index(summand, index), kept


def _term(einsum: Einsum, choice: dict[int, Circuit], name: str | None) -> Einsum:
    """The einsum with operand ``p`` replaced by ``choice[p]``; letters only the
    replaced Adds carried come back as ones, so a broadcast summand is summed
    (or spread) over them exactly as the Add was."""
    slots = list(zip(einsum.children, einsum.operand_axes))
    operands = [_placed(choice[p], slot) if p in choice else slot for p, slot in enumerate(slots)]
    sizes = _letter_sizes(slots)
    present = {a for _, axes in operands for a in axes}
    missing = sorted({a for _, axes in slots for a in axes} - present)
    operands.extend((Scalar(1.0, shape=(sizes[a],)), (a,)) for a in missing)
    return Einsum(*operands, out_axes=einsum.out_axes, name=name)


def _check_depth(depth: Any, rewrite: str) -> None:
    if depth is not None and (isinstance(depth, bool) or not isinstance(depth, int) or depth < 1):
        raise PassError(f"{rewrite}: depth must be a positive int or None (every level), got {depth!r}")


def _summands(add: Add, depth: int | None, opens: Matcher) -> list[Circuit]:
    """The Add's summands, nested Adds that ``opens`` matches opened ``depth`` levels deep."""
    found = list(add.children)
    level = 1
    while (depth is None or level < depth) and any(isinstance(s, Add) and opens(s) for s in found):
        found = [t for s in found for t in (s.children if isinstance(s, Add) and opens(s) else (s,))]
        level += 1
    if not found:
        raise PassError(f"distribute: {add.describe()} has no summands to distribute over")
    return found


def _distributed(
    einsum: Einsum,
    positions: Sequence[int],
    depth: int | None,
    traversal: Any,
    prefix: str | None,
    suffix: str,
) -> Add:
    opens = Matcher(traversal)
    start = f"{einsum.name}." if prefix is None and einsum.name else (prefix or "")
    options = [list(enumerate(_summands(einsum.children[p], depth, opens))) for p in positions]
    terms = []
    for combination in itertools.product(*options):
        label = ".".join(s.name if s.name else str(i) for i, s in combination)
        choice = {p: s for p, (_, s) in zip(positions, combination)}
        terms.append(_term(einsum, choice, f"{start}{label}{suffix}"))
    return Add(*terms, name=einsum.name)


def distribute(
    einsum: Einsum,
    operand: int,
    *,
    depth: int | None = 1,
    traversal: Any = True,
    prefix: str | None = None,
    suffix: str = "",
) -> Add:
    """``Einsum(..., Add(s_i), ...)`` -> ``Add(Einsum(..., s_i, ...))`` for the Add at ``operand``.

    The result keeps the einsum's name; term ``i`` is named
    ``prefix + s_i.name + suffix`` (``prefix`` defaults to ``einsum.name + "."``;
    an unnamed summand is named by its position).  ``depth`` opens Adds nested
    in the Add that many levels (None: all), giving one term per innermost
    summand; only nested Adds that ``traversal`` (a matcher form) matches are opened.
    """
    _check_kind(einsum, Einsum, "distribute")
    _check_depth(depth, "distribute")
    if isinstance(operand, bool) or not isinstance(operand, int):
        raise PassError(f"distribute: operand must be an int position, got {operand!r}")
    if not -len(einsum.children) <= operand < len(einsum.children):
        raise PassError(
            f"distribute: operand {operand} is out of range for {einsum.describe()} "
            f"with {len(einsum.children)} operands"
        )
    position = operand % len(einsum.children)
    if not isinstance(einsum.children[position], Add):
        raise PassError(
            f"distribute: operand {operand} of {einsum.describe()} is "
            f"{einsum.children[position].describe()}, not an Add"
        )
    return _distributed(einsum, [position], depth, traversal, prefix, suffix)


def distribute_all(
    einsum: Einsum,
    *,
    depth: int | None = 1,
    traversal: Any = True,
    prefix: str | None = None,
    suffix: str = "",
) -> Add:
    """Every Add operand distributed at once: one term per choice of a summand from each.

    Term names join the chosen summands' names with ``"."`` after ``prefix``.
    """
    _check_kind(einsum, Einsum, "distribute_all")
    _check_depth(depth, "distribute_all")
    positions = [p for p, child in enumerate(einsum.children) if isinstance(child, Add)]
    if not positions:
        raise PassError(f"distribute_all: {einsum.describe()} has no Add operand to distribute over")
    return _distributed(einsum, positions, depth, traversal, prefix, suffix)


# --- factoring ----------------------------------------------------------------


def _check_factorable(add: Add) -> None:
    _check_kind(add, Add, "factor")
    if len(add.children) < 2:
        raise PassError(f"factor: {add.describe()} has {len(add.children)} operand(s); nothing to factor")
    for term in add.children:
        if not isinstance(term, Einsum):
            raise PassError(f"factor: operand {term.describe()} of {add.describe()} is not an Einsum")
        if term.shape != add.shape or term.out_axes != add.children[0].out_axes:
            raise PassError(
                f"factor: the Einsums of {add.describe()} differ in output axes or shape "
                f"({term.describe()}: {term.einsum_string} {list(term.shape)})"
            )


def _common_operands(terms: Sequence[Einsum]) -> Counter:
    common = Counter(zip(terms[0].children, terms[0].operand_axes))
    for term in terms[1:]:
        common &= Counter(zip(term.children, term.operand_axes))
    return common


def _split_operands(term: Einsum, common: Counter) -> tuple[list[Operand], list[Operand], int]:
    """The term's common operands and the rest, in order, and where the rest begins."""
    left = Counter(common)
    shared, rest, place = [], [], None
    for pair in zip(term.children, term.operand_axes):
        if left[pair]:
            left[pair] -= 1
            shared.append(pair)
        else:
            place = len(shared) if place is None else place
            rest.append(pair)
    return shared, rest, len(shared) if place is None else place


def _factor_part(rest: list[Operand], letters: tuple[int, ...], sizes: dict[int, int]) -> Circuit:
    """What a term multiplies the common operands by, over ``letters`` (ones where it has none)."""
    if len(rest) == 1 and rest[0][1] == letters:
        return rest[0][0]
    shape = tuple(sizes[a] for a in letters)
    if not rest:
        return Scalar(1.0, shape=shape)
    present = {a for _, axes in rest for a in axes}
    ones = [(Scalar(1.0, shape=(sizes[a],)), (a,)) for a in letters if a not in present]
    return Einsum(*rest, *ones, out_axes=letters)


def _inner_sum(
    rests: list[list[Operand]], letters: tuple[int, ...], sizes: dict[int, int], name: str | None
) -> Add:
    """The factored-out sum: a lone operand over trailing letters is left for the Add to
    broadcast (as before ``distribute``), unless no summand then spans every letter."""
    shape = tuple(sizes[a] for a in letters)
    lone = [len(r) == 1 and r[0][1] == letters[len(letters) - len(r[0][1]) :] for r in rests]
    implicit = [r[0][0] if alone else _factor_part(r, letters, sizes) for r, alone in zip(rests, lone)]
    if broadcast_shapes([part.shape for part in implicit], "factor") == shape:
        return Add(*implicit, name=name)
    return Add(*(_factor_part(r, letters, sizes) for r in rests), name=name)


def factor(add: Add, *, inner_name: str | None = None) -> Einsum:
    """``Add(Einsum(c, x_i))`` -> ``Einsum(c, Add(x_i))``: the inverse of ``distribute``.

    The operands (node and letters) every Einsum of the Add has in common are
    taken out once (there may be none); the rest of each Einsum becomes a
    summand of the inner Add (named ``inner_name``), over the letters it
    shares with them or the output.
    """
    _check_factorable(add)
    terms = list(add.children)
    common = _common_operands(terms)
    outer, _, place = _split_operands(terms[0], common)
    rests = [_split_operands(term, common)[1] for term in terms]
    shared = {a for _, axes in outer for a in axes} | set(terms[0].out_axes)
    order = (a for rest in rests for _, axes in rest for a in axes)
    letters = tuple(dict.fromkeys(a for a in order if a in shared))
    alike = {tuple(rest[0][1]) for rest in rests if len(rest) == 1}
    if len(alike) == 1 and all(len(rest) == 1 for rest in rests):
        # every rest is one operand over the same letters: the inner sum keeps them all, so a
        # letter only the summands have is summed once, outside (as before ``distribute``)
        letters = next(iter(alike))
    sizes = _letter_sizes((c, ax) for term in terms for c, ax in zip(term.children, term.operand_axes))
    outer.insert(place, (_inner_sum(rests, letters, sizes, inner_name), letters))
    return Einsum(*outer, out_axes=terms[0].out_axes, name=add.name)


# --- regrouping ---------------------------------------------------------------


def extract_add(add: Add, summands: Iterable[Circuit], name: str | None = None) -> Add:
    """The chosen summands of ``add`` pulled into a sub-Add named ``name``.

    The sub-Add takes the place of the first chosen summand; a summand that
    occurs several times is taken as often as it is chosen.
    """
    _check_kind(add, Add, "extract_add")
    wanted = Counter(summands)
    for summand in wanted:
        _check_kind(summand, Circuit, "extract_add")
    if not wanted:
        raise PassError(f"extract_add: no summands chosen from {add.describe()}")
    left = Counter(wanted) - Counter(add.children)
    if left:
        missing = ", ".join(node.describe() for node in left)
        raise PassError(f"extract_add: {missing} not among the operands of {add.describe()}")
    chosen, rest, place = [], [], None
    for child in add.children:
        if wanted[child]:
            wanted[child] -= 1
            chosen.append(child)
            place = len(rest) if place is None else place
        else:
            rest.append(child)
    rest.insert(place, Add(*chosen, name=name))
    return Add(*rest, name=add.name)


Group = tuple[str | None, list]  # a name and its items: operand positions or groups


def _group(item: Any, rewrite: str) -> Group | None:
    """A spec item as a group (``[...]`` or ``(name, [...])``), None for a position."""
    if isinstance(item, list):
        return None, item
    if isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], list):
        return item
    if isinstance(item, bool) or not isinstance(item, int):
        raise PassError(f"{rewrite}: a spec item is a position, a list or a (name, list), got {item!r}")
    return None


def _check_spec(spec: list, node: Circuit, rewrite: str) -> None:
    """The spec names each operand of ``node`` once, in groups that are not empty."""
    found, pending = [], [spec]
    while pending:
        items = pending.pop()
        if not items:
            raise PassError(f"{rewrite}: an empty group in the spec for {node.describe()}")
        for item in items:
            group = _group(item, rewrite)
            if group is None:
                found.append(item)
            else:
                pending.append(group[1])
    if sorted(found) != list(range(len(node.children))):
        raise PassError(
            f"{rewrite}: the spec must name each of the {len(node.children)} operands of "
            f"{node.describe()} exactly once (positions 0 to {len(node.children) - 1}), got {sorted(found)}"
        )


def nest_adds(add: Add, spec: list) -> Add:
    """The Add regrouped as ``spec`` says: a nested list of operand positions.

    ``[[0, 2], 1]`` is ``Add(Add(s0, s2), s1)``; a group given as
    ``(name, [...])`` is named.  Every operand appears exactly once.
    """
    _check_kind(add, Add, "nest_adds")
    _check_kind(spec, list, "nest_adds")
    _check_spec(spec, add, "nest_adds")

    def build(name: str | None, items: list) -> Add:
        groups = [_group(item, "nest_adds") for item in items]
        parts = [add.children[i] if g is None else build(*g) for i, g in zip(items, groups)]
        return Add(*parts, name=name)

    return build(add.name, spec)


def nest_einsums(einsum: Einsum, spec: list) -> Einsum:
    """The Einsum regrouped as ``spec`` says (as in ``nest_adds``): each group an Einsum
    over the letters its operands share with the rest or the output, summing the others."""
    _check_kind(einsum, Einsum, "nest_einsums")
    _check_kind(spec, list, "nest_einsums")
    _check_spec(spec, einsum, "nest_einsums")
    slots = list(zip(einsum.children, einsum.operand_axes))

    def build(name: str | None, items: list, out: tuple[int, ...]) -> Einsum:
        operands = []
        for item in items:
            group = _group(item, "nest_einsums")
            if group is None:
                operands.append(slots[item])
                continue
            inside = _positions_in(group[1])
            outside = {a for p, (_, ax) in enumerate(slots) if p not in inside for a in ax}
            mine = (a for p in inside for a in slots[p][1])
            letters = tuple(dict.fromkeys(a for a in mine if a in outside or a in einsum.out_axes))
            operands.append((build(group[0], group[1], letters), letters))
        return Einsum(*operands, out_axes=out, name=name)

    return build(einsum.name, spec, einsum.out_axes)


def _positions_in(items: list) -> list[int]:
    """The operand positions under a (checked) spec group, in order."""
    found, pending = [], list(reversed(items))
    while pending:
        item = pending.pop()
        group = _group(item, "spec")
        if group is None:
            found.append(item)
        else:
            pending.extend(reversed(group[1]))
    return found


def residual_rewrite(circuit: Circuit, estimate: Circuit, name: str | None = None) -> Add:
    """``circuit`` as ``estimate + (circuit - estimate)``, to study how good an estimate is.

    The circuit keeps its name inside; the outer Add is named ``name``
    (default ``circuit.name + ".rewritten"``, so that names stay unique), the
    residual ``circuit.name + ".residual"`` and the negated estimate
    ``circuit.name + ".minus_estimate"`` (all unnamed for an unnamed circuit).
    """
    _check_kind(circuit, Circuit, "residual_rewrite")
    _check_kind(estimate, Circuit, "residual_rewrite")
    try:
        fits = broadcast_shapes([circuit.shape, estimate.shape], "") == circuit.shape
    except BroadcastError:
        fits = False
    if not fits:
        raise PassError(
            f"residual_rewrite: the estimate {estimate.describe()} has shape {list(estimate.shape)}, "
            f"which does not broadcast to {circuit.describe()}'s {list(circuit.shape)}"
        )
    base = circuit.name
    label = (lambda part: f"{base}.{part}") if base else (lambda part: None)
    axes = tuple(range(estimate.rank))
    negated = Einsum((estimate, axes), (Scalar(-1.0), ()), out_axes=axes, name=label("minus_estimate"))
    residual = Add(circuit, negated, name=label("residual"))
    return Add(estimate, residual, name=label("rewritten") if name is None else name)


__all__ = [
    "distribute",
    "distribute_all",
    "extract_add",
    "factor",
    "flatten_add",
    "flatten_adds",
    "flatten_einsum",
    "flatten_einsums",
    "nest_adds",
    "nest_einsums",
    "residual_rewrite",
]
