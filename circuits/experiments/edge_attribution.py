"""``edge_attribution``: EAP and EAP-IG scores of every edge of an ``edge_circuit``.

EAP (Syed et al. 2023) estimates what patching one edge changes: the corrupted run's sender output
swapped into one receiver's input, in the clean run.  To first order that is::

    score(s -> r) = (out_s(corrupted) - out_s(clean)) · ∂metric/∂input_r (clean run)

summed over the batch and positions (``per_position=True`` keeps the positions): one plain run on
the corrupted inputs, one tracked run and one backward on the clean inputs.  The sign and the
difference are hannamw/EAP-IG's (``get_scores_eap``: corrupted minus clean, the gradient on the
clean run); EAP-IG's ``attribute`` further divides by the number of examples, which we do not (the
sum over the batch is the estimate of patching every row at once, as ``attribution_patching``).

EAP-IG (Hanna et al. 2024) replaces the one gradient by the mean of ``steps`` gradients along a
path from the corrupted to the clean run:

- ``"eap-ig-inputs"``: the input embeddings (the sender ``'embeds'``) interpolated,
  ``corrupted + k/steps * (clean - corrupted)`` for ``k = 0 .. steps-1``, everything above computed
  from them (hannamw/EAP-IG's ``get_scores_eap_ig``).
- ``"eap-ig-activations"``: for each edge, its sender's *unit* (the embeddings, one layer's heads
  together, or one MLP) set to ``k/steps * clean + (1 - k/steps) * corrupted`` for ``k = 1 ..
  steps``, every other component computed as usual; the receivers above the unit take their
  gradients from those runs.  hannamw/EAP-IG's ``get_scores_ig_activations`` averages each
  receiver's gradient over the interpolations of *every* unit (some of them above the receiver,
  where the fixed unit cuts the gradient's path); ours uses the edge's own sender unit, the
  integrated gradient of the activation the edge carries.

The metric is a function of the logits returning one number (as ``ex.gradients`` takes it) or a
``Metric`` built over the circuit (``logit_diff(..., push_down=False)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import torch

from circuits.core.nodes import Circuit, Index
from circuits.core.traversal import unique_nodes
from circuits.errors import ExperimentError
from circuits.evaluation import compile_plan, evaluate_many
from circuits.experiments.discovery_metric import one_number
from circuits.experiments.edges import Edge, EdgeCircuit, edge_circuit
from circuits.experiments.inputs import same_shape_inputs, with_targets_of
from circuits.experiments.metrics import Metric, find
from circuits.experiments.norm_vjp import NormVJP
from circuits.experiments.tables import records_frame
from circuits.rewriting.rewrite import replace
from circuits.transformer import names

__all__ = ["EDGE_METHODS", "EdgeScores", "edge_attribution"]

EDGE_METHODS = ("eap", "eap-ig-inputs", "eap-ig-activations")


class EdgeScores:
    """Every edge's score: ``edges`` (``Edge``, in ``EdgeCircuit.edges`` order), ``scores``
    (``[edges]``, or ``[edges, positions]`` with ``per_position``), ``metric`` (the clean run's),
    ``method`` and ``steps``.  ``scores_by_name['b0.a.head1->b1.m']``; ``to_pandas()``; ``comment``
    for ``c.print(comment=...)``."""

    def __init__(self, edges: tuple[Edge, ...], scores: torch.Tensor, metric: float, method: str, steps: int):
        self.edges, self.scores, self.metric = edges, scores, metric
        self.method, self.steps = method, steps
        self._index = {edge.name: i for i, edge in enumerate(edges)}

    def __len__(self) -> int:
        return len(self.edges)

    def __repr__(self) -> str:
        return f"EdgeScores({self.method}, {len(self)} edges, metric {self.metric:.6g})"

    def __getitem__(self, name: str) -> torch.Tensor:
        """The score of the edge ``'sender->receiver'``; another name is an ``ExperimentError``."""
        if name not in self._index:
            raise ExperimentError(
                f"EdgeScores: no edge {name!r} (edges are 'sender->receiver', e.g. {self.edges[0].name!r})"
            )
        return self.scores[self._index[name]]

    def top(self, k: int) -> list[tuple[str, float]]:
        """The ``k`` edges of largest absolute score (summed over positions), largest first."""
        total = self.scores.reshape(len(self), -1).sum(-1)
        order = total.abs().argsort(descending=True)[:k]
        return [(self.edges[i].name, float(total[i])) for i in order.tolist()]

    @property
    def records(self) -> list[dict]:
        """One dict per edge (and position): ``edge``, ``sender``, ``receiver``, (``pos``), ``score``."""
        rows = []
        for edge, score in zip(self.edges, self.scores):
            base = {"edge": edge.name, "sender": edge.sender, "receiver": edge.receiver}
            if score.ndim == 0:
                rows.append({**base, "score": float(score)})
            else:
                rows += [{**base, "pos": p, "score": float(v)} for p, v in enumerate(score.tolist())]
        return rows

    def to_pandas(self):
        """``records`` as a pandas DataFrame (pandas is not a dependency: install it to use this)."""
        return records_frame(self.records, "EdgeScores")

    def comment(self, node: Circuit, top: int = 4) -> str | None:
        """For ``c.print(comment=scores.comment)``: on each receiver's input ``'edges->r'`` (the
        unmasked form's ``'edges.normed->r'``), its
        ``top`` senders by absolute score (``'b0.a.head1 +0.0312'``)."""
        prefix = next((p for p in ("edges->", "edges.normed->") if (node.name or "").startswith(p)), None)
        if prefix is None:
            return None
        receiver = node.name.removeprefix(prefix)
        mine = [
            (e.sender, float(self.scores[i].sum()))
            for i, e in enumerate(self.edges)
            if e.receiver == receiver
        ]
        mine.sort(key=lambda pair: -abs(pair[1]))
        return ", ".join(f"{sender} {score:+.4g}" for sender, score in mine[:top]) or None


def edge_attribution(
    circuit: Circuit | EdgeCircuit,
    corrupted_inputs: Mapping[Any, Any],
    metric: Metric | Callable[[torch.Tensor], torch.Tensor],
    *,
    method: str = "eap",
    steps: int = 5,
    per_position: bool = False,
) -> EdgeScores:
    """Every edge's EAP or EAP-IG score (module docstring); ``circuit`` is a model circuit (rewritten
    by ``edge_circuit``) or an ``EdgeCircuit``, on the clean inputs.  ``corrupted_inputs`` maps its
    inputs (``'toks_int_var'``) to values of the same shape.

    >>> scores = ex.edge_attribution(c, {"toks_int_var": corrupted}, lambda logits: logits[:, -1, 7].sum())
    >>> scores.to_pandas().sort_values("score").head()
    """
    if method not in EDGE_METHODS:
        raise ExperimentError(f"edge_attribution: method must be one of {EDGE_METHODS}, got {method!r}")
    if method != "eap" and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 1):
        raise ExperimentError(f"edge_attribution: steps must be a positive int, got {steps!r}")
    edges = circuit if isinstance(circuit, EdgeCircuit) else edge_circuit(circuit, masked=False)
    what = "edge_attribution: corrupted_inputs"
    # unmasked, the senders compute what the model's nodes of their names compute, without the
    # receivers' copies of the norms: the corrupted run is the model's (its heads computed together
    # where edge_circuit kept them so)
    source = edges.circuit if isinstance(circuit, EdgeCircuit) else edges.model
    corrupted = same_shape_inputs(source, corrupted_inputs, what)
    if corrupted.hash == source.hash:
        raise ExperimentError(f"{what} {list(corrupted_inputs)!r} change nothing: every score would be zero")
    if isinstance(metric, Metric) and metric.targets == "corrupted":  # it scores the corrupted next tokens
        edges = dataclasses.replace(edges, circuit=with_targets_of(edges.circuit, corrupted, what))
    run = _Runs(edges, metric)
    with torch.no_grad():
        corrupted_out = run.senders(corrupted)
    clean = run.tracked()
    clean_out = [value.detach() for value in clean.senders]
    diff = torch.empty((len(clean_out), *clean_out[0].shape), dtype=clean_out[0].dtype)
    for row, (after, before) in enumerate(zip(corrupted_out, clean_out)):  # no stacked copies
        torch.sub(after, before, out=diff[row])
    if method == "eap":
        grads = clean.grads()
    elif method == "eap-ig-inputs":
        grads = _ig_inputs(run, clean_out, corrupted_out, steps)
    else:
        grads = _ig_activations(run, clean_out, corrupted_out, steps)
    scores = _scores(edges, diff, grads, per_position)
    return EdgeScores(
        edges.edges, scores, float(clean.metric.detach()), method, 1 if method == "eap" else steps
    )


class _Tracked:
    """One tracked run: the metric, the senders' values, each receiver input's value and (the
    unmasked form) per shared norm its stream's and output's values, its receivers' indices and
    its closed-form product with the run's scale (None: autograd's product)."""

    def __init__(self, metric: torch.Tensor, senders: list, inputs: list, norms: list):
        self.metric, self.senders, self.inputs, self.norms = metric, senders, inputs, norms

    def grads(self) -> list[torch.Tensor | None]:
        """``∂metric/∂input`` per receiver (zeros where the metric does not depend on it; None for a
        receiver the run did not compute: one below a sender whose value was given); in the
        unmasked form, carried through each shared norm to the stream it reads."""
        computed = [x for x in self.inputs if x is not None]
        retain = any(closed is None for *_, closed in self.norms)  # autograd's products follow
        found = iter(torch.autograd.grad(self.metric, computed, allow_unused=True, retain_graph=retain))
        grads = [None if x is None else next(found) for x in self.inputs]
        grads = [g if x is None or g is not None else torch.zeros_like(x) for x, g in zip(self.inputs, grads)]
        for stream, output, readers, closed in self.norms:
            readers = [i for i in readers if grads[i] is not None]
            if closed is not None and readers:
                vjp, rsqrt = closed
                through = vjp(torch.stack([grads[i] for i in readers]), stream, rsqrt)
                for k, i in enumerate(readers):
                    grads[i] = through[k]
                continue
            for i in readers:  # one product per receiver: faster on a CPU than vmap's batched one
                (grads[i],) = torch.autograd.grad(output, stream, grads[i], retain_graph=True)
        return grads


class _Runs:
    """The runs of one attribution: the metric's root over the edge circuit, the receivers tracked."""

    def __init__(self, edges: EdgeCircuit, metric: Any):
        self.edges, self.metric = edges, metric
        if isinstance(metric, Metric):
            self.root = _narrowed(metric.circuit(edges.circuit), edges)
        elif callable(metric):
            self.root = find(
                edges.circuit, names.LOGITS, "edge_attribution: a metric function takes the logits"
            )
        else:
            raise ExperimentError(
                f"edge_attribution: metric must be a Metric or a function of the logits, got {metric!r}"
            )
        present = {node.hash for node in unique_nodes([self.root])}
        missing = [r.name for r in edges.receivers if r.input.hash not in present]
        if missing:
            raise ExperimentError(
                f"edge_attribution: metric {getattr(metric, 'name', metric)!r} does not read the receivers "
                f"{missing[:4]} of the edge circuit (a Metric that pushes an Index down, such as logit_diff, "
                "needs push_down=False here)"
            )
        self.receiver_hashes = {r.input.hash: i for i, r in enumerate(edges.receivers)}
        #: the unmasked form's shared norms (by hash): the stream each reads and its receivers
        self.norms: dict[bytes, tuple[bytes, list[int], NormVJP | None]] = {}
        for i, receiver in enumerate(edges.receivers):
            if receiver.norm is not None and receiver.norm.hash not in self.norms:
                vjp = NormVJP.of(receiver.norm, receiver.stream)
                self.norms[receiver.norm.hash] = (receiver.stream.hash, [], vjp)
            if receiver.norm is not None:
                self.norms[receiver.norm.hash][1].append(i)
        self.stream_hashes = {stream for stream, _, _ in self.norms.values()}
        self.rsqrt_hashes = {vjp.rsqrt.hash for _, _, vjp in self.norms.values() if vjp is not None}
        self.sender_hashes = {node.hash: i for i, node in enumerate(edges.sender_nodes)}

    def senders(self, circuit: Circuit) -> list[torch.Tensor]:
        """Every sender's value in ``circuit``'s run (found by name), in sender order."""
        wanted = set(self.edges.senders)
        found: dict[str, list[Circuit]] = {}
        for node in unique_nodes([circuit]):
            if node.name in wanted:
                found.setdefault(node.name, []).append(node)
        if any(len(found.get(name, ())) != 1 for name in wanted):
            raise ExperimentError(f"edge_attribution: {circuit.describe()} has no one node per sender name")
        return evaluate_many([found[name][0] for name in self.edges.senders])

    def tracked(self, known: Mapping[Circuit, torch.Tensor] | None = None) -> _Tracked:
        """The clean run with every receiver input's value (the unmasked form: every shared norm's
        stream) in the autograd graph."""
        inputs: list[Any] = [None] * len(self.edges.receivers)
        senders: list[Any] = [None] * len(self.edges.senders)
        norms: dict[bytes, Any] = {}
        tracked = self.stream_hashes if self.norms else self.receiver_hashes

        def kernel(node: Circuit, default: Callable) -> Callable:
            return _tracked(default) if node.hash in tracked else default

        def on_value(node: Circuit, value: torch.Tensor) -> None:
            if node.hash in self.receiver_hashes:
                inputs[self.receiver_hashes[node.hash]] = value
            if node.hash in self.sender_hashes:
                senders[self.sender_hashes[node.hash]] = value
            if node.hash in self.stream_hashes or node.hash in self.norms or node.hash in self.rsqrt_hashes:
                norms[node.hash] = value

        given = {node: value.detach().requires_grad_() for node, value in (known or {}).items()}
        with torch.enable_grad():
            value = compile_plan([self.root], known=given, kernel=kernel).run(on_value=on_value)[0]
            number = value if isinstance(self.metric, Metric) else self.metric(value)
        for node, value in given.items():  # a given stream is no value of the run's
            if node.hash in self.stream_hashes:
                norms[node.hash] = value
        shared = []
        for norm, (stream, readers, vjp) in self.norms.items():
            if norm in norms and stream in norms:
                rsqrt = None if vjp is None else norms.get(vjp.rsqrt.hash)
                closed = (vjp, rsqrt) if vjp is not None and vjp.accepts(norms[stream], rsqrt) else None
                shared.append((norms[stream], norms[norm], readers, closed))
        return _Tracked(_checked_number(number, self.metric), senders, inputs, shared)


def _narrowed(root: Circuit, edges: EdgeCircuit) -> Circuit:
    """``root`` with the metric's own Index nodes (a position of the logits, as ``logit_diff``'s)
    pushed down to the receivers' inputs, which stay whole: the unembedding and the final norm then
    run, forward and backward, for the measured positions only; the receivers' values and
    gradients are unchanged (the gradient is zero at every other position)."""
    from circuits.passes import push_index

    model = {node.hash for node in unique_nodes([edges.circuit])}
    stops = [r.input for r in edges.receivers] + list(edges.sender_nodes)
    pushed = {
        node: push_index(node, stop_at=stops)
        for node in unique_nodes([root])
        if isinstance(node, Index) and node.hash not in model
    }
    return replace(root, pushed) if pushed else root


def _tracked(default: Callable) -> Callable:
    def tracked(*arguments: torch.Tensor) -> torch.Tensor:
        value = default(*arguments)
        return value if value.requires_grad else value.detach().requires_grad_()

    return tracked


def _checked_number(value: Any, metric: Any) -> torch.Tensor:
    one_number(value, "edge_attribution")
    if not value.requires_grad:
        raise ExperimentError(
            f"edge_attribution: metric {getattr(metric, 'name', metric)!r} does not depend on the edges (its "
            "value is outside the autograd graph): compute it from the logits it is given, with torch operations"
        )
    return value.reshape(())


def _ig_inputs(run: _Runs, clean: list, corrupted: list, steps: int) -> list[torch.Tensor]:
    """The mean over ``k = 0 .. steps-1`` of the receivers' gradients with the embeddings at
    ``corrupted + k/steps (clean - corrupted)``."""
    embeds = run.edges.sender_nodes[0]
    total = None
    for k in range(steps):
        value = corrupted[0] + (k / steps) * (clean[0] - corrupted[0])
        grads = run.tracked({embeds: value}).grads()
        total = grads if total is None else [t + g for t, g in zip(total, grads)]
    return [t / steps for t in total]


def _units(edges: EdgeCircuit) -> list[list[int]]:
    """The senders grouped in units (the embeddings, each layer's heads, each MLP): sender indices."""
    units: list[list[int]] = []
    previous = None
    for index, name in enumerate(edges.senders):
        parsed = names.parse(name)
        key = (parsed.kind, parsed.layer) if parsed is not None and parsed.kind == "head" else name
        if key != previous:
            units.append([])
        units[-1].append(index)
        previous = key
    return units


def _ig_activations(run: _Runs, clean: list, corrupted: list, steps: int) -> dict:
    """Per unit of senders, the mean over ``k = 1 .. steps`` of the gradients of the receivers reading
    it, with the unit's senders at ``k/steps clean + (1 - k/steps) corrupted``: ``{unit: {receiver
    index: gradient}}``."""
    edges, per_unit = run.edges, {}
    for unit in _units(edges):
        readers = [i for i, r in enumerate(edges.receivers) if r.n_senders > unit[0]]
        total: list[torch.Tensor] | None = None
        for k in range(1, steps + 1):
            alpha = k / steps
            known = {edges.sender_nodes[s]: alpha * clean[s] + (1 - alpha) * corrupted[s] for s in unit}
            grads = run.tracked(known).grads()
            total = grads if total is None else [None if g is None else t + g for t, g in zip(total, grads)]
        per_unit[tuple(unit)] = {i: total[i] / steps for i in readers}
    return per_unit


def _scores(edges: EdgeCircuit, diff: torch.Tensor, grads: list | dict, per_position: bool) -> torch.Tensor:
    """``diff_s · grad_r`` per edge, summed over every axis but the positions (with ``per_position``),
    as matrix products over blocks of senders and receivers.  ``grads``: one per receiver, or (the
    activations IG) ``{unit: {receiver: gradient}}``."""
    receivers = edges.receivers
    shape = (diff.shape[0], len(receivers)) + ((diff.shape[-2],) if per_position else ())
    table = torch.zeros(shape, dtype=diff.dtype)
    if isinstance(grads, dict):
        blocks = [(list(unit), sorted(by_receiver), by_receiver) for unit, by_receiver in grads.items()]
    else:
        by_count: dict[int, list[int]] = {}
        for i, receiver in enumerate(receivers):
            by_count.setdefault(receiver.n_senders, []).append(i)
        blocks = [(list(range(n)), readers, dict(enumerate(grads))) for n, readers in by_count.items()]
    for senders, readers, by_receiver in blocks:
        if readers:
            first, end = senders[0], senders[-1] + 1  # the senders are contiguous: a view, no copy
            block = _dot(diff[first:end], _stacked([by_receiver[i] for i in readers]), per_position)
            table[first:end][:, readers] = block
    return torch.cat([table[: r.n_senders, i] for i, r in enumerate(receivers)])


def _stacked(grads: list[torch.Tensor]) -> torch.Tensor:
    """``torch.stack(grads)``, without the copy where they are already consecutive rows of one
    tensor (the gradients a shared norm's product gave)."""
    base = grads[0]._base
    if base is not None and base.shape[1:] == grads[0].shape and base.stride()[1:] == grads[0].stride():
        step, start = base.stride(0), grads[0].storage_offset()
        rows = range(start, start + step * len(grads), step)
        if all(g._base is base and g.storage_offset() == row for g, row in zip(grads, rows)):
            return base.narrow(0, (start - base.storage_offset()) // step, len(grads))
    return torch.stack(grads)


def _dot(senders: torch.Tensor, grads: torch.Tensor, per_position: bool) -> torch.Tensor:
    """``[senders, receivers]`` (``[senders, receivers, positions]``): each pair's product summed
    over every axis (but the positions, the second to last)."""
    if not per_position:
        return senders.reshape(senders.shape[0], -1) @ grads.reshape(grads.shape[0], -1).T
    s = senders.movedim(-2, 0).reshape(senders.shape[-2], senders.shape[0], -1)
    g = grads.movedim(-2, 0).reshape(grads.shape[-2], grads.shape[0], -1)
    return torch.bmm(s, g.transpose(1, 2)).permute(1, 2, 0)
