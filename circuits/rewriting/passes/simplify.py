"""Simplification rules: value-preserving rewrites that make circuits smaller.

Each rule is a local rewrite of one node whose children are already
simplified; each is available alone (``fold_scalars(c)``; the flattening
rules are those of ``circuits.rewriting.passes.algebra``) and ``simplify`` applies
them all, bottom-up, until none applies.  Nodes a rule removes take their
names with them; the node a rule rewrites keeps its name.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from circuits.core.nodes import Add, Circuit, Einsum, GeneralFunction, Index, Rearrange, Scalar
from circuits.rewriting.passes.algebra import flatten_add, flatten_einsum
from circuits.rewriting.passes.push_down import pattern_groups, is_full
from circuits.core.shapes import broadcast_shapes

Rule = Callable[[Circuit], Circuit]

# Largest constant a folded function is computed over (a larger Scalar input is left alone).
_FOLD_LIMIT = 1 << 16


def _fold_scalars(node: Circuit) -> Circuit:
    """Combine Scalar operands; a node computed from Scalars alone becomes a Scalar."""
    if isinstance(node, Add):
        return _fold_add(node)
    if isinstance(node, Einsum):
        return _fold_einsum(node)
    if isinstance(node, Index) and isinstance(node.node, Scalar):
        return Scalar(node.node.value, shape=node.shape, name=node.name)
    if (
        isinstance(node, GeneralFunction)
        and node.children
        and all(isinstance(c, Scalar) for c in node.children)
    ):
        return _fold_function(node)
    return node


def _fold_add(node: Add) -> Circuit:
    scalars = [c for c in node.children if isinstance(c, Scalar)]
    others = [c for c in node.children if not isinstance(c, Scalar)]
    if not scalars or (len(scalars) == 1 and others and scalars[0].value != 0):
        return node
    total = sum(s.value for s in scalars)
    if not others:
        return Scalar(total, shape=node.shape, name=node.name)
    shape = broadcast_shapes([s.shape for s in scalars], node.describe())
    if total == 0 and broadcast_shapes([c.shape for c in others], node.describe()) == node.shape:
        return others[0] if len(others) == 1 and node.name is None else Add(*others, name=node.name)
    return Add(*others, Scalar(total, shape=shape), name=node.name)


def _fold_einsum(node: Einsum) -> Circuit:
    pairs = list(zip(node.children, node.operand_axes))
    scalars = [(c, ax) for c, ax in pairs if isinstance(c, Scalar)]
    if not scalars or (
        len(scalars) == 1 and not scalars[0][1] and len(pairs) > 1 and scalars[0][0].value != 1
    ):
        return node
    others = [(c, ax) for c, ax in pairs if not isinstance(c, Scalar)]
    sizes = {a: s for c, ax in pairs for a, s in zip(ax, c.shape)}
    kept = {a for _, ax in others for a in ax}
    only_scalar = {a for _, ax in scalars for a in ax} - kept
    value = math.prod(c.value for c, _ in scalars)
    value *= math.prod(sizes[a] for a in only_scalar if a not in node.out_axes)
    needed = tuple(dict.fromkeys(a for a in node.out_axes if a in only_scalar))
    if not others and not node.repeats_output_axes:  # a diagonal embedding is zero off its diagonal
        return Scalar(value, shape=node.shape, name=node.name)
    operands = list(others)
    if value != 1 or needed or not others:
        operands.append((Scalar(value, shape=tuple(sizes[a] for a in needed)), needed))
    if operands == pairs:
        return node
    return Einsum(*operands, out_axes=node.out_axes, name=node.name)


def _fold_function(node: GeneralFunction) -> Circuit:
    if math.prod(node.shape) > _FOLD_LIMIT or any(math.prod(c.shape) > _FOLD_LIMIT for c in node.children):
        return node
    inputs = [torch.full(c.shape, c.value, dtype=torch.float64) for c in node.children]
    try:
        value = node.spec.function(*inputs)
    except Exception:  # a function undefined on these constants is left for evaluation to report
        return node
    flat = value.reshape(-1)
    if flat.numel() == 0 or not bool((flat == flat[0]).all()):
        return node
    return Scalar(float(flat[0]), shape=node.shape, name=node.name)


def _remove_identity_index(node: Circuit) -> Circuit:
    if isinstance(node, Index) and all(is_full(item) for item in node.index):
        return node.node
    return node


def _remove_identity_rearrange(node: Circuit) -> Circuit:
    if not isinstance(node, Rearrange) or "..." in node.pattern:
        return node
    left, right = (side.strip() for side in node.pattern.split("->"))
    if pattern_groups(left) == pattern_groups(right):
        return node.node
    return node


def _remove_single_operand(node: Circuit) -> Circuit:
    """A one-operand Add, or an Einsum that only renames axes in order, is its operand."""
    if isinstance(node, Add) and len(node.children) == 1 and node.children[0].shape == node.shape:
        return node.children[0]
    if (
        isinstance(node, Einsum)
        and len(node.children) == 1
        and node.operand_axes[0] == node.out_axes
        and not node.repeats_output_axes  # "aa->aa" keeps the diagonal only
    ):
        return node.children[0]
    return node


RULES: dict[str, Rule] = {
    "flatten_adds": flatten_add,
    "flatten_einsums": flatten_einsum,
    "fold_scalars": _fold_scalars,
    "remove_identity_index": _remove_identity_index,
    "remove_identity_rearrange": _remove_identity_rearrange,
    "remove_single_operand": _remove_single_operand,
}


def _apply(circuit: Circuit, rules: list[Rule]) -> Circuit:
    def rewrite(node: Circuit) -> Circuit:
        while True:
            before = node
            for rule in rules:
                node = rule(node)
            if node == before:  # structurally: a rule may rebuild an equal node
                return before

    return circuit.update(True, rewrite)


def simplify(circuit: Circuit) -> Circuit:
    """Every rule, bottom-up, until none applies; the value is unchanged."""
    return _apply(circuit, list(RULES.values()))


def fold_scalars(circuit: Circuit) -> Circuit:
    """Scalar operands combined; Adds, Einsums, Indexes and functions of Scalars alone become Scalars."""
    return _apply(circuit, [_fold_scalars])


def remove_identity_index(circuit: Circuit) -> Circuit:
    """Indexes that select everything removed."""
    return _apply(circuit, [_remove_identity_index])


def remove_identity_rearrange(circuit: Circuit) -> Circuit:
    """Rearranges whose output axes are their input axes removed."""
    return _apply(circuit, [_remove_identity_rearrange])


def remove_single_operand(circuit: Circuit) -> Circuit:
    """One-operand Adds and axis-preserving one-operand Einsums removed."""
    return _apply(circuit, [_remove_single_operand])
