"""``Correspondence``: each interpretation node's branch of the model, and rust_circuit's checks.

``corr.add(interp_node, matcher)``: the matcher picks out the node's part of the model (the root's
is ``corr_root_matcher``: the whole model; a child's chains on from its parent's).  The checks,
each raising ``IllegalCorrespondenceError`` that names the interpretation node and says what is
wrong: *complete* (every child of a mapped node is mapped), *root is the model*, *well defined*
(each matcher finds exactly one node, and reaches the dataset's inputs below it: run only when
called, as in rust_circuit, whose ``Experiment`` allows a matcher finding several nodes),
*injective on the treeified circuit* (no circuit node is claimed by two interpretation nodes).
"""

from __future__ import annotations

from typing import Any

import torch

from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.hypothesis import (
    InterpNode,
    SampledInputs,
    corr_root_matcher,
    input_names,
    to_inputs,
)
from circuits.errors import IllegalCorrespondenceError
from circuits.rewriting.matching import IterativeMatcher, are_any_found, as_iterative, get
from circuits.core.nodes import Circuit

__all__ = ["Correspondence"]


class Correspondence:
    """Interpretation nodes -> their branches of the model (``IterativeMatcher``s)."""

    def __init__(self):
        self.corr: dict[InterpNode, IterativeMatcher] = {}
        self.i_names: dict[str, InterpNode] = {}

    def copy(self) -> Correspondence:
        """A shallow copy: the same interpretation nodes and matchers in a new mapping."""
        new = Correspondence()
        new.corr, new.i_names = dict(self.corr), dict(self.i_names)
        return new

    def __len__(self) -> int:
        return len(self.corr)

    def __contains__(self, i_node: InterpNode) -> bool:
        return i_node in self.corr

    def __getitem__(self, i_node: InterpNode) -> IterativeMatcher:
        return self.corr[i_node]

    def get_by_name(self, name: str) -> InterpNode:
        if name not in self.i_names:
            raise IllegalCorrespondenceError(
                f"no interpretation node named {name!r}; have {sorted(self.i_names)}"
            )
        return self.i_names[name]

    def add(self, i_node: InterpNode, m_node: Any) -> None:
        """Map ``i_node`` to the branch ``m_node`` (an IterativeMatcher or any matcher form)."""
        if not isinstance(i_node, InterpNode):
            raise IllegalCorrespondenceError(f"Correspondence.add: {i_node!r} is not an InterpNode")
        if i_node in self.corr:
            raise IllegalCorrespondenceError(
                f"interpretation node {i_node.name!r} is already in the correspondence", i_node=i_node
            )
        if i_node.name in self.i_names:
            raise IllegalCorrespondenceError(
                f"another interpretation node named {i_node.name!r} is already in the correspondence",
                i_node=i_node,
            )
        self.corr[i_node] = as_iterative(m_node)
        self.i_names[i_node.name] = i_node

    def replace(self, i_node: InterpNode, m_node: Any) -> None:
        """Map ``i_node``, already in the correspondence, to another branch."""
        if i_node not in self.corr:
            raise IllegalCorrespondenceError(
                f"interpretation node {i_node.name!r} is not in the correspondence", i_node=i_node
            )
        self.corr[i_node] = as_iterative(m_node)

    def get_root(self) -> InterpNode:
        """The one mapped node that is no mapped node's child."""
        if not self.corr:
            raise IllegalCorrespondenceError("an empty correspondence has no root")
        children = {id(child) for node in self.corr for child in node.children}
        roots = [node for node in self.corr if id(node) not in children]
        if len(roots) != 1:
            shown = [node.name for node in roots]
            raise IllegalCorrespondenceError(
                f"a correspondence needs one root (a node no other mapped node has as a child); found {shown or 'none'}"
            )
        return roots[0]

    def in_dfs_order(self) -> list[tuple[InterpNode, IterativeMatcher]]:
        return [(node, matcher) for _, node, matcher in self.in_dfs_order_with_parents()]

    def in_dfs_order_with_parents(self) -> list[tuple[InterpNode | None, InterpNode, IterativeMatcher]]:
        """``(parent, node, matcher)`` from the root down, depth first; a node of the tree that is
        not mapped is an error naming it (the check ``check_complete`` makes, met even without it)."""
        if not self.corr:
            return []
        root = self.get_root()
        pairs = [(None, root), *root.get_descendants_with_parents()]
        for parent, node in pairs:
            if node not in self.corr:
                raise IllegalCorrespondenceError(
                    f"interpretation node {node.name!r} (a child of {parent.name!r}) is not in the correspondence",
                    i_node=node,
                )
        return [(parent, node, self.corr[node]) for parent, node in pairs]

    # ------------------------------------------------------------------ checks

    def check_complete(self) -> None:
        """Every child of a mapped node is mapped."""
        for node in self.corr:
            for child in node.children:
                if child not in self.corr:
                    raise IllegalCorrespondenceError(
                        f"interpretation node {child.name!r} (a child of {node.name!r}) is not in the correspondence",
                        i_node=child,
                    )

    def check_root_is_model(self) -> None:
        """The root's branch is ``corr_root_matcher``: the whole model."""
        root = self.get_root()
        if repr(self.corr[root]) != repr(corr_root_matcher):
            raise IllegalCorrespondenceError(
                f"the root {root.name!r} must be mapped to corr_root_matcher (the whole model), not {self.corr[root]!r}",
                i_node=root,
            )

    def check_well_defined(self, circuit: Circuit, ds: Dataset | set[str] | None = None) -> None:
        """Each branch finds exactly one node of ``circuit`` and, given ``ds``, reaches its inputs."""
        for node, matcher in self.in_dfs_order():
            found = get(circuit, matcher)
            if len(found) != 1:
                shown = ", ".join(sorted(n.describe() for n in found)[:5])
                raise IllegalCorrespondenceError(
                    f"interpretation node {node.name!r}: its matcher {matcher!r} finds {len(found)} nodes "
                    f"of the circuit{': ' + shown if found else ''}; it must find exactly one",
                    i_node=node,
                )
            if ds is not None and not are_any_found(circuit, to_inputs(matcher, ds)):
                raise IllegalCorrespondenceError(
                    f"interpretation node {node.name!r}: no input {sorted(input_names(ds))} below "
                    f"{next(iter(found)).describe()}: its branch does not reach the inputs",
                    i_node=node,
                )

    def get_all_matched(self, circuit: Circuit) -> list[Circuit]:
        """Every circuit node some branch finds, once per branch that finds it."""
        return [found for matcher in self.corr.values() for found in get(circuit, matcher)]

    def check_injective_on_treeified(self, circuit: Circuit) -> None:
        """No node of the treeified circuit is claimed by two interpretation nodes."""
        claimed: dict[bytes, list[str]] = {}
        for node, matcher in self.corr.items():
            for found in get(circuit, matcher):
                claimed.setdefault(found.hash, []).append(node.name)
        for names in claimed.values():
            if len(names) > 1:
                raise IllegalCorrespondenceError(
                    f"interpretation nodes {sorted(names)} claim the same node of the treeified circuit: "
                    "a correspondence must be injective (give each its own branch)"
                )

    def check(self, circuit: Circuit, circuit_treeified: bool = True) -> None:
        self.check_complete()
        self.check_root_is_model()
        if circuit_treeified:
            self.check_injective_on_treeified(circuit)

    def sample(self, source_ds: Dataset, rng: torch.Generator, ref_ds: Dataset) -> SampledInputs:
        return self.get_root().sample(rng=rng, source_ds=source_ds, parent_ds=ref_ds)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(corr={self.corr!r})"
