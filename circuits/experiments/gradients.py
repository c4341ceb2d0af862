"""``gradients``: the derivative of a metric with respect to activation points, by autograd.

One evaluation computes the metric with every requested point tracked (``compile_plan``'s
``kernel=`` seam wraps each point's step so that its value requires grad, as a leaf of the
autograd graph when nothing below it does); one backward pass (``torch.autograd.grad`` on the
points alone) gives each point's gradient.  No weight gets a gradient, so the backward costs
about one forward.  ``attribution_patching`` is built on ``tracked_run``.

The metric is a function of the logits (the node ``'t.call'``, ``[batch, pos, vocab]``) returning
one number as a tensor, as TransformerLens's metrics and the patching grids take it, or a
``Metric`` (``ex.mean_loss``, ``ex.logit_diff``, ...), which is built over the circuit and
evaluated in the same pass.  A Metric that
rewrites the nodes a point names (``logit_diff(..., push_down=True)`` pushes its Index below
the logits) leaves that point outside the metric's circuit: the point is refused with a message
saying so (make the Metric with ``push_down=False``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Iterable, NamedTuple

import torch

from circuits.errors import ExperimentError
from circuits.evaluation import compile_plan
from circuits.transformer import names
from circuits.experiments.metrics import Metric, find
from circuits.transformer.points import ByPoint, Point, PointCollector, as_point, resolve_points, show_key
from circuits.core.nodes import Circuit, check_node
from circuits.core.traversal import unique_nodes

__all__ = ["Gradients", "TrackedRun", "gradients", "tracked_run"]

Key = Point


class Gradients(ByPoint):
    """``∂metric/∂activation`` by ``Point``; ``metric`` (a float) and ``activations``
    (the points' values from the same run, read with the same keys: ``activations["z", 0]``)."""

    missing = "no gradient for it here; there are"

    def __init__(self, metric: float, grads: dict[Key, torch.Tensor], activations: dict[Key, torch.Tensor]):
        super().__init__(grads)
        self.metric = metric
        self.activations = _Activations(activations)

    def __repr__(self) -> str:
        return f"Gradients(metric {self.metric:.6g}; {len(self)} points: {self.shown()})"


class _Activations(ByPoint):
    """``Gradients.activations``: the tracked points' values, by the gradients' keys."""

    missing = "no activation for it here; there are"

    def __repr__(self) -> str:
        return f"activations ({len(self)} points: {self.shown()})"


class TrackedRun(NamedTuple):
    """One evaluation: the metric as a tensor, and each point's value (tracked when asked)."""

    metric: torch.Tensor
    values: dict[Key, torch.Tensor]


def gradients(
    circuit: Circuit,
    metric: Metric | Callable[[torch.Tensor], torch.Tensor],
    points: Iterable[Any],
    *,
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> Gradients:
    """``∂metric/∂activation`` at each point, from one evaluation and one backward pass.

    ``points``: as ``run_with_cache`` takes them (``Point("resid_pre", 1)``, or ``'logits'``,
    ``('resid_pre', 1)``, ``('z', 1, 2)``).  ``metric``: a function of the logits, or a Metric (module docstring).  A point the metric does not
    depend on gets a gradient of zeros.  ``inputs``, ``device``, ``dtype``: as ``cc.evaluate``.

    >>> grads = ex.gradients(c, lambda logits: logits[:, -1, 7].sum(), [("resid_pre", 1)])
    >>> grads["resid_pre", 1].shape                  # the node's shape, [batch, pos, d_model]
    """
    keys = [as_point(point) for point in points]
    if not keys:
        raise ExperimentError("gradients: no points given; name at least one, e.g. [('resid_pre', 0)]")
    run = tracked_run(circuit, metric, keys, track=True, inputs=inputs, device=device, dtype=dtype)
    tensors = [run.values[key] for key in keys]
    found = torch.autograd.grad(run.metric, tensors, allow_unused=True)
    grads = {key: torch.zeros_like(t) if g is None else g for key, t, g in zip(keys, tensors, found)}
    values = {key: value.detach() for key, value in run.values.items()}
    return Gradients(float(run.metric.detach()), grads, values)


def tracked_run(
    circuit: Circuit,
    metric: Metric | Callable[[torch.Tensor], torch.Tensor],
    keys: list[Key],
    *,
    track: bool,
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> TrackedRun:
    """The metric of ``circuit`` and the values at ``keys`` (full ``(kind, layer, head)``) from one
    evaluation; with ``track``, under autograd, each point's value requiring grad."""
    check_node(circuit, "gradients: the circuit", ExperimentError)
    wanted = resolve_points(circuit, keys)
    root = _metric_root(circuit, metric, wanted)
    keep = PointCollector(wanted)
    by_hash = keep.by_hash

    def kernel(node: Circuit, default: Callable) -> Callable:
        return _tracked(default) if node.hash in by_hash else default

    with torch.set_grad_enabled(track):
        plan = compile_plan([root], inputs, device, dtype, kernel=kernel if track else None)
        _refuse_leaf_points(plan, by_hash)
        value = plan.run(on_value=keep)[0]
        number = value if isinstance(metric, Metric) else _number(metric(value), track)
    return TrackedRun(number, {key: keep.values[key] for key in keys})


def _tracked(default: Callable) -> Callable:
    def tracked(*arguments: torch.Tensor) -> torch.Tensor:
        value = default(*arguments)
        return value if value.requires_grad else value.detach().requires_grad_()

    return tracked


def _metric_root(circuit: Circuit, metric: Any, wanted: dict[Key, Circuit]) -> Circuit:
    """The node to evaluate: the Metric built over the circuit, or the logits a function takes."""
    if isinstance(metric, Metric):
        root, what = metric.circuit(circuit), f"the metric {metric.name}'s circuit"
        hint = "the metric rewrote them (a Metric that pushes an Index down, such as logit_diff, needs push_down=False here), or it does not read them"
    elif callable(metric):
        root, what = (
            find(circuit, names.LOGITS, "gradients: a metric function takes the logits"),
            "the logits",
        )
        hint = "they are computed from the logits (the loss, log-probabilities): use a Metric such as ex.mean_loss"
    else:
        raise ExperimentError(
            f"gradients: metric must be a Metric or a function of the logits, got {metric!r}"
        )
    present = {node.hash for node in unique_nodes([root])}
    outside = [key for key, node in wanted.items() if node.hash not in present]
    if outside:
        raise ExperimentError(
            f"gradients: {what} do(es) not contain the point(s) {', '.join(map(show_key, outside))}: {hint}"
        )
    return root


def _refuse_leaf_points(plan, by_hash: dict[bytes, list[Key]]) -> None:
    """A leaf's value is the tensor itself, with no step to track: refused, not silently untracked."""
    for node, _ in plan.initial_values():
        if node.hash in by_hash:
            keys = ", ".join(map(show_key, by_hash[node.hash]))
            raise ExperimentError(f"gradients: point {keys} is a leaf ({node.describe()}), not an activation")


def _number(value: Any, track: bool) -> torch.Tensor:
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        shape = f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
        raise ExperimentError(
            f"gradients: the metric must return one number as a torch tensor, got a {type(value).__name__}{shape}"
        )
    if track and not value.requires_grad:
        raise ExperimentError(
            "gradients: the metric's value does not depend on any point (it is not part of the autograd graph); "
            "compute it from the tensor the metric is given, with torch operations"
        )
    return value.reshape(())
