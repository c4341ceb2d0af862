"""Causal scrubbing hypotheses and experiments on small arithmetic circuits (as rust_circuit's own
tests): ``out = s + c`` with ``s = a + b`` and ``a, b, c`` the three columns of an input ``x``.

The expected values are sums of columns of the datasets each interpretation node was given,
computed in torch; the checks of the correspondence each raise ``IllegalCorrespondenceError``
naming the node.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits.causal_scrubbing import (
    Correspondence,
    Dataset,
    ExactSampler,
    Experiment,
    FuncSampler,
    IllegalCorrespondenceError,
    InterpNode,
    UncondSampler,
    corr_root_matcher,
)

N = 60


def dataset() -> Dataset:
    rows = torch.arange(N)
    x = torch.stack([rows % 2, rows % 3, rows % 5], dim=1).double() + torch.tensor([0.0, 10.0, 100.0])
    return Dataset({"x": x})


def circuit(batch: int = N) -> cc.Circuit:
    """Built on any batch: scrubbing replaces ``x`` by each node's data (the reference's rows)."""
    x = cc.Array(torch.zeros(batch, 3, dtype=torch.float64), name="x")
    a, b, c = (cc.Index(x, (slice(None), column), name=name) for column, name in enumerate("abc"))
    return cc.Add(cc.Add(a, b, name="s"), c, name="out")


def column(data: Dataset, index: int) -> torch.Tensor:
    return data.x.value[:, index]


def run(corr: Correspondence, seed: int = 0, examples: int = 25, **scrub):
    scrubbed = Experiment(circuit(7), dataset(), corr, random_seed=seed).scrub(examples, **scrub)
    return scrubbed, scrubbed.evaluate()


def test_naming_every_path_exactly_gives_the_clean_values():
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    for name in "abc":
        corr.add(root.make_descendant(ExactSampler(), name), corr_root_matcher.chain(name))
    scrubbed, value = run(corr)
    ref = scrubbed.ref_ds
    assert value.shape == (25,)
    torch.testing.assert_close(value, ref.x.value.sum(-1), rtol=0, atol=0)


def test_naming_no_path_gives_the_fully_resampled_values():
    corr = Correspondence()
    root = InterpNode(UncondSampler(), "root")  # a leaf: all of the model runs on its draw
    corr.add(root, corr_root_matcher)
    scrubbed, value = run(corr)
    drawn = scrubbed.sampled_inputs[root]
    torch.testing.assert_close(value, drawn.x.value.sum(-1), rtol=0, atol=0)
    assert not torch.equal(drawn.x.value, scrubbed.ref_ds.x.value), "the draw must be fresh data"


def test_a_claimed_path_keeps_its_data_and_the_rest_is_resampled():
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root", other_inputs_sampler=UncondSampler())
    corr.add(root, corr_root_matcher)
    corr.add(root.make_descendant(ExactSampler(), "a"), corr_root_matcher.chain("a"))
    scrubbed, value = run(corr)
    other = scrubbed.sampled_inputs.other_inputs_datasets[root]
    expected = column(scrubbed.ref_ds, 0) + column(other, 1) + column(other, 2)
    torch.testing.assert_close(value, expected, rtol=0, atol=0)


def test_nested_feature_samplers_scrub_path_by_path():
    """root (exact) -> S on branch 's' (keeps a + b) -> A on 's' -> 'a' (keeps a): the value is
    A's a, plus S's other inputs' b, plus the root's other inputs' c."""
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    s_node = root.make_descendant(FuncSampler(lambda d: d.x.value[:, 0] + d.x.value[:, 1]), "S")
    corr.add(s_node, corr_root_matcher.chain("s"))
    a_node = s_node.make_descendant(FuncSampler(lambda d: d.x.value[:, 0]), "A")
    corr.add(a_node, corr_root_matcher.chain("s").chain("a"))
    for treeify in (True, False):
        scrubbed, value = run(corr, treeify=treeify)
        sampled = scrubbed.sampled_inputs
        expected = (
            column(sampled[a_node], 0)
            + column(sampled.other_inputs_datasets[s_node], 1)
            + column(sampled.other_inputs_datasets[root], 2)
        )
        torch.testing.assert_close(value, expected, rtol=0, atol=0)
    ref, s_data, a_data = scrubbed.ref_ds, sampled.datasets[s_node], sampled.datasets[a_node]
    torch.testing.assert_close(column(s_data, 0) + column(s_data, 1), column(ref, 0) + column(ref, 1))
    torch.testing.assert_close(column(a_data, 0), column(s_data, 0))
    assert not torch.equal(a_data.x.value, ref.x.value)


def test_the_same_seed_gives_the_same_scrub_and_another_seed_another():
    corr = Correspondence()
    corr.add(InterpNode(UncondSampler(), "root"), corr_root_matcher)
    _, one = run(corr, seed=3)
    _, again = run(corr, seed=3)
    _, other = run(corr, seed=4)
    assert torch.equal(one, again) and not torch.equal(one, other)


# ------------------------------------------------------------------------ checks


def two_level(child_matcher, name="a") -> Correspondence:
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    corr.add(root.make_descendant(ExactSampler(), name), child_matcher)
    return corr


def test_an_incomplete_correspondence_is_refused_naming_the_child():
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    root.make_descendant(ExactSampler(), "forgotten")
    with pytest.raises(IllegalCorrespondenceError) as info:
        Experiment(circuit(), dataset(), corr)
    assert info.value.i_node.name == "forgotten"


@pytest.mark.parametrize(
    "matcher, message",
    [
        (corr_root_matcher.chain("nowhere"), "finds 0 nodes"),
        (corr_root_matcher.chain(cc.Index), "finds 3 nodes"),
    ],
)
def test_the_well_defined_check_runs_when_asked_and_names_the_node(matcher, message):
    with pytest.raises(IllegalCorrespondenceError, match=message) as info:  # the count found
        two_level(matcher).check_well_defined(circuit(), dataset())
    assert info.value.i_node.name == "a"


def test_a_matcher_finding_several_nodes_is_allowed_under_check_true_as_in_rust_circuit():
    """rust_circuit runs the well-defined check only when asked: 'abc' claims all three columns."""
    corr = two_level(corr_root_matcher.chain(cc.Index), name="abc")
    scrubbed = Experiment(circuit(7), dataset(), corr, check=True).scrub(25)
    torch.testing.assert_close(scrubbed.evaluate(), scrubbed.ref_ds.x.value.sum(-1), rtol=0, atol=0)


def test_a_matcher_finding_nothing_is_refused_when_scrubbing_naming_the_node():
    experiment = Experiment(circuit(7), dataset(), two_level(corr_root_matcher.chain("nowhere")))
    with pytest.raises(IllegalCorrespondenceError, match="its branch reaches none of the inputs") as info:
        experiment.scrub(10)
    assert info.value.i_node.name == "a"


def test_a_branch_that_does_not_reach_the_inputs_is_refused():
    x = cc.Array(torch.zeros(N, 3, dtype=torch.float64), name="x")
    constant = cc.Scalar(2.0, shape=(N,), name="k")
    with_constant = cc.Add(cc.Index(x, (slice(None), 0), name="a"), constant, name="out")
    corr = two_level(corr_root_matcher.chain("k"), name="k")
    for treeify in (True, False):  # an exact child's data equal its parent's: refused all the same
        with pytest.raises(IllegalCorrespondenceError, match="its branch reaches none of the inputs") as info:
            Experiment(with_constant, dataset(), corr).scrub(N, treeify=treeify)
        assert info.value.i_node.name == "k"
    with pytest.raises(IllegalCorrespondenceError, match="does not reach the inputs") as info:
        corr.check_well_defined(with_constant, dataset())
    assert info.value.i_node.name == "k"


def test_the_root_must_be_the_whole_model():
    corr = Correspondence()
    corr.add(InterpNode(ExactSampler(), "root"), corr_root_matcher.chain("s"))
    with pytest.raises(IllegalCorrespondenceError, match="must be mapped to corr_root_matcher") as info:
        Experiment(circuit(), dataset(), corr)
    assert info.value.i_node is corr.get_root()


def test_two_nodes_claiming_one_branch_are_refused_as_not_injective():
    corr = two_level(corr_root_matcher.chain("a"))
    root = corr.get_root()
    corr.add(root.make_descendant(ExactSampler(), "again"), corr_root_matcher.chain("a"))
    with pytest.raises(IllegalCorrespondenceError) as info:
        Experiment(circuit(7), dataset(), corr).scrub(10)
    assert info.value.i_node.name == "again"


def test_a_child_outside_its_parents_branch_is_refused():
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    s_node = root.make_descendant(ExactSampler(), "S")
    corr.add(s_node, corr_root_matcher.chain("s"))
    corr.add(s_node.make_descendant(ExactSampler(), "C"), corr_root_matcher.chain("c"))
    with pytest.raises(IllegalCorrespondenceError, match="outside its parent") as info:
        Experiment(circuit(7), dataset(), corr).scrub(10)
    assert info.value.i_node.name == "C"


def non_injective() -> Correspondence:
    corr = two_level(corr_root_matcher.chain("a"))
    corr.add(corr.get_root().make_descendant(ExactSampler(), "again"), corr_root_matcher.chain("a"))
    return corr


@pytest.mark.filterwarnings("ignore:check=False")
def test_scrub_checks_unless_told_not_to_whatever_the_experiment_says():
    """rust_circuit's ``scrub(check=True)`` default: Experiment(check=False) skips only its own
    checks; ``scrub(check=False)`` (or None: the experiment's) scrubs the non-injective hypothesis."""
    experiment = Experiment(circuit(7), dataset(), non_injective(), check=False)
    with pytest.raises(IllegalCorrespondenceError) as info:
        experiment.scrub(10)
    assert info.value.i_node.name == "again"
    for check in (False, None):
        scrubbed = experiment.scrub(10, check=check)
        other = scrubbed.sampled_inputs.other_inputs_datasets[scrubbed.nodes.get_root()]
        expected = column(scrubbed.ref_ds, 0) + column(other, 1) + column(other, 2)
        torch.testing.assert_close(scrubbed.evaluate(), expected, rtol=0, atol=0)


@pytest.mark.parametrize("check", [1, 0, "slow", None, 1.0])
def test_check_must_be_true_false_or_fast(check):
    with pytest.raises(IllegalCorrespondenceError, match="check must be True, False or 'fast'"):
        Experiment(circuit(7), dataset(), two_level(corr_root_matcher.chain("a")), check=check)
    if check is not None:  # None at scrub means the experiment's
        experiment = Experiment(circuit(7), dataset(), two_level(corr_root_matcher.chain("a")))
        with pytest.raises(IllegalCorrespondenceError, match="scrub: check must be"):
            experiment.scrub(5, check=check)


def test_adding_twice_or_a_taken_name_is_refused():
    corr = Correspondence()
    root = InterpNode(ExactSampler(), "root")
    corr.add(root, corr_root_matcher)
    with pytest.raises(IllegalCorrespondenceError, match="already") as info:
        corr.add(root, corr_root_matcher)
    assert info.value.i_node is root
    other = InterpNode(ExactSampler(), "root")
    with pytest.raises(IllegalCorrespondenceError, match="named 'root'") as info:  # another node, same name
        corr.add(other, corr_root_matcher)
    assert info.value.i_node is other
    with pytest.raises(IllegalCorrespondenceError, match="CondSampler"):
        InterpNode("not a sampler", "x")
    assert isinstance(IllegalCorrespondenceError("x"), ValueError)  # rust_circuit raised ValueError here


def test_evaluation_settings_take_rust_circuits_arguments_and_refuse_what_they_cannot_do():
    from circuits.causal_scrubbing import CausalScrubbingError, ExperimentEvalSettings

    corr = Correspondence()
    corr.add(InterpNode(ExactSampler(), "root"), corr_root_matcher)
    scrubbed, value = run(corr)
    settings = ExperimentEvalSettings(optimize=True, device_dtype=("cpu", torch.float32))
    torch.testing.assert_close(scrubbed.evaluate(settings), value.float(), rtol=0, atol=0)
    assert scrubbed.evaluate(settings).dtype == torch.float32
    assert scrubbed.evaluate(evaluator=cc.Evaluator(2**20)).equal(value)
    for bad in (dict(batch_size=8), dict(num_samples=3), dict(run_on_all=False)):
        with pytest.raises(CausalScrubbingError, match="not supported|only run_on_all"):
            ExperimentEvalSettings(**bad)
