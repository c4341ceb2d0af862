"""The algebraic rewrites: distribute, factor, extract_add, residual_rewrite, flattening.

Values are compared with the evaluation of the circuit before the rewrite
and with torch written here; expected structures and names are written by hand.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import random_circuits

import circuits as cc
from circuits.passes import (
    distribute,
    distribute_all,
    extract_add,
    factor,
    flatten_adds,
    flatten_einsums,
    nest_adds,
    nest_einsums,
    residual_rewrite,
)

TOL = dict(rtol=1e-10, atol=1e-10)


def arr(*shape, name=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return cc.Array(torch.randn(shape, generator=generator, dtype=torch.float64), name=name)


def residual_model():
    """``out = w @ (a + b + c + d)`` with summands of shapes [4,5], [1,5], [5] and []."""
    w = arr(3, 4, name="w")
    summands = [arr(4, 5, name="a", seed=1), arr(1, 5, name="b", seed=2), arr(5, name="c", seed=3)]
    resid = cc.Add(*summands, arr(name="d", seed=4), name="resid")
    return w, resid, cc.Einsum.from_einsum_string("ij,jk->ik", w, resid, name="out")


def expected_out(w, resid):
    a, b, c, d = (child.value for child in resid.children)
    return w.value @ (a + b + c + d)


# --- distribute ----------------------------------------------------------------


def test_distribute_names_each_term_from_its_summand_and_broadcasts():
    w, resid, out = residual_model()
    terms = distribute(out, 1)
    assert isinstance(terms, cc.Add) and terms.name == "out"
    assert [t.name for t in terms.children] == ["out.a", "out.b", "out.c", "out.d"]
    assert all(t.shape == (3, 5) for t in terms.children)
    torch.testing.assert_close(terms.evaluate(), expected_out(w, resid), **TOL)
    torch.testing.assert_close(
        terms.children[1].evaluate(), w.value @ resid.children[1].value.expand(4, 5), **TOL
    )


def test_distribute_shares_the_operands_it_does_not_change():
    w, resid, out = residual_model()
    terms = distribute(out, -1)
    assert all(t.children[0] is w for t in terms.children)
    assert terms.children[0].children[1] is resid.children[0]
    assert terms.children[2].children[1] is resid.children[2]


def test_distribute_over_a_summed_broadcast_axis_counts_it():
    x = arr(4, name="x")
    y = arr(3, 1, name="y", seed=1)
    total = cc.Einsum.from_einsum_string("ab->", cc.Add(x, y, name="s"), name="total")
    terms = distribute(total, 0)
    torch.testing.assert_close(terms.evaluate(), (x.value + y.value).sum(), **TOL)
    torch.testing.assert_close(terms.children[0].evaluate(), 3 * x.value.sum(), **TOL)
    torch.testing.assert_close(terms.children[1].evaluate(), 4 * y.value.sum(), **TOL)


def test_distribute_prefix_suffix_and_unnamed_summands():
    x, y = arr(2, name="x"), arr(2, seed=1)
    e = cc.Einsum.from_einsum_string("a,a->a", x, cc.Add(x, y), name="e")
    assert [t.name for t in distribute(e, 1).children] == ["e.x", "e.1"]
    named = distribute(e, 1, prefix="path:", suffix="!")
    assert [t.name for t in named.children] == ["path:x!", "path:1!"]
    unnamed = cc.Einsum.from_einsum_string("a,a->a", x, cc.Add(x, y))
    assert [t.name for t in distribute(unnamed, 1).children] == ["x", "1"]


def test_distribute_depth_opens_nested_adds():
    x, y, z = arr(2, name="x"), arr(2, name="y", seed=1), arr(2, name="z", seed=2)
    e = cc.Einsum.from_einsum_string("a,a->", x, cc.Add(x, cc.Add(y, z, name="yz"), name="s"), name="e")
    assert [t.name for t in distribute(e, 1).children] == ["e.x", "e.yz"]
    assert [t.name for t in distribute(e, 1, depth=None).children] == ["e.x", "e.y", "e.z"]
    torch.testing.assert_close(distribute(e, 1, depth=2).evaluate(), e.evaluate(), **TOL)
    assert [t.name for t in distribute(e, 1, depth=None, traversal="other").children] == ["e.x", "e.yz"]
    assert [t.name for t in distribute(e, 1, depth=None, traversal="yz").children] == ["e.x", "e.y", "e.z"]


def test_distribute_all_takes_one_summand_from_each_add():
    x, y = arr(2, 3, name="x"), arr(3, name="y", seed=1)
    s = cc.Add(x, y, name="s")
    square = cc.Einsum.from_einsum_string("ab,ab->ab", s, s, name="sq")
    terms = distribute_all(square)
    assert [t.name for t in terms.children] == ["sq.x.x", "sq.x.y", "sq.y.x", "sq.y.y"]
    torch.testing.assert_close(terms.evaluate(), (x.value + y.value) ** 2, **TOL)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda w, resid, out: distribute(out, 0), "operand 0 of Einsum 'out' is Array 'w', not an Add"),
        (lambda w, resid, out: distribute(out, 2), "operand 2 is out of range for Einsum 'out'"),
        (lambda w, resid, out: distribute(resid, 0), "expected Einsum, got Add 'resid'"),
        (lambda w, resid, out: distribute(out, 1, depth=0), "depth must be a positive int"),
        (lambda w, resid, out: distribute_all(cc.Einsum.from_einsum_string("ij->i", w)), "no Add operand"),
        (lambda w, resid, out: factor(resid), "Array 'a' of Add 'resid' is not an Einsum"),
        (lambda w, resid, out: extract_add(resid, [w]), "Array 'w' not among the operands of Add 'resid'"),
        (lambda w, resid, out: extract_add(resid, []), "no summands chosen from Add 'resid'"),
        (lambda w, resid, out: extract_add(resid, ["a"]), "expected Circuit, got str 'a'"),
        (lambda w, resid, out: residual_rewrite(out, w), "does not broadcast to Einsum 'out'"),
    ],
)
def test_rewrites_refuse_input_they_cannot_rewrite(call, message):
    with pytest.raises(cc.errors.PassError, match=message):
        call(*residual_model())


# --- factor ----------------------------------------------------------------------


def test_factor_undoes_distribute_to_the_same_circuit():
    x, y, w = arr(3, 4, name="x"), arr(3, 4, name="y", seed=1), arr(4, 2, name="w", seed=2)
    e = cc.Einsum.from_einsum_string("ab,bc->ac", cc.Add(x, y, name="s"), w, name="e")
    assert factor(distribute(e, 0), inner_name="s") == e


def test_factor_takes_out_the_common_operands():
    w, x, y = arr(3, 4, name="w"), arr(4, name="x", seed=1), arr(4, 2, name="y", seed=2)
    terms = cc.Add(
        cc.Einsum.from_einsum_string("ab,b->a", w, x, name="t0"),
        cc.Einsum.from_einsum_string("ab,bc->a", w, y, name="t1"),
        name="sum",
    )
    factored = factor(terms, inner_name="inner")
    assert factored.name == "sum" and factored.children[0] is w
    assert factored.children[1].name == "inner"
    torch.testing.assert_close(factored.evaluate(), w.value @ (x.value + y.value.sum(1)), **TOL)


def test_factor_refuses_einsums_of_other_outputs_and_lone_terms():
    x, y = arr(2, name="x"), arr(2, name="y", seed=1)
    single = cc.Einsum.from_einsum_string("a->a", x, name="t")
    other = cc.Einsum.from_einsum_string("a->", y, name="u")
    with pytest.raises(cc.errors.PassError, match="Einsums of Add 's' differ in output axes or shape"):
        factor(cc.Add(single, other, name="s"))
    with pytest.raises(cc.errors.PassError, match="Add 'one' has 1 operand"):
        factor(cc.Add(single, name="one"))


# --- extract_add, residual_rewrite, flattening ---------------------------------------


def test_extract_add_groups_the_chosen_summands_where_the_first_was():
    w, resid, out = residual_model()
    a, b, c, d = resid.children
    grouped = extract_add(resid, [d, b], name="bd")
    assert grouped.name == "resid"
    assert grouped.children[0] is a and grouped.children[2] is c
    assert grouped.children[1] == cc.Add(b, d, name="bd")
    torch.testing.assert_close(grouped.evaluate(), a.value + b.value + c.value + d.value, **TOL)


def test_extract_add_takes_a_repeated_summand_as_often_as_chosen():
    x, y = arr(2, name="x"), arr(2, name="y", seed=1)
    grouped = extract_add(cc.Add(x, y, x), [x], name="one_x")
    assert grouped == cc.Add(cc.Add(x, name="one_x"), y, x)


def test_residual_rewrite_is_estimate_plus_residual():
    w, resid, out = residual_model()
    estimate = arr(3, 5, name="guess", seed=9)
    rewritten = residual_rewrite(out, estimate)
    assert rewritten.name == "out.rewritten" and rewritten.children[0] is estimate
    residual = rewritten.children[1]
    assert residual.name == "out.residual" and residual.children[0] is out
    assert residual.children[1].name == "out.minus_estimate"
    torch.testing.assert_close(residual.evaluate(), expected_out(w, resid) - estimate.value, **TOL)
    torch.testing.assert_close(rewritten.evaluate(), expected_out(w, resid), **TOL)
    assert residual_rewrite(out, estimate, name="out").name == "out"


def test_flatten_adds_limited_by_a_traversal():
    x, y, z = arr(2, name="x"), arr(2, name="y", seed=1), arr(2, name="z", seed=2)
    inner = cc.Add(y, z, name="inner")
    middle = cc.Add(x, inner, name="middle")
    top = cc.Add(middle, x, name="top")
    assert flatten_adds(top, "middle") == cc.Add(cc.Add(x, y, z, name="middle"), x, name="top")
    assert flatten_adds(top) == cc.Add(x, y, z, x, name="top")


def test_flatten_einsums_limited_by_a_traversal():
    x = arr(2, 2, name="x")
    inner = cc.Einsum.from_einsum_string("ab,bc->ac", x, x, name="inner")
    outer = cc.Einsum.from_einsum_string("ab->", inner, name="outer")
    assert flatten_einsums(outer, "inner") is outer
    flat = flatten_einsums(outer, "outer")
    assert flat.children == (x, x)
    torch.testing.assert_close(flat.evaluate(), (x.value @ x.value).sum(), **TOL)


def test_nest_adds_groups_as_the_spec_says():
    x, y, z = arr(2, 3, name="x"), arr(3, name="y", seed=1), arr(name="z", seed=2)
    total = cc.Add(x, y, z, name="total")
    nested = nest_adds(total, [[0, 2], ("y_only", [1])])
    assert nested == cc.Add(cc.Add(x, z), cc.Add(y, name="y_only"), name="total")
    torch.testing.assert_close(nested.evaluate(), x.value + y.value + z.value, **TOL)


def test_nest_einsums_keeps_the_letters_the_rest_needs():
    x, y, z = arr(2, 3, name="x"), arr(3, 4, name="y", seed=1), arr(4, 5, name="z", seed=2)
    chain = cc.Einsum.from_einsum_string("ab,bc,cd->ad", x, y, z, name="chain")
    nested = nest_einsums(chain, [0, ("yz", [1, 2])])
    assert nested.einsum_string == "ab,bd->ad" and nested.children[0] is x
    assert nested.children[1].name == "yz" and nested.children[1].einsum_string == "bc,cd->bd"
    torch.testing.assert_close(nested.evaluate(), x.value @ y.value @ z.value, **TOL)


@pytest.mark.parametrize(
    "spec, message",
    [
        ([0, 1], "name each of the 3 operands of Add 'total' exactly once"),
        ([0, 1, 1, 2], "got \\[0, 1, 1, 2\\]"),
        ([0, [], 1, 2], "an empty group"),
        ([0, "y", 2], "a spec item is a position, a list or a \\(name, list\\), got 'y'"),
    ],
)
def test_nest_adds_refuses_a_spec_that_does_not_cover_the_operands(spec, message):
    total = cc.Add(arr(2, name="x"), arr(2, name="y"), arr(2, name="z"), name="total")
    with pytest.raises(cc.errors.PassError, match=message):
        nest_adds(total, spec)


# --- random circuits ------------------------------------------------------------------

LETTERS = "abcde"


@st.composite
def einsums_over_adds(draw) -> cc.Einsum:
    """An Einsum with an Add operand whose summands broadcast (lower rank, size-1 axes,
    Adds nested in it), beside other operands (perhaps an Add too) sharing its letters."""
    sizes = {a: draw(st.integers(0, 3)) for a in range(len(LETTERS))}
    letters = st.lists(st.integers(0, len(LETTERS) - 1), max_size=3)
    seeds = iter(range(draw(st.integers(0, 1000)), 10_000))

    def summand(axes):
        full = [sizes[a] for a in axes]
        rank = draw(st.integers(0, len(full)))
        shape = [1 if draw(st.booleans()) else n for n in full[len(full) - rank :]]
        return arr(*shape, name=draw(st.sampled_from([None, "s", "t"])), seed=next(seeds))

    add_axes = tuple(draw(letters))
    pieces = [summand(add_axes) for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        pieces.append(cc.Add(summand(add_axes), summand(add_axes), name="nested"))
    add = cc.Add(arr(*[sizes[a] for a in add_axes], seed=next(seeds)), *pieces, name="sum")
    others = [tuple(draw(letters)) for _ in range(draw(st.integers(0, 2)))]
    operands = [(arr(*[sizes[a] for a in axes], seed=next(seeds)), axes) for axes in others]
    if operands and draw(st.booleans()):  # a second Add, for distribute_all
        first, axes = operands[0]
        operands[0] = (cc.Add(first, summand(axes), name="other"), axes)
    operands.insert(draw(st.integers(0, len(operands))), (add, add_axes))
    used = sorted({a for _, axes in operands for a in axes})
    out = draw(st.permutations(used).flatmap(lambda p: st.integers(0, len(p)).map(lambda k: tuple(p[:k]))))
    return cc.Einsum(*operands, out_axes=out, name="e")


def add_position(einsum):
    return next(p for p, child in enumerate(einsum.children) if isinstance(child, cc.Add))


@settings(max_examples=150, deadline=None)
@given(einsums_over_adds(), st.sampled_from([1, 2, None]))
def test_distribute_keeps_the_value(einsum, depth):
    terms = distribute(einsum, add_position(einsum), depth=depth)
    assert terms.shape == einsum.shape
    torch.testing.assert_close(terms.evaluate(), einsum.evaluate(), **TOL)


@settings(max_examples=100, deadline=None)
@given(einsums_over_adds())
def test_distribute_all_keeps_the_value(einsum):
    torch.testing.assert_close(distribute_all(einsum).evaluate(), einsum.evaluate(), **TOL)


@settings(max_examples=150, deadline=None)
@given(einsums_over_adds(), st.sampled_from([1, None]))
def test_factor_of_distribute_keeps_the_value(einsum, depth):
    terms = distribute(einsum, add_position(einsum), depth=depth)
    factored = factor(terms)
    assert isinstance(factored, cc.Einsum) and factored.shape == einsum.shape
    torch.testing.assert_close(factored.evaluate(), einsum.evaluate(), **TOL)


@settings(max_examples=100, deadline=None)
@given(einsums_over_adds(), st.data())
def test_extract_add_keeps_the_value(einsum, data):
    add = einsum.children[add_position(einsum)]
    positions = data.draw(st.sets(st.integers(0, len(add.children) - 1), min_size=1))
    chosen = [add.children[p] for p in sorted(positions)]
    grouped = extract_add(add, chosen, name="group")
    assert grouped.shape == add.shape
    torch.testing.assert_close(grouped.evaluate(), add.evaluate(), **TOL)


@settings(max_examples=100, deadline=None)
@given(random_circuits(evaluable=True), st.integers(0, 1000))
def test_residual_rewrite_keeps_the_value(circuit, seed):
    generator = torch.Generator().manual_seed(seed)
    estimate = cc.Array(torch.randn(circuit.shape, generator=generator, dtype=torch.float64), name="est")
    expected = circuit.evaluate(dtype=torch.float64)
    rewritten = residual_rewrite(circuit, estimate, name="split")
    torch.testing.assert_close(rewritten.evaluate(dtype=torch.float64), expected, **TOL)


@settings(max_examples=100, deadline=None)
@given(
    random_circuits(evaluable=True),
    st.sampled_from([flatten_adds, flatten_einsums]),
    st.sampled_from([True, cc.Matcher.regex("^[a-m]")]),
)
def test_flattening_under_a_traversal_keeps_the_value(circuit, flatten, traversal):
    expected = circuit.evaluate(dtype=torch.float64)
    torch.testing.assert_close(flatten(circuit, traversal).evaluate(dtype=torch.float64), expected, **TOL)


@st.composite
def groupings(draw, count: int) -> list:
    """A random nesting of positions ``0..count-1``: shuffled, then cut into groups."""
    items = list(draw(st.permutations(range(count))))
    while len(items) > 1 and draw(st.booleans()):
        start = draw(st.integers(0, len(items) - 1))
        stop = draw(st.integers(start + 1, len(items)))
        items[start:stop] = [items[start:stop]]
    return items


@settings(max_examples=100, deadline=None)
@given(einsums_over_adds(), st.data())
def test_nesting_keeps_the_value(einsum, data):
    nested = nest_einsums(einsum, data.draw(groupings(len(einsum.children))))
    torch.testing.assert_close(nested.evaluate(), einsum.evaluate(), **TOL)
    add = einsum.children[add_position(einsum)]
    regrouped = nest_adds(add, data.draw(groupings(len(add.children))))
    assert regrouped.shape == add.shape
    torch.testing.assert_close(regrouped.evaluate(), add.evaluate(), **TOL)
