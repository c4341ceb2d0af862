"""Activation patching and path patching.

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
"""

from __future__ import annotations

from typing import Any, Mapping

from circuits.experiments.ablation import rewrite_on_inputs
from circuits.core.nodes import Circuit

__all__ = ["patch"]


def patch(circuit: Circuit, matcher: Any, source_inputs: Mapping[Any, Any]) -> Circuit:
    """``circuit`` with the nodes ``matcher`` finds computed on ``source_inputs`` instead.

    ``source_inputs`` maps a matcher form (usually ``'toks_int_var'``) to a
    tensor or node of the same shape as what it replaces; batch row ``b`` of
    a patched node comes from row ``b`` of the source.  Patching from the
    circuit's own inputs gives back the same circuit.

    >>> patched = patch(split, "b0.a.head1", {"toks_int_var": corrupted_tokens})
    >>> cc.evaluate(patched).mean()                  # loss with head 0.1 from the corrupted run
    """

    return rewrite_on_inputs(
        circuit,
        matcher,
        source_inputs,
        "patch",
        "source_inputs must have the shape of the inputs they replace (the source run is row for row)",
    )
