"""``attribution_patching``: the gradient approximation of activation patching, every point at once.

Patching one activation from a source run into a target run changes the metric by about
``(source - target) · ∂metric/∂activation`` (the gradient on the target run): one tracked forward
and one backward on the target (``gradients.tracked_run``), one plain forward on the source, and
every point of every layer (and head, and position) is estimated at once.  The default,
``into="corrupted"``, estimates what TransformerLens's patching grids (and ours) measure exactly:
the clean activation patched into the corrupted run, minus the corrupted run's metric;
``into="clean"`` estimates the corrupted activation patched into the clean run
(``(corrupted - clean) · ∂metric/∂activation`` at the clean run).  The exact grid is the check
(docs/patching.md compares them on the shipped model).  A Metric scores the next tokens of its
``targets`` run in both runs (the clean prompt's by default, as the grids do: ``Metric.targets``).

Layouts (sums over the batch and the activation's own axis, as patching a position of every
row at once changes the metric by that sum): residual and layer kinds ``[layer, pos]``; per-head
kinds ``[layer, head, pos]``; a spliced SAE's features (``'sae_acts'``, ``'resid_pre.sae_acts'``,
``'sae_pre'``: ``points.SAE_KINDS``) ``[layer, pos, feature]``, each feature at each position (its
reconstruction, error and input: ``[layer, pos]``), NaN in the layers with no SAE there (``attn_probs``, ``attn_scores``: the destination position, as
TransformerLens's pattern grids).  Heads come from a head axis on an unsplit layer or from the
head branches of a split one; ``z`` is the head output's attribution on either (a head's output is
``z`` times its W_O, so both give the same number).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import torch

from circuits.errors import ExperimentError
from circuits.transformer import names
from circuits.evaluation.leaves import check_device
from circuits.experiments.gradients import tracked_run
from circuits.experiments.inputs import same_shape_inputs, with_targets_of
from circuits.evaluation.costs import cost
from circuits.experiments.memory_budget import (
    check_memory_bytes,
    evaluation_bytes,
    refuse,
    tracked_bytes,
    usable,
)
from circuits.experiments.metrics import Metric
from circuits.experiments.patch_batches import model_output
from circuits.transformer.points import HEAD_KINDS, SAE_KINDS, Point, resolve_points, sae_site
from circuits.rewriting.matching import get
from circuits.core.nodes import Circuit, check_node
from circuits.experiments.tables import records_frame

__all__ = ["ATTRIBUTION_KINDS", "AttributionResult", "attribution_patching"]

#: The kinds ``attribution_patching`` takes: those with a position axis and a feature axis.
ATTRIBUTION_KINDS = (
    "resid_pre",
    "resid_mid",
    "resid_post",
    "attn_out",
    "mlp_pre",
    "mlp_post",
    "mlp_out",
    "ln1",
    "ln2",
    "q",
    "k",
    "v",
    "attn_scores",
    "attn_probs",
    "z",
    "head_out",
)


class AttributionResult(dict):
    """``{kind: tensor}`` in the layouts of the module docstring, with tidy ``records``.

    ``target_metric`` and ``source_metric``: the metric of the run patched into and of the run
    patched from; ``records``: one dict per estimate (``kind``, ``layer``, ``head`` or None,
    ``pos``, ``attribution``).
    """

    def __init__(self, grids: dict[str, torch.Tensor], target_metric: float, source_metric: float, into: str):
        super().__init__(grids)
        self.target_metric = target_metric
        self.source_metric = source_metric
        self.into = into

    @property
    def records(self) -> list[dict]:
        rows = []
        for kind, grid in self.items():
            grid = grid.cpu()  # one copy, not one device read per number
            features = _is_features(kind)
            for index in torch.cartesian_prod(*[torch.arange(n) for n in grid.shape]).reshape(-1, grid.ndim):
                at = [int(i) for i in index]
                value = float(grid[tuple(at)])
                if features and math.isnan(value):
                    continue  # no SAE in that layer
                head = at[1] if grid.ndim == 3 and not features else None
                pos = at[1] if features else at[-1]
                row = {"kind": kind, "layer": at[0], "head": head, "pos": pos, "attribution": value}
                rows.append(row | ({"feature": at[2]} if features else {}))
        return rows

    def to_pandas(self):
        """``records`` as a pandas DataFrame (pandas is not a dependency: install it to use this)."""
        return records_frame(self.records, "AttributionResult")


def attribution_patching(
    circuit: Circuit,
    corrupted_inputs: Mapping[Any, Any],
    metric: Metric | Callable[[torch.Tensor], torch.Tensor],
    kinds: Iterable[str] = ("resid_pre", "attn_out", "mlp_out", "z"),
    *,
    into: str = "corrupted",
    memory_bytes: int | None = None,
    device: torch.device | str | None = None,
) -> AttributionResult:
    """Attribution patching of every layer (and head) of each of ``kinds``; see the module docstring.

    ``circuit`` is built on the clean inputs; ``corrupted_inputs`` maps its input (usually
    ``'toks_int_var'``) to values of the same shape.  ``metric``: as ``ex.gradients`` takes it
    (a function of the logits returning one number as a tensor, as the patching grids take it, or
    a Metric that keeps the points, e.g. ``logit_diff(-1, good, bad, push_down=False)``).
    ``device``: as ``cc.evaluate``'s (None: where the circuit's Arrays are); both runs, the backward
    and the grids are there (the grids stay on it; ``records`` and the two metrics are floats).
    ``memory_bytes``: the most its values may take (not the weights); a ``CacheError`` before
    anything runs when ``cc.cost``'s bound on the tracked run, its gradients and the source run
    (``memory_budget.tracked_bytes``) exceeds it.  Nothing is batched to fit: split the prompts.

    >>> result = ex.attribution_patching(c, {"toks_int_var": corrupted}, metric, ["resid_pre", "z"])
    >>> result["z"].sum(-1)              # [layer, head]: each head's output over every position
    """
    check_node(circuit, "attribution_patching: the circuit", ExperimentError)
    device = check_device(device, "attribution_patching", ExperimentError)
    kinds = _checked_kinds(kinds)
    if into not in ("corrupted", "clean"):
        raise ExperimentError(f"attribution_patching: into must be 'corrupted' or 'clean', got {into!r}")
    corrupted = _corrupted(circuit, corrupted_inputs)
    target, source = (corrupted, circuit) if into == "corrupted" else (circuit, corrupted)
    if isinstance(metric, Metric):  # both runs score the next tokens of the run the metric names
        scored = circuit if metric.targets == "clean" else corrupted
        target, source = (with_targets_of(run, scored, "attribution_patching") for run in (target, source))
    layout = _layout(circuit, kinds)
    keys = [key for entries in layout.values() for _, key in entries]
    if check_memory_bytes(memory_bytes, "attribution_patching") is not None:
        _check_budget(target, source, metric, keys, memory_bytes, device)
    tracked = tracked_run(target, metric, keys, track=True, device=device)
    grads = torch.autograd.grad(tracked.metric, [tracked.values[key] for key in keys], allow_unused=True)
    with torch.no_grad():
        plain = tracked_run(source, metric, keys, track=False, device=device)
        per_key = {}
        for key, grad in zip(keys, grads):
            if grad is not None:
                per_key[key] = _reduced(key, grad * (plain.values[key] - tracked.values[key].detach()))
        grids = {kind: _grid(entries, per_key) for kind, entries in layout.items()}
    return AttributionResult(grids, float(tracked.metric.detach()), float(plain.metric), into)


def _check_budget(
    target: Circuit, source: Circuit, metric: Any, keys: list, memory_bytes: int, device: torch.device | None
) -> None:
    """``CacheError`` when the tracked run (``tracked_bytes``), the gradients and values at ``keys``
    and the source run's evaluation together may exceed ``memory_bytes``."""
    roots = [
        metric.circuit(run) if isinstance(metric, Metric) else model_output(run) for run in (target, source)
    ]
    tracked, plain = cost(roots[0], device), cost(roots[1], device)
    nodes = resolve_points(target, keys)
    at_keys = sum(tracked[nodes[key]].out_bytes for key in keys if nodes[key].hash in tracked.by_hash)
    need = tracked_bytes(tracked) + 2 * at_keys + evaluation_bytes(plain, plain.held_bytes)
    if need > usable(memory_bytes):
        raise refuse(
            "attribution_patching", memory_bytes, need, "the tracked run, its gradients and the source run"
        )


def _checked_kinds(kinds: Iterable[str]) -> list[str]:
    if isinstance(kinds, str):
        kinds = [kinds]
    kinds = list(kinds)
    unknown = [kind for kind in kinds if kind not in ATTRIBUTION_KINDS and sae_site(kind) is None]
    if unknown or not kinds:
        raise ExperimentError(
            f"attribution_patching: kinds {unknown or kinds!r} are not among {', '.join(ATTRIBUTION_KINDS)}, "
            f"or a spliced SAE's {', '.join(SAE_KINDS)} (of one site: 'resid_pre.sae_acts')"
        )
    return kinds


def _corrupted(circuit: Circuit, corrupted_inputs: Mapping[Any, Any]) -> Circuit:
    what = "attribution_patching: corrupted_inputs"
    corrupted = same_shape_inputs(circuit, corrupted_inputs, what)
    if corrupted.hash == circuit.hash:
        raise ExperimentError(
            f"{what} {list(corrupted_inputs)!r} change nothing in {circuit.describe()} (the same values): "
            "every attribution would be zero"
        )
    return corrupted


def _layout(circuit: Circuit, kinds: list[str]) -> dict[str, list[tuple[tuple, tuple]]]:
    """Per kind, ``[(grid index, point key)]``: ``(layer,)`` or ``(layer, head)`` (None: a head axis)."""
    layers = sorted({layer for _, layer, _ in resolve_points(circuit) if layer is not None})
    layout = {}
    for kind in kinds:
        if sae_site(kind) is not None:
            layout[kind] = _sae_layout(circuit, kind, layers)
            continue
        entries = []
        for layer in layers:
            if kind not in HEAD_KINDS:
                entries.append(((layer,), (kind, layer, None)))
                continue
            count = len(get(circuit, Point("z" if kind == "head_out" else kind, layer)))
            if count == 1 and kind != "head_out":
                entries.append(((layer, None), (kind, layer, None)))  # unsplit: the head axis
            else:
                entries += [((layer, head), (kind, layer, head)) for head in range(count)]
        if not entries:
            raise ExperimentError(f"attribution_patching: {circuit.describe()} has no layer with {kind!r}")
        layout[kind] = entries
    return layout


def _sae_layout(circuit: Circuit, kind: str, layers: list[int]) -> list[tuple[tuple, tuple]]:
    """The layers with the SAE ``kind`` names (a point that finds several SAEs is refused by name)."""
    if sae_site(kind)[0] is not None and names.ACTIVATION_KINDS[sae_site(kind)[0]].scope != "layer":
        raise ExperimentError(f"attribution_patching: {kind!r} has no layer to lay out; use ex.gradients")
    entries = []
    for layer in layers:
        point = Point(kind, layer)
        found = get(circuit, point)
        if len(found) > 1:
            resolve_points(circuit, [point])  # raises, naming the SAEs
        if found:
            entries.append(((layer,), (kind, layer, None)))
    if not entries:
        raise ExperimentError(
            f"attribution_patching: no SAE spliced in {circuit.describe()} is found by {kind!r} "
            "(ex.splice_sae first)"
        )
    return entries


def _is_features(kind: str) -> bool:
    site = sae_site(kind)
    return site is not None and site[1] in ("acts", "pre")


def _reduced(key: tuple, product: torch.Tensor) -> torch.Tensor:
    """Sum over the batch and the feature axis: ``[pos]``, or ``[head, pos]`` on a head axis; an
    SAE's features keep theirs: ``[pos, feature]``."""
    kind, _, head = key
    if _is_features(kind):
        return product.reshape(-1, *product.shape[-2:]).sum(0)
    kept = 3 if kind in HEAD_KINDS and kind != "head_out" and head is None else 2
    summed = product.sum(-1)
    return summed.reshape(-1, *summed.shape[summed.ndim - kept + 1 :]).sum(0)


def _grid(entries: list[tuple[tuple, tuple]], per_key: dict[tuple, torch.Tensor]) -> torch.Tensor:
    """The per-point estimates placed at their ``(layer, head)``; zeros where the metric does not
    depend, NaN in the layers an SAE kind has no SAE in."""
    first = next((per_key[key] for _, key in entries if key in per_key), None)
    if first is None:
        raise ExperimentError("attribution_patching: the metric depends on none of these points")
    layers = max(index[0] for index, _ in entries) + 1
    if len(entries[0][0]) == 1:
        grid = torch.zeros((layers, *first.shape), dtype=first.dtype, device=first.device)
        if sae_site(entries[0][1][0]) is not None:
            grid[[layer for layer in range(layers) if (layer,) not in {i for i, _ in entries}]] = math.nan
    else:
        axis = max(
            (per_key[key].shape[0] for (_, head), key in entries if head is None and key in per_key),
            default=0,
        )
        heads = max([axis] + [head + 1 for (_, head), _ in entries if head is not None])
        grid = torch.zeros((layers, heads, first.shape[-1]), dtype=first.dtype, device=first.device)
    for index, key in entries:
        if key in per_key:
            grid[index if index[-1] is not None else index[:1]] = per_key[key]
    return grid
