"""simplify and each of its rules: smaller circuits, same values.

Expected structures are written by hand; values are compared with the
unsimplified circuit's evaluation and with torch written here.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import random_circuits

import circuits as cc
from circuits.passes import (
    flatten_adds,
    flatten_einsums,
    fold_scalars,
    remove_identity_index,
    remove_identity_rearrange,
    remove_single_operand,
    simplify,
)

TOL = dict(rtol=1e-12, atol=1e-12)


def arr(*shape, name=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return cc.Array(torch.randn(*shape, generator=generator, dtype=torch.float64), name=name)


def test_flatten_adds_merges_nested_adds_with_broadcasting():
    a, b, c = arr(3, name="a", seed=1), arr(2, 3, name="b", seed=2), arr(1, name="c", seed=3)
    nested = cc.Add(cc.Add(a, c, name="inner"), b, name="outer")
    flat = flatten_adds(nested)
    assert flat.kind == "Add" and flat.name == "outer" and list(flat.children) == [a, c, b]
    torch.testing.assert_close(flat.evaluate(), a.value + c.value + b.value, **TOL)


def test_flatten_einsums_renames_summed_letters_apart():
    x, w, v = arr(4, 5, name="x", seed=1), arr(5, 6, name="w", seed=2), arr(6, 5, name="v", seed=3)
    inner = cc.Einsum.from_einsum_string("ab,bc->ac", x, w, name="inner")  # sums b
    outer = cc.Einsum.from_einsum_string("ac,cb->ab", inner, v, name="outer")  # its own b
    flat = flatten_einsums(outer)
    assert flat.kind == "Einsum" and len(flat.children) == 3 and flat.name == "outer"
    assert all(c.kind == "Array" for c in flat.children)
    torch.testing.assert_close(flat.evaluate(), x.value @ w.value @ v.value, **TOL)


def test_flatten_einsum_into_a_diagonal():
    x = arr(3, 3, name="x", seed=4)
    square = cc.Einsum.from_einsum_string("ab,bc->ac", x, x)
    trace = cc.Einsum.from_einsum_string("aa->", square)
    torch.testing.assert_close(flatten_einsums(trace).evaluate(), torch.trace(x.value @ x.value), **TOL)


def test_fold_scalars_in_add_einsum_index_and_functions():
    x = arr(2, 3, name="x", seed=5)
    added = cc.Add(x, cc.Scalar(1.5), cc.Scalar(-0.5), name="sum")
    folded = fold_scalars(added)
    assert len(folded.children) == 2 and folded.children[1].value == 1.0
    assert fold_scalars(cc.Add(x, cc.Scalar(0.0))) is x
    assert fold_scalars(cc.Add(x, cc.Scalar(0.0), name="kept")) == cc.Add(x, name="kept")  # the name stays
    scaled = cc.Einsum.from_einsum_string("ab,,c->ab", x, cc.Scalar(3.0), cc.Scalar(2.0, shape=(4,)))
    folded = fold_scalars(scaled)  # c only in a scalar and summed: its size multiplies
    assert [c.kind for c in folded.children] == ["Array", "Scalar"] and folded.children[1].value == 24.0
    torch.testing.assert_close(folded.evaluate(), x.value * 24.0, **TOL)
    constant = cc.GeneralFunction.new_by_name(cc.Scalar(4.0, shape=(2,)), spec_name="rsqrt", name="half")
    assert fold_scalars(constant) == cc.Scalar(0.5, shape=(2,), name="half")
    assert fold_scalars(cc.Index(cc.Scalar(7.0, shape=(5, 2)), (1,))) == cc.Scalar(7.0, shape=(2,))
    size = cc.GeneralFunction.new_by_name(cc.Scalar(0.0, shape=(3, 8)), spec_name="last_dim_size")
    assert fold_scalars(size) == cc.Scalar(8.0, shape=(3,))


def test_identity_index_rearrange_and_single_operands_go():
    x = arr(2, 3, name="x", seed=6)
    assert remove_identity_index(cc.Index(x, (slice(None), slice(None)))) is x
    assert remove_identity_index(cc.Index(x, (slice(0, 2),))).kind == "Index"
    assert remove_identity_rearrange(cc.Rearrange(x, "a b -> a b")) is x
    assert remove_identity_rearrange(cc.Rearrange(x, "a b -> b a")).kind == "Rearrange"
    assert remove_single_operand(cc.Add(x)) is x
    assert remove_single_operand(cc.Einsum.from_einsum_string("ab->ab", x)) is x
    assert remove_single_operand(cc.Einsum.from_einsum_string("ab->ba", x)).kind == "Einsum"
    assert remove_single_operand(cc.Add(cc.Scalar(1.0, shape=(3,)), name="s")).kind == "Scalar"


def test_simplify_reaches_a_fixed_point_and_keeps_values():
    x = arr(2, 3, name="x", seed=7)
    messy = cc.Add(
        cc.Add(cc.Index(x, (slice(None), slice(None))), cc.Scalar(0.0)),
        cc.Einsum.from_einsum_string("ab,->ab", cc.Rearrange(x, "a b -> a b"), cc.Scalar(1.0)),
    )
    simple = simplify(messy)
    assert simple == cc.Add(x, x)
    torch.testing.assert_close(simple.evaluate(), 2 * x.value, **TOL)
    assert simplify(simple) == simple


@settings(max_examples=120)
@given(
    random_circuits(evaluable=True),
    st.sampled_from(
        [
            simplify,
            flatten_adds,
            flatten_einsums,
            fold_scalars,
            remove_identity_index,
            remove_identity_rearrange,
            remove_single_operand,
        ]
    ),
)
def test_every_rule_keeps_the_value(circuit, rule):
    simpler = rule(circuit)
    assert simpler.shape == circuit.shape
    # float64 even for a circuit of Scalars alone (float32 by default), whose rounding is far above 1e-10
    expected = circuit.evaluate(dtype=torch.float64)
    torch.testing.assert_close(simpler.evaluate(dtype=torch.float64), expected, rtol=1e-10, atol=1e-10)
    assert len(cc.unique_nodes([simpler])) <= len(cc.unique_nodes([circuit])) + 1
