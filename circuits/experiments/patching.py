"""Activation patching and path patching; resample ablation is the same rewrite.

``patch(c, matcher, source_inputs)`` replaces every node the matcher finds
by the same node computed on ``source_inputs`` (the source run), leaving the
rest of the circuit on its own inputs (the target run).  It is a rewrite:
the patched node's subtree on the source inputs becomes part of the
circuit, so evaluating it costs no more than the nodes that changed, and a
cached ``Evaluator`` shares the source run between patches.

With a plain matcher (a name, a regex, ...) the node is patched wherever it
is used: activation patching.  With an ``IterativeMatcher`` it is patched
only where it is reached along the matched path, and every other use keeps
the target run's value: path patching.  For instance, what head 0.1
contributes to the *value* input of head 1.2 only::

    value_path = (
        cc.IterativeMatcher("b1.a.head2")  # the later head's branch
        .then("a.v")                       # its value projection (a head's own q/k/v nodes are its own)
        .then("b0.a.head1")                # head 0.1 in what feeds it
    )
    patched = patch(split, value_path, {"toks_int_var": source_tokens})

Head 1.2's keys and queries, every other head and the MLPs still see head
0.1 on the target inputs.

Resample ablation (a node replaced by itself on other inputs, drawn from a
dataset) is this rewrite: ``resample_ablate`` is another name of ``patch``
(the same function), for the experiments that read as ablations.
"""

from __future__ import annotations

from typing import Any, Mapping

from circuits.core.nodes import Circuit, check_node
from circuits.errors import ExperimentError
from circuits.experiments.ablation import rewrite_found
from circuits.experiments.inputs import check_keys_found, shape_changes, with_inputs

__all__ = ["patch", "resample_ablate"]


def patch(circuit: Circuit, matcher: Any, source_inputs: Mapping[Any, Any]) -> Circuit:
    """``circuit`` with the nodes ``matcher`` finds computed on ``source_inputs`` instead.

    ``source_inputs`` maps a matcher form (usually ``'toks_int_var'``) to a
    tensor or node of the same shape as what it replaces; batch row ``b`` of
    a patched node comes from row ``b`` of the source (for a resample
    ablation, draw the rows from a dataset: ``dataset[torch.randint(len(dataset), (B,))]``;
    to average over a dataset use ``mean_ablate``).  The result is a rewrite,
    not a value: the node's subtree on the source inputs is part of the
    circuit (and evaluates once, shared, in a sweep).  Patching from the
    circuit's own inputs gives back the same circuit.

    >>> patched = patch(split, "b0.a.head1", {"toks_int_var": corrupted_tokens})
    >>> cc.evaluate(patched).mean()                  # loss with head 0.1 from the corrupted run
    """
    check_node(circuit, "patch: the circuit", ExperimentError)
    check_keys_found(circuit, source_inputs, "patch")

    def on_inputs(node: Circuit) -> Circuit:
        changes = shape_changes(node, source_inputs, "patch")
        if changes:
            raise ExperimentError(
                f"patch: {node.describe()} {list(node.shape)} would be computed on inputs of other "
                f"shapes: {'; '.join(changes)}; source_inputs must have the shape of the inputs they "
                "replace (the source run is row for row; to average over a dataset use mean_ablate)"
            )
        return with_inputs(node, source_inputs, what="patch")[0]  # every shape kept: a plain replacement

    return rewrite_found(circuit, matcher, on_inputs, "patch")


#: Resample ablation: ``patch`` from other inputs of the same shape (the same function).
resample_ablate = patch
