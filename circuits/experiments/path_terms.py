"""First-order path terms: a model's logits at one position as an ``Add`` of one node per direct path.

``path_terms(circuit, pos)`` rewrites the logits (``'t.call'``) at ``pos`` as a sum of named terms,
ordinary circuit nodes that print, evaluate and can be ablated: ``'path.embed'``,
``'path.pos_embed'`` (GPT-2), ``'path.L{l}H{h}'``, ``'path.{l}_attn_bias'`` (GPT-2),
``'path.{l}_mlp_out'`` and ``'path.bias'`` (the final norm's bias and the unembedding bias).

The one approximation, named so it is never mistaken for exact algebra: the final norm's scale
``1/sqrt(var + eps)`` is frozen at the clean run's value (an Array ``'path.frozen_ln_scale'``), as
direct logit attribution does, so the logits are linear in the residual stream.  On the clean
inputs the terms sum to the logits exactly (up to float rounding); after ablating a term they
are the first-order (direct-path) logits, not what the model would compute.  docs/path_terms.md.
"""

from __future__ import annotations

import dataclasses

import torch

from circuits import names
from circuits.errors import ExperimentError
from circuits.evaluation import evaluate_many
from circuits.experiments import residual
from circuits.experiments.composition import Compositions, head_of
from circuits.experiments.points import point
from circuits.nodes import Add, Array, Circuit, Einsum, Index, Scalar, check_node
from circuits.passes import split_heads

__all__ = ["PathTerms", "path_terms"]


@dataclasses.dataclass(frozen=True)
class PathTerms:
    """``terms``: the Add ``'path_terms'`` (``[batch, vocab]``) of one node per label in ``labels``
    (each term is named ``'path.' + label``); ``compositions``: the labels of the head-input terms
    inside them (``'L1H1.k.L0H2'``, named ``'path.L1H1.k.L0H2'``; empty at ``order=1``);
    ``circuit``: the model circuit the terms read, heads split."""

    terms: Circuit
    labels: list[str]
    circuit: Circuit
    compositions: list[str] = dataclasses.field(default_factory=list)


def _find(circuit: Circuit, matcher, what: str) -> Circuit:
    """``circuit``'s one node ``matcher`` finds, or an ``ExperimentError`` naming ``what`` is missing."""
    found = circuit.get(matcher)
    if len(found) != 1:
        raise ExperimentError(
            f"path_terms needs a model circuit with one {what}; {circuit.describe()} has {len(found)}"
        )
    return next(iter(found))


def _array(circuit: Circuit, name: str, required: bool = True) -> Circuit | None:
    """The weight ``name`` as the circuit's own node (None when optional and absent)."""
    found = circuit.get(name)
    if not found and not required:
        return None
    return _find(circuit, name, f"weight {name!r}")


def _position(pos, seq: int) -> int:
    """``pos`` as a non-negative index into ``seq`` positions; anything else is refused by name."""
    if isinstance(pos, bool) or not isinstance(pos, int) or not -seq <= pos < seq:
        raise ExperimentError(f"path_terms: pos={pos!r}; give one position, an int in [{-seq}, {seq})")
    return pos % seq


def _components(circuit: Circuit, facts, below: int | None = None) -> list[tuple[str, Circuit]]:
    """Every direct path into the residual stream before layer ``below`` (None: the final
    residual), as the circuit's nodes (``[..., pos, d_model]``)."""
    parts = [("embed", _find(circuit, point("embed"), "token embedding"))]
    if facts.pos_in_resid:
        parts.append(("pos_embed", _find(circuit, point("pos_embed"), "position embedding")))
    for layer in range(facts.n_layers if below is None else below):
        for head in range(facts.split_heads.get(layer, 0)):
            parts.append((f"L{layer}H{head}", _find(circuit, point("head_out", layer, head), "head")))
        bias = _array(circuit, names.attn_weight(layer, "o_bias"), required=False)
        if bias is not None:
            parts.append((f"{layer}_attn_bias", bias))
        if facts.has_mlp:
            parts.append((f"{layer}_mlp_out", _find(circuit, point("mlp_out", layer), "MLP output")))
    return parts


def _at_pos(node: Circuit, pos: int, seq: int) -> tuple[Circuit, str]:
    """``node`` at position ``pos`` and its einsum axes: ``'bd'`` (batched), ``'d'`` (a weight or a
    position embedding shared by the batch)."""
    if node.rank == 1:
        return node, "d"
    if node.shape[-2] != seq:
        raise ExperimentError(
            f"path_terms: {node.describe()} of shape {list(node.shape)} has no {seq} positions"
        )
    index = (slice(None),) * (node.rank - 2) + (pos,)
    return Index(node, index), "bd" if node.rank == 3 else "d"


def _term(label: str, node: Circuit, axes: str, read: list) -> Circuit:
    """``unembed(final-norm weight * centred(node) * frozen scale)``: one path's logits ``[batch, vocab]``."""
    return Einsum((node, axes), *read, out_axes="bv", name=f"path.{label}")


def _readout(circuit: Circuit, facts, scale: torch.Tensor) -> list:
    """The linear map from the residual to the logits, as einsum operands over ``d`` (residual),
    ``e`` (after centring), ``b`` (batch), ``v`` (vocab)."""
    d_model = _array(circuit, names.UNEMBED_WEIGHT).shape[-1]
    centre = torch.eye(d_model, dtype=scale.dtype) - 1.0 / d_model
    if facts.norm != names.LN:
        centre = torch.eye(d_model, dtype=scale.dtype)
    return [
        (Array(centre, name="path.centre"), "de"),
        (Array(scale, name="path.frozen_ln_scale"), "b"),
        (_array(circuit, names.norm_weight(names.FINAL, "scale", facts.norm)), "e"),
        (_array(circuit, names.UNEMBED_WEIGHT), "ve"),
    ]


def _bias_term(circuit: Circuit, facts, batch: int, vocab: int) -> Circuit:
    """The logits no path writes: the final norm's bias unembedded, plus the unembedding bias."""
    ones = Scalar(1.0, shape=(batch,), name="path.batch_ones")
    parts: list[Circuit] = [Scalar(0.0, shape=(batch, vocab), name="path.zero")]
    norm_bias = _array(circuit, names.norm_weight(names.FINAL, "bias", facts.norm), required=False)
    if norm_bias is not None:
        unembedding = _array(circuit, names.UNEMBED_WEIGHT)
        parts.append(Einsum((norm_bias, "e"), (unembedding, "ve"), (ones, "b"), out_axes="bv"))
    out_bias = _array(circuit, names.UNEMBED_BIAS_WEIGHT, required=False)
    if out_bias is not None:
        parts.append(Einsum((out_bias, "v"), (ones, "b"), out_axes="bv"))
    return Add(*parts, name="path.bias")


def path_terms(circuit: Circuit, pos: int = -1, order: int = 1) -> PathTerms:
    """The logits at ``pos`` as an Add ``'path_terms'`` of one node per direct path (see the module).

    ``circuit``: a batched model circuit the builders make (GPT-2, attention-only, Llama), heads split
    or not (unsplit layers are split here).  The sum equals the logits at ``pos`` on the clean inputs;
    ``ex.zero_ablate(result.terms, 'path.L1H2')`` drops one head's direct path.  ``order=2`` also
    writes each head's Q, K and V inputs as sums of named terms, one per source
    (``'path.L1H1.k.L0H2'``: head 0.2 composing into head 1.1's keys); ``order=3`` expands those
    head sources in turn, and so on (``experiments.composition``)."""
    check_node(circuit, "the model circuit", ExperimentError)
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise ExperimentError(f"path_terms: order={order!r}; give an int >= 1 (1: direct paths only)")
    facts = residual.model_facts(circuit)
    if not facts.batched:
        raise ExperimentError("path_terms needs a batched circuit (tokens [batch, positions])")
    logits = _find(circuit, point("logits"), "logits node 't.call' ([batch, pos, vocab])")
    batch, seq, vocab = logits.shape
    pos = _position(pos, seq)
    unsplit = [layer for layer in range(facts.n_layers) if layer not in facts.split_heads]
    if unsplit:
        circuit = split_heads(circuit, unsplit)
        facts = residual.model_facts(circuit)
    final = _find(circuit, point("ln_final_scale"), "final norm scale")
    layer_scales = Compositions.scale_nodes(circuit, facts) if order > 1 else {}
    final_scale, *values = evaluate_many([final, *layer_scales.values()])
    read = _readout(circuit, facts, final_scale.reshape(batch, seq)[:, pos].detach())
    compositions = Compositions(
        circuit, facts, lambda below: _components(circuit, facts, below), dict(zip(layer_scales, values))
    )
    terms, labels = [], []
    for label, node in _components(circuit, facts):
        head = head_of(label)
        if head is not None and order > 1:
            node = compositions.expand(*head, f"path.{label}", order)
        terms.append(_term(label, *_at_pos(node, pos, seq), read))
        labels.append(label)
    terms.append(_bias_term(circuit, facts, batch, vocab))
    labels.append("bias")
    return PathTerms(Add(*terms, name="path_terms"), labels, circuit, compositions.labels)
