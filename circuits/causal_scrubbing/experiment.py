"""``Experiment``: scrub a circuit along a correspondence, and ``ScrubbedExperiment``: evaluate it.

rust_circuit's names and arguments (``Experiment(circuit, dataset, corr, random_seed=42,
check=True)``, ``.scrub(ref_ds_or_num, treeify=True, check=True)``, ``.evaluate()``).  Our model
circuits are batched: the reference dataset's rows become the circuit's batch axis, and each input
array is replaced, path by path, by the array of the same name drawn for the interpretation node
whose branch the path belongs to (row ``i`` of every replacement is drawn for reference datum
``i``).  ``update`` along a matcher un-shares a node only where the paths through it differ, so the
scrubbed circuit is a DAG: what two branches compute from the same data is computed once.

*Treeifying* (``treeified``) marks each branch's inputs with the interpretation node's name (the
input renamed ``'{input}_scrub_{node}'`` under an identity ``Add`` that keeps the input's name,
rust_circuit's ``Tag``), so the checks can see which node claims what.  It is optional: replacing
the inputs path by path gives the same values without it.
"""

from __future__ import annotations

import warnings
from typing import Any

import attrs
import torch

from circuits.causal_scrubbing.correspondence import Correspondence
from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.hypothesis import InterpNode, SampledInputs, to_inputs
from circuits.errors import CausalScrubbingError, IllegalCorrespondenceError
from circuits.matching import are_any_found, get
from circuits.nodes import Add, Circuit, check_node
from circuits.rewrite import update
from circuits.traversal import unique_nodes

__all__ = ["Experiment", "ExperimentEvalSettings", "ScrubbedExperiment"]

_SCRUB = "_scrub_"


def _is_tag(node: Circuit) -> bool:
    """An identity ``Add`` named like an input around that input renamed for its claimant."""
    return (
        isinstance(node, Add)
        and len(node.children) == 1
        and node.name is not None
        and (node.children[0].name or "").startswith(node.name + _SCRUB)
    )


class Experiment:
    """A causal scrubbing experiment on ``circuit`` (its inputs named like ``dataset``'s input
    arrays, examples on the leading axis) under the hypothesis ``corr``; ``random_seed`` seeds the
    one generator every draw uses; ``check`` runs the correspondence's checks (``"fast"``: only
    the cheap ones, with a warning, as rust_circuit)."""

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
        if check not in (True, False, "fast"):
            raise IllegalCorrespondenceError(
                f"Experiment: check must be True, False or 'fast', got {check!r}"
            )
        if check is not True:
            warnings.warn(
                f"check={check!r}: your correspondence may have issues that won't be caught", stacklevel=2
            )
        self._base_circuit, self._dataset, self._nodes, self._check = circuit, dataset, corr, check
        if check:
            corr.check(circuit, circuit_treeified=False)
        if check is True:
            corr.check_well_defined(circuit, dataset)
        self._seed = random_seed
        self._rng = torch.Generator().manual_seed(random_seed)

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
            raise IllegalCorrespondenceError(f"scrub: {num_examples!r} reference examples; give an int >= 1")
        return self._dataset.sample(num_examples, self._rng)

    def sample(self, ref_ds: Dataset) -> SampledInputs:
        """Every interpretation node's data, drawn against ``ref_ds``."""
        return self._nodes.sample(self._dataset, self._rng, ref_ds)

    def scrub(
        self, ref_ds_or_num: Dataset | int, group: Any = None, treeify: bool = True, check: Any = None
    ) -> ScrubbedExperiment:
        """Sample the reference data (``ref_ds_or_num`` examples from the dataset, or that
        dataset) and every node's data, treeify (optional) and replace the inputs path by path.
        ``group`` (rust_circuit's DiscreteVar group) has no counterpart: the reference rows are
        the batch; anything but None raises."""
        if group is not None:
            raise CausalScrubbingError(
                "scrub: group= is not supported (the reference examples are the batch axis)"
            )
        check = bool(self._check if check is None else check)
        ref_ds = ref_ds_or_num if isinstance(ref_ds_or_num, Dataset) else self.make_ref_ds(ref_ds_or_num)
        sampled = self.sample(ref_ds)
        circuit = self._base_circuit
        if treeify:
            circuit = self.treeified(check)
            if check:
                self._nodes.check_injective_on_treeified(circuit)
        circuit = self.replace_inputs(circuit, sampled)
        return ScrubbedExperiment(circuit, ref_ds, sampled, self._seed, self._nodes)

    def treeified(self, check: bool = True) -> Circuit:
        """The circuit with each branch's inputs marked by its interpretation node (see the module);
        with ``check``, a node's branch must reach its inputs through its parent's."""
        circuit = self._base_circuit
        root = self._nodes.get_root()
        for node, matcher in self._nodes.in_dfs_order():
            path = to_inputs(matcher, self._dataset)
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
                    f"branch (last claimed by {claimant!r}): a child's matcher must chain on from its parent's"
                )
            inside = {n.hash for claimed in get(circuit, self._nodes[parent]) for n in unique_nodes(claimed)}
            for claimed in get(circuit, self._nodes[node]):
                if claimed.hash not in inside:
                    raise IllegalCorrespondenceError(
                        f"interpretation node {node.name!r} claims {claimed.describe()}, which is not inside "
                        f"its parent {parent.name!r}'s branch"
                    )

    def replace_inputs(self, circuit: Circuit, sampled_inputs: SampledInputs) -> Circuit:
        """Each node's branch run on its data: parents first, so a child's paths end on the child's."""
        for parent, node, matcher in self._nodes.in_dfs_order_with_parents():
            data = sampled_inputs[node]
            if parent is not None and sampled_inputs[parent] == data:
                continue
            path = to_inputs(matcher, self._dataset)
            if not are_any_found(circuit, path):
                raise IllegalCorrespondenceError(
                    f"interpretation node {node.name!r}: its branch reaches none of the inputs "
                    f"{sorted(self._dataset.input_names)} in the circuit"
                )
            circuit = update(circuit, path, lambda found, data=data: data.arrs[found.name])
        return circuit


def _tagged(found: Circuit, node: InterpNode) -> Circuit:
    """``found`` (an input, or one tagged before) tagged for ``node``."""
    inner = found.children[0] if _is_tag(found) else found
    return Add(inner.rename(f"{found.name}{_SCRUB}{node.name}"), name=found.name)


class ExperimentEvalSettings:
    """How ``ScrubbedExperiment.evaluate`` runs, with rust_circuit's arguments.

    ``device_dtype``: a device (str) or a ``(device, dtype)`` pair.  ``optimize`` and
    ``optim_settings`` are accepted and have no effect (our evaluator has no separate optimiser).
    rust_circuit's batching and sampling options (``batch_size``, ``run_on_all=False``,
    ``num_samples``) are not supported: anything but their defaults raises, rather than being
    silently ignored.  Every reference example is run once, in order.
    """

    def __init__(
        self,
        optimize: bool = True,
        optim_settings: Any = None,
        batch_size: int | None = None,
        run_on_all: bool = True,
        num_samples: int | None = None,
        device_dtype: Any = None,
    ):
        unsupported = {"batch_size": batch_size, "num_samples": num_samples}
        for name, value in unsupported.items():
            if value is not None:
                raise CausalScrubbingError(
                    f"ExperimentEvalSettings: {name}={value!r} is not supported (give None)"
                )
        if run_on_all is not True:
            raise CausalScrubbingError("ExperimentEvalSettings: only run_on_all=True is supported")
        self.optimize, self.optim_settings, self.device_dtype = optimize, optim_settings, device_dtype


@attrs.define(frozen=True)
class ScrubbedExperiment:
    """The scrubbed circuit, the reference data and what was sampled for each node."""

    circuit: Circuit
    ref_ds: Dataset
    sampled_inputs: SampledInputs
    seed: int
    nodes: Correspondence

    def evaluate(
        self, eval_settings: ExperimentEvalSettings | None = None, *, evaluator=None
    ) -> torch.Tensor:
        """The scrubbed circuit's value, one row per reference example (through ``evaluator``, a
        ``cc.Evaluator``, when given, so what earlier runs computed is reused)."""
        device = dtype = None
        settings = eval_settings or ExperimentEvalSettings()
        if isinstance(settings.device_dtype, str):
            device = settings.device_dtype
        elif settings.device_dtype is not None:
            device, dtype = settings.device_dtype
        if evaluator is not None:
            return evaluator.evaluate(self.circuit, device=device, dtype=dtype)
        return self.circuit.evaluate(device=device, dtype=dtype)

    def print(
        self,
        print_data: bool = True,
        color_by_data: bool = True,
        repr: bool = False,
        datum_idx: int = 0,
        show_inputs: bool = False,
    ):
        """Print the scrubbed circuit down to the mapped nodes (``show_inputs``: and down to every
        input outside the mapped leaves), each mapped node commented with its interpretation node
        and samplers, each input with whose data it is (colours by dataset); ``repr=True``
        returns the text, without colours (``causal_scrubbing.printing``)."""
        from circuits.causal_scrubbing.printing import scrubbed_repr

        text = scrubbed_repr(
            self,
            print_data=print_data,
            color_by_data=color_by_data,
            datum_idx=datum_idx,
            color=not repr,
            show_inputs=show_inputs,
        )
        if repr:
            return text
        print(text)
        return None
