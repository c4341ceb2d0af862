"""rust_circuit's own causal scrubbing tests (python/tests/causal_scrubbing/test_experiment.py),
ported to this library's API: circuits built on one example, as rust_circuit's are (``xs`` is one
row of the dataset's ``xs``), which ``scrub`` wraps in ``DiscreteVar``s of a group and
``evaluate`` runs on every reference example.

Where rust_circuit's test only runs or only bounds the loss, the port also asserts the scrubbed
value against the one computed in torch from the data each interpretation node drew.
"""

from __future__ import annotations

import re

import pytest
import torch

import circuits as cc
from circuits.causal_scrubbing import (
    Correspondence,
    Dataset,
    ExactSampler,
    Experiment,
    ExperimentEvalSettings,
    ScrubbedExperiment,
    FuncSampler,
    IllegalCorrespondenceError,
    InterpNode,
    UncondSampler,
    UncondTogetherSampler,
    corr_root_matcher,
    to_inputs,
)


def int_dataset(shape: tuple[int, int], labeler, seed: int = 0, maxint: int = 10) -> Dataset:
    """rust_circuit's ``IntDataset.of_shape``: random ints ``xs`` and ``labels = labeler(row)``."""
    xs = torch.randint(maxint, shape, generator=torch.Generator().manual_seed(seed)).double()
    return Dataset({"xs": xs, "labels": torch.stack([labeler(row) for row in xs])})


def loss_fn(ds: Dataset, out: torch.Tensor) -> float:
    return (out.double() - ds.labels.value).abs().mean().item()


def col(data: Dataset, i: int) -> torch.Tensor:
    return data.xs.value[:, i]


def scalar_mul(node: cc.Circuit, k: float, name: str | None = None) -> cc.Circuit:
    return cc.Einsum.from_einsum_string(",->", node, cc.Scalar(float(k)), name=name)


def xs_array(n: int = 2) -> cc.Array:
    return cc.Array(torch.arange(float(n)), name="xs")


def index(xs: cc.Circuit, i: int, name: str | None = None) -> cc.Circuit:
    return cc.Index(xs, (i,), name=name)


label_cond = FuncSampler(lambda d: d.labels.value)


def column_cond(i: int) -> FuncSampler:
    return FuncSampler(lambda d: d.xs.value[:, i])


def run_experiment(c, ds, corr, assert_loss=None, num_examples=1, num_seeds=10, treeify=True, check=True):
    """rust_circuit's helper: scrub with seeds 0..9, and check the loss of each."""
    runs = []
    for seed in range(num_seeds):
        scrubbed = Experiment(c, ds, corr, random_seed=seed, check=check).scrub(num_examples, treeify=treeify)
        out = scrubbed.evaluate(ExperimentEvalSettings(device_dtype="cpu"))
        assert out.shape == (num_examples,)
        if assert_loss is not None:
            loss = loss_fn(scrubbed.ref_ds, out)
            assert assert_loss(loss), (seed, loss)
        runs.append((scrubbed, out))
    return runs


def datum_loss(c: cc.Circuit, ds: Dataset) -> float:
    """The unscrubbed circuit on the first datum."""
    datum = cc.Array(ds.xs.value[0], name="ref")
    return loss_fn(ds[0], cc.update(c, "xs", lambda _: datum).evaluate()[None])


def chain_corr(root_name: str, *children: tuple[str, object]) -> tuple[Correspondence, InterpNode, list]:
    corr = Correspondence()
    root = InterpNode(UncondSampler(), root_name)
    corr.add(root, corr_root_matcher)
    nodes = []
    for name, matcher in children:
        node = root.make_descendant(UncondSampler(), name)
        corr.add(node, matcher)
        nodes.append(node)
    return corr, root, nodes


DATA = int_dataset((1000, 2), lambda x: 2 * x[0] + 3 * x[1])

# ------------------------------------------------------------------ correspondence checks


def test_corr_well_defined_matches_many_is_allowed_and_scrubs_both_nodes():
    """rust_circuit: an interpretation node whose matcher finds several nodes runs under check=True."""
    xs = xs_array()
    c = cc.Add(index(xs, 0, "x0"), index(xs, 1, "x0"), name="C")
    corr, _, (x0,) = chain_corr("C", ("x0", corr_root_matcher.chain("x0")))
    for scrubbed, out in run_experiment(c, DATA, corr, num_examples=3):
        data = scrubbed.sampled_inputs[x0]
        torch.testing.assert_close(out, col(data, 0) + col(data, 1), rtol=0, atol=0)


def test_corr_well_defined_matches_none():
    xs = cc.Array(torch.tensor([0.0, 1.0]), name="not xs")
    c = cc.Add(index(xs, 0, "x0"), cc.Scalar(5.0), name="C")
    corr, _, _ = chain_corr("Ct")
    with pytest.raises(IllegalCorrespondenceError, match="none of the dataset's inputs"):
        run_experiment(c, DATA, corr)
    corr, _, _ = chain_corr("Ct", ("x0", corr_root_matcher.chain("not_x0")))
    with pytest.raises(IllegalCorrespondenceError, match="none of the dataset's inputs"):
        run_experiment(c, DATA, corr)
    with_xs = cc.Add(index(xs_array(), 0, "x0"), cc.Scalar(5.0), name="C")
    with pytest.raises(IllegalCorrespondenceError, match="its branch reaches none of the inputs") as info:
        run_experiment(with_xs, DATA, corr)
    assert info.value.i_node.name == "x0"


def test_corr_injective_simple():
    xs = xs_array()
    c = cc.Add(index(xs, 0, "x0"), index(xs, 1, "x1"), name="C")
    to_x0 = corr_root_matcher.chain("x0")
    corr, _, _ = chain_corr("C", ("x0_1", to_x0), ("x0_2", to_x0))
    # treeifying meets it first, as rust_circuit's: x0_1 tagged the input, and is not x0_2's parent
    with pytest.raises(IllegalCorrespondenceError, match="reaches input 'xs' outside its parent") as info:
        run_experiment(c, DATA, corr)
    assert info.value.i_node.name == "x0_2"


def test_corr_injective_subsumed():
    """rust_circuit's test leaves the einsum unnamed, so the branch 'A' finds nothing."""
    xs = xs_array()
    first = index(xs, 0, "x0")
    c = cc.Add(first, scalar_mul(first, 2), name="C")
    corr = Correspondence()
    c_t = InterpNode(UncondSampler(), "C")
    a = c_t.make_descendant(UncondSampler(), "A")
    a_x0 = a.make_descendant(UncondSampler(), "A_x0")
    x0 = c_t.make_descendant(UncondSampler(), "x0")
    corr.add(c_t, corr_root_matcher)
    corr.add(a, corr_root_matcher.chain("A"))
    corr.add(x0, corr_root_matcher.chain("x0"))
    corr.add(a_x0, corr_root_matcher.then("x0", term_early_at="A"))
    with pytest.raises(IllegalCorrespondenceError, match="its branch reaches none") as info:
        run_experiment(c, DATA, corr)
    assert info.value.i_node is a


def test_corr_injective_checking_leaves_insufficient():
    """The leaves map to different nodes of the treeified model, but two inner nodes to one."""
    xs = xs_array()
    added = cc.Add(index(xs, 0, "x0"), index(xs, 1, "x1"), name="x2")
    c = cc.Add(added, name="C")
    corr = Correspondence()
    c_t = InterpNode(UncondSampler(), "C")
    added_1 = c_t.make_descendant(UncondSampler(), "x2_1")
    added_2 = c_t.make_descendant(UncondSampler(), "x2_2")
    to_1, to_2 = corr_root_matcher.chain("x2"), corr_root_matcher.then("x2", term_early_at={"x3"})
    corr.add(c_t, corr_root_matcher)
    corr.add(added_1, to_1)
    corr.add(added_2, to_2)
    corr.add(added_1.make_descendant(UncondSampler(), "x0"), to_1.chain("x0"))
    corr.add(added_2.make_descendant(UncondSampler(), "x1"), to_2.chain("x1"))
    # treeifying meets it first, as rust_circuit's: x2_2's inputs were last tagged by x0, x2_1's child
    # the message names the input and the node that last claimed it
    with pytest.raises(
        IllegalCorrespondenceError,
        match=re.escape("reaches input 'xs' outside its parent's branch (last claimed by 'x0')"),
    ) as info:
        run_experiment(c, DATA, corr)
    assert info.value.i_node is added_2


def test_corr_injective_unused_direct():
    xs = xs_array()
    c = cc.Add(index(xs, 0, "x0"), index(xs, 1, "x1"), name="C")
    corr, _, _ = chain_corr(
        "C",
        ("x0_1", corr_root_matcher.chain("x0")),
        ("x0_2", corr_root_matcher.then("x0", term_early_at="x1")),
    )
    with pytest.raises(IllegalCorrespondenceError, match="reaches input 'xs' outside its parent") as info:
        run_experiment(c, DATA, corr)
    assert info.value.i_node.name == "x0_2"


def test_corr_tree_structure_same_paths_to_inputs():
    """The interpretation upside down: its root is not mapped to the whole model."""
    c = cc.Add(index(xs_array(), 0, "x0"), name="C")
    x0 = InterpNode(UncondSampler(), "x0")
    c_t = x0.make_descendant(UncondSampler(), "C")
    corr = Correspondence()
    corr.add(c_t, corr_root_matcher)
    corr.add(x0, corr_root_matcher.chain("x0"))
    with pytest.raises(IllegalCorrespondenceError, match="must be mapped to corr_root_matcher") as info:
        run_experiment(c, DATA, corr)
    assert info.value.i_node is x0


def test_corr_injective_separate_paths():
    first = index(xs_array(), 0, "x0")
    c = cc.Add(cc.Add(first, name="A"), scalar_mul(first, 2, "B"), name="C")
    corr, _, (x0_a, x0_b) = chain_corr(
        "C",
        ("x0_A", corr_root_matcher.chain("A").chain("x0")),
        ("x0_B", corr_root_matcher.chain("B").chain("x0")),
    )
    scrubbed = Experiment(c, DATA, corr).scrub(4, treeify=True, check=True)
    sampled = scrubbed.sampled_inputs
    expected = col(sampled[x0_a], 0) + 2 * col(sampled[x0_b], 0)
    torch.testing.assert_close(scrubbed.evaluate(), expected, rtol=0, atol=0)


def test_corr_tree_structure_respects_paths():
    first = index(xs_array(), 0, "x0")
    c = cc.Add(cc.Add(first, name="A"), scalar_mul(first, 2, "B"), name="C")
    corr = Correspondence()
    c_t = InterpNode(UncondSampler(), "C")
    a = c_t.make_descendant(UncondSampler(), "A")
    corr.add(c_t, corr_root_matcher)
    corr.add(a, corr_root_matcher.chain("A"))
    corr.add(a.make_descendant(UncondSampler(), "x0"), corr_root_matcher.chain("B").chain("x0"))  # not via A
    with pytest.raises(IllegalCorrespondenceError, match="reaches input 'xs' outside its parent") as info:
        run_experiment(c, DATA, corr)
    assert info.value.i_node.name == "x0"


def test_corr_tree_structure_only_if():
    """A node's paths may extend another's only if it is that one's child."""
    a = scalar_mul(index(xs_array(), 0, "x0"), 2, "A")
    c = scalar_mul(scalar_mul(a, 3, "B"), 5, "C")
    corr = Correspondence()
    c_t = InterpNode(UncondSampler(), "C")
    a_t = c_t.make_descendant(UncondSampler(), "At")
    b_t = c_t.make_descendant(UncondSampler(), "Bt")
    to_b = corr_root_matcher.chain("B")
    corr.add(c_t, corr_root_matcher)
    corr.add(b_t, to_b)
    corr.add(a_t, to_b.chain("A"))
    # the message names the input and the node that last claimed it
    with pytest.raises(
        IllegalCorrespondenceError,
        match=re.escape("reaches input 'xs' outside its parent's branch (last claimed by 'At')"),
    ) as info:
        run_experiment(c, DATA, corr)
    assert info.value.i_node is b_t


# ------------------------------------------------------------------ unit tests


def num_input_tags(c: cc.Circuit) -> int:
    return len(c.get(cc.Matcher.regex(r".*_scrub_.*")))


@pytest.mark.filterwarnings("ignore:check=False")
def test_treeify():
    xs = xs_array()
    a = scalar_mul(index(xs, 0), 2, "A")
    dataset = int_dataset((5, 2), lambda x: 2 * x[0] + 3 * x[1])
    c_t = InterpNode(ExactSampler(), "Ct")
    corr = Correspondence()
    corr.add(c_t, corr_root_matcher)
    corr.add(c_t.make_descendant(ExactSampler(), "A"), corr_root_matcher.chain("A"))
    # the child's branch is all of the parent's
    experiment = Experiment(scalar_mul(a, 3, "C"), dataset, corr, check=False)
    experiment.sample(experiment.make_ref_ds(1))
    assert num_input_tags(experiment.treeified()) == 1
    # only some children are mapped
    c = cc.Add(a, scalar_mul(index(xs, 1), 3, "B"), name="C")
    assert num_input_tags(Experiment(c, dataset, corr).treeified()) == 2
    # several children are mapped
    corr.add(c_t.make_descendant(ExactSampler(), "B"), corr_root_matcher.chain("B"))
    treeified = Experiment(c, dataset, corr).treeified()
    assert {node.name for node in treeified.get(cc.Matcher.regex(r".*_scrub_.*"))} == {
        "xs_scrub_A",
        "xs_scrub_B",
    }


def test_set_inputs():
    xs = xs_array()
    c = cc.Add(scalar_mul(index(xs, 0), 2, "A"), scalar_mul(index(xs, 1), 3, "B"), name="C")
    dataset = int_dataset((5, 2), lambda x: 2 * x[0] + 3 * x[1])
    corr = Correspondence()
    c_t = InterpNode(UncondSampler(), "C")
    corr.add(c_t, corr_root_matcher)
    corr.add(c_t.make_descendant(UncondSampler(), "A"), corr_root_matcher.chain("A"))
    for treeify in (True, False):
        experiment = Experiment(c, dataset, corr, random_seed=1)
        ref_ds = experiment.make_ref_ds(1)
        sampled = experiment.sample(ref_ds)
        circuit = experiment.treeified() if treeify else experiment.base_circuit
        assert num_input_tags(circuit) == (2 if treeify else 0)
        circuit = experiment.wrap_in_var(circuit, ref_ds, cc.DiscreteVar.uniform_probs_and_group(1))
        circuit = experiment.replace_inputs(circuit, sampled)
        # the seed draws different data for C's other inputs and for A: two arrays
        assert sampled[c_t] != sampled[c_t.children[0]]
        assert len(circuit.get("xs")) == 2


# ------------------------------------------------------------------ end to end


def identical_corr(check_inputs: bool = False):
    corr = Correspondence()
    c_t = InterpNode(label_cond, "Ct")
    corr.add(c_t, corr_root_matcher)
    corr.add(c_t.make_descendant(column_cond(0), "At"), corr_root_matcher.chain("A"))
    corr.add(c_t.make_descendant(column_cond(1), "Bt"), corr_root_matcher.chain("B"))
    return corr


def two_column_circuit(a_extra=None, b_scale: float = 3.0) -> cc.Circuit:
    xs = xs_array()
    first, second = index(xs, 0), index(xs, 1)
    a = scalar_mul(first, 2.0) if a_extra is None else cc.Add(scalar_mul(first, 2.0), a_extra(second))
    return cc.Add(cc.Add(a, name="A"), scalar_mul(second, b_scale, "B"), name="C")


@pytest.mark.filterwarnings("ignore:check=False")
@pytest.mark.parametrize("check", [True, False])
def test_identical(check):
    run_experiment(two_column_circuit(), DATA, identical_corr(), lambda loss: loss == 0, check=check)


def test_explicit_inputs_okay():
    """Interpretation nodes mapped to the input arrays themselves (treeify=False: the treeified
    checks refuse explicit inputs, as in rust_circuit)."""
    xs = xs_array()
    c = cc.Add(index(xs, 0, "x0"), index(xs, 1, "x1"), name="C")
    dataset = int_dataset((100, 2), lambda x: x[0] + x[1])
    corr = Correspondence()
    c_t = InterpNode(label_cond, "Ct")
    corr.add(c_t, corr_root_matcher)
    for i in (0, 1):
        node = c_t.make_descendant(column_cond(i), f"x{i}t")
        corr.add(node, corr_root_matcher.chain(f"x{i}"))
        corr.add(
            node.make_descendant(column_cond(i), f"x{i}_xs"), corr_root_matcher.chain(f"x{i}").chain("xs")
        )
    run_experiment(c, dataset, corr, lambda loss: loss == 0, treeify=False)


def test_spread_over_residual():
    xs = xs_array()
    second = index(xs, 1, "x2")
    c = cc.Add(cc.Add(index(xs, 0, "x1"), second, name="A"), second, name="C")
    dataset = int_dataset((1000, 2), lambda x: x[0] + 2 * x[1])
    assert datum_loss(c, dataset) < 0.01
    corr = Correspondence()
    c_t = InterpNode(label_cond, "Ct")
    a_t = c_t.make_descendant(column_cond(0), "A")
    corr.add(c_t, corr_root_matcher)
    corr.add(a_t, corr_root_matcher.chain("A"))
    corr.add(a_t.make_descendant(column_cond(0), "x1"), corr_root_matcher.chain("A").chain("x1"))
    x2 = c_t.make_descendant(column_cond(1), "x2")
    corr.add(x2, corr_root_matcher.then("x2", term_early_at={"A"}))
    for scrubbed, out in run_experiment(c, dataset, corr, lambda loss: loss > 1, num_examples=50):
        sampled = scrubbed.sampled_inputs
        expected = col(sampled[a_t.children[0]], 0) + col(sampled.other_inputs_datasets[a_t], 1)
        torch.testing.assert_close(out, expected + col(sampled[x2], 1), rtol=0, atol=0)


def test_spread_over_two_nodes():
    first = index(xs_array(), 0)
    c = cc.Add(scalar_mul(first, 2, "A"), scalar_mul(first, 3, "B"), name="C")
    dataset = int_dataset((1000, 2), lambda x: 5 * x[0])
    assert datum_loss(c, dataset) < 0.01
    corr = Correspondence()
    c_t = InterpNode(column_cond(0), "Ct")
    corr.add(c_t, corr_root_matcher)
    corr.add(c_t.make_descendant(column_cond(0), "A"), corr_root_matcher.chain("A"))
    run_experiment(c, dataset, corr, lambda loss: loss > 0.1, num_examples=50)


def test_large_deviation():
    c = two_column_circuit(a_extra=lambda second: second)
    run_experiment(c, DATA, identical_corr(), lambda loss: loss > 1, num_examples=50)


def test_tiny_deviation():
    c = two_column_circuit(a_extra=lambda second: scalar_mul(second, 0.001))
    run_experiment(c, DATA, identical_corr(), lambda loss: loss < 0.01, num_examples=1)


def test_intermediates_cancel():
    xs = xs_array(3)
    first, second, third = index(xs, 0), index(xs, 1), index(xs, 2)
    minus_third = scalar_mul(third, -1.0)
    c = cc.Add(cc.Add(first, third, name="A"), cc.Add(second, minus_third, name="B"), name="C")
    dataset = int_dataset((1000, 3), lambda x: x[0] + x[1])
    assert datum_loss(c, dataset) < 0.0001
    corr = Correspondence()
    c_t = InterpNode(FuncSampler(lambda d: d.xs.value[:, 0] + d.xs.value[:, 1]), "Ct")
    corr.add(c_t, corr_root_matcher)
    corr.add(c_t.make_descendant(column_cond(0), "At"), corr_root_matcher.chain("A"))
    corr.add(c_t.make_descendant(column_cond(1), "Bt"), corr_root_matcher.chain("B"))
    run_experiment(c, dataset, corr, lambda loss: loss > 1, num_examples=50)


def test_swapped_intermediates():
    xs = xs_array()
    first, second = index(xs, 0), index(xs, 1)
    a = cc.Add(scalar_mul(first, 2), second, name="A")
    b = cc.Add(first, scalar_mul(second, 2), name="B")
    c = cc.Add(a, b, name="C")
    dataset = int_dataset((1000, 2), lambda x: 3 * x[0] + 3 * x[1])
    assert datum_loss(c, dataset) == 0
    corr = Correspondence()
    c_t = InterpNode(FuncSampler(lambda d: 2 * d.xs.value[:, 0] + 3 * d.xs.value[:, 1]), "Ct")
    corr.add(c_t, corr_root_matcher)
    a_cond = FuncSampler(lambda d: d.xs.value[:, 0] + 2 * d.xs.value[:, 1])
    corr.add(c_t.make_descendant(a_cond, "At"), corr_root_matcher.chain("A"))
    b_cond = FuncSampler(lambda d: d.xs.value[:, 0] + d.xs.value[:, 1])
    corr.add(c_t.make_descendant(b_cond, "Bt"), corr_root_matcher.chain("B"))
    run_experiment(c, dataset, corr, lambda loss: loss > 1, num_examples=50)


def test_data_correlation():
    xs = xs_array()
    c = cc.Add(index(xs, 0, "x0"), index(xs, 1, "x1"), name="C")
    rands = torch.randint(10, (1000, 1), generator=torch.Generator().manual_seed(5)).double()
    dataset = Dataset({"xs": torch.hstack((rands, 2 * rands)), "labels": (3 * rands)[:, 0]})
    assert datum_loss(c, dataset) == 0
    corr = Correspondence()
    c_t = InterpNode(column_cond(0), "Ct")
    corr.add(c_t, corr_root_matcher)
    corr.add(c_t.make_descendant(column_cond(0), "x0"), corr_root_matcher.chain("x0"))
    run_experiment(c, dataset, corr, lambda loss: loss > 1, num_examples=50)


@pytest.mark.filterwarnings("ignore::circuits.causal_scrubbing.TooFewSamplesWarning")
def test_unspecified_nodes():
    c = two_column_circuit()
    dataset = int_dataset((5, 2), lambda x: 2 * x[0] + 3 * x[1])
    corr = Correspondence()
    c_t = InterpNode(label_cond, "Ct")
    corr.add(c_t, corr_root_matcher)
    corr.add(c_t.make_descendant(column_cond(0), "At"), corr_root_matcher.chain("A"))
    # the path through B is left out: it runs on random data, and the loss is bad
    run_experiment(c, dataset, corr, lambda loss: loss > 1, num_examples=50)
    # unless the root keeps its other inputs exactly
    c_t.other_inputs_sampler = ExactSampler()
    run_experiment(c, dataset, corr, lambda loss: loss == 0, num_examples=1)


# ------------------------------------------------------------------ the simple demo


def demo_circuit() -> cc.Circuit:
    """rust_circuit's demos/causal_scrubbing/causal_scrubbing_simple.py: a made-up graph on one
    example, ``xs`` of 3 ints and a label, scored as ``D * label``."""
    xs = cc.Array(torch.zeros(3), name="xs")
    labels = cc.Array(torch.zeros(()), name="labels")
    x0, x1, x2 = (index(xs, i, f"x{i}") for i in range(3))

    def gate(name):
        total = cc.Add(x0, scalar_mul(x1, 0), scalar_mul(x2, 0), cc.Scalar(-3.0))
        return cc.GeneralFunction.new_by_name(total, spec_name="sigmoid", name=name)

    a, b, c = gate("A"), gate("B"), cc.Add(x0, x1, x2)
    d = cc.Add(cc.Einsum.from_einsum_string(",->", a, b), scalar_mul(c, 0), name="D")
    return cc.Einsum.from_einsum_string(",->", d, labels, name="loss")


def demo_dataset() -> Dataset:
    data = torch.randint(10, (100, 3), generator=torch.Generator().manual_seed(33))
    labels = torch.logical_or(data[:, 0] > 2, data[:, 1] > 4).double()
    return Dataset({"xs": data.double(), "labels": labels})


def demo_hypothesis(labels_matcher) -> tuple[Correspondence, dict[str, InterpNode]]:
    def x0_gt_3(d):
        return d.xs.value[:, 0] > 3

    def x1_gt_3(d):
        return d.xs.value[:, 1] > 3

    def agrees_with_label(d):
        return torch.logical_or(x0_gt_3(d), x1_gt_3(d)) == d.labels.value.bool()

    out = InterpNode(FuncSampler(agrees_with_label), "out")
    d_prime = out.make_descendant(FuncSampler(lambda d: torch.logical_or(x0_gt_3(d), x1_gt_3(d))), "D'")
    a_prime = d_prime.make_descendant(FuncSampler(x0_gt_3), "A'")
    b_prime = d_prime.make_descendant(FuncSampler(x1_gt_3), "B'")
    x0_prime = a_prime.make_descendant(column_cond(0), "x0'")
    x1_prime = b_prime.make_descendant(column_cond(1), "x1'")
    y_prime = out.make_descendant(label_cond, "y'")
    corr = Correspondence()
    corr.add(out, corr_root_matcher)
    corr.add(d_prime, cc.IterativeMatcher("D"))
    corr.add(b_prime, cc.IterativeMatcher("B"))
    corr.add(a_prime, cc.IterativeMatcher("A"))
    corr.add(x1_prime, cc.IterativeMatcher("B").chain("x1"))
    corr.add(x0_prime, cc.IterativeMatcher("A").chain("x0"))
    corr.add(y_prime, labels_matcher)
    return corr, {node.name: node for node in out.get_nodes()}


def demo_expected(sampled, nodes) -> torch.Tensor:
    """Each path on its node's data: A's x0 on x0''s, B's x0 on B''s other inputs (x1' claims B's
    x1, which B multiplies by 0), C on D''s other inputs (times 0), the label on y''s."""
    a = torch.sigmoid(col(sampled[nodes["x0'"]], 0) - 3)
    b = torch.sigmoid(col(sampled.other_inputs_datasets[nodes["B'"]], 0) - 3)
    return a * b * sampled[nodes["y'"]].labels.value


@pytest.mark.parametrize("treeify", [True, False])
def test_the_simple_demo_maps_y_prime_to_the_labels_array_itself(treeify):
    """As the demo does: ``corr.add(y_prime, IterativeMatcher("labels"))``, the interpretation
    node mapped to an input array, which is then its branch's only input."""
    corr, nodes = demo_hypothesis(cc.IterativeMatcher("labels"))
    scrubbed = Experiment(demo_circuit(), demo_dataset(), corr, random_seed=11).scrub(20, treeify=treeify)
    expected = demo_expected(scrubbed.sampled_inputs, nodes)
    torch.testing.assert_close(scrubbed.evaluate(), expected, rtol=1e-6, atol=0)
    # y' draws against its parent's data: the same label as out's draw
    sampled = scrubbed.sampled_inputs
    assert torch.equal(sampled[nodes["y'"]].labels.value, sampled.datasets[nodes["out"]].labels.value)


def test_the_simple_demo_steps_sample_treeify_wrap_and_replace():
    """The demo's walk through: sampling, treeifying (then the treeified checks), wrapping the
    inputs in variables of a one-example group, replacing, and evaluating a ScrubbedExperiment
    built by hand; the same values as ``scrub``."""
    corr, nodes = demo_hypothesis(cc.IterativeMatcher("labels"))
    experiment = Experiment(demo_circuit(), demo_dataset(), corr, random_seed=11)
    ref_datum = experiment.make_ref_ds(1)
    sampled = experiment.sample(ref_datum)
    treeified = experiment.treeified()
    corr.check(treeified, circuit_treeified=True)
    group = cc.DiscreteVar.uniform_probs_and_group(1)
    circuit = experiment.replace_inputs(experiment.wrap_in_var(treeified, ref_datum, group), sampled)
    built = ScrubbedExperiment(circuit, ref_datum, sampled, group, 11, corr)
    value = built.evaluate(ExperimentEvalSettings(device_dtype="cpu"))
    torch.testing.assert_close(value, demo_expected(sampled, nodes), rtol=1e-6, atol=0)
    assert value.shape == (1,)


# ------------------------------------------------------------------ rust_circuit's test_hypothesis.py


def test_implicit_inputs():
    dataset = Dataset({"xs": torch.arange(4.0), "labels": torch.zeros(4)})
    xs, labels = cc.Array(torch.zeros(()), name="xs"), cc.Array(torch.zeros(()), name="labels")
    c = cc.Add(xs, labels, name="C")
    assert c.get(to_inputs(corr_root_matcher, dataset)) == {xs, labels}
    only_xs = Dataset(dataset.arrs, input_names={"xs"})
    assert c.get(to_inputs(corr_root_matcher, only_xs)) == {xs}
    # a matcher that finds an input itself reaches it (rust_circuit's chain may match where it starts)
    assert c.get(to_inputs(cc.IterativeMatcher("labels"), dataset)) == {labels}


def test_corr_get_root_connected_and_acyclic():
    a = InterpNode(UncondSampler(), "C")
    b = a.make_descendant(UncondSampler(), "B")
    corr = Correspondence()
    corr.add(b, corr_root_matcher)
    corr.add(a, corr_root_matcher)
    assert corr.get_root() is a
    unconnected = Correspondence()
    unconnected.add(InterpNode(UncondSampler(), "A"), corr_root_matcher)
    unconnected.add(InterpNode(UncondSampler(), "B"), corr_root_matcher)
    with pytest.raises(IllegalCorrespondenceError, match=r"one root .*found \['A', 'B'\]"):
        unconnected.get_root()
    b._children = b.children + (a,)  # very bad, no one should ever do this!
    with pytest.raises(IllegalCorrespondenceError, match="found none"):
        corr.get_root()


def test_corr_complete():
    a = InterpNode(UncondSampler(), "C")
    b = a.make_descendant(UncondSampler(), "B")
    corr = Correspondence()
    corr.add(a, corr_root_matcher)
    with pytest.raises(IllegalCorrespondenceError, match="a child of 'C'") as info:  # names the parent too
        corr.check_complete()
    assert info.value.i_node is b
    corr.add(b, corr_root_matcher)
    corr.check_complete()
    alone = Correspondence()
    alone.add(b, corr_root_matcher)
    alone.check_complete()


def test_uncond_together_sampler_without_a_generator():
    dataset = Dataset({"xs": torch.arange(100)})
    root = InterpNode(ExactSampler(), "A")
    b0 = root.make_descendant(UncondTogetherSampler(), "B0")
    b1 = root.make_descendant(UncondTogetherSampler(), "B1")
    sampled = root.sample(None, dataset, dataset)
    assert len(sampled.sampler_pools) == 1
    assert sampled.datasets[b0] == sampled.datasets[b1] != dataset


def test_print_interpretation_before_and_after_sampling():
    c_t = InterpNode(ExactSampler(), "C")
    c_t.make_descendant(ExactSampler(), "x0_A")
    c_t.make_descendant(UncondSampler(), "x0_B")
    assert c_t.print(None, repr=True).splitlines() == [
        "C  # cond_sampler=ExactSampler, other_inputs_sampler=UncondSampler",
        "  x0_A  # cond_sampler=ExactSampler",
        "  x0_B  # cond_sampler=UncondSampler",
    ]
    ds = Dataset({"xs": torch.arange(10), "labels": torch.arange(10)})
    sampled = c_t.sample(torch.Generator().manual_seed(11), ds, ds)
    c_datum, other, b_datum = sampled.datasets[c_t][0], sampled[c_t][0], sampled[c_t.children[1]][0]
    assert c_t.print(None, sampled, color_by_data=False, repr=True).splitlines() == [
        f"C  # cond_sampler=ExactSampler(d={c_datum}), other_inputs_sampler=UncondSampler(d={other})",
        f"  x0_A  # cond_sampler=ExactSampler(d={c_datum})",
        f"  x0_B  # cond_sampler=UncondSampler(d={b_datum})",
    ]
    assert c_datum == ds[0]
