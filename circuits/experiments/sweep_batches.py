"""Zero-ablating many heads at once: the batched path of ``sweep``.

Zeroing head ``h`` of layer ``L`` changes one node of the circuit, the layer's attention output
``'b{L}.a'`` (call it ``Y``): with the layer split into one branch per head, the ablated circuit
is the clean one with ``Y`` replaced by the Add of the other heads' branches and a zero (``X``).
So the targets of one layer all measure the same circuit above ``Y``, each on its own value of
``Y``.  ``sweep`` builds that circuit once per layer, with ``Y`` an input (a Symbol) and the
metric on top, ``expand``-ed over a leading *target* axis; then, per chunk of targets, it
evaluates their ``X`` (a few small nodes: the heads' outputs come from the cache), stacks the
values and evaluates everything above ``Y`` once for the whole chunk.  Per target that saves
rewriting and planning the whole circuit, and the layers above run as a few big matmuls instead
of many small ones (on short prompts the small ones are several times slower per FLOP).

The path is taken when the ablation is ``zero_ablate`` and the target a head name
(``'b3.a.head7'``, ``'b3.a.head4-7'``):

- of an unsplit layer (no node has that name): ``Y`` is the layer's head-summing Einsum, the
  only node of its name, and its branches are ``split_layer(..., push_down=False)``'s, the
  Einsum over its operands' ``Index`` at the heads.  Their values are those of ``split_heads``'s
  branches, which the general path ablates, up to float rounding;
- of a split layer: the branch must be the only node of its name, with one parent, an Add named
  ``'b{L}.a'``: then ``Y`` is that Add, exactly as ``zero_ablate`` finds it.

``X`` is then exactly ``zero_ablate``'s rewrite of ``Y`` (the branch replaced by a Scalar 0 of its
shape and name), and since ``Y`` holds every use of the branch, the ablated circuit is the
clean one with ``Y`` replaced by ``X``.  A metric that cannot be built over the circuit with
``Y`` an input (one that reads a node only ``Y`` reaches), like any other target, takes the
general path: one rewritten circuit per target.
"""

from __future__ import annotations

from typing import Any, Callable

import attrs
import torch

from circuits.core.nodes import Add, Circuit, Einsum, Scalar, Symbol
from circuits.core.traversal import unique_nodes
from circuits.errors import CircuitError
from circuits.evaluation.cache import Evaluator
from circuits.evaluation.costs import cost
from circuits.experiments.ablation import zero_ablate
from circuits.rewriting.batching import expand
from circuits.rewriting.rewrite import replace
from circuits.transformer import names
from circuits.transformer.attention import split_layer, unsplit_head_counts

__all__ = ["BATCH_BYTES", "Chunk", "batched_chunks", "run_chunk"]

#: About the most memory one batched evaluation may take: its targets' peaks together.
BATCH_BYTES = 2**29


@attrs.frozen(eq=False)
class Chunk:
    """Targets of one layer measured in one batch: target ``labels[i]`` is element ``i`` of
    ``batched`` with ``symbol[i]`` bound to the value of ``layer_values[i]`` (its ``X``).

    ``rank``: the rank of one target's measured value (``batched`` has one more axis in front,
    unless the measured circuit does not read the layer at all)."""

    labels: list
    layer_values: list[Circuit]
    symbol: Symbol
    batched: Circuit
    rank: int


def batched_chunks(
    circuit: Circuit,
    items: list[tuple[Any, Any]],
    ablation: Callable,
    measure: Callable[[Circuit], Circuit],
    batch_bytes: int | None = None,
) -> tuple[list[Chunk], list[tuple[Any, Any]]]:
    """The chunks of ``items`` (``(label, target)`` pairs) that the batched path measures, and the
    items it leaves to the general path (in their order).  ``measure(circuit)`` builds the
    measured circuit (the metric's, or the circuit itself); ``batch_bytes``: default
    ``BATCH_BYTES``."""
    if ablation is not zero_ablate:
        return [], items
    layers = _Layers(circuit)
    groups: dict[bytes, tuple[Circuit, list]] = {}
    rest = []
    for item in items:
        found = layers.ablated(item[1])
        if found is None:
            rest.append(item)
        else:
            groups.setdefault(found[0].hash, (found[0], []))[1].append((item, found[1]))
    chunks: list[Chunk] = []
    size = None
    for layer_node, members in groups.values():
        template = _template(circuit, layer_node, measure)
        if template is None:
            rest.extend(item for item, _ in members)
            continue
        if size is None:
            budget = BATCH_BYTES if batch_bytes is None else batch_bytes
            size = max(1, budget // max(1, cost(template[1]).peak_value_bytes))
        chunks += _chunks(*template, members, size)
    return chunks, rest


def run_chunk(
    chunk: Chunk, evaluator: Evaluator, store: Any, device: torch.device | None = None
) -> list[torch.Tensor]:
    """Each target's measured value, from two evaluations on ``device``: the targets' ``X``, then the
    batch (their values, stacked where they were computed, bound as its input; the list is freed
    once stacked)."""
    stacked = torch.stack(evaluator.evaluate_many(chunk.layer_values, device=device, store=store))
    measured = evaluator.evaluate(chunk.batched, {chunk.symbol: stacked}, device=device, store=store)
    if measured.dim() == chunk.rank:  # the measured circuit does not read the layer: no target axis
        return [measured] * len(chunk.labels)
    return list(measured.unbind(0))


def _template(circuit: Circuit, layer_node: Circuit, measure: Callable) -> tuple[Symbol, Circuit] | None:
    """The measured circuit with ``layer_node`` an input, and that input; None if
    the metric cannot be built over it.  (``logit_diff`` pushes its index through the last layer
    only: every position of the layers below is computed anyway.)"""
    symbol = Symbol.new_with_random_uuid(layer_node.shape, name=layer_node.name)
    with_input = replace(circuit, {layer_node: symbol})
    try:
        return symbol, measure(with_input)
    except CircuitError:
        return None


def _chunks(symbol: Symbol, measured: Circuit, members: list, size: int) -> list[Chunk]:
    """One layer's targets in chunks of ``size``, each over its own batched circuit (a circuit
    per chunk: the plan counts each chunk's work); the first of each size is ``expand``-ed, the
    next ones are it with another Symbol, which rebuilds without deriving anything again."""
    chunks: list[Chunk] = []
    expanded: dict[int, tuple[Symbol, Circuit]] = {}
    for start in range(0, len(members), size):
        part = members[start : start + size]
        batched_symbol = Symbol.new_with_random_uuid((len(part), *symbol.shape), name=symbol.name)
        if len(part) in expanded:
            first_symbol, first = expanded[len(part)]
            batched = replace(first, {first_symbol: batched_symbol})
        else:
            batched = expand(measured, {symbol: batched_symbol})
            expanded[len(part)] = batched_symbol, batched
        labels, values = [label for (label, _), _ in part], [value for _, value in part]
        chunks.append(Chunk(labels, values, batched_symbol, batched, measured.rank))
    return chunks


def _zero(node: Circuit) -> Scalar:
    """What ``zero_ablate`` puts in place of ``node``."""
    return Scalar(0.0, shape=node.shape, name=node.name)


class _Layers:
    """What the batched path needs to know of one circuit: its head branches and unsplit layers."""

    def __init__(self, circuit: Circuit):
        self.by_name: dict[str, list[Circuit]] = {}  # head and layer names -> their distinct nodes
        self.parents: dict[bytes, dict[bytes, Circuit]] = {}  # a head branch's hash -> its parents
        for node in unique_nodes([circuit]):
            if _wanted(node.name):
                self.by_name.setdefault(node.name, []).append(node)
            for child in node.children:
                if names.parse_head_group(child.name) is not None:
                    self.parents.setdefault(child.hash, {})[node.hash] = node
        self.counts = unsplit_head_counts(circuit)
        self.splits: dict[tuple, Add] = {}

    def ablated(self, target: Any) -> tuple[Circuit, Circuit] | None:
        """``(Y, X)`` for a target of the batched path (the module docstring), else None."""
        if not isinstance(target, str):
            return None
        heads = names.parse_head_group(target)
        if heads is None:
            return None
        if target in self.by_name:
            return self._split_layer_target(target, heads[0])
        return self._unsplit_layer_target(target, heads)

    def _split_layer_target(self, target: str, layer: int) -> tuple[Circuit, Circuit] | None:
        branches = self.by_name[target]
        if len(branches) != 1:
            return None
        parents = list(self.parents.get(branches[0].hash, {}).values())
        if len(parents) != 1 or not isinstance(parents[0], Add) or parents[0].name != names.attn_out(layer):
            return None
        return parents[0], _without(parents[0], branches[0])

    def _unsplit_layer_target(
        self, target: str, heads: tuple[int, int, int]
    ) -> tuple[Circuit, Circuit] | None:
        layer, first, last = heads
        layer_nodes = self.by_name.get(names.attn_out(layer), [])
        if layer not in self.counts or len(layer_nodes) != 1 or not isinstance(layer_nodes[0], Einsum):
            return None
        if not first <= last < self.counts[layer] or target != names.head(layer, first, last):
            return None  # not a head of that layer, or not spelled as its branch: the general path says so
        groups = [(h,) for h in range(first)] + [tuple(range(first, last + 1))]
        groups += [(h,) for h in range(last + 1, self.counts[layer])]
        key = (layer, tuple(groups))  # every single head of a layer shares one split
        if key not in self.splits:
            self.splits[key] = split_layer(layer_nodes[0], layer, groups, push_down=False)
        split = self.splits[key]
        branch = next(child for child in split.children if child.name == target)
        return layer_nodes[0], _without(split, branch)


def _wanted(name: str | None) -> bool:
    return name is not None and (
        names.parse_head_group(name) is not None or names.parse_attn_out(name) is not None
    )


def _without(layer: Circuit, branch: Circuit) -> Circuit:
    """``layer`` with ``branch`` zeroed, as ``zero_ablate`` rewrites it."""
    return layer.with_children([_zero(c) if c.hash == branch.hash else c for c in layer.children])
