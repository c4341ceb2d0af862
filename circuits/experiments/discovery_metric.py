"""The metric of a circuit-discovery run (``acdc``, ``discovered_circuit``, ``faithfulness``).

Three forms, one interface (``DiscoveryMetric``):

- ``"kl"``: KL(full || circuit) of the next-token distributions, in nats, averaged over the batch
  and the positions, or at one ``position`` (ACDC's tasks measure the last one).  The full
  model's distribution is computed once and held as a constant Array ``'metric.full_log_probs'``;
  with a ``position`` the Index is pushed down through the unembedding and the final norm (to the
  logits receiver's input), so that only that position's logits are computed.
- a ``Metric`` (``ex.logit_diff(-1, good, bad, push_down=False)``): its circuit, built on the
  edge circuit; it must read the logits receiver.
- a function of the logits returning one number: called on the logits ``'t.call'`` of each
  evaluated circuit (not part of the circuit: a discovered circuit then saves without it).

Each has a ``root(circuit)`` to evaluate (through a cached ``Evaluator``) and a ``value(tensor)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from circuits.core.nodes import Add, Array, Circuit, Einsum, GeneralFunction, Index, Scalar
from circuits.core.shapes import EINSUM_LETTERS
from circuits.core.traversal import unique_nodes
from circuits.errors import ExperimentError
from circuits.evaluation import evaluate
from circuits.experiments.metrics import Metric, find
from circuits.rewriting.passes.push_down import push_index
from circuits.transformer import names

__all__ = ["DiscoveryMetric", "check_threshold", "one_number"]


class DiscoveryMetric:
    """``metric`` (``"kl"``, a ``Metric`` or a function of the logits) over ``edges`` (an
    ``EdgeCircuit``, masks at 1: the full model); ``what`` names the caller in errors."""

    def __init__(self, metric: Any, edges, *, position: int | None = None, what: str):
        self.what, self.position = what, position
        self.logits_input = edges.receiver(names.LOGITS).input.name  # 'edges->t.call'
        if isinstance(metric, str):
            if metric != "kl":
                raise ExperimentError(
                    f"{what}: metric must be 'kl', a Metric or a function of the logits, got {metric!r}"
                )
            self.kind, self.name = "kl", "kl" if position is None else f"kl(position={position})"
            self._full = self._log_probs(edges.circuit)
            with torch.no_grad():
                full = evaluate(self._full).detach()
            self._full_lp = Array(full, name="metric.full_log_probs")
            self._full_p = Array(full.exp(), name="metric.full_probs")
        elif isinstance(metric, Metric):
            self.kind, self.name, self.metric = "metric", metric.name, metric
        elif callable(metric):
            self.kind, self.metric = "function", metric
            self.name = getattr(metric, "__name__", type(metric).__name__)
        else:
            raise ExperimentError(
                f"{what}: metric must be 'kl', a Metric or a function of the logits, got {metric!r}"
            )
        if position is not None and self.kind != "kl":
            raise ExperimentError(
                f"{what}: position= is for metric='kl' (a Metric or function picks its own)"
            )
        self.root(edges.circuit)  # a metric that does not read the edges is refused here

    def _logits(self, circuit: Circuit) -> Circuit:
        logits = find(circuit, names.LOGITS, f"{self.what}: metric")
        if self.position is None:
            return logits
        seq = logits.shape[-2]
        if (
            isinstance(self.position, bool)
            or not isinstance(self.position, int)
            or not -seq <= self.position < seq
        ):
            raise ExperimentError(
                f"{self.what}: position must be an int in [-{seq}, {seq}), got {self.position!r}"
            )
        at = Index(
            logits, (slice(None),) * (logits.rank - 2) + (self.position, slice(None)), name="metric.logits_at"
        )
        stops = [node for node in unique_nodes([logits]) if node.name == self.logits_input]
        return push_index(at, stop_at=stops)

    def _log_probs(self, circuit: Circuit) -> Circuit:
        return GeneralFunction.new_by_name(
            self._logits(circuit), spec_name="log_softmax", name="metric.log_probs"
        )

    def root(self, circuit: Circuit) -> Circuit:
        """What to evaluate on ``circuit`` (the edge circuit's root, masks as they are)."""
        if self.kind == "function":
            return find(circuit, names.LOGITS, f"{self.what}: metric")
        node = self._kl(circuit) if self.kind == "kl" else self.metric.circuit(circuit)
        if not any(n.name == self.logits_input for n in unique_nodes([node])):
            raise ExperimentError(
                f"{self.what}: metric {self.name!r} does not read the edges (its circuit has no "
                f"{self.logits_input!r}; a Metric that pushes an Index down, such as logit_diff, needs "
                "push_down=False)"
            )
        return node

    def _kl(self, circuit: Circuit) -> Circuit:
        lp = self._log_probs(circuit)
        letters = EINSUM_LETTERS[: lp.rank]
        neg = Einsum.scalar_mul(lp, -1.0, name="metric.neg_log_probs", scalar_name="metric.neg")
        ratio = Add(self._full_lp, neg, name="metric.log_ratio")
        count = math.prod(lp.shape[:-1])
        return Einsum.from_einsum_string(
            f"{letters},{letters},->",
            self._full_p,
            ratio,
            Scalar(1.0 / max(count, 1), name="metric.recip_positions"),
            name="metric.kl_div",
        )

    def value(self, tensor: torch.Tensor) -> float:
        """The number ``root``'s value stands for."""
        if self.kind != "function":
            return float(tensor)
        return float(one_number(self.metric(tensor), self.what))

    def saved_root(self, circuit: Circuit) -> Circuit | None:
        """The metric as a circuit over ``circuit`` (None for a function of the logits)."""
        return None if self.kind == "function" else self.root(circuit)


def check_threshold(threshold: Any, what: str) -> float:
    """A finite, non-negative number (``ExperimentError`` naming ``threshold`` otherwise)."""
    if (
        isinstance(threshold, bool)
        or not isinstance(threshold, (int, float))
        or not math.isfinite(threshold)
        or threshold < 0
    ):
        raise ExperimentError(f"{what}: threshold must be a finite number >= 0, got {threshold!r}")
    return float(threshold)


def one_number(value: Any, what: str) -> torch.Tensor:
    """``value``, checked to be what a metric function returns: one number as a torch tensor."""
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        got = (
            f"a tensor of shape {list(value.shape)}"
            if isinstance(value, torch.Tensor)
            else type(value).__name__
        )
        raise ExperimentError(f"{what}: metric must return one number as a torch tensor, got {got}")
    return value
