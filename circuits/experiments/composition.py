"""Head composition terms: a head's query, key and value inputs as sums of named source terms.

A head of layer ``L`` reads the residual stream through its layer's attention norm.  With that
norm's scale frozen at the clean run's value (the one approximation, as for the final norm in
``path_terms``), the norm is linear, so its output is exactly the sum of the normed *sources* the
residual stream is made of: the embeddings, every earlier head, attention bias and MLP, plus the
norm's own bias.  ``Compositions.expand`` rebuilds one head with each of its Q, K and V inputs
replaced by an ``Add`` ``'{prefix}.q'`` (``.k``, ``.v``) of one named node per source, e.g.
``'path.L1H1.k.L0H2'``: zero-ablating that node removes head 0.2's K-composition into head 1.1
and nothing else.  Head sources of layer 1 and above are expanded again, with a longer prefix,
while ``order`` allows.  docs/path_terms.md.
"""

from __future__ import annotations

from typing import Callable

import torch

from circuits.transformer import names
from circuits.errors import ExperimentError
from circuits.transformer.points import Point
from circuits.experiments.stream import Norm
from circuits.rewriting.matching import IterativeMatcher, Matcher
from circuits.core.nodes import Add, Array, Circuit, Einsum, Scalar
from circuits.rewriting.rewrite import update

__all__ = ["Compositions", "head_of"]

#: Each role and the nodes that read the layer's norm for it (grouped-query heads, split, read
#: their key/value group's ``'a.k_kv'``, ``'a.v_kv'``).
_ROLES = {"q": (names.Q,), "k": (names.K, names.K_KV), "v": (names.V, names.V_KV)}

#: ``layer -> [(label, node)]``: the residual stream's sources below a layer (``'embed'``, ``'L0H2'``...).
Sources = Callable[[int], list[tuple[str, Circuit]]]


def _axes(node: Circuit) -> str:
    """``node``'s einsum axes among batch ``b``, position ``s`` and model ``d``: a head or MLP
    output ``[b,s,d]``, a position embedding ``[s,d]`` shared by the batch, a bias ``[d]``."""
    return "bsd"[3 - node.rank :]


def head_of(label: str) -> tuple[int, int] | None:
    """``'L3H1'`` -> ``(3, 1)``; any other source label -> None."""
    layer, _, head = label[1:].partition("H")
    return (int(layer), int(head)) if label[:1] == "L" and layer.isdigit() and head.isdigit() else None


class Compositions:
    """Expands heads of one model circuit (heads split, batched), sharing what heads have in common:
    each layer's frozen norm scale (evaluated once, in one run) and each normed source (built once
    per layer, so the evaluator computes it once for every head and role that reads it)."""

    def __init__(
        self,
        circuit: Circuit,
        facts,
        sources: Sources,
        scales: dict[int, torch.Tensor],
        norms: dict[int, Norm],
    ):
        """``sources(layer)``: the residual stream's parts below ``layer``; ``scales``: each layer's
        attention-norm scale on the clean inputs, ``[batch, pos]``; ``norms``: each layer's
        attention norm as the circuit's nodes (its weight node: Gemma's ``1 + w``)."""
        self.circuit, self.facts, self.sources, self.norms = circuit, facts, sources, norms
        self.heads = {head_of(label): node for label, node in sources(facts.n_layers) if head_of(label)}
        self.scales = {
            layer: Array(value.detach(), name=f"path.frozen_ln{layer}_scale")
            for layer, value in scales.items()
        }
        self._normed: dict[tuple[int, bytes], Circuit] = {}
        self._positions: Circuit | None = None
        self.labels: list[str] = []

    def _weights(self, layer: int) -> tuple[Circuit, Circuit | None]:
        """Layer ``layer``'s attention-norm weight and bias (RMSNorm: None), the circuit's own nodes."""
        return self.norms[layer].weight, self.norms[layer].bias

    def _normed_source(self, layer: int, source: Circuit) -> Circuit:
        """``source`` through layer ``layer``'s norm, scale frozen, ``[b,s,d]``: ``(x - mean(x)) *
        scale * w`` (RMSNorm: ``x * scale * w``); the mean is a second einsum (a ``d x d``
        centring matrix would cost ``d`` times more)."""
        key = (layer, source.hash)
        if key not in self._normed:
            scale, (weight, _) = self.scales[layer], self._weights(layer)
            axes = _axes(source)
            normed = Einsum((source, axes), (scale, "bs"), (weight, "d"), out_axes="bsd")
            if self.norms[layer].centred:
                d_model = source.shape[-1]
                neg_mean = Scalar(-1.0 / d_model, shape=(d_model,), name="path.neg_mean")
                mean_axes = axes.replace("d", "e")
                shift = Einsum(
                    (source, mean_axes), (neg_mean, "e"), (scale, "bs"), (weight, "d"), out_axes="bsd"
                )
                normed = Add(normed, shift)
            self._normed[key] = normed
        return self._normed[key]

    def _term(self, node: Circuit, name: str) -> Circuit:
        """A named node of ``node``'s value (an Add of one: the evaluator returns its child's
        tensor, no copy), so each head and role has its own node to ablate while the shared
        normed source is computed once."""
        self.labels.append(name.removeprefix("path."))
        return Add(node, name=name)

    def _role_terms(self, layer: int, prefix: str, order: int) -> list[Circuit]:
        """One role's named terms: each source (heads of layer >= 1 expanded while ``order``
        allows), normed, then the norm's bias."""
        terms = []
        for label, source in self.sources(layer):
            parsed = head_of(label)
            if parsed is not None and order > 2:
                source = self.expand(*parsed, f"{prefix}.{label}", order - 1)
            terms.append(self._term(self._normed_source(layer, source), f"{prefix}.{label}"))
        _, bias = self._weights(layer)
        if bias is not None:
            terms.append(self._term(bias, f"{prefix}.ln_bias"))
        return terms

    def expand(self, layer: int, head: int, prefix: str, order: int) -> Circuit:
        """Head ``layer.head``'s output with its Q, K and V inputs expanded into named terms
        ``'{prefix}.q.{source}'`` (see the module).  ``order`` 2 expands one step; each further
        order expands the head sources too.  Layer 0 heads read no head and come back as they are.
        The recursion is over ``order``, so never deeper than the model has layers."""
        node = self.heads[(layer, head)]
        if order < 2 or layer == 0:
            return node
        # Searches stop at the norm and at the roles already expanded: below those are other
        # layers' heads, whose own 'a.q', 'a.k', 'a.v' must not be touched.
        stops = Matcher.any(names.attn_norm(layer), *(f"{prefix}.{role}" for role in _ROLES))
        for role, readers in _ROLES.items():
            terms = self._role_terms(layer, f"{prefix}.{role}", order)
            reads = IterativeMatcher(Matcher.any(*readers), term_early_at=stops)
            target = names.attn_norm(layer)
            if role != "v" and node.get(reads.then(names.QK_INPUT, stop_at_match=True, term_early_at=stops)):
                # attention-only models add the position embedding to Q and K after the norm
                target = names.QK_INPUT
                terms.append(self._term(self._pos_embed(), f"{prefix}.{role}.pos_embed"))
            path = reads.then(target, stop_at_match=True, term_early_at=stops)
            if not node.get(path):
                raise ExperimentError(
                    f"path_terms: head {layer}.{head}'s {role} input: found no {target!r} below "
                    f"{' or '.join(map(repr, readers))} in {node.describe()}"
                )
            replacement = Add(*terms, name=f"{prefix}.{role}")
            node = update(node, path, lambda _, r=replacement: r)
        return node

    def _pos_embed(self) -> Circuit:
        """The position embeddings attention-only models add to Q and K after the norm."""
        if self._positions is None:
            self._positions = self.circuit.get_unique(Point("pos_embed"))
        return self._positions
