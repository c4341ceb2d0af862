"""``run_with_cache``: the circuit's value and the activations at chosen points, from one evaluation.

Each point (a ``Point(kind, layer, head)``, or its short spelling ``'logits'``, ``('attn_probs', 1)``,
``('z', 1, 2)``) is resolved to its node, and one run of the evaluation plan hands every wanted value
to the cache as it is computed (``Plan.run(on_value=)``), so nothing is evaluated twice.  Keys are
the ``Point``s; ``cache[Point("z", 1, 2)]``, ``cache["logits"]``, ``cache["attn_probs", 1]`` and
``cache["z", 1, 2]`` read them.  Shapes are the nodes' own (heads as
an axis after the batch, ``[b, h, s, c]``; docs/models.md compares them with TransformerLens's).

The cache keeps its circuit (``cache.circuit``) and has TransformerLens's analyses by the same names
(``accumulated_resid``, ``decompose_resid``, ``stack_head_results``, ``apply_ln_to_stack``,
``logit_attrs``), written in ``circuits.experiments.residual`` (docs/analyses.md).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Iterable

import torch

from circuits.errors import ExperimentError
from circuits.evaluation import compile_plan
from circuits.experiments import residual
from circuits.transformer.points import ByPoint, Point, PointCollector, as_point, resolve_points
from circuits.core.nodes import Circuit, check_node

__all__ = ["ActivationCache", "run_with_cache"]

Key = Point


class ActivationCache(ByPoint):
    """Activations by ``Point``, the circuit's ``value`` and the ``circuit``; read-only.

    The analyses read points the cache lacks with one more evaluation of ``circuit`` (same inputs,
    device and dtype), kept aside: iterating the cache shows only the points asked for.
    """

    missing = "not in this cache; it holds"

    def __init__(
        self,
        value: torch.Tensor,
        activations: dict[Key, torch.Tensor],
        circuit: Circuit,
        run_options: Mapping[str, Any] | None = None,
    ):
        super().__init__(activations)
        self.value = value
        self.circuit = circuit
        self._run_options = dict(run_options or {})
        self._extra: dict[Key, torch.Tensor] = {}

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations: {self.shown()})"

    @functools.cached_property
    def facts(self) -> residual.ModelFacts:
        """What the analyses read off the circuit's names: layers, norm, heads split, batched."""
        return residual.model_facts(self.circuit)

    def values_at(self, keys: Iterable[Any]) -> list[torch.Tensor]:
        """The activations at ``keys``: cached ones, and the rest from one more evaluation."""
        wanted = [as_point(key) for key in keys]
        missing = [k for k in dict.fromkeys(wanted) if k not in self._by_point and k not in self._extra]
        if missing:
            self._extra.update(_evaluate_points(self.circuit, missing, self._run_options)[1])
        return [self._by_point[k] if k in self._by_point else self._extra[k] for k in wanted]

    def accumulated_resid(
        self,
        layer: int | None = None,
        incl_mid: bool = False,
        apply_ln: bool = False,
        pos_slice: Any = None,
        mlp_input: bool = False,
        return_labels: bool = False,
    ):
        """The residual stream entering each layer up to ``layer``: ``[component, batch, pos, d_model]``."""
        stack, labels = residual.accumulated_resid(self, layer, incl_mid, apply_ln, pos_slice, mlp_input)
        return (stack, labels) if return_labels else stack

    def decompose_resid(
        self,
        layer: int | None = None,
        mlp_input: bool = False,
        mode: str = "all",
        apply_ln: bool = False,
        pos_slice: Any = None,
        incl_embeds: bool = True,
        return_labels: bool = False,
    ):
        """The residual stream entering ``layer`` as the outputs that sum to it (embeddings, attention, MLPs)."""
        stack, labels = residual.decompose_resid(
            self, layer, mlp_input, mode, apply_ln, pos_slice, incl_embeds
        )
        return (stack, labels) if return_labels else stack

    def stack_head_results(
        self,
        layer: int = -1,
        return_labels: bool = False,
        incl_remainder: bool = False,
        pos_slice: Any = None,
        apply_ln: bool = False,
    ):
        """Every head's output below ``layer``, ``[layer * head, batch, pos, d_model]``, labelled ``'L0H0'``."""
        stack, labels = residual.stack_head_results(self, layer, incl_remainder, pos_slice, apply_ln)
        return (stack, labels) if return_labels else stack

    def apply_ln_to_stack(
        self,
        residual_stack: torch.Tensor,
        layer: int | None = None,
        mlp_input: bool = False,
        pos_slice: Any = None,
        batch_slice: Any = None,
        has_batch_dim: bool = True,
    ) -> torch.Tensor:
        """``residual_stack`` centred (layer norm) and scaled by the clean run's norm scale at ``layer``."""
        return residual.apply_ln_to_stack(
            self, residual_stack, layer, mlp_input, pos_slice, batch_slice, has_batch_dim
        )

    def logit_attrs(
        self,
        residual_stack: torch.Tensor,
        tokens: Any,
        incorrect_tokens: Any = None,
        pos_slice: Any = None,
        batch_slice: Any = None,
        has_batch_dim: bool = True,
        *,
        uncapped: bool = False,
    ) -> torch.Tensor:
        """Each component's direct contribution to the logit of ``tokens`` (minus ``incorrect_tokens``);
        a soft-capped model's (Gemma 2) only with ``uncapped=True``: to the logit before the cap."""
        return residual.logit_attrs(
            self, residual_stack, tokens, incorrect_tokens, pos_slice, batch_slice, has_batch_dim, uncapped
        )


def run_with_cache(
    circuit: Circuit,
    points: Iterable[Any] | None = None,
    *,
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> ActivationCache:
    """The value of ``circuit`` and the activations at ``points``, from one evaluation.

    ``points``: ``Point``s, or their short spellings: kinds (``'logits'``), ``(kind, layer)`` or
    ``(kind, layer, head)`` tuples; by default every kind of every layer the circuit has that names one
    node (on a split layer the per-head kinds are one node per head: ask for them with a head).
    ``inputs``, ``device``, ``dtype``: as ``cc.evaluate``.
    """
    check_node(circuit, "run_with_cache: the circuit", ExperimentError)
    options = {"inputs": inputs, "device": device, "dtype": dtype}
    keys = None if points is None else [as_point(p) for p in points]
    value, found = _evaluate_points(circuit, keys, options)
    return ActivationCache(value, found, circuit, options)


def _evaluate_points(
    circuit: Circuit, keys: list[Key] | None, options: Mapping[str, Any]
) -> tuple[torch.Tensor, dict[Key, torch.Tensor]]:
    """The circuit's value and ``{key: activation}`` for ``keys`` (None: the default points), from one run."""
    wanted = resolve_points(circuit, keys)
    keep = PointCollector(wanted)
    plan = compile_plan([circuit], options["inputs"], options["device"], options["dtype"])
    for node, value in plan.initial_values():
        keep(node, value)
    value = plan.run(on_value=keep)[0]
    keep(circuit, value)
    return value, {key: keep.values[key] for key in wanted}
