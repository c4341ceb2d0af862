"""``run_with_cache``: the circuit's value and the activations at chosen points, from one evaluation.

Each point (``ex.point``'s ``(kind, layer, head)``) is resolved to its node, and one run of the
evaluation plan hands every wanted value to the cache as it is computed (``Plan.run(on_value=)``),
so nothing is evaluated twice.  Keys are the point's ``(kind, layer, head)``; ``cache["logits"]``,
``cache["attn_probs", 1]`` and ``cache["z", 1, 2]`` read them.  Shapes are the nodes' own (heads as
an axis after the batch, ``[b, h, s, c]``; docs/models.md compares them with TransformerLens's).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterable, Iterator

import torch

from circuits.errors import ExperimentError
from circuits.evaluation import compile_plan
from circuits.experiments.points import resolve_points
from circuits.nodes import Circuit, check_node

__all__ = ["ActivationCache", "run_with_cache"]

Key = tuple[str, "int | None", "int | None"]


class ActivationCache(Mapping):
    """Activations by ``(kind, layer, head)``, and the circuit's ``value``; read-only."""

    def __init__(self, value: torch.Tensor, activations: dict[Key, torch.Tensor]):
        self.value = value
        self._activations = activations

    def __getitem__(self, key: Any) -> torch.Tensor:
        normalized = _key(key)
        if normalized not in self._activations:
            raise KeyError(
                f"{key!r}: not in this cache; it holds {', '.join(_show(k) for k in self._activations)}"
            )
        return self._activations[normalized]

    def __iter__(self) -> Iterator[Key]:
        return iter(self._activations)

    def __len__(self) -> int:
        return len(self._activations)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations: {', '.join(_show(k) for k in list(self)[:6])}, ...)"


def _key(key: Any) -> Key:
    parts = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, tuple) else None
    if not parts or len(parts) > 3 or not isinstance(parts[0], str):
        raise KeyError(f"{key!r}: a key is a kind, (kind, layer) or (kind, layer, head)")
    return (parts[0], *parts[1:], *(None,) * (3 - len(parts)))


def _show(key: Key) -> str:
    return repr(tuple(part for part in key if part is not None)) if key[1] is not None else repr(key[0])


def run_with_cache(
    circuit: Circuit,
    points: Iterable[Any] | None = None,
    *,
    inputs: Mapping[Circuit | str, Any] | None = None,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> ActivationCache:
    """The value of ``circuit`` and the activations at ``points``, from one evaluation.

    ``points``: kinds (``'logits'``), ``(kind, layer)`` or ``(kind, layer, head)`` tuples, as
    ``ex.point`` takes them; by default every kind of every layer the circuit has that names one
    node (on a split layer the per-head kinds are one node per head: ask for them with a head).
    ``inputs``, ``device``, ``dtype``: as ``cc.evaluate``.
    """
    check_node(circuit, "run_with_cache: the circuit", ExperimentError)
    wanted = resolve_points(circuit, None if points is None else [_key(p) for p in points])
    by_hash: dict[bytes, list[Key]] = {}
    for key, node in wanted.items():
        by_hash.setdefault(node.hash, []).append(key)
    found: dict[Key, torch.Tensor] = {}

    def keep(node: Circuit, value: torch.Tensor) -> None:
        for key in by_hash.get(node.hash, ()):
            found[key] = value

    plan = compile_plan([circuit], inputs, device, dtype)
    for node, value in plan.initial_values():
        keep(node, value)
    value = plan.run(on_value=keep)[0]
    keep(circuit, value)
    return ActivationCache(value, {key: found[key] for key in wanted})
