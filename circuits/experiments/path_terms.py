"""First-order path terms: a model's logits at one position as an ``Add`` of one node per direct path.

``path_terms(circuit, pos)`` rewrites the logits (``'t.call'``) at ``pos`` as a sum of named terms,
ordinary circuit nodes that print, evaluate and can be ablated: ``'path.embed'``,
``'path.pos_embed'`` (GPT-2), ``'path.L{l}H{h}'``, ``'path.{l}_attn_bias'`` (GPT-2),
``'path.{l}_mlp_out'`` and ``'path.bias'`` (the final norm's bias and the unembedding bias).

The one approximation, named so it is never mistaken for exact algebra: the final norm's scale
``1/sqrt(var + eps)`` is frozen at the clean run's value (an Array ``'path.frozen_ln_scale'``), as
direct logit attribution does, so the logits are linear in the residual stream (Gemma 2: so are
the sandwich norms over the attention outputs, ``'path.frozen_post_norm{L}_scale'``; its logit
soft-cap is not linear, so a soft-capped model's terms are those of the logits before the cap,
``uncapped=True``, or none).  On the clean
inputs the terms sum to the logits exactly (up to float rounding); after ablating a term they
are the first-order (direct-path) logits, not what the model would compute.  docs/path_terms.md.
"""

from __future__ import annotations

import dataclasses

import torch

from circuits.errors import ExperimentError
from circuits.evaluation import evaluate_many
from circuits.evaluation.leaves import check_device
from circuits.experiments import residual
from circuits.experiments.composition import Compositions, head_of
from circuits.transformer.points import as_point, resolve_points
from circuits.experiments.stream import read_norm
from circuits.core.nodes import Add, Array, Circuit, Einsum, Index, Scalar, check_node
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


class _Model:
    """The nodes of a model circuit that path terms read, found in one walk (``resolve_points``)
    rather than one walk per node (a GPT-2-small has 144 heads), and the norm scales they freeze,
    evaluated in one run: the final norm's, each post-norm's (Gemma 2) and, for ``order > 1``, each
    attention norm's (``scales[key]``, ``[batch, pos]``)."""

    def __init__(self, circuit: Circuit, facts, order: int, device: torch.device | None = None):
        self.facts = facts
        keys = [("logits",), ("ln_final_scale",), ("embed",)]
        keys += [("pos_embed",)] if facts.pos_in_resid else []
        for layer in range(facts.n_layers):
            keys += [("head_out", layer, head) for head in range(facts.split_heads.get(layer, 0))]
            keys += [("ln1_scale", layer), ("ln1", layer)] if order > 1 and layer > 0 else []
        try:
            self.points = resolve_points(circuit, keys)
        except ExperimentError as error:
            raise ExperimentError(f"path_terms needs a model circuit the builders make: {error}") from None
        scales = {("ln_final_scale", None, None): self.point("ln_final_scale")}
        scales.update({key: node for key, node in self.points.items() if key[0] == "ln1_scale"})
        for layer, writes in enumerate(facts.writes):
            if writes.attn_norm is not None:
                scales[("attn_post_scale", layer, None)] = writes.attn_norm.rsqrt
        values = evaluate_many(list(scales.values()), device=device)
        self.scales = dict(zip(scales, (value.detach() for value in values)))

    def point(self, *key) -> Circuit:
        return self.points[as_point(key)]

    def scale(self, kind: str, layer: int | None = None) -> torch.Tensor:
        return self.scales[(kind, layer, None)]


def _position(pos, seq: int) -> int:
    """``pos`` as a non-negative index into ``seq`` positions; anything else is refused by name."""
    if isinstance(pos, bool) or not isinstance(pos, int) or not -seq <= pos < seq:
        raise ExperimentError(f"path_terms: pos={pos!r}; give one position, an int in [{-seq}, {seq})")
    return pos % seq


def _components(model: _Model) -> list[tuple[str, Circuit]]:
    """Every direct path into the final residual stream, in layer order, as the circuit's nodes
    (``[..., pos, d_model]``)."""
    facts = model.facts
    parts = [("embed", model.point("embed"))]
    if facts.pos_in_resid:
        parts.append(("pos_embed", model.point("pos_embed")))
    for layer, writes in enumerate(facts.writes):
        for head in range(facts.split_heads.get(layer, 0)):
            parts.append(
                (f"L{layer}H{head}", _head_write(model, layer, model.point("head_out", layer, head)))
            )
        if writes.attn_bias is not None:
            parts.append((f"{layer}_attn_bias", writes.attn_bias))
        if writes.mlp is not None:
            parts.append((f"{layer}_mlp_out", writes.mlp))
    return parts


def _head_write(model: _Model, layer: int, head: Circuit) -> Circuit:
    """A head's output as it reaches the residual stream: itself, or (Gemma 2) through the layer's
    post-norm with its scale frozen at the clean run's (``'path.frozen_post_norm{L}_scale'``) and the
    norm's own weight node, ``[b,s,d]``; the heads' terms then sum to the post-norm's output."""
    norm = model.facts.writes[layer].attn_norm
    if norm is None:
        return head
    scale = Array(model.scale("attn_post_scale", layer), name=f"path.frozen_post_norm{layer}_scale")
    return Einsum((head, "bsd"), (scale, "bs"), (norm.weight, "d"), out_axes="bsd")


def _below(parts: list[tuple[str, Circuit]], layer: int) -> list[tuple[str, Circuit]]:
    """The parts written before layer ``layer``: those labelled with an earlier layer, or none."""
    return [(label, node) for label, node in parts if _layer_of(label) < layer]


def _layer_of(label: str) -> int:
    """The layer a part's label names (``'L3H1'``, ``'3_mlp_out'``), -1 for the embeddings."""
    digits = label[1:].partition("H")[0] if label.startswith("L") else label.partition("_")[0]
    return int(digits) if digits.isdigit() else -1


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


def _vocab_rows(weight: Circuit, tokens: torch.Tensor | None, name: str) -> Circuit:
    """``weight`` (vocab first), or only its rows of ``tokens`` (an Index named ``name``)."""
    return weight if tokens is None else Index(weight, (tokens,), name=name)


def _tokens(tokens, vocab: int) -> torch.Tensor | None:
    """``tokens`` as a 1-D int64 tensor of vocabulary ids, or None (the whole vocabulary)."""
    if tokens is None:
        return None
    try:
        ids = torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError):
        ids = torch.empty(0)
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.dim() != 1 or ids.numel() == 0:
        raise ExperimentError(f"path_terms: tokens={tokens!r}; give a non-empty 1-D list of vocabulary ids")
    if ids.min() < 0 or ids.max() >= vocab:
        raise ExperimentError(
            f"path_terms: tokens={ids.tolist()} has ids outside the vocabulary [0, {vocab})"
        )
    return ids.to(torch.int64)


def _readout(model: _Model, scale: torch.Tensor, tokens: torch.Tensor | None) -> list:
    """The linear map from the residual to the logits before any soft-cap (of ``tokens`` only, if
    given), as einsum operands over ``d`` (residual), ``e`` (after centring), ``b`` (batch), ``v``
    (vocab): the final norm's own weight node (Gemma's ``1 + w``) and the unembedding node."""
    readout = model.facts.readout
    d_model = readout.unembed.shape[-1]
    centre = torch.eye(d_model, dtype=scale.dtype, device=scale.device)
    if readout.norm.centred:
        centre = centre - 1.0 / d_model
    return [
        (Array(centre, name="path.centre"), "de"),
        (Array(scale, name="path.frozen_ln_scale"), "b"),
        (readout.norm.weight, "e"),
        (_vocab_rows(readout.unembed, tokens, "path.unembed_rows"), "ve"),
    ]


def _bias_term(model: _Model, batch: int, vocab: int, tokens: torch.Tensor | None) -> Circuit:
    """The logits no path writes: the final norm's bias unembedded, plus the unembedding bias."""
    ones = Scalar(1.0, shape=(batch,), name="path.batch_ones")
    width = vocab if tokens is None else len(tokens)
    parts: list[Circuit] = [Scalar(0.0, shape=(batch, width), name="path.zero")]
    readout = model.facts.readout
    if readout.norm.bias is not None:
        unembedding = _vocab_rows(readout.unembed, tokens, "path.unembed_rows")
        parts.append(Einsum((readout.norm.bias, "e"), (unembedding, "ve"), (ones, "b"), out_axes="bv"))
    out_bias = readout.bias
    if out_bias is not None:
        out_bias = _vocab_rows(out_bias, tokens, "path.unembed_bias_rows")
        parts.append(Einsum((out_bias, "v"), (ones, "b"), out_axes="bv"))
    return Add(*parts, name="path.bias")


def _residual_term(label: str, node: Circuit, axes: str, batch: int) -> Circuit:
    """One part of the residual stream at the position, ``[batch, d_model]`` (a weight or a
    position embedding, shared by the batch, spread over it)."""
    ones = Scalar(1.0, shape=(batch,), name="path.batch_ones")
    return Einsum((node, axes), (ones, "b"), out_axes="bd", name=f"path.{label}")


def _layer(layer, n_layers: int) -> int | None:
    """``layer`` checked: None (the logits) or the layer whose input residual stream is expanded."""
    if layer is None:
        return None
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n_layers:
        raise ExperimentError(
            f"path_terms: layer={layer!r}; give None (the logits) or an int in [0, {n_layers}] "
            f"(the residual stream entering that layer; {n_layers}: the final one)"
        )
    return layer


def path_terms(
    circuit: Circuit,
    pos: int = -1,
    order: int = 1,
    layer: int | None = None,
    tokens=None,
    *,
    uncapped: bool = False,
    device: torch.device | str | None = None,
) -> PathTerms:
    """The logits at ``pos`` as an Add ``'path_terms'`` of one node per direct path (see the module).

    ``circuit``: a batched model circuit the builders make (GPT-2, attention-only, Llama), heads split
    or not (unsplit layers are split here).  The sum equals the logits at ``pos`` on the clean inputs;
    ``ex.zero_ablate(result.terms, 'path.L1H2')`` drops one head's direct path.  ``order=2`` also
    writes each head's Q, K and V inputs as sums of named terms, one per source
    (``'path.L1H1.k.L0H2'``: head 0.2 composing into head 1.1's keys); ``order=3`` expands those
    head sources in turn, and so on (``experiments.composition``).  ``layer=L`` expands the
    residual stream entering layer ``L`` (``Point('resid_pre', L)``; ``L = n_layers``: the final
    residual) at ``pos`` instead of the logits: ``[batch, d_model]`` terms, no norm, no bias term.
    ``tokens`` (vocabulary ids) keeps only those logits, in that order: ``[batch, len(tokens)]``
    terms, each reading only those rows of the unembedding (much cheaper with a large vocabulary).
    A model that soft-caps its logits (Gemma 2) is refused unless ``uncapped=True``: the terms then
    sum to the logits before the cap (``'t.unembed'``, plus the unembedding bias if any).
    ``device``: where the frozen scales are computed (as ``cc.evaluate``'s; None: where the circuit's
    Arrays are); the Arrays made here (the scales, the centring matrix) live there, so evaluate the
    terms there too (``cc.evaluate(result.terms, device=device)``)."""
    check_node(circuit, "the model circuit", ExperimentError)
    device = check_device(device, "path_terms", ExperimentError)
    if isinstance(order, bool) or not isinstance(order, int) or order < 1:
        raise ExperimentError(f"path_terms: order={order!r}; give an int >= 1 (1: direct paths only)")
    facts = residual.model_facts(circuit)
    if not facts.batched:
        raise ExperimentError("path_terms needs a batched circuit (tokens [batch, positions])")
    layer = _layer(layer, facts.n_layers)
    if layer is None:
        residual.check_uncapped(facts, uncapped, "path_terms")
    unsplit = [other for other in range(facts.n_layers) if other not in facts.split_heads]
    if unsplit:
        circuit = split_heads(circuit, unsplit)
        facts = residual.model_facts(circuit)
    model = _Model(circuit, facts, order, device)
    batch, seq, vocab = model.point("logits").shape
    pos = _position(pos, seq)
    tokens = _tokens(tokens, vocab)
    if tokens is not None and layer is not None:
        raise ExperimentError(
            "path_terms: tokens= selects logits; it does not apply with layer= (the residual)"
        )
    read = _readout(model, model.scale("ln_final_scale").reshape(batch, seq)[:, pos], tokens)
    parts = _components(model)
    layers = range(1, facts.n_layers) if order > 1 else range(0)
    compositions = Compositions(
        circuit,
        facts,
        lambda below: _below(parts, below),
        {other: model.scale("ln1_scale", other) for other in layers},
        {other: read_norm(model.point("ln1", other)) for other in layers},
    )
    terms, labels = [], []
    for label, node in parts if layer is None else _below(parts, layer):
        head = head_of(label)
        if head is not None and order > 1:
            node = compositions.expand(*head, f"path.{label}", order)
        at_pos = _at_pos(node, pos, seq)
        terms.append(_term(label, *at_pos, read) if layer is None else _residual_term(label, *at_pos, batch))
        labels.append(label)
    if layer is None:
        terms.append(_bias_term(model, batch, vocab, tokens))
        labels.append("bias")
    return PathTerms(Add(*terms, name="path_terms"), labels, circuit, compositions.labels)
