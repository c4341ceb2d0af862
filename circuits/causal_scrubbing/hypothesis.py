"""Hypotheses: interpretation graphs (``InterpNode`` trees) and their ``Correspondence`` to the model.

rust_circuit's names and arguments (``InterpNode(cond_sampler, name, other_inputs_sampler)``,
``make_descendant``, ``Correspondence.add``, ``corr_root_matcher``, ``IllegalCorrespondenceError``).
An ``InterpNode`` says which inputs its part of the model is indifferent between (its
``cond_sampler`` draws data equivalent to its parent's); a ``Correspondence`` maps each node to an
``IterativeMatcher`` picking that part out of the model: a branch, reached from the root through
the parent's branch.  What the correspondence checks, and how each check fails, is in
docs/causal_scrubbing.md.

Differences from rust_circuit: matchers are our ``IterativeMatcher`` (``corr_root_matcher.chain(
"b1.a.head1")``); walks over interpretation trees are iterative; the root's matcher must have
``corr_root_matcher``'s stages (compared by ``repr``: matchers have no equality), not be that
very object.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Mapping

import attrs
import torch

from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.samplers import CondSampler, PoolsPerSampler, UncondSampler
from circuits.errors import IllegalCorrespondenceError
from circuits.rewriting.matching import IterativeMatcher, Matcher, as_iterative

if TYPE_CHECKING:  # only annotations here
    from circuits.text.print_options import PrintOptions

__all__ = [
    "IllegalCorrespondenceError",
    "InterpNode",
    "SampledInputs",
    "corr_root_matcher",
    "input_names",
    "to_inputs",
]

#: The root interpretation node's branch: the whole model, found at the root and nowhere below.
corr_root_matcher = IterativeMatcher(True, max_depth=0)


@attrs.define(frozen=True)
class SampledInputs:
    """The data sampled at each interpretation node: ``datasets[node]`` (its ``cond_sampler``'s
    draw) and, for an inner node, ``other_inputs_datasets[node]`` (for the inputs of its branch no
    child claims).  ``sampled[node]`` is what the node's own branch is run on."""

    datasets: dict = attrs.field(factory=dict)
    other_inputs_datasets: dict = attrs.field(factory=dict)
    sampler_pools: PoolsPerSampler = attrs.field(factory=dict)

    def __getitem__(self, node: InterpNode) -> Dataset:
        return self.datasets[node] if node.is_leaf() else self.other_inputs_datasets[node]

    def get(self, node: InterpNode, default: Dataset | None = None) -> Dataset | None:
        try:
            return self[node]
        except KeyError:
            return default


class InterpNode:
    """A node of an interpretation tree; compared by identity, as rust_circuit's.

    ``cond_sampler`` draws, for each datum of the parent's data, one the node treats as equivalent
    (``ExactSampler``: the same datum; ``FuncSampler(f)``: one with the same feature ``f``).
    ``other_inputs_sampler`` (inner nodes only) draws the data for the inputs of this node's branch
    that no child claims: "everything else in here does not matter" (random by default).
    """

    def __init__(
        self, cond_sampler: CondSampler, name: str, other_inputs_sampler: CondSampler = UncondSampler()
    ):
        if not isinstance(name, str) or not name:
            raise IllegalCorrespondenceError(f"InterpNode: name must be a non-empty str, got {name!r}")
        for what, sampler in (("cond_sampler", cond_sampler), ("other_inputs_sampler", other_inputs_sampler)):
            if not isinstance(sampler, CondSampler):
                raise IllegalCorrespondenceError(
                    f"InterpNode {name!r}: {what} must be a CondSampler (FuncSampler, ExactSampler, "
                    f"UncondSampler, ...), got {type(sampler).__name__}"
                )
        self._name = name
        self.cond_sampler = cond_sampler
        self.other_inputs_sampler = other_inputs_sampler
        self._children: tuple[InterpNode, ...] = ()

    @property
    def name(self) -> str:
        return self._name

    @property
    def children(self) -> tuple[InterpNode, ...]:
        return self._children

    def make_descendant(
        self, cond_sampler: CondSampler, name: str, other_inputs_sampler: CondSampler = UncondSampler()
    ) -> InterpNode:
        """A new child of this node (appended to ``children``), returned."""
        child = self.__class__(
            cond_sampler=cond_sampler, name=name, other_inputs_sampler=other_inputs_sampler
        )
        self._children = self._children + (child,)
        return child

    def is_leaf(self) -> bool:
        return not self._children

    def get_nodes(self) -> list[InterpNode]:
        """This node and its descendants, depth first (parents before children, children in order)."""
        return [node for _, node in self._with_parents()]

    def get_tree_size(self) -> int:
        return len(self.get_nodes())

    def get_descendants_with_parents(self) -> list[tuple[InterpNode, InterpNode]]:
        """``(parent, child)`` for every descendant, depth first."""
        return [(parent, node) for parent, node in self._with_parents() if parent is not None]

    def _with_parents(self) -> Iterator[tuple[InterpNode | None, InterpNode]]:
        stack: list[tuple[InterpNode | None, InterpNode]] = [(None, self)]
        seen: set[int] = set()
        while stack:
            parent, node = stack.pop()
            if id(node) in seen:
                raise IllegalCorrespondenceError(
                    f"interpretation node {node.name!r} is reached twice: an interpretation is a tree",
                    i_node=node,
                )
            seen.add(id(node))
            yield parent, node
            stack.extend((node, child) for child in reversed(node.children))

    def sample(
        self, rng: torch.Generator, source_ds: Dataset, parent_ds: Dataset, recursive: bool = True
    ) -> SampledInputs:
        """Every node's data: this node's ``cond_sampler`` draws from ``source_ds`` against
        ``parent_ds``, each child against its parent's draw (depth first, one generator)."""
        into = SampledInputs()
        pending: list[tuple[InterpNode, Dataset]] = [(self, parent_ds)]
        while pending:
            node, parent_data = pending.pop()
            data = node.cond_sampler.sample_and_update_pool(parent_data, source_ds, rng, into.sampler_pools)
            if not node.is_leaf():
                into.other_inputs_datasets[node] = node.other_inputs_sampler.sample_and_update_pool(
                    data, source_ds, rng, into.sampler_pools
                )
            into.datasets[node] = data
            if recursive:
                pending.extend((child, data) for child in reversed(node.children))
        return into

    def str_samplers(self, sampled_inputs: SampledInputs = SampledInputs(), datum_idx: int = 0) -> str:
        text = f"cond_sampler={self.cond_sampler.pretty_str(sampled_inputs.datasets.get(self), datum_idx)}"
        if not self.is_leaf():
            other = sampled_inputs.other_inputs_datasets.get(self)
            text += f", other_inputs_sampler={self.other_inputs_sampler.pretty_str(other, datum_idx)}"
        return text

    def print(
        self,
        options: PrintOptions | Mapping[str, Any] | None = None,
        sampled_inputs: SampledInputs = SampledInputs(),
        print_data: bool = True,
        color_by_data: bool = True,
        repr: bool = False,
        datum_idx: int = 0,
    ) -> str | None:
        """Print this interpretation tree, each node with its samplers and (given
        ``sampled_inputs``) the ``datum_idx``-th datum they drew; ``repr=True`` returns the text
        (without colours) instead.  ``options`` comes first, as rust_circuit's print options do:
        None, or a ``cc.PrintOptions`` or mapping setting only ``comment`` and ``color``,
        functions of an InterpNode (``causal_scrubbing.printing``)."""
        from circuits.causal_scrubbing.printing import interp_repr

        text = interp_repr(
            self,
            options,
            sampled_inputs,
            print_data=print_data,
            color_by_data=color_by_data,
            datum_idx=datum_idx,
            color=not repr,
        )
        if repr:
            return text
        print(text)
        return None

    def pretty_str(self, sampled_inputs: SampledInputs = SampledInputs()) -> str:
        children = [child.name for child in self.children]
        return f"InterpNode(name={self.name}, {self.str_samplers(sampled_inputs)}, children={children})"

    def __str__(self) -> str:
        return self.pretty_str()

    def __repr__(self) -> str:
        return str(self)


def input_names(ds: Dataset | set[str] | frozenset[str]) -> frozenset[str]:
    """The circuit input names of a dataset (or the names themselves)."""
    return frozenset(ds.input_names if isinstance(ds, Dataset) else ds)


def to_inputs(matcher: Any, ds: Dataset | set[str]) -> IterativeMatcher:
    """``matcher`` extended to the dataset's input arrays at or below what it finds (as
    rust_circuit's ``chain``, which may match where it starts: a node mapped to an input array
    itself, ``IterativeMatcher("labels")``, reaches that input)."""
    return as_iterative(matcher).then(Matcher.any(*sorted(input_names(ds))), min_depth=0)
