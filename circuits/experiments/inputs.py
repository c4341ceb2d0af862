"""Running a circuit on other inputs: the one rewrite every experiment shares.

Inputs are given as a mapping from a matcher form (usually the name of the
token Array the model builders make, ``'toks_int_var'``) to the new value:
a tensor (wrapped as an Array named like the node it replaces) or a node::

    {"toks_int_var": other_tokens}            # [B, S+1] like the circuit's own

How the new value relates to the node it replaces decides the rewrite:

- the same shape: a plain replacement (``update``), e.g. other prompts;
- the same rank, another leading (batch) size: a plain replacement too; the
  circuit is rebuilt for that batch (``[N, S+1]`` tokens for a circuit built
  on ``[B, S+1]``), which works when the batch axis is leading throughout,
  as in every model builder's circuits;
- extra leading axes: ``circuits.expand`` (``[N, S+1]`` tokens for an
  unbatched ``[S+1]`` circuit, or ``[N, B, S+1]`` for a batched one).

A key that matches nothing in the subtree being rewritten leaves it as it
is (that subtree does not depend on that input); the experiments refuse a
key that matches no node of the whole circuit (a typo would otherwise
measure an effect of exactly zero).
"""

from __future__ import annotations

import difflib
from typing import Any, Mapping

import torch

from circuits.transformer import names
from circuits.rewriting.batching import expand
from circuits.errors import ExperimentError, shown
from circuits.rewriting.matching import IterativeMatcher
from circuits.core.nodes import Array, Circuit
from circuits.rewriting.rewrite import replace
from circuits.core.traversal import unique_nodes

__all__ = ["check_keys_found", "same_shape_inputs", "shape_changes", "with_inputs", "with_targets_of"]

SAME, REBATCHED, EXPANDED = "same", "rebatched", "expanded"


def _replacement(node: Circuit, value: Any, what: str) -> Circuit:
    if isinstance(value, Circuit):
        return value
    if isinstance(value, torch.Tensor):
        return Array(value, name=node.name)
    try:
        return Array(torch.as_tensor(value), name=node.name)
    except Exception:
        raise ExperimentError(
            f"{what}: the value for {node.describe()} is a {type(value).__name__}, not a tensor or a node"
        ) from None


def _relation(old: Circuit, new: Circuit, what: str) -> str:
    old_shape, new_shape = tuple(old.shape), tuple(new.shape)
    if new_shape == old_shape:
        return SAME
    if len(new_shape) == len(old_shape) >= 2 and new_shape[1:] == old_shape[1:]:
        return REBATCHED
    extra = len(new_shape) - len(old_shape)
    if extra > 0 and new_shape[extra:] == old_shape:
        return EXPANDED
    raise ExperimentError(
        f"{what}: {old.describe()} has shape {list(old_shape)} but its new value {new.describe()} has "
        f"shape {list(new_shape)}; give the same shape, another leading (batch) size "
        f"[N, {', '.join(map(str, old_shape[1:]))}], or extra leading axes [..., "
        f"{', '.join(map(str, old_shape))}]"
    )


def with_inputs(
    circuit: Circuit, inputs: Mapping[Any, Any], *, what: str = "with_inputs"
) -> tuple[Circuit, str]:
    """``circuit`` on other inputs, and how it was rewritten (``"same"``, ``"rebatched"``, ``"expanded"``).

    See the module docstring.  The kind is ``"same"`` when nothing
    changed shape (or nothing matched).
    """
    if not isinstance(inputs, Mapping):
        raise ExperimentError(
            f"{what}: inputs must be a mapping {{name or matcher: tensor or node}}, "
            f"got {type(inputs).__name__}"
        )
    plain: dict[Any, Any] = {}
    batched: dict[Any, Any] = {}
    kinds = set()
    for key, value in inputs.items():
        if isinstance(key, IterativeMatcher):
            raise ExperimentError(f"{what}: input keys are plain matcher forms (a name, a node), not {key!r}")
        nodes = circuit.get(key)
        if not nodes:
            continue
        for node in nodes:
            new = _replacement(node, value, what)
            kind = _relation(node, new, what)
            kinds.add(kind)
            (batched if kind == EXPANDED else plain)[node] = new
    if not kinds:
        return circuit, SAME
    if EXPANDED in kinds and REBATCHED in kinds:
        raise ExperimentError(
            f"{what}: some inputs add batch axes and others change the batch size; give them alike"
        )
    result = circuit
    if plain:
        result = replace(result, plain)
    if batched:
        result = expand(result, {node: new for node, new in batched.items()})
    kind = EXPANDED if EXPANDED in kinds else REBATCHED if REBATCHED in kinds else SAME
    return result, kind


def shape_changes(circuit: Circuit, inputs: Mapping[Any, Any], what: str) -> list[str]:
    """For each node of ``circuit`` that ``inputs`` replaces with a value of another shape, both
    shapes: ``"Array 'toks_int_var' has shape [2, 13], the value given for it [3, 13]"``."""
    changes = []
    for key, value in inputs.items():
        if isinstance(key, IterativeMatcher):
            continue  # with_inputs refuses it
        for node in sorted(circuit.get(key), key=lambda n: (n.describe(), n.hash)):
            new = _replacement(node, value, what)
            if tuple(new.shape) != tuple(node.shape):
                changes.append(
                    f"{node.describe()} has shape {list(node.shape)}, the value given for it "
                    f"{list(new.shape)}"
                )
    return changes


def check_keys_found(circuit: Circuit, inputs: Mapping[Any, Any], what: str) -> None:
    """Refuse input keys that match no node of ``circuit``: a typo would measure an effect of zero.

    (A key that is in the circuit but not below a rewritten node is no
    mistake: that node does not depend on it, and keeps its value.)
    """
    if not isinstance(inputs, Mapping):
        raise ExperimentError(
            f"{what}: inputs must be a mapping {{name or matcher: tensor or node}}, got {type(inputs).__name__}"
        )
    missed = [
        key for key in inputs if not isinstance(key, IterativeMatcher) and not circuit.are_any_found(key)
    ]
    if not missed:
        return
    names = sorted({node.name for node in unique_nodes([circuit]) if node.name is not None})
    hints = []
    for key in missed:
        close = difflib.get_close_matches(key, names, n=1) if isinstance(key, str) else []
        hints.append(shown(repr(key)) + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ExperimentError(
        f"{what}: input keys that match no node of {circuit.describe()}: {', '.join(hints)}"
    )


def same_shape_inputs(circuit: Circuit, inputs: Mapping[Any, Any], what: str) -> Circuit:
    """``circuit`` on ``inputs`` that must match what they replace in shape: two runs compared row for
    row and position for position (patching grids, attribution patching).  A key that finds nothing,
    or a value of another shape, is an ``ExperimentError`` naming it."""
    check_keys_found(circuit, inputs, what)
    changes = shape_changes(circuit, inputs, what)
    if changes:
        raise ExperimentError(
            f"{what} must have the shape of the clean inputs (the runs are patched row for row, position "
            f"for position): {'; '.join(changes)}"
        )
    result, _ = with_inputs(circuit, inputs, what=what)
    return result


def with_targets_of(run: Circuit, source: Circuit, what: str) -> Circuit:
    """``run`` with its loss scoring ``source``'s next tokens: its targets node ``'true_toks_int'`` (the
    targets Index of the token Array) replaced by ``source``'s, every activation still ``run``'s.

    How an experiment that compares two runs scores the next tokens a Metric names
    (``Metric.targets``).  A circuit with no targets node (a prompt) has nothing to replace.
    """
    if source is run:
        return run
    found = source.get(names.TARGET_TOKENS)
    if len(found) > 1:
        raise ExperimentError(
            f"{what}: {source.describe()} has {len(found)} nodes named {names.TARGET_TOKENS!r}; "
            "which next tokens the metric scores is ambiguous"
        )
    if not found:
        return run
    (kept,) = found
    return replace(run, {node: kept for node in run.get(names.TARGET_TOKENS)})
