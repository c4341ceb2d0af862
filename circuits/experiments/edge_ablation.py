"""What a masked-off edge reads: zero, the sender's corrupted-run value, or its mean over a batch.

``EdgeCircuit.with_ablation`` (and ``edge_circuit(..., ablation=)``) rewrites each receiver's input
from the masked sum of its senders to::

    'edges->b1.m' Add
      'edges.kept->b1.m' Einsum s,sbpd->bpd            # sum_s m_s * clean_s
        'edges.mask->b1.m' [8] Array
        'edges.senders<8' Concat 0
      'edges.ablated->b1.m' Einsum s,sbpd->bpd         # sum_s (1 - m_s) * ablated_s
        'edges.unmask->b1.m' Add                       # 1 - m
        'edges.ablated<8' Index [0:8]
          'edges.ablated' [9, B, P, D] Array           # every sender's ablated value
      'b0.a.bias_out' ...                              # the attention output biases, as before

A mask entry of 1 keeps the edge (``1 - m`` is exactly 0: the model's value, bit for bit as the
zero-ablation form), 0 swaps the sender's output for its ablated value in that receiver's input
alone.  ``'edges.ablated'`` is one named Array: ``"resample"`` holds every sender's output on the
corrupted inputs (ACDC's and EAP's patching), ``"mean"`` its mean over the batch of the given
inputs (``[senders, P, D]``, broadcast over the batch), ``"zero"`` keeps the zero-ablation form.
The values are computed once, on the model circuit (``EdgeCircuit.model``), so the rewritten circuit
is self-contained: it prints, saves and loads like any other.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import torch

from circuits.core.nodes import Add, Array, Circuit, Einsum, Index, Scalar
from circuits.core.traversal import unique_nodes
from circuits.errors import ExperimentError
from circuits.evaluation import evaluate_many
from circuits.experiments.inputs import check_keys_found, same_shape_inputs, shape_changes, with_inputs
from circuits.rewriting.matching import Matcher
from circuits.rewriting.rewrite import update

__all__ = ["ABLATIONS", "ablated_values", "sender_values", "with_ablation"]

#: What an ablated edge reads (``with_ablation``).
ABLATIONS = ("zero", "mean", "resample")


def sender_values(edges, circuit: Circuit) -> torch.Tensor:
    """Every sender of ``edges`` evaluated in ``circuit`` (a model circuit, found by name), stacked
    ``[senders, ...]`` in ``edges.senders`` order."""
    wanted = set(edges.senders)
    found: dict[str, list[Circuit]] = {}
    for node in unique_nodes([circuit]):
        if node.name in wanted:
            found.setdefault(node.name, []).append(node)
    missing = [name for name in edges.senders if len(found.get(name, ())) != 1]
    if missing:
        raise ExperimentError(
            f"sender_values: {circuit.describe()} has no one node named each sender: {missing[:4]}"
        )
    with torch.no_grad():
        return torch.stack(evaluate_many([found[name][0] for name in edges.senders]))


def ablated_values(edges, ablation: str, inputs: Mapping[Any, Any] | None, what: str) -> torch.Tensor:
    """The ``'edges.ablated'`` tensor: each sender's output on ``inputs`` (``"resample"``: the
    shape of the clean inputs) or its mean over their batch (``"mean"``: any batch size)."""
    if inputs is None:
        raise ExperimentError(f"{what}: ablation={ablation!r} needs corrupted_inputs (the run it reads)")
    model = edges.model
    if ablation == "resample":
        corrupted = same_shape_inputs(model, inputs, f"{what}: corrupted_inputs")
        if corrupted.hash == model.hash:
            raise ExperimentError(
                f"{what}: corrupted_inputs {list(inputs)!r} change nothing: every resampled edge would read "
                "its clean value"
            )
        values = sender_values(edges, corrupted)
    else:
        check_keys_found(model, inputs, f"{what}: corrupted_inputs")
        if edges.sender_nodes[0].rank != 3:
            raise ExperimentError(
                f"{what}: ablation='mean' averages over the batch, and this model's senders have shape "
                f"{list(edges.sender_nodes[0].shape)} (no batch axis)"
            )
        circuit, _ = with_inputs(model, inputs, what=f"{what}: corrupted_inputs")
        values = sender_values(edges, circuit)
        if tuple(values.shape[2:]) != tuple(edges.sender_nodes[0].shape[1:]):
            changes = "; ".join(shape_changes(model, inputs, f"{what}: corrupted_inputs"))
            raise ExperimentError(f"{what}: corrupted_inputs change the positions: {changes}")
        values = values.mean(1)
    return values.detach()


def with_ablation(edges, ablation: str, corrupted_inputs: Mapping[Any, Any] | None = None):
    """``edges`` (an ``EdgeCircuit`` in the zero-ablation form) whose masked-off edges read the
    ablated senders (module docstring)."""
    what = "EdgeCircuit.with_ablation"
    if ablation not in ABLATIONS:
        raise ExperimentError(f"{what}: ablation must be one of {ABLATIONS}, got {ablation!r}")
    if any(r.mask is None for r in edges.receivers):
        raise ExperimentError(f"{what}: this edge circuit has no masks (masked=False)")
    if edges.ablation != "zero":
        raise ExperimentError(f"{what}: this edge circuit already reads {edges.ablation!r} ablations")
    if ablation == "zero":
        return edges
    values = ablated_values(edges, ablation, corrupted_inputs, what)
    table = Array(values.to(edges.receivers[0].mask.value.dtype), name="edges.ablated")
    prefixes = {
        n: Index(table, (slice(0, n),), name=f"edges.ablated<{n}")
        for n in sorted({r.n_senders for r in edges.receivers})
    }
    inputs = {r.input.hash: r for r in edges.receivers}
    by_name = {r.input.name: r for r in edges.receivers}

    def ablated_input(node: Circuit) -> Circuit:  # bottom-up: its children are already rewritten
        receiver = by_name[node.name]
        return _ablated_input(receiver.name, node, prefixes[receiver.n_senders])

    matcher = Matcher.from_predicate(lambda node: node.hash in inputs, "Matcher(receiver inputs)")
    circuit = update(edges.circuit, matcher, ablated_input)
    rebuilt = dataclasses.replace(edges, circuit=circuit, ablation=ablation, ablated=table)
    return rebuilt.with_masks({})


def _ablated_input(name: str, node: Circuit, ablated: Circuit) -> Circuit:
    """Receiver ``name``'s input ``node`` as the Add of the kept senders, the ablated ones and the biases."""
    masked, biases = (node, ()) if isinstance(node, Einsum) else (node.children[0], node.children[1:])
    mask, _ = masked.children
    mask_axes, stack_axes = masked.operand_axes
    kept = Einsum(
        *zip(masked.children, masked.operand_axes), out_axes=masked.out_axes, name=f"edges.kept->{name}"
    )
    minus = Einsum.scalar_mul(mask, -1.0, name=f"edges.minus_mask->{name}", scalar_name="edges.minus_one")
    unmask = Add(Scalar(1.0, name="edges.one"), minus, name=f"edges.unmask->{name}")
    axes = stack_axes[:1] + stack_axes[len(stack_axes) - ablated.rank + 1 :]
    term = Einsum((unmask, mask_axes), (ablated, axes), out_axes=axes[1:], name=f"edges.ablated->{name}")
    return Add(kept, term, *biases, name=node.name)
