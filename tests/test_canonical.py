"""canonicalize and diff: same value, idempotent, blind to Add operand order and to
the route (factor of distribute); diff shows exactly the changed lines.

Values are compared with the evaluation of the circuit before canonicalizing.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import random_circuits

import circuits as cc
from circuits.passes import canonicalize, distribute, factor

TOL = dict(rtol=1e-10, atol=1e-10)


def arr(*shape, name=None, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return cc.Array(torch.randn(shape, generator=generator, dtype=torch.float64), name=name)


# --- hand-built ---------------------------------------------------------------------


def test_canonicalize_sorts_flattens_and_renames():
    x, y, z = arr(3, name="x"), arr(3, name="y", seed=1), arr(3, name="z", seed=2)
    assert canonicalize(cc.Add(x, cc.Add(y, z))) == canonicalize(cc.Add(cc.Add(z, x), y))
    w = arr(3, 4, name="w", seed=3)
    one = cc.Einsum.from_einsum_string("ab,a->b", w, x)
    other = cc.Einsum.from_einsum_string("q,qk->k", x, w)
    assert one != other and canonicalize(one) == canonicalize(other)
    assert canonicalize(one).einsum_string == canonicalize(other).einsum_string


def test_canonicalize_shares_what_it_does_not_change():
    x = arr(3, name="x")
    relu = cc.GeneralFunction(x, spec="relu", name="r")
    assert canonicalize(relu) is relu
    named = cc.Add(arr(3, name="a", seed=1), arr(3, name="b", seed=2), name="s")
    assert canonicalize(named, keep_names=True) is named
    assert canonicalize(named).name is None


def test_factor_of_distribute_canonicalizes_to_the_same_circuit():
    x, y, w = arr(3, 4, name="x"), arr(3, 4, name="y", seed=1), arr(4, 2, name="w", seed=2)
    e = cc.Einsum.from_einsum_string("ab,bc->ac", cc.Add(x, y, name="s"), w, name="e")
    assert canonicalize(factor(distribute(e, 0))) == canonicalize(e)


def test_a_letter_only_the_sum_has_stays_summed_outside_it():
    """``'a'`` is summed only inside the Add operand: factor keeps it on the inner sum, so the
    route back gives the same tree (it used to sum ``'a'`` inside each summand)."""
    x, y, w = arr(3, 4, name="x"), arr(3, 4, name="y", seed=1), arr(4, 2, name="w", seed=2)
    e = cc.Einsum.from_einsum_string("ab,bc->c", cc.Add(x, y, name="s"), w, name="e")
    factored = factor(distribute(e, 0), inner_name="s")
    assert factored.einsum_string == "ab,bc->c" and factored.children[0] == cc.Add(x, y, name="s")
    assert canonicalize(factored) == canonicalize(e)


def test_diff_of_a_circuit_with_itself_is_empty():
    c = cc.Add(arr(3, name="a"), arr(3, name="b", seed=1), name="s")
    assert cc.diff(c, c) == ""
    assert not cc.circuit_diff(c, c)


def test_diff_after_a_rename_shows_the_changed_line():
    a = arr(3, name="a")
    old = cc.Add(a, arr(3, name="b", seed=1), name="s")
    new = old.update("a", lambda n: n.rename("a2"))
    text = cc.diff(new, old)
    changed = [line for line in text.splitlines() if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    assert [line[0] for line in changed] == ["-", "+"]
    assert "'a'" in changed[0] and "'a2'" in changed[1]
    colored = cc.diff(new, old, color=True)
    assert "\x1b[31m-" in colored and "\x1b[32m+" in colored
    html = cc.circuit_diff(new, old)._repr_html_()
    assert html.startswith("<pre") and "a2" in html


# --- random circuits ---------------------------------------------------------------


@settings(max_examples=120, deadline=None)
@given(random_circuits(evaluable=True))
def test_canonicalize_keeps_the_value_and_is_idempotent(circuit):
    canonical = canonicalize(circuit)
    assert canonical.shape == circuit.shape
    # float64 even for a circuit of Scalars alone (float32 by default, far above 1e-10 in rounding)
    expected = circuit.evaluate(dtype=torch.float64)
    torch.testing.assert_close(canonical.evaluate(dtype=torch.float64), expected, **TOL, equal_nan=True)
    assert canonicalize(canonical) == canonical


@settings(max_examples=120, deadline=None)
@given(random_circuits(evaluable=True), st.randoms(use_true_random=False))
def test_canonicalize_is_blind_to_add_operand_order(circuit, rng):
    adds = [n for n in cc.unique_nodes(circuit) if isinstance(n, cc.Add)]
    if not adds:
        return
    target = rng.choice(adds)
    children = list(target.children)
    rng.shuffle(children)
    permuted = circuit.replace({target: target.with_children(children)})
    assert canonicalize(permuted) == canonicalize(circuit)


LETTERS = "abcde"


@st.composite
def einsums_over_adds(draw) -> cc.Einsum:
    """As in test_algebra.py, without broadcasting: an Einsum with an Add operand whose
    summands have the Add's full shape, beside one or two other operands (with none, factor has
    no common operand to take out, and the Add stays a sum of Einsums)."""
    sizes = {a: draw(st.integers(1, 3)) for a in range(len(LETTERS))}
    letters = st.lists(st.integers(0, len(LETTERS) - 1), max_size=3, unique=True)
    seeds = iter(range(draw(st.integers(0, 1000)), 10_000))
    add_axes = tuple(draw(letters))
    summands = [
        arr(*[sizes[a] for a in add_axes], name=draw(st.sampled_from([None, "s", "t"])), seed=next(seeds))
        for _ in range(draw(st.integers(2, 4)))
    ]
    others = [tuple(draw(letters)) for _ in range(draw(st.integers(1, 2)))]
    operands = [(arr(*[sizes[a] for a in axes], seed=next(seeds)), axes) for axes in others]
    operands.insert(draw(st.integers(0, len(operands))), (cc.Add(*summands, name="sum"), add_axes))
    used = sorted({a for _, axes in operands for a in axes})
    out = draw(st.permutations(used).flatmap(lambda p: st.integers(0, len(p)).map(lambda k: tuple(p[:k]))))
    return cc.Einsum(*operands, out_axes=out, name="e")


@settings(max_examples=150, deadline=None)
@given(einsums_over_adds())
def test_factor_of_distribute_canonicalizes_equal(einsum):
    position = next(p for p, child in enumerate(einsum.children) if isinstance(child, cc.Add))
    factored = factor(distribute(einsum, position))
    assert canonicalize(factored) == canonicalize(einsum), cc.diff(
        canonicalize(factored), canonicalize(einsum)
    )
