"""``sweep``: one ablation per target, one metric each, through one cached Evaluator.

    from circuits import experiments as ex
    table = ex.sweep(circuit, ex.head_names(circuit), ex.zero_ablate, ex.mean_loss)
    table["b3.a.head7"]                     # the metric with that head zeroed
    table.baseline                          # the metric of the circuit as given
    table.to_pandas().pivot(index="layer", columns="head", values="delta")

Head names and head points work on a circuit whose layers are split
(``split_heads``) or not: on an unsplit layer, ``'b3.a.head7'`` (or
``Point('z', 3, 7)``) is ablated in the circuit with layer 3 alone split; the values are those of the fully split circuit, up
to float rounding in how the heads are summed.  The sweep evaluates the
clean circuit once, then per target only the nodes whose hash changed; the
cache admits only the values a later circuit reads, and drops each after
its last reader.  Zero-ablated heads are measured many at a time: per layer,
the layers above it run once for a chunk of targets, as one batch
(``circuits.experiments.sweep_batches``).  How and why, with figures:
docs/rewrites.md.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import pickle

import collections
import time
from typing import Any, Callable, Iterable, Mapping

import torch

from circuits.transformer import names
from circuits.evaluation.cache import DEFAULT_CACHE_BYTES, Evaluator, check_cache_bytes
from circuits.evaluation.costs import cost
from circuits.evaluation.leaves import check_device
from circuits.errors import ExperimentError, shown
from circuits.experiments.ablation import zero_ablate
from circuits.experiments.memory_budget import check_memory_bytes, evaluation_bytes, refuse, split, usable
from circuits.experiments.metrics import Metric, mean_loss
from circuits.experiments.workers import one_thread_if_forked
from circuits.core.nodes import Circuit, check_node
from circuits.transformer.attention import split_heads, unsplit_head_counts
from circuits.transformer.points import Point
from circuits.core.traversal import unique_nodes
from circuits.experiments.sweep_batches import Chunk, batched_chunks, run_chunk
from circuits.experiments.tables import records_frame

__all__ = ["SweepPlan", "SweepResult", "head_names", "sweep", "sweep_plan"]


class SweepResult(dict):
    """``{target: metric value}``, plus the tidy ``records`` and the clean ``baseline``.

    ``records`` is a list of dicts, one per target: ``target``, ``metric``,
    ``baseline``, ``delta`` (metric - baseline), ``seconds`` (evaluation
    time; the targets of one batch share its time equally), and
    ``layer``/``head`` when the target is a head branch name
    (``'b3.a.head7'``).  ``to_pandas()`` makes a DataFrame of them (pandas
    is not a dependency; install it to use this).
    """

    def __init__(self, records: list[dict], baseline: float, metric: str):
        super().__init__((record["target"], record["metric"]) for record in records)
        self.records = records
        self.baseline = baseline
        self.metric = metric

    def head_grid(self, value: str = "delta") -> torch.Tensor:
        """``[layers, heads]`` of ``value`` (a record field: ``"delta"``, ``"metric"``) for the single-head
        targets, NaN where a head was not swept; for ``plot_grid``."""
        heads = [r for r in self.records if "layer" in r]
        if not heads:
            raise ExperimentError("head_grid: no target of this sweep is a single head ('b3.a.head7')")
        if value not in heads[0]:
            raise ExperimentError(f"head_grid: records have no {value!r}; they have {sorted(heads[0])}")
        grid = torch.full(
            (max(r["layer"] for r in heads) + 1, max(r["head"] for r in heads) + 1), float("nan")
        )
        for record in heads:
            grid[record["layer"], record["head"]] = record[value]
        return grid

    def to_pandas(self):
        """``records`` as a pandas DataFrame (pandas is not a dependency: install it to use this)."""
        return records_frame(self.records, "SweepResult")

    def __repr__(self) -> str:
        shown = ", ".join(f"{k!r}: {v:.6g}" for k, v in list(self.items())[:6])
        more = f", ... ({len(self) - 6} more)" if len(self) > 6 else ""
        return f"SweepResult({self.metric}, baseline {self.baseline:.6g}, {{{shown}{more}}})"


@dataclasses.dataclass(frozen=True)
class SweepPlan:
    """What a sweep will cost, before it runs (``sweep_plan``).

    ``flops``: FLOPs of every distinct node of the sweep's evaluations (the clean circuit, every
    ablated one, and the batches that measure a layer's heads at once, ``sweep_batches``), each
    once, as the planned cache computes it once (more, if ``cache_bytes`` cannot hold what later
    evaluations read).  ``peak_bytes``: the largest, over the evaluations in run order, of one
    evaluation's own peak (``cc.cost``) plus the values the cache holds for later ones then
    (capped at ``cache_bytes``): an estimate, not a bound.  ``circuits``: how many circuits are
    measured (the clean one and one per target); ``cached_bytes``: the most the cache holds at
    once.  ``cost``: ``cc.cost`` of them all.
    """

    circuits: int
    flops: int
    peak_bytes: int
    cached_bytes: int
    cost: Any

    def __str__(self) -> str:
        return (
            f"sweep of {self.circuits} evaluations: {self.flops / 1e9:.3f} GFLOP, peak about "
            f"{self.peak_bytes / 2**20:.1f} MiB (cache up to {self.cached_bytes / 2**20:.1f} MiB)"
        )


def _plan(units: list[list[Circuit]], cache_bytes: int, circuits: int) -> SweepPlan:
    """The ``SweepPlan`` of making the evaluations ``units`` (each a list of roots) in order with
    the planned cache; ``circuits``: how many circuits they measure."""
    together = cost([root for unit in units for root in unit])
    reads, last_read = _reuse_plan(units)
    last = {node_hash: position for position, hashes in last_read.items() for node_hash in hashes}
    first: dict[bytes, int] = {}
    for position, roots in enumerate(units):
        for node in unique_nodes(roots):
            first.setdefault(node.hash, position)
    held = [0] * len(units)
    for node_hash in reads:
        for position in range(first[node_hash], last[node_hash] + 1):
            held[position] += together.by_hash[node_hash].out_bytes
    held = [min(bytes_, cache_bytes) for bytes_ in held]
    peaks = [cost(roots).peak_bytes + held[position] for position, roots in enumerate(units)]
    return SweepPlan(circuits, together.total.flop_count, max(peaks), max(held), together)


def head_names(circuit: Circuit) -> list[str]:
    """Every head ``'b{L}.a.head{h}'``, by layer then head: split branches, and the heads of unsplit layers.

    A layer that ``split_heads`` has split contributes its branch names
    (``'b2.a.head0-3'`` for a group); a layer still unsplit contributes one
    name per head, which ``sweep`` resolves by splitting that layer alone.
    """
    found = {}
    for node in unique_nodes([circuit]):
        heads = names.parse_head_group(node.name)
        if heads is not None:
            found[node.name] = heads
    for layer, count in unsplit_head_counts(circuit).items():
        found.update((names.head(layer, head), (layer, head, head)) for head in range(count))
    return sorted(found, key=found.__getitem__)


def _head_splitter(circuit: Circuit) -> Callable[[Any], Circuit]:
    """``base(target)``: the circuit to ablate ``target`` in, with only the target's layer split if need be.

    A head name (``'b3.a.head7'``, ``'b3.a.head4-7'``) that names no node
    of ``circuit``, or a head's ``Point`` (``Point('z', 3, 7)``), of an
    unsplit layer gets that layer split, with the named heads as one branch and every other head
    alone.  Any other target is ablated in ``circuit`` as it is.  Splits are
    made once per layer and grouping, and shared by the targets that need them.
    """
    present = {node.name for node in unique_nodes([circuit]) if node.name is not None}
    counts = unsplit_head_counts(circuit)
    splits: dict[tuple, Circuit] = {}

    def base(target: Any) -> Circuit:
        heads = _heads_of(target, present)
        if heads is None or heads[0] not in counts:
            return circuit
        layer, first, last = heads
        count = counts[layer]
        if not first <= last < count:
            return circuit  # not a head of that layer: the ablation reports that it finds nothing
        groups = [(h,) for h in range(first)] + [tuple(range(first, last + 1))]
        groups += [(h,) for h in range(last + 1, count)]
        key = (layer, tuple(groups))  # every single head of a layer shares one split
        if key not in splits:
            splits[key] = split_heads(circuit, layers=[layer], heads=groups)
        return splits[key]

    return base


def _heads_of(target: Any, present: set) -> tuple[int, int, int] | None:
    """``(layer, first head, last head)`` a target names: a head name of no node, or a head's Point."""
    if isinstance(target, Point):
        return None if target.head is None else (target.layer, target.head, target.head)
    return names.parse_head_group(target) if isinstance(target, str) and target not in present else None


def _label(target: Any) -> Any:
    if isinstance(target, (str, int, tuple)):
        return target
    if isinstance(target, Circuit):
        return target.name if target.name is not None else repr(target)
    return repr(target)


def _targets(targets: Any, what: str = "sweep") -> list[tuple[Any, Any]]:
    """``[(label, target)]``, refusing what cannot be a collection of targets."""
    if isinstance(targets, (str, bytes, Circuit, Point)):
        raise ExperimentError(
            f"{what}: targets must be a list (or mapping) of targets, got the single {type(targets).__name__} "
            f"{shown(repr(targets))}; write [{shown(repr(targets))}]"
        )
    if isinstance(targets, Mapping):
        items = list(targets.items())
    else:
        try:
            items = [(_label(t), t) for t in targets]
        except TypeError:
            raise ExperimentError(
                f"{what}: targets must be a list (or mapping) of targets, got {type(targets).__name__}"
            ) from None
    counts = collections.Counter(repr(label) for label, _ in items)
    repeated = [label for label, count in counts.items() if count > 1]
    if repeated:
        raise ExperimentError(
            f"{what}: the targets labelled {', '.join(repeated[:5])} appear more than once; give each target "
            "once, or a mapping {label: target} to tell them apart"
        )
    return items


def _ablated(ablation: Callable, circuit: Circuit, label: Any, target: Any) -> Circuit:
    result = ablation(circuit, target)
    name = getattr(ablation, "__name__", repr(ablation))
    return check_node(
        result, f"sweep: ablation {name} returned {{got}} for target {label!r}", ExperimentError
    )


def _number(value: Any, metric_name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError, RuntimeError) as error:
        shape = f" of shape {list(value.shape)}" if isinstance(value, torch.Tensor) else ""
        raise ExperimentError(
            f"sweep: metric {metric_name} gave a {type(value).__name__}{shape}, not one number ({error})"
        ) from error


def _reuse_plan(units: list[list[Circuit]]) -> tuple[set[bytes], dict[int, list[bytes]]]:
    """Which computed values later evaluations of the sweep will read, and when each is read last.

    Evaluations (``units``, each a list of roots) are made in order.  Evaluation ``j`` computes
    the nodes no earlier one had, and reads from the cache the earlier nodes those new nodes have
    as children (its frontier).  Returns the hashes read by some evaluation after the one that
    first computes them (the values worth caching), and for each evaluation the hashes it is the
    last reader of (dropped once it has run).
    """
    seen: set[bytes] = set()
    last: dict[bytes, int] = {}
    for position, roots in enumerate(units):
        visited: set[bytes] = set()
        stack = list(roots)
        while stack:
            node = stack.pop()
            node_hash = node.hash
            if node_hash in visited:
                continue
            visited.add(node_hash)
            if node_hash in seen:
                if node.children:
                    last[node_hash] = position  # computed before: read from the cache here
                continue
            stack.extend(node.children)
        seen.update(visited)
    by_position: dict[int, list[bytes]] = {}
    for node_hash, position in last.items():
        by_position.setdefault(position, []).append(node_hash)
    return set(last), by_position


def _progress(items: list, enabled: bool, desc: str):
    if not enabled:
        return items
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is optional
        return items
    return tqdm(items, desc=desc)


def sweep(
    circuit: Circuit,
    targets: Iterable[Any] | Mapping[Any, Any],
    ablation: Callable[[Circuit, Any], Circuit] = zero_ablate,
    metric: Metric | Callable[[torch.Tensor], Any] = mean_loss,
    *,
    evaluator: Evaluator | None = None,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    policy: str = "planned",
    progress: bool = True,
    executor: concurrent.futures.Executor | None = None,
    shards: int | None = None,
    memory_bytes: int | None = None,
    device: torch.device | str | None = None,
) -> SweepResult:
    """Apply ``ablation`` to each target in turn and measure ``metric``; see the module docstring.

    - ``targets``: matcher forms (names such as ``'b3.a.head7'``, ``Point``s,
      Matchers, IterativeMatchers), or a mapping ``{label: matcher}``; the
      result is keyed by the name, the Point (or the label).  A head name of an unsplit layer
      is ablated with that layer split (see the module docstring).
    - ``ablation(circuit, target) -> circuit``: ``zero_ablate`` (default),
      or e.g. ``functools.partial(mean_ablate, dataset_inputs=...,
      evaluator=ev)``, ``functools.partial(patch, source_inputs=...)``.
    - ``metric``: a ``Metric`` (``mean_loss``, ``logit_diff(...)``,
      ``kl_div(clean)``; built over each ablated circuit and evaluated with
      the cache), or any function of the ablated circuit's value (a tensor)
      returning a number.
    - ``evaluator``: an ``Evaluator`` to use (and keep warm across sweeps);
      by default a new one of ``cache_bytes``.
    - ``policy``: ``"planned"`` (the default; see the module docstring) or
      ``"lru"`` (admit every value, plain LRU).
    - ``progress``: a tqdm progress bar, if tqdm is installed.
    - ``executor``: a ``concurrent.futures.Executor`` (a
      ``ProcessPoolExecutor``, or a dask.distributed ``Client.get_executor()``
      for a cluster) to shard the targets across: each shard is a sweep of
      its own, with its own Evaluator of ``cache_bytes``, in the order given;
      ``shards`` (default: one per target, at most 4 per CPU here) sets how
      many.  The circuit, ``ablation`` and ``metric`` travel by pickle:
      module-level functions or ``functools.partial`` of them, not lambdas.
      The table is the local run's; every row's ``baseline`` and ``delta``
      use the first shard's baseline.  A worker forked from this process
      (``ProcessPoolExecutor``'s default on Linux) runs torch on one thread:
      forked, torch's thread pool would hang (``circuits.experiments.workers``).
    - ``memory_bytes``: the most the sweep's values may take (its cache, each evaluation's
      values and batches; not the weights): the cache and the batches are sized to fit
      (``circuits.experiments.memory_budget``), and a budget below one evaluation's need is a
      ``CacheError`` before anything runs.  With an ``evaluator``, its ``cache_bytes`` must fit
      in it; with an ``executor``, each shard keeps to it.
    - ``device``: as ``cc.evaluate``'s (None: where the circuit's Arrays are); every evaluation
      runs there, and a metric function gets the value there.  The table is Python floats
      (``head_grid`` is a CPU tensor), whatever the device.

    What it will cost before it runs: ``sweep_plan`` with the same arguments.

    >>> table = sweep(circuit, head_names(circuit))        # zero each head, mean loss
    >>> table["b0.a.head1"] - table.baseline
    """
    _check_arguments(circuit, ablation, evaluator, cache_bytes, policy)
    check_memory_bytes(memory_bytes, "sweep")
    device = check_device(device, "sweep", ExperimentError)
    items = _targets(targets)
    if executor is not None:
        budget = (cache_bytes, memory_bytes)
        return _sharded(executor, shards, circuit, items, ablation, metric, evaluator, budget, policy, device)
    if evaluator is not None:
        cache_bytes = evaluator.cache_bytes
    steps, cache_bytes = _budgeted_steps(
        "sweep", circuit, items, ablation, metric, (cache_bytes, memory_bytes), evaluator is not None, device
    )
    ev = evaluator if evaluator is not None else Evaluator(cache_bytes)
    return _sweep_items(steps, items, metric, ev, policy, progress, device)


def sweep_plan(
    circuit: Circuit,
    targets: Iterable[Any] | Mapping[Any, Any],
    ablation: Callable[[Circuit, Any], Circuit] = zero_ablate,
    metric: Metric | Callable[[torch.Tensor], Any] = mean_loss,
    *,
    cache_bytes: int = DEFAULT_CACHE_BYTES,
    memory_bytes: int | None = None,
) -> SweepPlan:
    """What ``sweep`` with these arguments will cost, before it runs: every circuit is built and
    nothing is evaluated; the ``SweepPlan`` has the FLOPs and the peak memory the sweep will need
    with the cache plan it would use (``cache_bytes``, sized to ``memory_bytes`` if given, as
    ``sweep`` sizes it: a budget too small is the same ``CacheError``).

    >>> print(sweep_plan(circuit, head_names(circuit)))   # GFLOP and peak MiB
    """
    _check_arguments(circuit, ablation, None, cache_bytes, "planned", "sweep_plan")
    check_memory_bytes(memory_bytes, "sweep_plan")
    items = _targets(targets, "sweep_plan")
    steps, cache_bytes = _budgeted_steps(
        "sweep_plan", circuit, items, ablation, metric, (cache_bytes, memory_bytes), False
    )
    return _plan([unit for step in steps for unit in step.units], cache_bytes, len(items) + 1)


def _budgeted_steps(
    what: str,
    circuit: Circuit,
    items: list,
    ablation: Callable,
    metric: Any,
    budget: tuple[int, int | None],
    fixed_cache: bool,
    device: torch.device | None = None,
) -> tuple[list[_Step], int]:
    """The sweep's steps and its cache budget, within ``memory_bytes`` (``memory_budget``): the
    batches halved until the largest evaluation and the cache fit, a ``CacheError`` if none does.
    ``budget``: ``(cache_bytes, memory_bytes)``; ``fixed_cache``: ``cache_bytes`` is a given
    evaluator's, which the budget must hold whole; ``device``: where it runs, for ``cc.cost``."""
    cache_bytes, memory_bytes = budget
    if memory_bytes is None:
        return _steps(circuit, items, ablation, metric), cache_bytes
    measure = metric.circuit if isinstance(metric, Metric) else _itself
    clean = cost(measure(circuit), device)
    held = clean.held_bytes  # the weights and inputs: the caller's
    single = evaluation_bytes(clean, held)
    room = usable(memory_bytes)
    reserved = cache_bytes if fixed_cache else 0
    if fixed_cache and single + reserved > room:
        raise refuse(what, memory_bytes, single + reserved, "one evaluation and the evaluator's cache")
    cache, batch_bytes = (
        (cache_bytes, room - cache_bytes)
        if fixed_cache
        else split(what, memory_bytes, single, cache_bytes, "one evaluation of the circuit")
    )
    while True:
        steps = _steps(circuit, items, ablation, metric, batch_bytes)
        need = max(evaluation_bytes(cost(unit, device), held) for step in steps for unit in step.units)
        if need + reserved <= room:
            return steps, cache if fixed_cache else min(cache, room - need)
        if not any(step.chunk is not None and len(step.labels) > 1 for step in steps):
            raise refuse(what, memory_bytes, need + reserved, "its largest evaluation (one target)")
        batch_bytes //= 2


@dataclasses.dataclass
class _Step:
    """One step of a sweep: the clean circuit, one target's circuit, or a chunk of targets
    measured as one batch (``sweep_batches``).  ``units``: its evaluations, each a list of roots."""

    labels: list
    units: list[list[Circuit]]
    chunk: Chunk | None = None


def _steps(
    circuit: Circuit, items: list, ablation: Callable, metric: Any, batch_bytes: int | None = None
) -> list[_Step]:
    """The clean circuit's step, then one per chunk or target in the order of the targets (each
    chunk at its first), every circuit built: a bad target fails before anything runs."""
    measure = metric.circuit if isinstance(metric, Metric) else _itself
    clean = _Step([], [[measure(circuit)]])
    chunks, rest = batched_chunks(circuit, items, ablation, measure, batch_bytes)
    base = _head_splitter(circuit)
    steps = [
        _Step([label], [[measure(_ablated(ablation, base(target), label, target))]]) for label, target in rest
    ]
    steps += [_Step(chunk.labels, [chunk.layer_values, [chunk.batched]], chunk) for chunk in chunks]
    order = {repr(label): position for position, (label, _) in enumerate(items)}
    return [clean] + sorted(steps, key=lambda step: order[repr(step.labels[0])])


def _itself(circuit: Circuit) -> Circuit:
    return circuit


def _sweep_items(
    steps: list[_Step],
    items: list,
    metric: Any,
    ev: Evaluator,
    policy: str,
    progress: bool,
    device: torch.device | None = None,
) -> SweepResult:
    """The sweep of ``items`` (``(label, target)`` pairs), built as ``steps``, through ``ev`` on ``device``."""
    as_metric = isinstance(metric, Metric)
    metric_name = metric.name if as_metric else getattr(metric, "__name__", repr(metric))
    units = [unit for step in steps for unit in step.units]
    reads, last_read = _reuse_plan(units)

    def planned(node: Circuit) -> bool:
        return node.hash in reads  # a later evaluation reads it from the cache

    admit = True if policy == "lru" else planned
    found: dict[str, tuple[float, float]] = {}
    position = 0  # of the step's first unit
    for number, step in enumerate(_progress(steps, progress, "sweep")):
        start = time.perf_counter()
        with torch.no_grad():
            if step.chunk is None:
                values = [ev.evaluate(step.units[0][0], device=device, store=admit)]
            else:
                values = run_chunk(step.chunk, ev, admit, device)
            numbers = [_number(value if as_metric else metric(value), metric_name) for value in values]
        seconds = (time.perf_counter() - start) / len(values)
        if not step.labels:
            baseline = numbers[0]
        for label, value in zip(step.labels, numbers):
            found[repr(label)] = (value, seconds)
        for unit in range(position, position + len(step.units)):
            if policy == "planned":
                done = last_read.pop(unit, ())
                ev.discard(done)
                reads.difference_update(done)
        position += len(step.units)
        steps[number] = None  # release what only this step held
    records = [_record(label, *found[repr(label)], baseline) for label, _ in items]
    return SweepResult(records, baseline, metric_name)


def _shard(
    circuit: Circuit, items: list, ablation: Callable, metric: Any, budget: tuple, policy: str, device=None
):
    """One shard of a sharded sweep, run where the executor runs it (module-level: it travels by
    pickle); ``budget``: ``(cache_bytes, memory_bytes)``."""
    one_thread_if_forked()
    steps, cache_bytes = _budgeted_steps("sweep", circuit, items, ablation, metric, budget, False, device)
    return _sweep_items(steps, items, metric, Evaluator(cache_bytes), policy, progress=False, device=device)


def _sharded(
    executor, shards, circuit, items, ablation, metric, evaluator, budget, policy, device=None
) -> SweepResult:
    if not isinstance(executor, concurrent.futures.Executor) and not callable(
        getattr(executor, "submit", None)
    ):
        raise ExperimentError(
            f"sweep: executor must be a concurrent.futures.Executor, got {type(executor).__name__}"
        )
    if evaluator is not None:
        raise ExperimentError(
            "sweep: an evaluator cannot be shared across an executor's workers; pass one or the other"
        )
    if shards is not None and (isinstance(shards, bool) or not isinstance(shards, int) or shards < 1):
        raise ExperimentError(f"sweep: shards must be a positive int, got {shards!r}")
    if shards is None:
        shards = 4 * (os.cpu_count() or 1)
    count = max(1, min(shards, len(items)))
    bounds = [round(i * len(items) / count) for i in range(count + 1)]
    parts = [items[bounds[i] : bounds[i + 1]] for i in range(count)]
    try:
        futures = [
            executor.submit(_shard, circuit, part, ablation, metric, budget, policy, device) for part in parts
        ]
        results = [future.result() for future in futures]
    except (pickle.PicklingError, AttributeError, TypeError) as error:
        if "pickle" not in str(error).lower():
            raise
        raise ExperimentError(
            f"sweep: the executor could not send the work to its workers ({error}); ablation and metric must "
            "be picklable: module-level functions or functools.partial of them, not lambdas or local functions"
        ) from error
    baseline = results[0].baseline
    records = [
        {**record, "baseline": baseline, "delta": record["metric"] - baseline}
        for result in results
        for record in result.records
    ]
    return SweepResult(records, baseline, results[0].metric)


def _check_arguments(
    circuit: Any, ablation: Any, evaluator: Any, cache_bytes: Any, policy: Any, what: str = "sweep"
) -> None:
    check_node(circuit, f"{what}: the circuit", ExperimentError)
    if policy not in ("planned", "lru"):
        raise ExperimentError(f"{what}: policy {policy!r} is not 'planned' or 'lru'")
    check_cache_bytes(cache_bytes, what)
    if evaluator is not None and not isinstance(evaluator, Evaluator):
        raise ExperimentError(f"{what}: evaluator must be a cc.Evaluator, got {type(evaluator).__name__}")
    if not callable(ablation):
        raise ExperimentError(
            f"{what}: ablation must be a function (circuit, target) -> circuit, got {ablation!r}"
        )


def _record(label: Any, value: float, seconds: float, baseline: float) -> dict:
    """One row of ``SweepResult.records``; a single head's name adds its layer and head."""
    record = {
        "target": label,
        "metric": value,
        "baseline": baseline,
        "delta": value - baseline,
        "seconds": seconds,
    }
    head = names.parse_head(label)
    if head is not None:
        record["layer"], record["head"] = head
    return record
