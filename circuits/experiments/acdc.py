"""``acdc``: Automatic Circuit DisCovery (Conmy et al. 2023) over the edges of an ``edge_circuit``.

Greedy pruning from the logits down.  The receivers are visited in reverse topological order
(the reverse of ``EdgeCircuit.receivers``: the logits, the last MLP, the last layer's heads from
the last, value before key before query, ... the first layer's); for each, its senders from the
latest written to the embeddings.  Each edge is tentatively ablated (its mask entry set to 0, so
that the receiver reads the sender's ablated value: ``EdgeCircuit.with_ablation``); with ``m`` the
metric of the circuit so far and ``m'`` with the edge ablated::

    delta = m' - m            (absolute=True: |m' - m|)
    delta < threshold  ->  the edge stays removed, m = m'
    otherwise          ->  it is restored

The metric is one ACDC minimises: ``"kl"`` (KL from the full model's next-token distribution, at
one ``position`` or averaged over all) or a task metric written so that lower is better (a negated
logit difference), or compared by absolute change (``absolute=True``, ACDC's
``abs_value_threshold``).

A component whose output no kept edge reads any more (no path to the logits) has its input edges
removed without a test, as ACDC prunes it: every receiver reading it reads its ablated value, so
its own inputs cannot change the metric.  Such edges are in the result's steps with
``tested=False``.

Each test runs against an ``EdgeState`` (``circuits.experiments.edge_state``): the edge circuit
held as tensors at the current masks, every receiver's input and every sender's value.  Removing
an edge changes its receiver's input by one add; its component is evaluated again and its change
added to the later receivers that read it over a kept edge, up to the metric.  Only the components
on a kept path above the receiver are computed, no masked sum is, and where the metric reads one
position (``"kl"`` at ``position=-1``) a component whose kept readers read that position alone is
evaluated at it alone.  Each edge is tested on its own, in greedy ACDC's order.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping

import torch

from circuits.core.nodes import Circuit
from circuits.errors import ExperimentError, NoCircuitError
from circuits.evaluation.cache import DEFAULT_CACHE_BYTES, Evaluator
from circuits.experiments.discovery_metric import DiscoveryMetric, check_threshold
from circuits.experiments.edge_ablation import ABLATIONS
from circuits.experiments.edge_state import EdgeState, Trial
from circuits.experiments.edges import EdgeCircuit, edge_circuit
from circuits.experiments.tables import records_frame
from circuits.transformer import names

__all__ = ["ACDCResult", "ACDCStep", "acdc"]


@dataclasses.dataclass(frozen=True)
class ACDCStep:
    """One edge in visit order: its ``delta`` (None where it was pruned untested), whether it was
    ``kept``, and the ``metric`` of the circuit after the decision."""

    edge: str
    sender: str
    receiver: str
    tested: bool
    delta: float | None
    kept: bool
    metric: float


class ACDCResult:
    """What ``acdc`` found: ``kept`` (edge names, in ``EdgeCircuit.edges`` order), ``steps`` (every
    edge in visit order), ``masks`` (per receiver, 1 = kept), ``edges`` (the full ``EdgeCircuit`` it
    searched, masks at 1), the metric's ``name``, ``metric_full`` (0 for KL) and ``metric`` (the
    discovered circuit's), ``threshold``, ``ablation``; ``evaluations`` (metrics computed: the full
    circuit's, every edge ablated, one per tested edge) and ``seconds`` (from the first test to the
    last).  ``circuit()`` is the discovered circuit."""

    def __init__(self, edges, metric: DiscoveryMetric, masks, steps, settings: dict):
        self.edges, self.metric_spec, self.masks, self.steps = edges, metric, masks, tuple(steps)
        self.metric_name = metric.name
        for key, value in settings.items():
            setattr(self, key, value)
        self.kept = tuple(e.name for e in edges.edges if masks[e.receiver][e.index] != 0)

    @property
    def tested(self) -> int:
        """How many edges were tested (the others were pruned as unconnected)."""
        return sum(step.tested for step in self.steps)

    def __repr__(self) -> str:
        return (
            f"ACDCResult({len(self.kept)} of {len(self.edges.edges)} edges kept, {self.metric_name} "
            f"{self.metric:.6g} (full {self.metric_full:.6g}), threshold {self.threshold:g}, {self.ablation} "
            f"ablation)"
        )

    @property
    def records(self) -> list[dict]:
        """One dict per step: ``step``, ``edge``, ``sender``, ``receiver``, ``tested``, ``delta``,
        ``kept``, ``metric``."""
        return [{"step": i, **dataclasses.asdict(step)} for i, step in enumerate(self.steps)]

    def to_pandas(self):
        """``records`` as a pandas DataFrame (pandas is not a dependency)."""
        return records_frame(self.records, "ACDCResult")

    def circuit(self):
        """The discovered circuit: ``discovered_circuit(self)``."""
        from circuits.experiments.discovered import discovered_circuit

        return discovered_circuit(self)


def acdc(
    circuit: Circuit | EdgeCircuit,
    corrupted_inputs: Mapping[Any, Any] | None,
    metric: Any = "kl",
    *,
    threshold: float,
    ablation: str = "resample",
    position: int | None = None,
    absolute: bool = False,
    evaluator: Evaluator | None = None,
) -> ACDCResult:
    """ACDC over every edge of ``circuit`` (a model circuit, or an ``EdgeCircuit``); see the module
    docstring.  ``corrupted_inputs`` (``{"toks_int_var": tokens}``) give the ablated values:
    ``"resample"`` their senders' outputs (the shape of the clean inputs), ``"mean"`` their mean over
    the batch; ``"zero"`` needs none (None).  ``evaluator``: the cache the components evaluated
    at every position go through.
    A threshold that removes every edge is a ``NoCircuitError`` (an ``ExperimentError``).

    >>> result = ex.acdc(c, {"toks_int_var": corrupted}, "kl", threshold=0.01, position=-1)
    >>> result.kept, result.to_pandas(), result.circuit().save("ioi.circ")
    """
    what = "acdc"
    threshold = check_threshold(threshold, what)
    edges = _edge_circuit(circuit, corrupted_inputs, ablation, what)
    spec = DiscoveryMetric(metric, edges, position=position, what=what)
    search = _Search(
        edges,
        spec,
        Evaluator(DEFAULT_CACHE_BYTES) if evaluator is None else evaluator,
        threshold,
        absolute,
    )
    start = time.perf_counter()
    search.check_depends()
    search.run()
    settings = dict(
        threshold=threshold,
        ablation=edges.ablation,
        absolute=absolute,
        metric_full=search.full,
        metric=search.current,
        evaluations=search.evaluations,
        seconds=time.perf_counter() - start,
    )
    result = ACDCResult(edges, spec, search.masks, search.steps, settings)
    if not result.kept:
        deltas = [abs(s.delta) if absolute else s.delta for s in result.steps if s.delta is not None]
        raise NoCircuitError(
            f"{what}: threshold {threshold:g} removed every edge (the largest {'|delta|' if absolute else 'delta'} "
            f"was {max(deltas):.6g}): no circuit; lower the threshold",
            threshold=threshold,
            largest_delta=max(deltas),
        )
    return result


def _edge_circuit(circuit: Any, corrupted_inputs: Any, ablation: str, what: str) -> EdgeCircuit:
    """The edge circuit to search, masks at 1, reading ``ablation`` values."""
    if ablation not in ABLATIONS:
        raise ExperimentError(f"{what}: ablation must be one of {ABLATIONS}, got {ablation!r}")
    if isinstance(circuit, EdgeCircuit):
        if circuit.per_position or any(r.mask is None for r in circuit.receivers):
            raise ExperimentError(
                f"{what}: circuit must have one mask entry per edge (not per_position, masked)"
            )
        edges = circuit.with_masks({r.name: torch.ones_like(r.mask.value) for r in circuit.receivers})
        if edges.ablation == "zero" and ablation != "zero":
            _check_inputs(corrupted_inputs, ablation, what)
            edges = edges.with_ablation(ablation, corrupted_inputs)
        elif edges.ablation != ablation:
            raise ExperimentError(
                f"{what}: circuit reads {edges.ablation!r} ablations, ablation={ablation!r} was asked"
            )
        return edges
    if ablation == "zero":
        return edge_circuit(circuit)
    _check_inputs(corrupted_inputs, ablation, what)
    return edge_circuit(circuit, ablation=ablation, corrupted_inputs=corrupted_inputs)


def _check_inputs(corrupted_inputs: Any, ablation: str, what: str) -> None:
    if corrupted_inputs is None:
        raise ExperimentError(f"{what}: ablation={ablation!r} needs corrupted_inputs (the run it reads)")


def _component(receiver: str) -> str | None:
    """The sender a receiver feeds: ``'b1.a.head0.q'`` -> ``'b1.a.head0'``; the logits feed none."""
    if receiver == names.LOGITS:
        return None
    head, dot, role = receiver.rpartition(".")
    return head if dot and role in ("q", "k", "v") else receiver


class _Search:
    """ACDC's state: the masks, the edge circuit held as tensors over them (``EdgeState``), the
    steps so far."""

    def __init__(self, edges: EdgeCircuit, spec: DiscoveryMetric, evaluator, threshold, absolute):
        self.edges, self.spec, self.evaluator = edges, spec, evaluator
        self.threshold, self.absolute = threshold, absolute
        self.masks = {r.name: r.mask.value.clone() for r in edges.receivers}
        self.readers = {name: 0 for name in edges.senders}  # kept edges out of each sender
        self.steps: list[ACDCStep] = []
        self.evaluations = 1
        with torch.no_grad():
            self.state = EdgeState(edges, spec.root(edges.circuit), self.masks, self._evaluate, spec.value)
        self.full = self.current = self.state.value

    def _evaluate(self, circuit: Circuit, inputs: dict) -> torch.Tensor:
        return self.evaluator.evaluate(circuit, inputs)

    def trial(self, changes: dict[str, torch.Tensor]) -> Trial:
        self.evaluations += 1
        with torch.no_grad():
            return self.state.trial(changes)

    def check_depends(self) -> None:
        """Refuse a metric that every edge ablated leaves unchanged: ACDC would prune everything."""
        value = self.trial({r: torch.zeros_like(m) for r, m in self.masks.items()}).value
        if value == self.full:
            raise ExperimentError(
                f"acdc: metric {self.spec.name!r} is {value:.6g} with every edge ablated as with none: it "
                "does not depend on the edges (or corrupted_inputs change nothing it reads)"
            )

    def run(self) -> None:
        for receiver in reversed(self.edges.receivers):
            component = _component(receiver.name)
            if component is not None and self.readers.get(component, 1) == 0:
                self.prune(receiver)
            else:
                self.visit(receiver)

    def prune(self, receiver) -> None:
        """Every input edge of ``receiver`` removed untested: its component has no path to the logits."""
        mask = torch.zeros_like(self.masks[receiver.name])
        with torch.no_grad():
            self.state.commit(self.state.trial({receiver.name: mask}))
        self.masks[receiver.name] = mask
        for index in reversed(range(receiver.n_senders)):
            sender = self.edges.senders[index]
            self.steps.append(
                ACDCStep(
                    f"{sender}->{receiver.name}", sender, receiver.name, False, None, False, self.current
                )
            )

    def visit(self, receiver) -> None:
        """Test ``receiver``'s input edges, latest sender first, one at a time against the state."""
        for index in reversed(range(receiver.n_senders)):
            mask = self.masks[receiver.name].clone()
            mask[index] = 0
            trial = self.trial({receiver.name: mask})
            delta = trial.value - self.current
            removed = (abs(delta) if self.absolute else delta) < self.threshold
            sender = self.edges.senders[index]
            if removed:
                with torch.no_grad():
                    self.state.commit(trial)
                self.current, self.masks[receiver.name] = trial.value, mask
            else:
                self.readers[sender] += 1
            self.steps.append(
                ACDCStep(
                    f"{sender}->{receiver.name}",
                    sender,
                    receiver.name,
                    True,
                    delta,
                    not removed,
                    self.current,
                )
            )
