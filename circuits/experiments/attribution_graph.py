"""Attribution graphs: circuit-tracer's direct effects between features, errors, tokens and logits.

``attribution_graph(circuit, transcoders)`` builds the local replacement model
(``frozen_replacement``: attention patterns and norm scales frozen, a transcoder per layer, errors
constant) and measures, by backward passes through it, the adjacency ``A[target, source]``: the
direct effect of each source on each target, every path through the frozen attention and norms but
through no other node.

- Nodes, in circuit-tracer's ``Graph`` order: the active features (``(layer, pos, feature)``,
  sorted; position 0 has none), the error nodes (``layer * n_pos + pos``), the token embeddings (one
  per position) and the logits (the most probable tokens at the last position, up to
  ``max_n_logits``, until their probability reaches ``desired_logit_prob``).
- A feature's value as a source is its activation times its decoder row; as a target, its
  pre-activation (the encoder row on what the transcoder reads).  A logit's value as a target is
  the logit minus the mean logit, before any soft-cap (the unembedding rows, demeaned).
- Rows are the targets (features, logits); the error and token rows are zero (nothing points to
  them).

The frozen circuit is linear in the sources, so a column of ``A`` is what setting that source to
zero takes away from every target in the frozen circuit (the tests check that, against
circuit-tracer's own adjacency too).  Pruning and export: ``circuits.experiments.graph_prune`` and
``graph_json``.  docs/features.md.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import torch

from circuits.core.nodes import Circuit, check_node
from circuits.errors import ExperimentError
from circuits.evaluation import compile_plan
from circuits.experiments.attribution_freeze import FrozenReplacement, frozen_replacement
from circuits.experiments.graph_json import graph_json
from circuits.experiments.graph_prune import PrunedGraph, prune_graph
from circuits.experiments.inputs import with_inputs
from circuits.transformer import names

__all__ = ["AttributionGraph", "attribution_graph"]


@dataclasses.dataclass(frozen=True, eq=False)
class AttributionGraph:
    """One prompt's attribution graph, as circuit-tracer's ``Graph`` holds it: ``input_tokens``
    ``[pos]``, ``logit_tokens`` and ``logit_probabilities`` ``[n_logits]``, ``active_features``
    ``[n_features, 3]`` (layer, pos, feature index), ``activation_values`` ``[n_features]``,
    ``adjacency_matrix`` ``[nodes, nodes]`` (``A[target, source]``), ``n_layers``; ``replacement``,
    the frozen circuit it was measured on."""

    input_tokens: torch.Tensor
    logit_tokens: torch.Tensor
    logit_probabilities: torch.Tensor
    active_features: torch.Tensor
    activation_values: torch.Tensor
    adjacency_matrix: torch.Tensor
    n_layers: int
    replacement: FrozenReplacement = dataclasses.field(repr=False)

    @property
    def n_pos(self) -> int:
        return int(self.input_tokens.shape[0])

    @property
    def n_features(self) -> int:
        return int(self.active_features.shape[0])

    @property
    def selected_features(self) -> torch.Tensor:
        """Indices into ``active_features`` of the feature nodes: all of them (circuit-tracer's field)."""
        return torch.arange(self.n_features)

    def error_index(self, layer: int, pos: int) -> int:
        """The node index of layer ``layer``'s error at ``pos``."""
        return self.n_features + layer * self.n_pos + pos

    def token_index(self, pos: int) -> int:
        """The node index of the token embedding at ``pos``."""
        return self.n_features + self.n_layers * self.n_pos + pos

    @property
    def logit_offset(self) -> int:
        """The node index of the first logit node."""
        return self.n_features + (self.n_layers + 1) * self.n_pos

    @property
    def nodes(self) -> list[tuple[str, int | None, int, int | None]]:
        """Every node in adjacency order as ``(kind, layer, pos, feature)``: ``('feature', L, pos,
        index)``, ``('error', L, pos, None)``, ``('embedding', None, pos, token)``, ``('logit', None,
        last pos, token)`` (the records circuit-tracer's graph JSON is written from)."""
        rows: list[tuple[str, int | None, int, int | None]] = []
        rows += [("feature", layer, pos, feature) for layer, pos, feature in self.active_features.tolist()]
        rows += [("error", layer, pos, None) for layer in range(self.n_layers) for pos in range(self.n_pos)]
        rows += [("embedding", None, pos, token) for pos, token in enumerate(self.input_tokens.tolist())]
        rows += [("logit", None, self.n_pos - 1, token) for token in self.logit_tokens.tolist()]
        return rows

    def prune(self, node_threshold: float = 0.8, edge_threshold: float = 0.98) -> PrunedGraph:
        """The nodes and edges circuit-tracer's ``prune_graph`` keeps (``graph_prune.prune_graph``)."""
        return prune_graph(
            self.adjacency_matrix,
            self.logit_probabilities,
            n_features=self.n_features,
            n_tokens=self.n_pos,
            node_threshold=node_threshold,
            edge_threshold=edge_threshold,
        )

    def to_json(
        self,
        *,
        slug: str,
        scan: str,
        prompt_tokens: Sequence[str] | None = None,
        logit_tokens: Sequence[str] | None = None,
        node_threshold: float = 0.8,
        edge_threshold: float = 0.98,
        **options: Any,
    ) -> dict[str, Any]:
        """The graph pruned at the thresholds, as circuit-tracer's graph JSON (``graph_json.graph_json``,
        which takes ``options``: ``prompt``, ``transcoder_list``); ``prompt_tokens`` and
        ``logit_tokens`` are the tokens as text (default: their ids)."""
        pruned = self.prune(node_threshold, edge_threshold)
        return graph_json(
            self.nodes,
            self.adjacency_matrix,
            node_mask=pruned.node_mask,
            edge_mask=pruned.edge_mask,
            cumulative_scores=pruned.cumulative_scores,
            activations=self.activation_values[self.selected_features].tolist(),
            prompt_tokens=prompt_tokens or [str(t) for t in self.input_tokens.tolist()],
            logit_tokens=logit_tokens or [str(t) for t in self.logit_tokens.tolist()],
            logit_probabilities=self.logit_probabilities,
            n_layers=self.n_layers,
            slug=slug,
            scan=scan,
            node_threshold=node_threshold,
            **options,
        )

    def node_label(self, index: int) -> str:
        """``'feature L1 pos3 #17'``, ``'error L0 pos2'``, ``'token pos0'``, ``'logit 42'``."""
        if not 0 <= index < self.adjacency_matrix.shape[0]:
            raise ExperimentError(
                f"node_label: index {index} is outside [0, {self.adjacency_matrix.shape[0]})"
            )
        if index < self.n_features:
            layer, pos, feature = self.active_features[index].tolist()
            return f"feature L{layer} pos{pos} #{feature}"
        if index < self.logit_offset - self.n_pos:
            layer, pos = divmod(index - self.n_features, self.n_pos)
            return f"error L{layer} pos{pos}"
        if index < self.logit_offset:
            return f"token pos{index - self.logit_offset + self.n_pos}"
        return f"logit {int(self.logit_tokens[index - self.logit_offset])}"


def attribution_graph(
    circuit: Circuit,
    transcoders: Sequence[Any],
    *,
    tokens: Any = None,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    batch_size: int = 128,
    skip_first_position: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> AttributionGraph:
    """The attribution graph of ``circuit`` (a model circuit of one prompt; ``tokens``, ``[1, n]``
    or ``[n]``, run it on others of its shape) with ``transcoders`` (one per layer, as
    ``frozen_replacement`` takes them); module docstring.  ``batch_size`` targets share one
    backward pass; ``device``, ``dtype``: of the runs (float64 for exact checks)."""
    check_node(circuit, "attribution_graph: circuit", ExperimentError)
    _check_options(max_n_logits, desired_logit_prob, batch_size)
    circuit = _on_tokens(circuit, tokens)
    frozen = frozen_replacement(
        circuit, transcoders, skip_first_position=skip_first_position, device=device, dtype=dtype
    )
    active, values = _active_features(frozen)
    logit_ids, probabilities = _salient_logits(frozen.logits_value[0, -1], max_n_logits, desired_logit_prob)
    run = _TrackedRun(frozen, active, values, device, dtype)
    unembed = frozen.unembed.evaluate(device=device, dtype=dtype).detach()
    logit_vectors = unembed[logit_ids] - unembed.mean(0)
    targets = [(0, frozen.n_pos - 1, vector) for vector in logit_vectors]
    for layer, pos, feature in active.tolist():
        targets.append((layer + 1, pos, frozen.transcoders[layer].W_enc[:, feature]))
    adjacency = run.tokens.new_zeros((run.n_columns + len(logit_ids),) * 2)
    # rows in the graph's order: the features' first, the logits' last (targets lists the logits first)
    order = torch.cat([torch.arange(len(logit_ids)) + run.n_columns, torch.arange(len(active))]).to(
        adjacency.device
    )
    for start in range(0, len(targets), batch_size):
        adjacency[order[start : start + batch_size], : run.n_columns] = run.rows(
            targets[start : start + batch_size]
        )
    return AttributionGraph(
        input_tokens=frozen.input_tokens,
        logit_tokens=logit_ids,
        logit_probabilities=probabilities,
        active_features=active,
        activation_values=values,
        adjacency_matrix=adjacency,
        n_layers=frozen.n_layers,
        replacement=frozen,
    )


def _active_features(frozen: FrozenReplacement) -> tuple[torch.Tensor, torch.Tensor]:
    """``[n, 3]`` (layer, pos, feature) of every nonzero activation, sorted, and the activations
    (each layer's transcoder may have its own width)."""
    active, values = [], []
    for layer, node in enumerate(frozen.acts):
        acts = node.value[0]
        found = acts.nonzero()
        active.append(torch.cat([torch.full_like(found[:, :1], layer), found], dim=1))
        values.append(acts[found[:, 0], found[:, 1]])
    return torch.cat(active), torch.cat(values)


def _check_options(max_n_logits: Any, desired_logit_prob: Any, batch_size: Any) -> None:
    for value, what in ((max_n_logits, "max_n_logits"), (batch_size, "batch_size")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ExperimentError(f"attribution_graph: {what} must be a positive int, got {value!r}")
    if isinstance(desired_logit_prob, bool) or not isinstance(desired_logit_prob, (int, float)):
        raise ExperimentError(
            f"attribution_graph: desired_logit_prob must be a number, got {desired_logit_prob!r}"
        )
    if not 0 < desired_logit_prob <= 1:
        raise ExperimentError(
            f"attribution_graph: desired_logit_prob must be in (0, 1], got {desired_logit_prob!r}"
        )


def _on_tokens(circuit: Circuit, tokens: Any) -> Circuit:
    """``circuit`` on ``tokens`` (``[1, n]``, or ``[n]``, like its token Array ``[1, n]``)."""
    if tokens is None:
        return circuit
    found = circuit.get(names.TOKENS)
    token_array = next(iter(found)) if len(found) == 1 else None
    if token_array is None or token_array.rank != 2 or token_array.shape[0] != 1:
        raise ExperimentError(
            f"attribution_graph: tokens were given, but the circuit has no token Array {names.TOKENS!r} "
            "of shape [1, n] to put them in"
        )
    try:
        value = torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError):
        value = torch.empty(0)
    value = value[None] if value.dim() == 1 else value
    if (
        value.is_floating_point()
        or value.dtype == torch.bool
        or tuple(value.shape) != tuple(token_array.shape)
    ):
        raise ExperimentError(
            f"attribution_graph: tokens of shape {list(value.shape)} ({value.dtype}); the circuit takes "
            f"integer tokens of shape {list(token_array.shape)} (one prompt)"
        )
    return with_inputs(circuit, {names.TOKENS: value.to(torch.int64)}, what="attribution_graph: tokens")[0]


def _salient_logits(logits: torch.Tensor, max_n_logits: int, desired_prob: float):
    """circuit-tracer's ``_from_salient``: the most probable tokens, up to ``max_n_logits``, until
    their cumulative probability reaches ``desired_prob`` (that token included)."""
    probs = torch.softmax(logits, dim=-1)
    top_p, top_idx = torch.topk(probs, min(max_n_logits, probs.shape[-1]))
    cutoff = int(torch.searchsorted(torch.cumsum(top_p, 0), desired_prob)) + 1
    return top_idx[:cutoff], top_p[:cutoff]


class _TrackedRun:
    """One evaluation of the frozen circuit with the sources (token embeddings, each layer's write)
    in autograd, and the rows of targets from backward passes over it: each target a cotangent
    (its direction at one position of one output), a batch of them through one vmapped backward."""

    def __init__(self, frozen: FrozenReplacement, active: torch.Tensor, values: torch.Tensor, device, dtype):
        self.frozen, self.active = frozen, active
        sources = [frozen.token_embeds, *frozen.writes]
        slots = {node.hash: i for i, node in enumerate(sources)}
        self.sources: list[Any] = [None] * len(sources)

        def kernel(node: Circuit, default: Callable) -> Callable:
            return _leaf(default) if node.hash in slots else default

        def keep(node: Circuit, value: torch.Tensor) -> None:
            if node.hash in slots:
                self.sources[slots[node.hash]] = value

        outputs = [frozen.readout_input, *frozen.feature_inputs]
        with torch.enable_grad():
            self.outputs = compile_plan(outputs, None, device, dtype, kernel=kernel).run(on_value=keep)
        self.tokens = self.sources[0].detach()[0]
        self.errors = [node.value.to(self.tokens)[0] for node in frozen.errors]
        decoders = [site.W_dec.to(self.tokens) for site in frozen.transcoders]
        self.by_layer = [
            _Decoders(active, values, layer, decoder, frozen.n_pos) for layer, decoder in enumerate(decoders)
        ]
        self.n_columns = len(active) + (frozen.n_layers + 1) * frozen.n_pos

    def rows(self, targets: list[tuple[int, int, torch.Tensor]]) -> torch.Tensor:
        """``[len(targets), n_columns]``: each target ``(output, pos, direction)``'s direct effects."""
        batch = len(targets)
        wanted = sorted({output for output, _, _ in targets})
        cotangents = []
        for output in wanted:
            cotangent = self.outputs[output].new_zeros((batch, *self.outputs[output].shape))
            mine = [(b, pos, vector) for b, (which, pos, vector) in enumerate(targets) if which == output]
            rows, positions = (torch.tensor(column) for column in list(zip(*mine))[:2])
            cotangent[rows, 0, positions] = torch.stack([vector for _, _, vector in mine]).to(cotangent)
            cotangents.append(cotangent)
        grads = torch.autograd.grad(
            [self.outputs[output] for output in wanted],
            self.sources,
            cotangents,
            retain_graph=True,
            allow_unused=True,
            is_grads_batched=True,
        )
        return self._columns(batch, [None if grad is None else grad[:, 0] for grad in grads])

    def _columns(self, batch: int, grads: list[torch.Tensor | None]) -> torch.Tensor:
        """The gradients at the sources, each times its source's value: features, errors, tokens
        (None: a source no target of the batch reads, such as a layer above them all)."""
        n_layers, n_pos = self.frozen.n_layers, self.frozen.n_pos
        row = self.tokens.new_zeros((batch, self.n_columns))
        n_features = len(self.active)
        for layer, grad in enumerate(grads[1:]):
            if grad is None:
                continue
            decoders = self.by_layer[layer]
            if decoders.stop > decoders.start:
                row[:, decoders.start : decoders.stop] = decoders.effects(grad)
            start = n_features + layer * n_pos
            row[:, start : start + n_pos] = torch.einsum("bpd,pd->bp", grad, self.errors[layer])
        if grads[0] is not None:
            row[:, n_features + n_layers * n_pos :] = torch.einsum("bpd,pd->bp", grads[0], self.tokens)
        return row


class _Decoders:
    """One layer's active features as sources: their decoder rows times their activations, held
    by position (``vectors [pos, d_model, most at one position]``, zero-padded) so that their
    effects on a batch are one batched product of the gradients at the layer's output."""

    def __init__(
        self, active: torch.Tensor, values: torch.Tensor, layer: int, decoder: torch.Tensor, n_pos: int
    ):
        mine = (active[:, 0] == layer).nonzero()[:, 0]  # contiguous: the features are sorted by layer
        self.start, self.stop = (int(mine[0]), int(mine[-1]) + 1) if len(mine) else (0, 0)
        positions, features = active[mine, 1], active[mine, 2]
        counts = torch.bincount(positions, minlength=n_pos)
        first = torch.cumsum(counts, 0) - counts
        self.positions, self.slots = (
            positions,
            torch.arange(len(mine), device=active.device) - first[positions],
        )
        widest = int(counts.max()) if len(mine) else 0
        padded = decoder.new_zeros((n_pos, widest, decoder.shape[-1]))
        padded[self.positions, self.slots] = decoder[features] * values[mine, None].to(decoder)
        self.vectors = padded.transpose(1, 2).contiguous()

    def effects(self, grad: torch.Tensor) -> torch.Tensor:
        """``[batch, features]``: the gradient ``grad [batch, pos, d_model]`` at each feature's
        position times its vector."""
        per_position = torch.bmm(grad.transpose(0, 1), self.vectors)  # [pos, batch, widest]
        return per_position[self.positions, :, self.slots].T


def _leaf(default: Callable) -> Callable:
    """A kernel whose value is a fresh autograd leaf: gradients stop there and are read there."""

    def leaf(*arguments: torch.Tensor) -> torch.Tensor:
        return default(*arguments).detach().requires_grad_()

    return leaf
