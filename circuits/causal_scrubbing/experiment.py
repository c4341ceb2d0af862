"""``Experiment``: scrub a circuit along a correspondence into a ``ScrubbedExperiment``.

rust_circuit's names and arguments (``Experiment(circuit, dataset, corr, random_seed=42,
check=True)``, ``.scrub(ref_ds_or_num, group=None, treeify=True, check=True)``, ``.treeified``,
``.wrap_in_var``, ``.replace_inputs``).  Each input array is replaced, path by path, by the array
of the same name drawn for the interpretation node whose branch the path belongs to (row ``i`` of
every replacement is drawn for reference datum ``i``).  ``update`` along a matcher un-shares a
node only where the paths through it differ, so the scrubbed circuit is a DAG: what two branches
compute from the same data is computed once.

The circuit is built either on one example, as rust_circuit's are (each input has the shape of
one row of the dataset's array of its name): ``scrub`` then wraps the inputs in ``DiscreteVar``s
of the group, as rust_circuit does, and ``evaluate`` runs the group on all reference examples; or
on a batch (each input has a leading batch axis of any size, the rows after it): the reference
rows become that axis.  Which one is read from the inputs' shapes; any other shape is an error
naming the input.

*Treeifying* (``treeified``) marks each branch's inputs with the interpretation node's name (the
input renamed ``'{input}_scrub_{node}'`` under an identity ``Add`` that keeps the input's name,
rust_circuit's ``Tag``), so the checks can see which node claims what.  It is optional: replacing
the inputs path by path gives the same values without it.
"""

from __future__ import annotations

import operator
import warnings
from typing import Any

import torch

from circuits.causal_scrubbing.correspondence import Correspondence
from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.hypothesis import InterpNode, SampledInputs, to_inputs
from circuits.causal_scrubbing.scrubbed import ExperimentEvalSettings, ScrubbedExperiment
from circuits.errors import CausalScrubbingError, IllegalCorrespondenceError, shown
from circuits.rewriting.matching import Matcher, are_any_found, get
from circuits.core.nodes import Add, Circuit, DiscreteVar, check_node
from circuits.rewriting.rewrite import update
from circuits.core.traversal import unique_nodes

__all__ = ["Experiment", "ExperimentEvalSettings", "ScrubbedExperiment", "checked_seed"]

_SCRUB = "_scrub_"
#: torch's generators take seeds in [0, 2**64) (a negative seed is read modulo 2**64).
_SEEDS = 2**64


def checked_seed(seed: Any, what: str = "random_seed") -> int:
    """``seed`` as an int a ``torch.Generator`` takes, or an error naming ``what``."""
    try:
        value = None if isinstance(seed, bool) else operator.index(seed)
    except TypeError:
        value = None
    if value is None or not 0 <= value < _SEEDS:
        raise CausalScrubbingError(f"{what} must be an int in [0, 2**64), got {shown(repr(seed))}")
    return value


def _is_tag(node: Circuit) -> bool:
    """An identity ``Add`` named like an input around that input renamed for its claimant."""
    return (
        isinstance(node, Add)
        and len(node.children) == 1
        and node.name is not None
        and (node.children[0].name or "").startswith(node.name + _SCRUB)
    )


def _on_one_example(circuit: Circuit, dataset: Dataset) -> bool:
    """Whether ``circuit`` is built on one example (its inputs are rows of the dataset's arrays)
    rather than on a batch of them; an input of neither shape, or a mix, is an error naming it."""
    names = dataset.input_names
    found = {node for node in unique_nodes(circuit) if node.name in names}
    if not found:
        raise IllegalCorrespondenceError(
            f"Experiment: the circuit has none of the dataset's inputs {sorted(names)}: there is nothing to scrub"
        )
    kinds: dict[bool, Circuit] = {}
    for node in sorted(found, key=lambda node: node.name):
        row = dataset.arrs[node.name].shape[1:]
        if node.shape == row or (len(node.shape) == len(row) + 1 and node.shape[1:] == row):
            kinds.setdefault(node.shape == row, node)
            continue
        batch = ", ".join(["batch", *map(str, row)])
        raise CausalScrubbingError(
            f"Experiment: input {node.describe()} has shape {list(node.shape)}; the dataset's "
            f"{node.name!r} is {list(dataset.arrs[node.name].shape)}, so the circuit's input must be one "
            f"row, {list(row)}, or a batch of rows, [{batch}]"
        )
    if len(kinds) > 1:
        one, batched = kinds[True], kinds[False]
        raise CausalScrubbingError(
            f"Experiment: input {one.describe()} {list(one.shape)} is one example but {batched.describe()} "
            f"{list(batched.shape)} is a batch: build the circuit on one example or on a batch"
        )
    return next(iter(kinds))


def _checked_check(check: Any, where: str) -> Any:
    if check is not True and check is not False and not (isinstance(check, str) and check == "fast"):
        raise IllegalCorrespondenceError(
            f"{where}: check must be True, False or 'fast', got {shown(repr(check))}"
        )
    return check


class Experiment:
    """A causal scrubbing experiment on ``circuit`` (its inputs named like ``dataset``'s input
    arrays: one example's rows, or a batch of them) under the hypothesis ``corr``;
    ``random_seed`` seeds the one generator every draw uses; ``check`` runs the correspondence's
    checks (complete, root is the model) as rust_circuit does: ``"fast"`` the same, with a
    warning, ``False`` none.  The well-defined check (each matcher finds one node) runs only when
    asked for, ``corr.check_well_defined(circuit, dataset)``, as in rust_circuit."""

    def __init__(
        self,
        circuit: Circuit,
        dataset: Dataset,
        corr: Correspondence,
        random_seed: int = 42,
        check: Any = True,
    ):
        check_node(circuit, "Experiment: the circuit", IllegalCorrespondenceError)
        if not isinstance(dataset, Dataset):
            raise IllegalCorrespondenceError(
                f"Experiment: dataset must be a Dataset, got {type(dataset).__name__}"
            )
        if not isinstance(corr, Correspondence):
            raise IllegalCorrespondenceError(
                f"Experiment: corr must be a Correspondence, got {type(corr).__name__}"
            )
        self._check = _checked_check(check, "Experiment")
        self._seed = checked_seed(random_seed, "Experiment: random_seed")
        if check is not True:
            warnings.warn(
                f"check={check!r}: your correspondence may have issues that won't be caught", stacklevel=2
            )
        self._base_circuit, self._dataset, self._nodes = circuit, dataset, corr
        if check:
            corr.check(circuit, circuit_treeified=False)
        self._one_example = _on_one_example(circuit, dataset)
        self._rng = torch.Generator().manual_seed(self._seed)

    @property
    def base_circuit(self) -> Circuit:
        return self._base_circuit

    @property
    def dataset(self) -> Dataset:
        return self._dataset

    @property
    def nodes(self) -> Correspondence:
        return self._nodes

    def make_ref_ds(self, num_examples: int) -> Dataset:
        if isinstance(num_examples, bool) or not isinstance(num_examples, int) or num_examples < 1:
            raise CausalScrubbingError(
                f"scrub: ref_ds_or_num must be a Dataset or a number of reference examples >= 1, "
                f"got {shown(repr(num_examples))}"
            )
        return self._dataset.sample(num_examples, self._rng)

    def sample(self, ref_ds: Dataset) -> SampledInputs:
        """Every interpretation node's data, drawn against ``ref_ds``."""
        return self._nodes.sample(self._dataset, self._rng, ref_ds)

    def scrub(
        self,
        ref_ds_or_num: Dataset | int,
        group: Circuit | None = None,
        treeify: bool = True,
        check: Any = True,
    ) -> ScrubbedExperiment:
        """Sample the reference data (``ref_ds_or_num`` examples from the dataset, or that
        dataset) and every node's data, treeify (optional), wrap a circuit on one example's
        inputs in ``DiscreteVar``s of ``group`` (a fresh uniform group of ``len(ref_ds)`` if None)
        and replace the inputs path by path.  ``check`` (True unless told otherwise, as in
        rust_circuit; None: the experiment's) runs the checks treeifying makes."""
        check = bool(self._check if check is None else _checked_check(check, "scrub"))
        ref_ds = self._checked_ref_ds(ref_ds_or_num)
        group = self._checked_group(group, len(ref_ds))
        sampled = self.sample(ref_ds)
        circuit = self._base_circuit
        if treeify:
            circuit = self.treeified(check)
            if check:
                self._nodes.check_injective_on_treeified(circuit)
        if self._one_example:
            circuit = self.wrap_in_var(circuit, ref_ds, group)
        circuit = self.replace_inputs(circuit, sampled)
        return ScrubbedExperiment(circuit, ref_ds, sampled, group, self._seed, self._nodes)

    def _checked_ref_ds(self, ref_ds_or_num: Any) -> Dataset:
        """The reference dataset: drawn, or given with every array of the dataset, row for row."""
        if not isinstance(ref_ds_or_num, Dataset):
            return self.make_ref_ds(ref_ds_or_num)
        ref_ds = ref_ds_or_num
        for name, array in self._dataset.arrs.items():
            if name not in ref_ds.arrs:
                raise CausalScrubbingError(
                    f"scrub: ref_ds_or_num has no array {name!r} (it has {sorted(ref_ds.arrs)}); the "
                    f"reference examples need every array of the dataset {sorted(self._dataset.arrs)}"
                )
            if ref_ds.arrs[name].shape[1:] != array.shape[1:]:
                raise CausalScrubbingError(
                    f"scrub: ref_ds_or_num's {name!r} has rows of shape {list(ref_ds.arrs[name].shape[1:])}, "
                    f"the dataset's {list(array.shape[1:])}"
                )
        if len(ref_ds) == 0:
            raise CausalScrubbingError("scrub: ref_ds_or_num has no examples")
        return ref_ds

    @staticmethod
    def _checked_group(group: Any, count: int, where: str = "scrub") -> Circuit:
        if group is None:
            return DiscreteVar.uniform_probs_and_group(count)
        check_node(group, f"{where}: group", CausalScrubbingError)
        if group.shape != (count,):
            raise CausalScrubbingError(
                f"{where}: group has shape {list(group.shape)}; it must be [{count}], one per reference example"
            )
        return group

    def wrap_in_var(self, circuit: Circuit, ref_ds: Dataset, group: Circuit) -> Circuit:
        """``circuit`` (built on one example) with each of ``ref_ds``'s inputs in it replaced by
        ``DiscreteVar(ref_ds's array, group, name='{input}_var')``: a variable over the reference
        examples (rust_circuit's; what ``replace_inputs`` then replaces are its values).  An
        input of another shape than one row is an error naming it; none at all, no change."""
        if not isinstance(ref_ds, Dataset):
            raise CausalScrubbingError(f"wrap_in_var: ref_ds must be a Dataset, got {type(ref_ds).__name__}")
        group = self._checked_group(group, len(ref_ds), "wrap_in_var")
        inputs = Matcher.any(*sorted(ref_ds.input_names))
        found = get(circuit, inputs)
        for node in found:
            row = ref_ds.arrs[node.name].shape[1:]
            if node.shape != row:
                raise CausalScrubbingError(
                    f"wrap_in_var: input {node.describe()} has shape {list(node.shape)}, not one row of "
                    f"ref_ds's {node.name!r} ({list(row)}): wrap_in_var is for circuits built on one example"
                )
        if not found:
            return circuit
        return update(
            circuit,
            inputs,
            lambda found: DiscreteVar(ref_ds.arrs[found.name], group, name=f"{found.name}_var"),
        )

    def treeified(self, check: bool = True) -> Circuit:
        """The circuit with each branch's inputs marked by its interpretation node (see the module);
        with ``check``, a node's branch must reach its inputs through its parent's."""
        circuit = self._base_circuit
        root = self._nodes.get_root()
        for node, matcher in self._nodes.in_dfs_order():
            path = to_inputs(matcher, self._dataset)
            self._check_reaches_inputs(circuit, node, path)
            if check and node is not root:
                self._check_inside_parent(circuit, node, path)
            # a branch that reaches no input is refused by replace_inputs where it matters
            circuit = update(
                circuit, path, lambda found, node=node: _tagged(found, node), assert_any_found=False
            )
        return circuit

    def _check_inside_parent(self, circuit: Circuit, node: InterpNode, path) -> None:
        """Each input ``node``'s branch reaches was last claimed by its parent, whose branch holds it."""
        for found in get(circuit, path):
            claimant = found.children[0].name.split(_SCRUB, 1)[1] if _is_tag(found) else None
            parent = self._nodes.i_names.get(claimant) if claimant is not None else None
            if parent is None or node not in parent.children:
                raise IllegalCorrespondenceError(
                    f"interpretation node {node.name!r} reaches input {found.name!r} outside its parent's "
                    f"branch (last claimed by {claimant!r}): a child's matcher must chain on from its parent's",
                    i_node=node,
                )
            inside = {n.hash for claimed in get(circuit, self._nodes[parent]) for n in unique_nodes(claimed)}
            for claimed in get(circuit, self._nodes[node]):
                if claimed.hash not in inside:
                    raise IllegalCorrespondenceError(
                        f"interpretation node {node.name!r} claims {claimed.describe()}, which is not inside "
                        f"its parent {parent.name!r}'s branch",
                        i_node=node,
                    )

    def replace_inputs(self, circuit: Circuit, sampled_inputs: SampledInputs) -> Circuit:
        """Each node's branch run on its data: parents first, so a child's paths end on the child's."""
        for parent, node, matcher in self._nodes.in_dfs_order_with_parents():
            data = sampled_inputs[node]
            path = to_inputs(matcher, self._dataset)
            self._check_reaches_inputs(circuit, node, path)
            if parent is not None and sampled_inputs[parent] == data:
                continue
            circuit = update(circuit, path, lambda found, data=data: data.arrs[found.name])
        return circuit

    def _check_reaches_inputs(self, circuit: Circuit, node: InterpNode, path) -> None:
        """A branch with no input below it scrubs nothing: an error naming the node (so that
        ``update`` along the branch always finds something)."""
        if not are_any_found(circuit, path):
            raise IllegalCorrespondenceError(
                f"interpretation node {node.name!r}: its branch reaches none of the inputs "
                f"{sorted(self._dataset.input_names)} in the circuit",
                i_node=node,
            )


def _tagged(found: Circuit, node: InterpNode) -> Circuit:
    """``found`` (an input, or one tagged before) tagged for ``node``."""
    inner = found.children[0] if _is_tag(found) else found
    return Add(inner.rename(f"{found.name}{_SCRUB}{node.name}"), name=found.name)
