"""Nothing silently wrong in the core: stale tensors, rebuilt nodes, gradients, scalars, pickling.

Each test asserts the right value (against torch computed directly) or the
typed error, for one way the library used to give a wrong number or lose
data without a word.
"""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

import circuits as cc
from circuits import models
from circuits.models.demo_model import repeated_tokens

# ------------------------------------------------------- tensors edited in place


def test_an_array_whose_tensor_was_edited_in_place_refuses_to_evaluate():
    w = torch.ones(3)
    c = cc.Add(cc.Array(w, name="w"), name="c")
    assert torch.equal(c.evaluate(), torch.ones(3))
    w.mul_(5)
    with pytest.raises(cc.errors.StaleTensorError) as info:
        c.evaluate()
    assert isinstance(info.value, cc.errors.EvaluationError)
    assert "'w'" in str(info.value) and "modified in place" in str(info.value)


def test_saving_an_edited_tensor_refuses_instead_of_writing_old_values(tmp_path):
    w = torch.ones(3)
    c = cc.Add(cc.Array(w, name="w"))
    path = tmp_path / "c.circ"
    cc.save(c, path)
    w.mul_(5)
    with pytest.raises(cc.errors.StaleTensorError) as info:
        cc.save(c, path)
    assert info.value.node is c.children[0]
    with pytest.raises(cc.errors.StaleTensorError) as info:
        cc.save(c, tmp_path / "fresh.circ")  # never a file under the old hash holding new values
    assert info.value.node is c.children[0]
    assert torch.equal(cc.load(path).evaluate(), torch.ones(3))  # what was saved is intact


def test_requires_grad_set_after_wrapping_is_stale():
    w = torch.ones(3)
    node = cc.Array(w, name="w")
    w.requires_grad_()
    with pytest.raises(cc.errors.StaleTensorError, match="requires_grad") as info:  # says what changed
        node.tensor()
    assert info.value.node is node


def test_the_evaluator_never_serves_a_value_computed_from_an_edited_tensor():
    w = torch.ones(3)
    c = cc.GeneralFunction.new_by_name(
        cc.Add(cc.Array(w, name="w"), cc.Array(torch.ones(3), name="b")), spec_name="exp"
    )
    ev = cc.Evaluator(2**20)
    ev.evaluate(c)
    w.mul_(5)
    with pytest.raises(cc.errors.StaleTensorError):
        ev.evaluate(c)
    assert len(ev) == 0
    fresh = c.update("w", lambda n: cc.Array(w, name="w"))  # the tensor as it is now
    assert torch.allclose(ev.evaluate(fresh), torch.exp(w + 1))


def test_the_evaluator_recomputes_a_returned_value_the_caller_edited():
    x = cc.Array(torch.arange(4.0), name="x")
    c = cc.GeneralFunction.new_by_name(cc.Add(x, x, name="s"), spec_name="exp", name="e")
    ev = cc.Evaluator(2**20)
    first = ev.evaluate(c)
    first.zero_()  # the caller's business, but the cache must not hand it out again
    again = ev.evaluate(c)
    assert torch.equal(again, torch.exp(torch.arange(4.0) * 2))


def test_an_index_keeps_its_own_copy_of_the_index_tensor():
    x = torch.randn(3, 4)
    idx = torch.tensor([0, 1])
    node = cc.Index(cc.Array(x, name="x"), (idx,), name="i")
    idx[0] = 2
    assert node.extra == "[[0,1],:]"
    assert torch.equal(node.evaluate(), x[[0, 1]])


def test_an_index_tensor_edited_through_the_node_is_refused():
    node = cc.Index(cc.Array(torch.randn(3, 4), name="x"), (torch.tensor([0, 1]),), name="i")
    node.index[0][0] = 2
    with pytest.raises(cc.errors.StaleTensorError) as info:
        node.evaluate()
    assert info.value.node is node


def test_editing_one_parse_result_does_not_reach_a_later_parse():
    text = "'i' [2,4] Index [[0,1],:]\n  'x' [3,4] Symbol"
    first = cc.parse(text)
    first.index[0].fill_(2)
    assert cc.parse(text).repr() == text


# ------------------------------------------------------------ rebuilt nodes


def test_a_rewrite_below_an_index_rechecks_the_slice():
    x = cc.Array(torch.randn(3, 4), name="x")
    c = cc.Index(x, (slice(0, 3),), name="i")
    with pytest.raises(cc.errors.IndexSpecError, match="'i'.*0:3 is out of range for size 2"):
        c.update("x", lambda n: cc.Array(torch.zeros(2, 4), name="x"))


def test_a_rewrite_changing_rank_below_a_concat_rechecks_the_axis():
    x = cc.Symbol((2, 3), name="x")
    c = cc.Concat(x, x, axis=1, name="c")
    with pytest.raises(cc.errors.ConcatError, match="'c'"):
        c.update("x", lambda n: cc.Symbol((6,), name="x"))


def test_evolve_builds_through_the_constructor():
    s = cc.Scalar(1.0, name="s")
    with pytest.raises(cc.errors.LeafError, match="'s'"):
        s.evolve(value=10**400)
    with pytest.raises(cc.errors.LeafError):
        s.evolve(value="one")
    a = cc.Array(torch.ones(2), name="a")
    moved = a.evolve(value=torch.zeros(5))
    assert moved == cc.Array(torch.zeros(5), name="a") and moved.shape == (5,)
    with pytest.raises(cc.errors.LeafError):
        a.evolve(content_hash="0" * 64)
    e = cc.Einsum.from_einsum_string("ab->a", cc.Symbol((2, 3), name="y"), name="e")
    with pytest.raises(cc.errors.EinsumError, match="'e'"):
        e.evolve(out_axes=(99,))
    with pytest.raises(cc.errors.NodeTypeError, match="bogus"):
        e.evolve(bogus=1)
    assert a.rename("b").extra == a.extra and a.rename("b").name == "b"


# ---------------------------------------------------------------- gradients


def test_two_leaves_with_equal_contents_get_their_own_gradients():
    a = torch.ones(3, requires_grad=True)
    b = torch.ones(3, requires_grad=True)
    c = cc.Einsum.from_einsum_string(
        "a,a->a", cc.Array(a, name="w"), cc.Add(cc.Array(b, name="w"), cc.Array(b, name="w"))
    )
    c.evaluate().sum().backward()
    ra, rb = a.detach().clone().requires_grad_(), b.detach().clone().requires_grad_()
    (ra * (rb + rb)).sum().backward()
    assert torch.equal(a.grad, ra.grad) and torch.equal(b.grad, rb.grad)


def test_replacing_an_array_by_an_equal_one_that_requires_grad_is_not_a_no_op():
    c = cc.Add(cc.Array(torch.ones(2), name="x"), name="c")
    g = torch.ones(2, requires_grad=True)
    swapped = c.update("x", lambda n: cc.Array(g, name="x"))
    assert swapped != c
    (swapped.evaluate() * torch.tensor([2.0, 3.0])).sum().backward()
    assert torch.equal(g.grad, torch.tensor([2.0, 3.0]))


def test_one_leaf_used_twice_is_one_variable():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    c = cc.Einsum.from_einsum_string("a,a->", cc.Array(w, name="w"), cc.Array(w, name="w"))
    c.evaluate().backward()
    assert torch.equal(w.grad, 2 * w.detach())


# ------------------------------------------------------------------ scalars


def test_negative_zero_survives_beside_positive_zero():
    neg, pos = cc.Scalar(-0.0, shape=(2,)), cc.Scalar(0.0, shape=(2,))
    values = cc.evaluate_many([cc.Add(neg), cc.Add(pos)])
    assert torch.equal(1 / values[0], torch.full((2,), -torch.inf))
    assert torch.equal(1 / values[1], torch.full((2,), torch.inf))


# ------------------------------------------------------- typed errors, values


def test_leaf_values_torch_cannot_hash_are_leaf_errors():
    for bad in (
        torch.empty(3, device="meta"),
        torch.eye(3).to_sparse(),
        torch.tensor([1 + 1j]).conj(),
    ):
        with pytest.raises(cc.errors.LeafError, match="'w'"):
            cc.Array(bad, name="w")
    with pytest.raises(cc.errors.LeafError, match="too large"):
        cc.Scalar(10**400, name="s")
    with pytest.raises(cc.errors.IndexSpecError, match="meta"):
        cc.Index(cc.Symbol((3,), name="x"), (torch.empty(2, dtype=torch.int64, device="meta"),))


def test_an_inference_tensor_is_copied_so_edits_cannot_go_unseen():
    with torch.inference_mode():
        t = torch.ones(3)
    node = cc.Array(t, name="t")
    assert not node.value.is_inference()
    with torch.inference_mode():
        t.mul_(2)
    assert torch.equal(node.evaluate(), torch.ones(3))


def test_einsum_string_of_the_wrong_type():
    with pytest.raises(cc.errors.EinsumError, match="123"):
        cc.Einsum.from_einsum_string(123, cc.Symbol((2,), name="x"))


def test_a_shape_fn_that_raises_anything_is_a_function_spec_error():
    def shape_fn(shapes):
        raise KeyError("boom")

    spec = cc.FunctionSpec("raises_key_error", 1, shape_fn, torch.exp)
    with pytest.raises(cc.errors.FunctionSpecError, match="'f'") as info:  # names the node being built
        cc.GeneralFunction(cc.Symbol((2,), name="x"), spec=spec, name="f")
    assert isinstance(info.value.__cause__, KeyError)


def test_a_function_returning_another_shape_than_declared_is_an_evaluation_error():
    spec = cc.FunctionSpec("lies_about_shape", 1, lambda shapes: shapes[0], lambda x: x.sum(-1))
    node = cc.GeneralFunction(cc.Array(torch.ones(2, 3), name="x"), spec=spec, name="f")
    # the message gives both shapes
    with pytest.raises(cc.errors.EvaluationError, match="returned shape \\[2\\].*declared \\[2,3\\]") as info:
        node.evaluate()
    assert info.value.node is node


def test_a_scalar_too_big_to_make_is_an_evaluation_error():
    huge = cc.Scalar(1.0, shape=(2**40, 2**40), name="huge")
    for root in (huge, cc.Add(huge, name="sum")):
        with pytest.raises(cc.errors.EvaluationError) as info:
            root.evaluate()
        assert info.value.node is huge


# ---------------------------------------------------------- pickle, deepcopy


def test_a_model_pickles_and_deep_copies():
    c = models.load_demo_model(repeated_tokens(2, 6))
    for again in (pickle.loads(pickle.dumps(c)), copy.deepcopy(c)):
        assert again == c
        assert torch.equal(again.evaluate(), c.evaluate())


def test_circuits_of_any_depth_pickle_and_deep_copy():
    node = cc.Array(torch.ones(2), name="x")
    for _ in range(5000):
        node = cc.GeneralFunction.new_by_name(node, spec_name="relu")
    assert pickle.loads(pickle.dumps(node)) == node
    assert copy.deepcopy(node) == node


def test_a_deep_copy_of_a_grad_leaf_is_a_new_variable():
    w = torch.ones(2, requires_grad=True)
    c = cc.Add(cc.Array(w, name="w"))
    twin = copy.deepcopy(c)
    assert twin != c and twin.repr() == c.repr()
    twin.evaluate().sum().backward()
    assert w.grad is None


def test_deep_copy_of_an_attached_weight_says_why_it_cannot():
    parameter = torch.ones(2, 2, requires_grad=True)
    c = cc.Add(cc.Array(parameter.t(), name="w.t"))
    with pytest.raises(cc.errors.LeafError, match="'w.t'.*autograd graph"):
        copy.deepcopy(c)
