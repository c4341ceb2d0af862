"""rust_circuit's group names: ``DiscreteVar.uniform_probs_and_group``, ``Experiment.wrap_in_var``,
``scrub(group=...)`` and ``ScrubbedExperiment.group``.  A circuit built on one example (rust_circuit's
way) has its inputs wrapped in variables of the group, and evaluating runs the group on every
reference example; the expected values are sums of columns computed in torch."""

from __future__ import annotations

import uuid

import pytest
import torch
from test_cs_experiment import circuit as batched_circuit
from test_cs_experiment import column, dataset, two_level

import circuits as cc
from circuits.causal_scrubbing import (
    CausalScrubbingError,
    Correspondence,
    ExactSampler,
    Experiment,
    InterpNode,
    ScrubbedExperiment,
    UncondSampler,
    corr_root_matcher,
)
from circuits.errors import RandomVariableError


def one_example() -> cc.Circuit:
    """``out = (a + b) + c`` on one row ``x`` [3], as rust_circuit builds circuits."""
    x = cc.Array(torch.zeros(3, dtype=torch.float64), name="x")
    a, b, c = (cc.Index(x, (i,), name=name) for i, name in enumerate("abc"))
    return cc.Add(cc.Add(a, b, name="s"), c, name="out")


def exact_a() -> Correspondence:
    return two_level(corr_root_matcher.chain("a"))


def test_uniform_probs_and_group_is_a_fresh_tag_of_equal_probabilities():
    group = cc.DiscreteVar.uniform_probs_and_group(4, name="g")
    assert isinstance(group, cc.Tag) and group.name == "g" and group.shape == (4,)
    torch.testing.assert_close(group.evaluate(), torch.full((4,), 0.25), check_dtype=False, rtol=0, atol=0)
    assert cc.DiscreteVar.uniform_probs_and_group(4).hash != cc.DiscreteVar.uniform_probs_and_group(4).hash
    var = cc.DiscreteVar(cc.Array(torch.zeros(4, 2)))
    assert isinstance(var.probs_and_group, cc.Tag) and var.probs_and_group.node == cc.Scalar(0.25, (4,))
    for bad in (-1, 1.5, True, "4"):
        with pytest.raises(RandomVariableError, match="uniform_probs_and_group: size must be an int >= 0"):
            cc.DiscreteVar.uniform_probs_and_group(bad)


def test_a_circuit_on_one_example_is_scrubbed_through_variables_of_the_group():
    scrubbed = Experiment(one_example(), dataset(), exact_a(), random_seed=5).scrub(12)
    variables = scrubbed.circuit.get(cc.DiscreteVar)
    assert variables and {var.name for var in variables} == {"x_var"}
    assert {var.probs_and_group.hash for var in variables} == {scrubbed.group.hash}
    assert scrubbed.group.shape == (12,)
    other = scrubbed.sampled_inputs[scrubbed.nodes.get_root()]
    expected = column(scrubbed.ref_ds, 0) + column(other, 1) + column(other, 2)
    torch.testing.assert_close(scrubbed.evaluate(), expected, rtol=0, atol=0)
    # the same hypothesis, seed and data on the batched circuit: the same values
    batched = Experiment(batched_circuit(7), dataset(), exact_a(), random_seed=5).scrub(12)
    assert not batched.circuit.get(cc.DiscreteVar)
    torch.testing.assert_close(batched.evaluate(), scrubbed.evaluate(), rtol=0, atol=0)


def test_a_group_given_to_scrub_is_kept_and_its_probabilities_play_no_part():
    """rust_circuit's run_on_all=True: every reference example once, whatever the probabilities."""
    group = cc.Tag(cc.Array(torch.tensor([0.5, 0.2, 0.1, 0.1, 0.1])), uuid.UUID(int=7), name="mine")
    experiment = Experiment(one_example(), dataset(), exact_a(), random_seed=2)
    scrubbed = experiment.scrub(5, group=group)
    assert scrubbed.group is group
    assert {var.probs_and_group for var in scrubbed.circuit.get(cc.DiscreteVar)} == {group}
    other = scrubbed.sampled_inputs[scrubbed.nodes.get_root()]
    expected = column(scrubbed.ref_ds, 0) + column(other, 1) + column(other, 2)
    torch.testing.assert_close(scrubbed.evaluate(), expected, rtol=0, atol=0)
    for bad, message in (
        (cc.DiscreteVar.uniform_probs_and_group(4), r"group has shape \[4\]; it must be \[5\]"),
        ("group", "scrub: group is a str, not a circuit node"),
    ):
        with pytest.raises(CausalScrubbingError, match=message):
            experiment.scrub(5, group=bad)


def test_a_group_is_kept_for_a_batched_circuit_too():
    group = cc.DiscreteVar.uniform_probs_and_group(6)
    scrubbed = Experiment(batched_circuit(7), dataset(), exact_a()).scrub(6, group=group)
    assert scrubbed.group is group and not scrubbed.circuit.get(cc.DiscreteVar)


def test_wrap_in_var_puts_one_examples_inputs_in_variables_of_the_group():
    experiment = Experiment(one_example(), dataset(), exact_a())
    ref_ds = dataset()[[0, 4, 2]]
    group = cc.DiscreteVar.uniform_probs_and_group(3)
    wrapped = experiment.wrap_in_var(one_example(), ref_ds, group)
    (var,) = wrapped.get(cc.DiscreteVar)
    assert var == cc.DiscreteVar(ref_ds.x, group, name="x_var")
    assert var.shape == (3,) and var.values.name == "x"
    # running the group on all of it is the circuit on each reference row
    built = ScrubbedExperiment(wrapped, ref_ds, experiment.sample(ref_ds), group, 42, experiment.nodes)
    torch.testing.assert_close(built.evaluate(), ref_ds.x.value.sum(-1), rtol=0, atol=0)
    # no input in the circuit: nothing to wrap, as rust_circuit
    constant = cc.Scalar(1.0, name="k")
    assert experiment.wrap_in_var(constant, ref_ds, group) is constant


def test_wrap_in_var_refuses_a_batched_input_and_a_group_of_another_size():
    experiment = Experiment(batched_circuit(7), dataset(), exact_a())
    ref_ds = dataset()[:3]
    with pytest.raises(
        CausalScrubbingError, match=r"wrap_in_var: input Array 'x' has shape \[7, 3\], not one row"
    ):
        experiment.wrap_in_var(batched_circuit(7), ref_ds, cc.DiscreteVar.uniform_probs_and_group(3))
    with pytest.raises(CausalScrubbingError, match=r"wrap_in_var: group has shape \[2\]"):
        experiment.wrap_in_var(one_example(), ref_ds, cc.DiscreteVar.uniform_probs_and_group(2))


def test_a_hierarchy_on_one_example_matches_the_batched_one():
    """root exact -> S on 's' (other inputs random) -> A on 's' -> 'a': the same draws and values
    on the circuit built on one example as on the batched circuit, with or without treeifying."""

    def corr():
        out = Correspondence()
        root = InterpNode(ExactSampler(), "root")
        out.add(root, corr_root_matcher)
        s_node = root.make_descendant(UncondSampler(), "S")
        out.add(s_node, corr_root_matcher.chain("s"))
        out.add(s_node.make_descendant(ExactSampler(), "A"), corr_root_matcher.chain("s").chain("a"))
        return out

    for treeify in (True, False):
        one = Experiment(one_example(), dataset(), corr(), random_seed=9).scrub(16, treeify=treeify)
        batched = Experiment(batched_circuit(7), dataset(), corr(), random_seed=9).scrub(16, treeify=treeify)
        sampled = one.sampled_inputs
        root = one.nodes.get_root()
        s_node = root.children[0]
        expected = (
            column(sampled[s_node.children[0]], 0)
            + column(sampled.other_inputs_datasets[s_node], 1)
            + column(sampled.other_inputs_datasets[root], 2)
        )
        torch.testing.assert_close(one.evaluate(), expected, rtol=0, atol=0)
        torch.testing.assert_close(batched.evaluate(), expected, rtol=0, atol=0)
