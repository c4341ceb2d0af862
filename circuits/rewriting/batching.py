"""Batching: ``expand`` adds leading batch axes to a circuit.

``expand(c, {matcher: new_node})`` replaces every node the matcher finds by
``new_node``, whose shape is the old shape with extra *leading* (batch)
axes: ``'toks' [302]`` becomes ``[4,302]`` for four sequences.  Every
ancestor is rebuilt to carry those axes in front of its own, so that
element ``b`` of the result is the original circuit evaluated with element
``b`` of the replacement:

- Einsum: fresh letters (unused by that einsum) are prefixed to every
  batched operand and to the output; unbatched operands are unchanged.
- Add: unbatched operands broadcast as before (numpy aligns shapes on the
  right); a batched operand of lower rank than the Add is padded with unit
  axes after its batch axes (a Rearrange ``B0 x0 -> B0 1 x0``), so its
  batch axes line up with the output's instead of with trailing axes.
- Index: leading full slices.  Concat: the axis shifts; unbatched operands
  are repeated over the batch (a Rearrange ``x0 -> B0 x0``).
- Rearrange: fresh axis names prefixed to both sides of the pattern.
- Tag: the same uuid over the batched child.  Scatter: leading full slices,
  and the batch shape in front of its shape.
- GeneralFunction: as its spec declares.  A spec with
  ``num_non_batchable_output_dims`` set treats extra leading axes of its
  (batchable, per ``input_batchability``) inputs as batch axes; with
  several inputs, unbatched batchable inputs are repeated over the batch.
  The gen_index family batches by rule, switching to another member of the
  family where needed (see ``_gen_index``) and adding Rearranges to put the
  batch axes first.  Any other spec is an ``ExpandError`` naming it.

All replacements that add axes must add the same batch shape.  A
replacement with no extra axes is a plain replacement.  A replacement whose
trailing shape differs from the node it replaces is an ``ExpandError``.

Like every rewrite: the input is not modified, unchanged subtrees stay the
same objects, a node is rebuilt only if something below it changed, matches
are replaced whole (nothing below a match is searched), and nothing
recurses.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from circuits.errors import CircuitError, ExpandError
from circuits.core.functions import GEN_INDEX_NAME, gen_index_layout, get_function
from circuits.core.gcpause import gc_paused
from circuits.rewriting.matching import IterativeMatcher, Matcher, walk
from circuits.core.nodes import (
    Add,
    Circuit,
    Concat,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    Scatter,
    Tag,
    check_node,
)
from circuits.core.shapes import EINSUM_LETTERS, Shape, format_shape

__all__ = ["expand"]


def expand(circuit: Circuit, replacements: Mapping[Any, Any]) -> Circuit:
    """``circuit`` with matched nodes replaced by batched versions, ancestors rebuilt.

    ``replacements`` maps a matcher form (a name, a node, a class, ...; see
    ``circuits.rewriting.matching``) to the new node, or to a function of the old node
    returning it.  If several keys match one node, the first wins.  Path
    restrictions (IterativeMatcher) are not supported here: expand a
    circuit, or un-share first with ``update``.
    """
    check_node(circuit, "expand: the circuit", ExpandError)
    try:
        items = list(replacements.items())
    except AttributeError:
        raise ExpandError(
            f"expand: expected a mapping {{matcher: new node}}, got {type(replacements).__name__}"
        ) from None
    rules: list[tuple[Matcher, Any]] = []
    for key, value in items:
        if isinstance(key, IterativeMatcher):
            raise ExpandError(f"expand: path-restricted matchers are not supported ({key!r})")
        if not (isinstance(value, Circuit) or callable(value)):
            raise ExpandError(
                f"expand: the replacement for {key!r} is a {type(value).__name__}, "
                "not a circuit node or a function returning one"
            )
        rules.append((Matcher(key), value))
    if not rules:
        return circuit
    predicates = [m.predicate for m, _ in rules]
    any_key = Matcher.from_predicate(lambda node: any(p(node) for p in predicates), "expand keys")
    with gc_paused():
        entries = walk(circuit, any_key, descend_found=False)
        return _Expander(rules).run(entries, circuit)


class _Expander:
    def __init__(self, rules):
        self.rules = rules
        self.batch: Shape | None = None  # the batch shape, set by the first batched replacement
        self.batch_source: str | None = None

    # ------------------------------------------------------------ driver

    def run(self, entries, root: Circuit) -> Circuit:
        # key -> None (unchanged) or (new node, batched?)
        results: dict[Any, tuple[Circuit, bool] | None] = {}
        interned: dict[bytes, Circuit] = {}
        for entry in entries:
            node = entry.node
            if entry.found:
                new, batched = self.replacement(node)
            else:
                children = list(node.children)
                flags = [False] * len(children)
                changed = False
                for position, child_key in enumerate(entry.child_keys):
                    result = results[child_key]
                    if result is not None:
                        changed = True
                        children[position], flags[position] = result
                if not changed:
                    results[entry.key] = None
                    continue
                try:
                    if any(flags):
                        new = self.batched(node, children, flags)
                        self.check_shape(node, new, "rebuilt")
                    else:
                        new = node.with_children(children)
                except ExpandError:
                    raise
                except CircuitError as error:
                    raise ExpandError(f"expand: rebuilding {node.describe()} failed: {error}") from error
                batched = any(flags)
            if new.hash == node.hash and not batched:
                results[entry.key] = None
            else:
                results[entry.key] = (interned.setdefault(new.hash, new), batched)
        result = results[entries[-1].key] if entries else None
        return root if result is None else result[0]

    def replacement(self, node: Circuit) -> tuple[Circuit, bool]:
        for matcher, value in self.rules:
            if matcher(node):
                break
        if not isinstance(value, Circuit):
            value = check_node(
                value(node),
                f"expand: the function for {matcher!r} returned {{got}} for {node.describe()}",
                ExpandError,
            )
        new = value
        old_shape, new_shape = node.shape, new.shape
        extra = len(new_shape) - len(old_shape)
        if extra < 0 or tuple(new_shape[extra:]) != tuple(old_shape):
            raise ExpandError(
                f"expand: {node.describe()} {format_shape(old_shape)} cannot be replaced by "
                f"{new.describe()} {format_shape(new_shape)}: the replacement's shape must be the "
                f"original shape {format_shape(old_shape)} with batch axes in front"
            )
        if extra == 0:
            return new, False
        batch = tuple(new_shape[:extra])
        if self.batch is None:
            self.batch = batch
            self.batch_source = f"{new.describe()} {format_shape(new_shape)} for {node.describe()}"
        elif batch != self.batch:
            raise ExpandError(
                f"expand: replacements add different batch shapes: {format_shape(self.batch)} "
                f"({self.batch_source}) and {format_shape(batch)} ({new.describe()} "
                f"{format_shape(new_shape)} for {node.describe()} {format_shape(old_shape)})"
            )
        return new, True

    def check_shape(self, old: Circuit, new: Circuit, what: str) -> None:
        expected = self.batch + old.shape
        if new.shape != expected:
            raise ExpandError(
                f"expand: {what} {old.describe()} has shape {format_shape(new.shape)}, expected "
                f"{format_shape(expected)} (batch {format_shape(self.batch)} + {format_shape(old.shape)})"
            )

    # ------------------------------------------------------------- rules

    def batched(self, node: Circuit, children: list[Circuit], flags: list[bool]) -> Circuit:
        if isinstance(node, Einsum):
            return self._einsum(node, children, flags)
        if isinstance(node, Add):
            return self._add(node, children, flags)
        if isinstance(node, Index):
            return Index(children[0], (slice(None),) * len(self.batch) + node.index, name=node.name)
        if isinstance(node, Rearrange):
            return self._rearrange(node, children[0])
        if isinstance(node, Concat):
            children = [c if f else self.repeat(c) for c, f in zip(children, flags)]
            return Concat(*children, axis=node.axis + len(self.batch), name=node.name)
        if isinstance(node, GeneralFunction):
            return self._function(node, children, flags)
        if isinstance(node, Tag):
            return Tag(children[0], node.uuid, name=node.name)
        if isinstance(node, Scatter):
            index = (slice(None),) * len(self.batch) + node.index
            return Scatter(children[0], index, self.batch + node.shape, name=node.name)
        raise ExpandError(f"expand: no batching rule for {node.describe()} (type {type(node).__name__})")

    def _einsum(self, node: Einsum, children, flags) -> Circuit:
        k = len(self.batch)
        used = set(node.out_axes).union(*node.operand_axes)
        fresh = tuple(axis for axis in range(len(EINSUM_LETTERS)) if axis not in used)[:k]
        if len(fresh) < k:
            raise ExpandError(
                f"expand: {node.describe()} ({node.einsum_string}) has no {k} unused letters "
                f"left for the batch axes (einsum allows {len(EINSUM_LETTERS)})"
            )
        operands = [
            (child, fresh + axes if flag else axes)
            for child, axes, flag in zip(children, node.operand_axes, flags)
        ]
        return Einsum(*operands, out_axes=fresh + node.out_axes, name=node.name)

    def _add(self, node: Add, children, flags) -> Circuit:
        rank = len(node.shape)
        padded = []
        for child, flag, old in zip(children, flags, node.children):
            if flag and len(old.shape) < rank:
                child = self.pad(child, rank - len(old.shape))
            padded.append(child)
        return Add(*padded, name=node.name)

    def _rearrange(self, node: Rearrange, child: Circuit) -> Circuit:
        lhs, rhs = node.pattern.split("->")
        taken = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", node.pattern)) | {a for a, _ in node.sizes}
        names, i = [], 0
        while len(names) < len(self.batch):
            candidate = f"batch{i}"
            if candidate not in taken:
                names.append(candidate)
            i += 1
        prefix = " ".join(names)
        pattern = f"{prefix} {lhs.strip()} -> {prefix} {rhs.strip()}"
        return Rearrange(child, pattern, name=node.name, sizes=dict(node.sizes))

    def _function(self, node: GeneralFunction, children, flags) -> Circuit:
        spec = node.spec
        if GEN_INDEX_NAME.fullmatch(spec.name):
            return self._gen_index(node, children, flags)
        if spec.num_non_batchable_output_dims is None:
            batched = [i for i, f in enumerate(flags) if f]
            raise ExpandError(
                f"expand: {node.describe()} cannot carry batch axes: its function {spec.name!r} "
                "declares no batching (FunctionSpec.num_non_batchable_output_dims is None); "
                f"input(s) {batched} are batched by {format_shape(self.batch)}"
            )
        batchable = spec.input_batchability or (True,) * len(children)
        new_children = []
        for position, (child, flag, can) in enumerate(zip(children, flags, batchable)):
            if flag and not can:
                raise ExpandError(
                    f"expand: {node.describe()}: input {position} of function {spec.name!r} is "
                    f"batched by {format_shape(self.batch)} but the spec's input_batchability "
                    f"{spec.input_batchability} says it cannot carry batch axes"
                )
            if can and not flag and len(children) > 1:
                child = self.repeat(child)
            new_children.append(child)
        return GeneralFunction(*new_children, spec=spec, name=node.name)

    def _gen_index(self, node: GeneralFunction, children, flags) -> Circuit:
        """gen_index_at_D[_batch_x][_no_batch_index][_c](x, index) with batch axes B.

        Without ``_batch_x``:
        - x batched only: index axis D+k of x in place (``_no_batch_index``),
          then move the index's axes after B if the original puts them first;
        - index batched only: the same function (the index's axes, B first,
          come first); ``_no_batch_index`` at D > 0 moves B to the front;
        - both: ``_batch_x_no_batch_index`` with the index's own axes
          flattened to one, then unflattened and placed as the original does.
        With ``_batch_x`` (x's leading axes are the index's batch axes): both
        batched is the same function with B joining those axes; a batched
        side alone has the other repeated over B first.
        """
        match = GEN_INDEX_NAME.fullmatch(node.spec.name)
        dim = int(match["dim"])
        batch_x = bool(match["batch_x"])
        batch_index = not match["no_batch_index"]
        check = "_c" if match["check"] else ""
        x, index = children
        x_batched, index_batched = flags
        old_x, old_index = node.children
        k = len(self.batch)

        if batch_x:
            if not x_batched:
                x = self.repeat(x)
            if not index_batched:
                index = self.repeat(index)
            return GeneralFunction(x, index, spec=node.spec, name=node.name)

        layout = gen_index_layout(old_x.shape, old_index.shape, dim, False, batch_index)
        d = layout.axis  # non-negative axis of the unbatched x
        x_shape, index_shape = old_x.shape, old_index.shape
        bn = [f"B{i}" for i in range(k)]
        xn = [f"x{i}" for i in range(len(x_shape))]
        ini = [f"i{i}" for i in range(len(index_shape))]
        # axis names of the original output, with the batch in front: the target layout
        if batch_index:
            target = bn + ini + xn[:d] + xn[d + 1 :]
        else:
            target = bn + xn[:d] + ini + xn[d + 1 :]

        if x_batched and not index_batched:
            spec = get_function(f"gen_index_at_{d + k}_no_batch_index{check}")
            got = bn + xn[:d] + ini + xn[d + 1 :]
            return self._arrange(GeneralFunction(x, index, spec=spec), got, target, node.name)
        if index_batched and not x_batched:
            if batch_index:
                got = bn + ini + xn[:d] + xn[d + 1 :]
            else:
                got = xn[:d] + bn + ini + xn[d + 1 :]
            return self._arrange(GeneralFunction(x, index, spec=node.spec), got, target, node.name)
        # both batched: the index's own axes flattened into one, looked up per batch element
        if len(index_shape) == 0:
            index = Rearrange(index, f"{' '.join(bn)} -> {' '.join(bn)} 1")
            flat = "1"
        elif len(index_shape) == 1:
            flat = ini[0]
        else:
            index = Rearrange(index, f"{' '.join(bn)} {' '.join(ini)} -> {' '.join(bn)} ({' '.join(ini)})")
            flat = "(" + " ".join(ini) + ")"
        spec = get_function(f"gen_index_at_{d}_batch_x_no_batch_index{check}")
        got = bn + xn[:d] + [flat] + xn[d + 1 :]
        sizes = dict(zip(ini, index_shape)) if len(index_shape) > 1 else {}
        return self._arrange(GeneralFunction(x, index, spec=spec), got, target, node.name, sizes)

    # ---------------------------------------------------------- helpers

    @staticmethod
    def _arrange(node: Circuit, got: list[str], target: list[str], name: str | None, sizes=None) -> Circuit:
        """``node`` (axes named ``got``) with its axes put in ``target`` order, named ``name``."""
        if got == target:
            return node.rename(name)
        return Rearrange(node, f"{' '.join(got)} -> {' '.join(target)}", name=name, sizes=sizes)

    def repeat(self, node: Circuit) -> Circuit:
        """``node`` repeated over the batch: shape B + its shape."""
        bn = [f"B{i}" for i in range(len(self.batch))]
        xn = [f"x{i}" for i in range(len(node.shape))]
        return Rearrange(node, f"{' '.join(xn)} -> {' '.join(bn + xn)}", sizes=dict(zip(bn, self.batch)))

    def pad(self, node: Circuit, count: int) -> Circuit:
        """A batched ``node`` with ``count`` unit axes after its batch axes."""
        k = len(self.batch)
        bn = [f"B{i}" for i in range(k)]
        xn = [f"x{i}" for i in range(len(node.shape) - k)]
        lhs = " ".join(bn + xn)
        rhs = " ".join(bn + ["1"] * count + xn)
        return Rearrange(node, f"{lhs} -> {rhs}")
