"""Ablations: replace what a matcher finds by zero or by its dataset mean.

Resample ablation, a node replaced by its value on other inputs, is activation patching:
``resample_ablate`` is ``patch`` (``circuits.experiments.patching``).

Each function takes a circuit and a matcher (any form ``circuits.rewriting.matching``
accepts: a name such as ``'b1.a.head3'``, a ``Point``, a regex Matcher, a set, an
IterativeMatcher for a path-restricted ablation) and returns the rewritten
circuit; nothing is evaluated except where the replacement needs a value
(the dataset mean).  A replacement keeps the name of the node it replaces,
so later matchers still find it.  A matcher that finds nothing is an
``ExperimentError`` (a typo should not silently ablate nothing).

Inputs (``dataset_inputs``) map a matcher form, usually
the token Array ``'toks_int_var'``, to a tensor or node; see
``circuits.experiments.inputs`` for how shapes are read.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import torch

from circuits.evaluation.cache import DEFAULT_CACHE_BYTES, Evaluator
from circuits.evaluation.leaves import check_device
from circuits.experiments.inputs import (
    EXPANDED,
    REBATCHED,
    SAME,
    ExperimentError,
    check_keys_found,
    with_inputs,
)
from circuits.rewriting.matching import no_match_hint
from circuits.core.nodes import Array, Circuit, Rearrange, Scalar, check_node
from circuits.rewriting.rewrite import update

__all__ = ["mean_ablate", "zero_ablate"]


def rewrite_found(circuit: Circuit, matcher: Any, fn: Callable[[Circuit], Circuit], what: str) -> Circuit:
    """``circuit.update(matcher, fn)``, refusing a matcher that finds nothing."""
    check_node(circuit, f"{what}: the circuit", ExperimentError)
    calls = []

    def counted(node: Circuit) -> Circuit:
        calls.append(node)
        return fn(node)

    result = update(circuit, matcher, counted, assert_any_found=False)  # refused below, as an ExperimentError
    if not calls:
        raise ExperimentError(
            f"{what}: {matcher!r} finds no node in {circuit.describe()}{no_match_hint(circuit, matcher)}"
        )
    return result


def zero_ablate(circuit: Circuit, matcher: Any) -> Circuit:
    """Every node ``matcher`` finds replaced by zeros of its shape (a Scalar 0 named like it).

    >>> ablated = zero_ablate(split, "b1.a.head3")          # head 1.3's output is zero
    >>> zero_ablate(split, cc.Matcher.regex(r"^b0\\.a\\.head"))  # every head of layer 0
    """
    return rewrite_found(
        circuit, matcher, lambda node: Scalar(0.0, shape=node.shape, name=node.name), "zero_ablate"
    )


def mean_ablate(
    circuit: Circuit,
    matcher: Any,
    dataset_inputs: Mapping[Any, Any],
    *,
    evaluator: Evaluator | None = None,
    device: torch.device | str | None = None,
) -> Circuit:
    """Every node ``matcher`` finds replaced by its mean over a dataset.

    The node (as ``update`` hands it over, i.e. with anything matched below
    it already ablated) is evaluated once on ``dataset_inputs`` and averaged
    over the dataset's batch axis; the mean becomes an Array named like the
    node.  How ``dataset_inputs`` is read:

    - extra leading axes (``[N, S+1]`` tokens for an unbatched circuit on
      ``[S+1]``; ``[N, B, S+1]`` for a batched one): the circuit is batched
      with ``circuits.expand`` and the mean is over those axes, so every
      position (and batch row) keeps its own mean;
    - the same rank as the circuit's batched input (``[N, S+1]`` tokens for
      a circuit on ``[B, S+1]``, any N): the node is computed for the N rows
      and averaged over its leading axis; the mean (per position) is
      repeated over the circuit's B rows by a Rearrange.  This assumes the
      batch axis is leading in the node, as in the model builders' circuits.

    A node that does not depend on the inputs is left as it is.  The
    dataset runs go through ``evaluator`` (default: a fresh
    ``Evaluator(DEFAULT_CACHE_BYTES)`` for this call), so several matched
    nodes share their common work, and a sweep can pass its own.  ``device``: where the dataset runs
    are evaluated (as ``cc.evaluate``'s; None: where the circuit's Arrays are); the means are Arrays
    on it.

    >>> tokens = torch.randint(0, vocab, (64, 129))             # 64 sequences of the right length
    >>> ablated = mean_ablate(split, "b1.a.head3", {"toks_int_var": tokens})
    """
    check_node(circuit, "mean_ablate: the circuit", ExperimentError)
    device = check_device(device, "mean_ablate", ExperimentError)
    check_keys_found(circuit, dataset_inputs, "mean_ablate")  # a mapping, every key found
    ev = evaluator if evaluator is not None else Evaluator(DEFAULT_CACHE_BYTES)
    unbatched_inputs = any(node.rank < 2 for key in dataset_inputs for node in circuit.get(key))

    def mean_of(node: Circuit) -> Circuit:
        on_dataset, kind = with_inputs(node, dataset_inputs, what="mean_ablate")
        if on_dataset.hash == node.hash:
            return node  # does not depend on the inputs: its own mean
        if kind == SAME:
            if unbatched_inputs:
                raise ExperimentError(
                    "mean_ablate: the circuit's inputs have no batch axis, so the dataset needs one: give "
                    "[N, ...] with an extra leading axis"
                )
            kind = REBATCHED  # [N, S+1] for [B, S+1] with N == B: still a dataset of N rows
        return _dataset_mean(node, on_dataset, kind, ev, device)

    return rewrite_found(circuit, matcher, mean_of, "mean_ablate")


def _dataset_mean(
    node: Circuit, on_dataset: Circuit, kind: str, ev: Evaluator, device: torch.device | None
) -> Circuit:
    """``node``'s mean over the dataset axes of ``on_dataset`` (extra leading axes, or the leading one)."""
    if kind == REBATCHED and on_dataset.rank != node.rank:
        raise ExperimentError(
            f"mean_ablate: {node.describe()} {list(node.shape)} on the dataset has shape "
            f"{list(on_dataset.shape)}; expected its batch axis leading (or give the dataset extra "
            "leading axes)"
        )
    extra = on_dataset.rank - node.rank
    averaged = on_dataset.shape[:extra] if kind == EXPANDED else on_dataset.shape[:1]
    if math.prod(averaged) == 0:
        raise ExperimentError(
            f"mean_ablate: the dataset has no examples: {node.describe()} on it has shape "
            f"{list(on_dataset.shape)}, and the mean over the dataset axes {list(averaged)} is undefined"
        )
    if kind != EXPANDED and node.rank == 0:
        raise ExperimentError(f"mean_ablate: {node.describe()} has no batch axis to average over")
    with torch.no_grad():
        value = ev.evaluate(on_dataset, device=device)
        if kind == EXPANDED:
            mean = value.mean(dim=tuple(range(extra))) if extra else value
            return Array(mean.clone(), name=node.name)
        mean = value.mean(dim=0).clone()
    axes = " ".join(f"x{i}" for i in range(node.rank - 1))
    base = Array(mean, name=None if node.name is None else f"{node.name}.mean")
    return Rearrange(base, f"{axes} -> batch {axes}".strip(), name=node.name, batch=node.shape[0])
