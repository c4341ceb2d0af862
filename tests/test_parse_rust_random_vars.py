"""rust_circuit's random-variable nodes: DiscreteVar, StoredCumulantVar and Cumulant.

Texts are in rust_circuit's spellings (from its tests and ``circuit_base/src/print.rs``); the
expected circuits are built with the constructors and the expected shapes written out by hand
from rust_circuit's rules (``variable_nodes.rs``, ``cumulant.rs``).  These nodes have no value
here: evaluating one raises ``RandomVariableEvaluationError`` naming it.
"""

from __future__ import annotations

import pickle
import uuid

import pytest
import torch

import circuits as cc
from parse_helpers import parse_error_message as parse_error
from parse_helpers import parsed
from circuits.rewriting.batching import expand
from circuits.text.saving import load, save

UUID = "1a280c74-fa9f-4dd9-94f4-5cca4a0cf243"


# --------------------------------------------------------- rust_circuit's texts


def test_discrete_var_from_rust_circuits_tests():
    node = parsed("0 DiscreteVar\n  2 [10,11] Scalar 2.2\n  1 [10] Scalar 0.1")
    assert node == cc.DiscreteVar(cc.Scalar(2.2, (10, 11)), cc.Scalar(0.1, (10,)))
    assert node.shape == (11,)
    assert node.repr() == "0 DiscreteVar\n  1 [10,11] Scalar 2.2\n  2 [10] Scalar 0.1"


def test_stored_cumulant_var_from_rust_circuits_tests():
    text = f"0 StoredCumulantVar 1,2|{UUID}\n  1 [3, 1] Scalar 1.2\n  2 [3, 1, 3, 1] Scalar 1.2"
    node = parsed(text)
    mean, variance = cc.Scalar(1.2, (3, 1)), cc.Scalar(1.2, (3, 1, 3, 1))
    assert node == cc.StoredCumulantVar({1: mean, 2: variance}, uuid.UUID(UUID))
    assert node.shape == (3, 1)
    assert node.cumulants == {1: mean, 2: variance}
    # rust_circuit's print.rs joins the orders with ", "
    assert node.repr().split("\n")[0] == f"0 StoredCumulantVar 1, 2|{UUID}"


def test_cumulant_from_rust_circuits_tests():
    text = f"0 Cumulant\n  1 [2, 3, 3] Scalar 1.0\n  3 Tag {UUID}\n    2 [3, 3, 3] Scalar 1.2"
    node = parsed(text)
    expected = cc.Cumulant(cc.Scalar(1.0, (2, 3, 3)), cc.Tag(cc.Scalar(1.2, (3, 3, 3)), UUID))
    assert node == expected
    assert node.shape == (2, 3, 3, 3, 3, 3)
    assert node.cumulant_number == 2


def test_named_nested_random_variables():
    text = f"""0 'k2' Cumulant
  1 'v' DiscreteVar
    2 'vals' [4,3] Scalar 0.5
    3 'p' [4] Scalar 0.25
  4 's' StoredCumulantVar 1, 2, 3|{UUID}
    5 [2] Scalar 0
    6 [2,2] Scalar 1
    7 [2,2,2] Scalar 0.5
  'v'"""
    node = parsed(text)
    v = cc.DiscreteVar(cc.Scalar(0.5, (4, 3), name="vals"), cc.Scalar(0.25, (4,), name="p"), name="v")
    s = cc.StoredCumulantVar(
        {3: cc.Scalar(0.5, (2, 2, 2)), 1: cc.Scalar(0.0, (2,)), 2: cc.Scalar(1.0, (2, 2))}, UUID, name="s"
    )
    assert node == cc.Cumulant(v, s, v, name="k2")
    assert node.shape == (3, 2, 3)
    assert s.shape == (2,) and s.orders == (1, 2, 3)


def test_orders_in_any_order_each_child_taking_its_place():
    """rust_circuit zips the orders with the children into a sorted map."""
    node = parsed(f"0 StoredCumulantVar 2,1|{UUID}\n  1 [2,2] Scalar 1\n  2 [2] Scalar 3")
    assert node == cc.StoredCumulantVar({2: cc.Scalar(1.0, (2, 2)), 1: cc.Scalar(3.0, (2,))}, UUID)
    assert [child.shape for child in node.children] == [(2,), (2, 2)]


def test_empty_cumulant_and_printed_shape_checked():
    assert parsed("0 Cumulant") == cc.Cumulant()
    assert cc.Cumulant().shape == ()
    assert parsed("0 [3] DiscreteVar\n  1 [2,3] Scalar 1\n  2 [2] Scalar 0.5").shape == (3,)
    assert "computes [3]" in parse_error("0 [4] DiscreteVar\n  1 [2,3] Scalar 1\n  2 [2] Scalar 0.5", 1)


def test_uniform_discrete_var_is_tagged_equal_probabilities():
    values = cc.Scalar(1.0, (4, 2))
    first, second = cc.DiscreteVar(values), cc.DiscreteVar(values)
    assert first.shape == (2,)
    probs = first.probs_and_group
    assert isinstance(probs, cc.Tag) and probs.node == cc.Scalar(0.25, (4,))
    assert first != second  # independent samplings, as in rust_circuit
    assert parsed(first.repr()) == first


def test_new_mv_and_random_uuid():
    mean, variance = cc.Scalar(0.0, (2,)), cc.Scalar(1.0, (2, 2))
    node = cc.StoredCumulantVar.new_mv(mean, variance, uuid=UUID)
    assert node == cc.StoredCumulantVar({1: mean, 2: variance}, UUID)
    assert cc.StoredCumulantVar({1: mean, 2: variance}) != cc.StoredCumulantVar({1: mean, 2: variance})


# ------------------------------------------------------------- no value here


@pytest.mark.parametrize(
    "node",
    [
        cc.DiscreteVar(cc.Array(torch.randn(3, 2), name="x"), name="v"),
        cc.StoredCumulantVar({1: cc.Scalar(0.0, (2,)), 2: cc.Scalar(1.0, (2, 2))}, UUID, name="v"),
        cc.Cumulant(cc.Array(torch.randn(2)), name="v"),
        cc.Cumulant(name="v"),
    ],
    ids=["DiscreteVar", "StoredCumulantVar", "Cumulant", "empty Cumulant"],
)
def test_evaluating_a_random_variable_raises_naming_it(node):
    root = cc.Add(node, cc.Scalar(1.0, node.shape), name="root")
    for circuit in (node, root):
        with pytest.raises(cc.errors.RandomVariableEvaluationError) as info:
            circuit.evaluate()
        assert isinstance(info.value, cc.errors.EvaluationError)
        assert info.value.node is node
        assert f"{node.kind} 'v'" in str(info.value) and "samples" in str(info.value)
    with pytest.raises(cc.errors.RandomVariableError, match=f"{node.kind} 'v'"):
        cc.cost(root)


def test_expand_refuses_a_random_variable():
    x = cc.Symbol((3, 2), name="x")
    with pytest.raises(cc.errors.ExpandError, match="DiscreteVar 'v'"):
        expand(cc.DiscreteVar(x, name="v"), {x: cc.Symbol((5, 3, 2), name="xb")})


# ------------------------------------------------------------------ bad input


def test_bad_discrete_vars():
    with pytest.raises(cc.errors.RandomVariableError, match=r"DiscreteVar 'v'.*3 samples.*2 probabilities"):
        cc.DiscreteVar(cc.Scalar(1.0, (3, 2)), cc.Scalar(0.5, (2,)), name="v")
    with pytest.raises(cc.errors.RandomVariableError, match=r"DiscreteVar 'v'.*must be 1-d"):
        cc.DiscreteVar(cc.Scalar(1.0, (3, 2)), cc.Scalar(0.5, (3, 1)), name="v")
    with pytest.raises(cc.errors.RandomVariableError, match=r"DiscreteVar 'v'.*shape \[\]"):
        cc.DiscreteVar(cc.Scalar(1.0, ()), name="v")
    with pytest.raises(cc.errors.RandomVariableError, match="DiscreteVar 'v'.*Tensor"):
        cc.DiscreteVar(torch.ones(3), name="v")
    assert "3 samples" in parse_error("0 DiscreteVar\n  1 [3,2] Scalar 1\n  2 [2] Scalar 0.5", 1)
    assert "two children" in parse_error("0 DiscreteVar\n  1 [3,2] Scalar 1", 1)


def test_bad_stored_cumulant_vars():
    mean = cc.Scalar(0.0, (3, 1))
    with pytest.raises(
        cc.errors.RandomVariableError, match=r"'s'.*cumulant 2 has shape \[3, 1\].*\[3, 1, 3, 1\]"
    ):
        cc.StoredCumulantVar({1: mean, 2: mean}, UUID, name="s")
    with pytest.raises(cc.errors.RandomVariableError, match="'s'.*orders 1 and 2"):
        cc.StoredCumulantVar({1: mean}, UUID, name="s")
    with pytest.raises(cc.errors.RandomVariableError, match="'s'.*order 0"):
        cc.StoredCumulantVar({0: mean, 1: mean, 2: cc.Scalar(0.0, (3, 1, 3, 1))}, UUID, name="s")
    with pytest.raises(cc.errors.RandomVariableError, match="'s'.*not a uuid"):
        cc.StoredCumulantVar({1: mean, 2: cc.Scalar(0.0, (3, 1, 3, 1))}, "not-a-uuid", name="s")
    children = "\n  1 [3] Scalar 1\n  2 [3,3] Scalar 1"
    assert "not a uuid" in parse_error(f"0 StoredCumulantVar 1,2|{UUID[:-1]}x{children}", 1)
    assert "'1, 2|<uuid>'" in parse_error(f"0 StoredCumulantVar 1,2 {UUID}{children}", 1)
    assert "repeat" in parse_error(f"0 StoredCumulantVar 1,1|{UUID}{children}", 1)
    assert "3 orders but has 2 children" in parse_error(f"0 StoredCumulantVar 1,2,3|{UUID}{children}", 1)
    assert "not ints" in parse_error(f"0 StoredCumulantVar 1,x|{UUID}{children}", 1)
    assert "cumulant 2 has shape [3]" in parse_error(f"0 StoredCumulantVar 2,1|{UUID}{children}", 1)


def test_bad_cumulants():
    with pytest.raises(cc.errors.RandomVariableError, match="Cumulant 'k': child 1 is a Tensor"):
        cc.Cumulant(cc.Scalar(1.0, (2,)), torch.ones(2), name="k")
    assert "nothing after the variant" in parse_error("0 Cumulant 3\n  1 [2] Scalar 1", 1)


# -------------------------------------------------------- rebuild, save, load


def circuit_with_all_three() -> cc.Circuit:
    x = cc.Array(torch.randn(4, 3), name="x")
    v = cc.DiscreteVar(x, cc.Scalar(0.25, (4,)), name="v")
    s = cc.StoredCumulantVar({1: cc.Scalar(0.5, (3,)), 2: cc.Scalar(1.0, (3, 3))}, UUID, name="s")
    return cc.Cumulant(v, s, cc.Add(v, cc.Scalar(1.0, (3,))), name="k")


def test_save_load_and_pickle_round_trip(tmp_path):
    root = circuit_with_all_three()
    save(root, tmp_path / "c")
    loaded = load(tmp_path / "c")
    assert loaded == root and loaded.repr() == root.repr()
    assert pickle.loads(pickle.dumps(root)) == root


def test_rebuilt_over_new_children_as_the_constructors_build():
    root = circuit_with_all_three()
    v, s, _ = root.children
    y = cc.Array(torch.randn(4, 3), name="y")
    assert v.with_children([y, v.children[1]]) == cc.DiscreteVar(y, cc.Scalar(0.25, (4,)), name="v")
    mean = cc.Scalar(7.0, (3,))
    assert s.with_children([mean, s.children[1]]) == cc.StoredCumulantVar(
        {1: mean, 2: cc.Scalar(1.0, (3, 3))}, UUID, name="s"
    )
    with pytest.raises(cc.errors.RandomVariableError, match="'s'"):
        s.with_children([cc.Scalar(7.0, (2,)), s.children[1]])
    assert (
        s.evolve(uuid=uuid.UUID(int=5))
        .repr()
        .split("\n")[0]
        .endswith("|00000000-0000-0000-0000-000000000005")
    )
