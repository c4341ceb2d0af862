"""Patching grids: TransformerLens's ``patching`` module as calls on a circuit.

Each grid patches the CLEAN value of one activation into the CORRUPTED run, for every layer and
every position / head / (head, position), and measures the metric, as TransformerLens's
``get_act_patch_*`` functions do; the tensor has TransformerLens's layout and the records are one
dict per patch (``layer``, ``pos``, ``head``, ``value``; ``None`` where the grid has no such axis).

================================  ========================================  ====================
ours                              TransformerLens                           layout
================================  ========================================  ====================
``act_patch_resid_pre``           ``get_act_patch_resid_pre``               [layer, pos]
``act_patch_resid_mid``           ``get_act_patch_resid_mid``               [layer, pos]
``act_patch_attn_out``            ``get_act_patch_attn_out``                [layer, pos]
``act_patch_mlp_out``             ``get_act_patch_mlp_out``                 [layer, pos]
``act_patch_attn_head_{x}_by_pos``  ``get_act_patch_attn_head_{x}_by_pos``  [layer, pos, head]
``act_patch_attn_head_pattern_by_pos``  ``..._pattern_by_pos``              [layer, head, dest]
``act_patch_attn_head_{x}_all_pos``  ``get_act_patch_attn_head_{x}_all_pos``  [layer, head]
``act_patch_block_every``         ``get_act_patch_block_every``             [3, layer, pos]
``act_patch_attn_head_all_pos_every``  ``..._all_pos_every``                [5, layer, head]
``act_patch_attn_head_by_pos_every``   ``..._by_pos_every``                 [5, layer, pos, head]
================================  ========================================  ====================

Over a spliced SAE's features (``ex.splice_sae``; TransformerLens has no such grid): in each layer
with an SAE (``Point('sae_acts', layer)``; by default every such layer), the clean value of one
feature (at every position, or at one) patched into the corrupted run:

- ``act_patch_sae_features``: ``[layer, feature]``, each feature at every position;
- ``act_patch_sae_features_by_pos``: ``[layer, pos, feature]``.

Two SAEs in one layer are refused by name (``ex.sae.feature_patching`` takes one site).

``{x}`` is ``out`` (the head's output before W_O, TransformerLens's ``z``), ``q``, ``k``, ``v``
or ``pattern``.  How the patches are evaluated (many at once, only above the patched node, one
unembedded position): ``circuits.experiments.patch_batches`` and docs/patching.md.
"""

from __future__ import annotations

import concurrent.futures
from typing import Any, Callable, Iterable, Mapping

import attrs
import torch

from circuits.transformer import names
from circuits.evaluation.cache import DEFAULT_CACHE_BYTES, Evaluator, check_cache_bytes
from circuits.evaluation.leaves import check_device
from circuits.errors import ExperimentError
from circuits.experiments.inputs import same_shape_inputs, with_targets_of
from circuits.experiments.metrics import Metric
from circuits.experiments.memory_budget import check_memory_bytes
from circuits.experiments.patch_batches import PatchRun, measure_all
from circuits.experiments.patch_budget import GridBudget, grid_budget, patches_that_fit
from circuits.experiments.workers import one_thread_if_forked
from circuits.transformer.points import Point
from circuits.core.nodes import Circuit, check_node
from circuits.core.traversal import unique_nodes
from circuits.rewriting.matching import get
from circuits.experiments.tables import records_frame

PATCHES_PER_RUN = 32  #: patches evaluated as one batch
POSITIONS_PER_RUN = 8  #: positions one batch spans (bench/patching_grid.py: 8 beat 2, 4 and 24)


@attrs.frozen
class Grid:
    """One grid: the point kind patched and the axes iterated over (TransformerLens's names)."""

    kind: str
    axes: tuple[str, ...]


_HEAD_KINDS = {"out": "z", "q": "q", "k": "k", "v": "v", "pattern": "attn_probs"}

#: Every grid, by the name its function carries (``act_patch_<name>``).
GRIDS: dict[str, Grid] = {
    **{kind: Grid(kind, ("layer", "pos")) for kind in ("resid_pre", "resid_mid", "attn_out", "mlp_out")},
    **{
        f"attn_head_{x}_by_pos": Grid(
            kind, ("layer", "head", "dest_pos") if x == "pattern" else ("layer", "pos", "head")
        )
        for x, kind in _HEAD_KINDS.items()
    },
    **{f"attn_head_{x}_all_pos": Grid(kind, ("layer", "head")) for x, kind in _HEAD_KINDS.items()},
}

#: The grids over a spliced SAE's features (``patch_grid`` takes them as it takes ``GRIDS``).
SAE_GRIDS: dict[str, Grid] = {
    "sae_features": Grid("sae_acts", ("layer", "feature")),
    "sae_features_by_pos": Grid("sae_acts", ("layer", "pos", "feature")),
}

#: The grids each ``*_every`` function stacks, in TransformerLens's order.
EVERY = {
    "block_every": ("resid_pre", "attn_out", "mlp_out"),
    "attn_head_all_pos_every": tuple(f"attn_head_{x}_all_pos" for x in _HEAD_KINDS),
    "attn_head_by_pos_every": tuple(f"attn_head_{x}_by_pos" for x in _HEAD_KINDS),
}

# Where each axis sits in our node's value, from the end: resid [B, S, D], q/k/v/z [B, H, S, d],
# attn_probs [B, H, dest, src].
# An SAE's features [B, S, d_sae].
_AXIS_FROM_END = {"pos": -2, "dest_pos": -2, "head": -3, "feature": -1}


@attrs.frozen
class PatchGrid:
    """A grid's values (TransformerLens's layout) and one record per patch."""

    values: torch.Tensor
    records: list[dict]
    grid: str

    def to_pandas(self):
        """``records`` as a pandas DataFrame (pandas is not a dependency: install it to use this)."""
        return records_frame(self.records, "PatchGrid")


def patch_grid(
    circuit: Circuit,
    corrupted_inputs: Mapping[Any, Any],
    metric: Metric | Callable[[torch.Tensor], Any],
    grid: str,
    *,
    layers: Iterable[int] | None = None,
    patches_per_run: int = PATCHES_PER_RUN,
    positions_per_run: int = POSITIONS_PER_RUN,
    executor: concurrent.futures.Executor | None = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    memory_bytes: int | None = None,
    device: torch.device | str | None = None,
) -> PatchGrid:
    """The grid ``grid`` (a name of ``GRIDS``, ``SAE_GRIDS`` or ``EVERY``); see the module docstring.

    ``circuit``: the model circuit on the clean inputs, heads not split.  ``corrupted_inputs``:
    e.g. ``{"toks_int_var": corrupted_tokens}``, the shape of what they replace.  ``metric``: a
    ``Metric`` (``logit_diff(-1, good, bad)`` unembeds one position; ``mean_loss`` scores the next
    tokens of the run its ``targets`` names, the clean prompt's by default, as TransformerLens
    users score them) or a function of the logits tensor ``[B, S, V]`` (every position unembedded)
    returning one number; in a circuit without logits (an encoder: ``build_bert``) the function
    gets the circuit's root, its output (the last hidden state, or the pooled embedding ``[B, d]``).  A patch that cannot reach the measured position (a later one, under a
    causal mask) leaves the corrupted run's metric.  ``patches_per_run``: patches evaluated as
    one batch; ``positions_per_run``: how many positions one batch spans (on a causal model a
    batch recomputes only from its first patched position on).  ``executor``: a
    ``concurrent.futures.Executor`` to run the layers on (one job per layer, each with its own
    cache of ``cache_bytes``); the result equals the local run's.  ``layers``: patch only these
    layers (ints, in the order given; default every layer): the tensor's first axis is theirs and
    each record names its layer, so a grid over a large model can be taken a few layers at a time.
    ``memory_bytes``: the most the grid's values may take (not the weights): the cache and the
    patches per run are sized to fit (``circuits.experiments.patch_budget``), and a budget below
    one patch's run is a ``CacheError`` before anything runs; with an executor, per job.
    ``device``: as ``cc.evaluate``'s (None: where the circuit's Arrays are); every run, the patched
    values and a metric function's logits are there.  ``values`` is a CPU tensor of the runs' metric
    numbers (in the activations' dtype) and the records are Python floats, whatever the device.
    """
    device = check_device(device, f"act_patch_{grid}", ExperimentError)
    options = RunOptions(patches_per_run, positions_per_run, cache_bytes, device)
    if isinstance(layers, Iterable) and not isinstance(layers, (str, bytes)):
        layers = list(layers)  # read once, though every part of an ``*_every`` grid uses it
    if grid in EVERY:
        parts = [
            patch_grid(
                circuit,
                corrupted_inputs,
                metric,
                part,
                layers=layers,
                executor=executor,
                memory_bytes=memory_bytes,
                **attrs.asdict(options),
            )
            for part in EVERY[grid]
        ]
        return _stacked(grid, parts)
    spec = _checked_grid(grid)
    _check_options(metric, options, executor)
    check_node(circuit, f"act_patch_{grid}: the circuit", ExperimentError)
    corrupted = _corrupted(circuit, corrupted_inputs, grid)
    if isinstance(metric, Metric) and metric.targets == "clean":  # the patched run scores the clean targets
        corrupted = with_targets_of(corrupted, circuit, f"act_patch_{grid}")
    if grid in SAE_GRIDS:
        chosen = _sae_layers(circuit, layers, grid)
    else:
        chosen = _checked_layers(layers, _layer_count(circuit), grid)
    budget = _budget(grid, corrupted, metric, spec, chosen, memory_bytes, options)
    if budget is not None:
        options = attrs.evolve(options, cache_bytes=budget.cache_bytes)
    jobs = [(circuit, corrupted, spec, layer, metric, options, budget) for layer in chosen]
    if executor is None:
        evaluator = Evaluator(options.cache_bytes)
        results = [_layer_values(*job, evaluator=evaluator) for job in jobs]
    else:
        results = [future.result() for future in [executor.submit(_layer_values, *job) for job in jobs]]
    return _assembled(grid, spec, chosen, results)


def _budget(
    grid: str, corrupted, metric, spec: Grid, chosen: list[int], memory_bytes, options
) -> GridBudget | None:
    """The grid's ``GridBudget`` within ``memory_bytes`` (None: no budget)."""
    if check_memory_bytes(memory_bytes, f"act_patch_{grid}") is None:
        return None
    budget = (memory_bytes, options.cache_bytes)
    return grid_budget(f"act_patch_{grid}", corrupted, metric, spec.kind, chosen, budget, options.device)


@attrs.frozen
class RunOptions:
    """How a grid's patches are batched, and the cache each layer's job uses."""

    patches_per_run: int
    positions_per_run: int
    cache_bytes: int
    device: torch.device | None = None


def _layer_values(
    circuit, corrupted, spec: Grid, layer: int, metric, options: RunOptions, budget=None, evaluator=None
):
    """``(sizes, cells, values, dtype)`` of one layer's patches (module-level: it travels by pickle);
    ``budget``: a ``GridBudget`` that sizes the runs, or None."""
    one_thread_if_forked()  # an executor's forked worker would hang on torch's threads
    if evaluator is None:  # not `or`: an empty Evaluator is falsy (its len is 0)
        evaluator = Evaluator(options.cache_bytes)
    run = PatchRun(circuit, corrupted, Point(spec.kind, layer), metric, evaluator, options.device)
    axes = spec.axes[1:]
    sizes = {axis: run.clean_value.shape[_AXIS_FROM_END[axis]] for axis in axes}
    cells = [()]
    for axis in axes:
        cells = [cell + (i,) for cell in cells for i in range(sizes[axis])]
    positions = [dict(zip(axes, cell)).get("pos", dict(zip(axes, cell)).get("dest_pos", 0)) for cell in cells]
    indices = [_index(axes, cell) for cell in cells]
    size = (
        options.patches_per_run if budget is None else patches_that_fit(run, budget, options.patches_per_run)
    )
    values = measure_all(run, indices, positions, size, options.positions_per_run)
    return sizes, cells, values, run.clean_value.dtype


def _index(axes: tuple[str, ...], cell: tuple[int, ...]) -> tuple:
    """The index of one patch into our node's value: ``(..., head, pos, :)`` and the like."""
    items = [slice(None)] * -min(_AXIS_FROM_END[axis] for axis in axes)
    for axis, i in zip(axes, cell):
        items[_AXIS_FROM_END[axis]] = i
    return (Ellipsis, *items)


def _assembled(grid: str, spec: Grid, layers: list[int], results: list) -> PatchGrid:
    sizes, dtype = results[0][0], results[0][3]
    values = torch.zeros((len(results), *(sizes[axis] for axis in spec.axes[1:])), dtype=dtype)
    records = []
    for row, (layer, (_, cells, found, _)) in enumerate(zip(layers, results)):
        for cell, value in zip(cells, found):
            values[(row, *cell)] = value
            where = dict(zip(spec.axes[1:], cell))
            pos = where.get("pos", where.get("dest_pos"))
            record = {"layer": layer, "pos": pos, "head": where.get("head"), "value": value}
            records.append(record | ({"feature": where["feature"]} if "feature" in where else {}))
    return PatchGrid(values, records, grid)


def _stacked(grid: str, parts: list[PatchGrid]) -> PatchGrid:
    """An ``*_every`` grid: the parts stacked on a new first axis (pattern by position as [layer, pos, head])."""
    values = [
        part.values.transpose(1, 2)
        if GRIDS[part.grid].axes[1] == "head" and len(GRIDS[part.grid].axes) == 3
        else part.values
        for part in parts
    ]
    records = [{"grid": part.grid, **record} for part in parts for record in part.records]
    return PatchGrid(torch.stack(values), records, grid)


def _checked_layers(layers: Any, n_layers: int, grid: str) -> list[int]:
    """``layers`` as a list of distinct layer numbers of the model (every layer for None)."""
    if layers is None:
        return list(range(n_layers))
    chosen = list(layers) if isinstance(layers, Iterable) and not isinstance(layers, (str, bytes)) else None
    if (
        not chosen
        or any(isinstance(layer, bool) or not isinstance(layer, int) for layer in chosen)
        or not all(0 <= layer < n_layers for layer in chosen)
        or len(set(chosen)) != len(chosen)
    ):
        raise ExperimentError(
            f"act_patch_{grid}: layers={layers!r}; expected distinct layer numbers in [0, {n_layers}) "
            "(or None for every layer)"
        )
    return chosen


def _sae_layers(circuit: Circuit, layers: Any, grid: str) -> list[int]:
    """The layers of an SAE grid: those given (each must have an SAE), or every one with an SAE."""
    with_sae = [layer for layer in range(_layer_count(circuit)) if get(circuit, Point("sae_acts", layer))]
    if layers is None:
        if not with_sae:
            raise ExperimentError(
                f"act_patch_{grid}: no SAE is spliced in {circuit.describe()} (ex.splice_sae first)"
            )
        return with_sae
    chosen = _checked_layers(layers, _layer_count(circuit), grid)
    lacking = [layer for layer in chosen if layer not in with_sae]
    if lacking:
        raise ExperimentError(
            f"act_patch_{grid}: layers {lacking} have no SAE spliced; the layers with one are {with_sae}"
        )
    return chosen


def _checked_grid(grid: Any) -> Grid:
    if not isinstance(grid, str) or (grid not in GRIDS and grid not in SAE_GRIDS):
        known = ", ".join([*GRIDS, *SAE_GRIDS, *EVERY])
        raise ExperimentError(f"patch_grid: unknown grid {grid!r}; the grids are {known}")
    return GRIDS[grid] if grid in GRIDS else SAE_GRIDS[grid]


def _check_options(metric, options: RunOptions, executor) -> None:
    if not isinstance(metric, Metric) and not callable(metric):
        raise ExperimentError(
            f"patch_grid: metric must be a Metric or a function of the logits tensor, got {metric!r}"
        )
    for field in ("patches_per_run", "positions_per_run"):
        value = getattr(options, field)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ExperimentError(f"patch_grid: {field} must be a positive int, got {value!r}")
    if executor is not None and not callable(getattr(executor, "submit", None)):
        raise ExperimentError(
            f"patch_grid: executor must be a concurrent.futures.Executor, got {type(executor).__name__}"
        )
    check_cache_bytes(options.cache_bytes, "patch_grid")


def _corrupted(circuit: Circuit, corrupted_inputs: Mapping[Any, Any], grid: str) -> Circuit:
    return same_shape_inputs(circuit, corrupted_inputs, f"act_patch_{grid}: corrupted_inputs")


def _layer_count(circuit: Circuit) -> int:
    layers = set()
    for node in unique_nodes([circuit]):
        parsed = names.parse(node.name) if node.name is not None else None
        if parsed is not None and parsed.kind == "block":
            layers.add(parsed.layer)
    if not layers:
        raise ExperimentError(
            f"patch_grid: {circuit.describe()} has no layers ('b0', 'b1', ...): is it a model circuit?"
        )
    return max(layers) + 1


def _grid_function(grid: str) -> Callable[..., PatchGrid]:
    def grid_function(
        circuit: Circuit,
        corrupted_inputs: Mapping[Any, Any],
        metric: Metric | Callable[[torch.Tensor], Any],
        *,
        layers: Iterable[int] | None = None,
        patches_per_run: int = PATCHES_PER_RUN,
        positions_per_run: int = POSITIONS_PER_RUN,
        executor: concurrent.futures.Executor | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        memory_bytes: int | None = None,
        device: torch.device | str | None = None,
    ) -> PatchGrid:
        return patch_grid(
            circuit,
            corrupted_inputs,
            metric,
            grid,
            layers=layers,
            patches_per_run=patches_per_run,
            positions_per_run=positions_per_run,
            executor=executor,
            cache_bytes=cache_bytes,
            memory_bytes=memory_bytes,
            device=device,
        )

    tl = f"transformer_lens.patching.get_act_patch_{grid}"
    grid_function.__name__ = grid_function.__qualname__ = f"act_patch_{grid}"
    like = f"as ``{tl}``" if grid not in SAE_GRIDS else "over a spliced SAE's features"
    grid_function.__doc__ = (
        f"``patch_grid(circuit, corrupted_inputs, metric, {grid!r}, ...)`` (the same options): {like}."
    )
    return grid_function


act_patch_resid_pre = _grid_function("resid_pre")
act_patch_resid_mid = _grid_function("resid_mid")
act_patch_attn_out = _grid_function("attn_out")
act_patch_mlp_out = _grid_function("mlp_out")
act_patch_attn_head_out_by_pos = _grid_function("attn_head_out_by_pos")
act_patch_attn_head_q_by_pos = _grid_function("attn_head_q_by_pos")
act_patch_attn_head_k_by_pos = _grid_function("attn_head_k_by_pos")
act_patch_attn_head_v_by_pos = _grid_function("attn_head_v_by_pos")
act_patch_attn_head_pattern_by_pos = _grid_function("attn_head_pattern_by_pos")
act_patch_attn_head_out_all_pos = _grid_function("attn_head_out_all_pos")
act_patch_attn_head_q_all_pos = _grid_function("attn_head_q_all_pos")
act_patch_attn_head_k_all_pos = _grid_function("attn_head_k_all_pos")
act_patch_attn_head_v_all_pos = _grid_function("attn_head_v_all_pos")
act_patch_attn_head_pattern_all_pos = _grid_function("attn_head_pattern_all_pos")
act_patch_sae_features = _grid_function("sae_features")
act_patch_sae_features_by_pos = _grid_function("sae_features_by_pos")
act_patch_block_every = _grid_function("block_every")
act_patch_attn_head_all_pos_every = _grid_function("attn_head_all_pos_every")
act_patch_attn_head_by_pos_every = _grid_function("attn_head_by_pos_every")

__all__ = ["EVERY", "GRIDS", "SAE_GRIDS", "PatchGrid", "patch_grid"] + [
    f"act_patch_{g}" for g in [*GRIDS, *SAE_GRIDS, *EVERY]
]
