"""The Concat passes: splitting a node into named position pieces, fusing and undoing splits."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import circuits as cc
from circuits.errors import CircuitError, PassError
from circuits.experiments import zero_ablate
from circuits.core.nodes import Add, Array, Concat, GeneralFunction, Index
from circuits.passes import (
    concat_drop_size_zero,
    concat_elim_split,
    concat_fuse,
    pull_concat,
    push_down_concat,
    split_to_concat,
)
from circuits.rewriting.passes.concat_pull import push_down_concat_once

from tests import experiments_reference as ref


def _array(*shape, name="x", seed=0):
    gen = torch.Generator().manual_seed(seed)
    return Array(torch.randn(*shape, generator=gen, dtype=torch.float64), name=name)


@pytest.mark.parametrize(
    ("axis", "sections"), [(1, 1), (1, 2), (1, [2, 0, 3]), (-1, [5]), (0, 3), (0, [1, 2])]
)
def test_split_keeps_the_value(axis, sections):
    x = _array(3, 5)
    split = split_to_concat(x, axis, sections)
    assert isinstance(split, Concat)
    torch.testing.assert_close(split.evaluate(), x.evaluate(), rtol=0, atol=0)


def test_piece_names_and_size_zero_pieces_dropped():
    x = _array(3, 5)
    assert [c.name for c in split_to_concat(x, 1, 1).children] == [f"x.at_pos{i}" for i in range(5)]
    assert [c.name for c in split_to_concat(x, 1, [2, 0, 1, 2]).children] == [
        "x.at_0_2",
        "x.at_pos2",
        "x.at_3_5",
    ]
    named = split_to_concat(x, 0, [1, 0, 2], names=["first", "rest"])
    assert [c.name for c in named.children] == ["first", "rest"]
    assert all(isinstance(c, Index) and c.node is x for c in named.children)


def test_elim_split_gives_back_the_node():
    x = _array(3, 5)
    for sections in (1, 2, [4, 1], [0, 5]):
        back = concat_elim_split(split_to_concat(x, 1, sections))
        assert back is x and back.hash == x.hash
    inside = Add(split_to_concat(x, 0, 1), _array(3, 5, name="y", seed=1))
    assert concat_elim_split(inside).children[0] is x


def test_elim_split_leaves_other_concats_alone():
    x = _array(3, 5)
    out_of_order = Concat(Index(x, (slice(None), slice(2, 5))), Index(x, (slice(None), slice(0, 2))), axis=1)
    partial = Concat(Index(x, (slice(None), slice(0, 2))), Index(x, (slice(None), slice(2, 4))), axis=1)
    two_nodes = Concat(Index(x, (slice(0, 1),)), Index(_array(3, 5, seed=2), (slice(1, 3),)), axis=0)
    for c in (out_of_order, partial, two_nodes):
        assert concat_elim_split(c) is c


def test_fuse_flattens_same_axis_concats_only():
    x, y, z = _array(2, 3), _array(2, 3, name="y", seed=1), _array(2, 3, name="z", seed=2)
    nested = Concat(
        Concat(x, y, axis=0),
        Concat(z, Concat(_array(2, 1, name="p"), _array(2, 2, name="q"), axis=1), axis=0),
        axis=0,
        name="c",
    )
    fused = concat_fuse(nested)
    assert fused.name == "c" and [c.name for c in fused.children[:3]] == ["x", "y", "z"]
    assert len(fused.children) == 4 and fused.children[3].axis == 1
    torch.testing.assert_close(fused.evaluate(), nested.evaluate(), rtol=0, atol=0)
    assert concat_fuse(x) is x


def test_pull_concat_through_functions_and_adds():
    x, y = _array(3, 4), _array(3, 4, name="y", seed=1)
    relu = GeneralFunction(split_to_concat(x, 1, 1), spec="relu", name="r")
    pulled = pull_concat(relu)
    assert isinstance(pulled, Concat) and pulled.name == "r" and len(pulled.children) == 4
    torch.testing.assert_close(pulled.evaluate(), relu.evaluate(), rtol=0, atol=0)
    total = Add(split_to_concat(x, 0, [1, 2]), y, name="s")
    pulled = pull_concat(total)
    assert isinstance(pulled, Concat) and all(isinstance(c, Add) for c in pulled.children)
    torch.testing.assert_close(pulled.evaluate(), total.evaluate(), rtol=0, atol=0)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"axis": 2, "sections": 1}, "axis 2"),
        ({"axis": 0, "sections": [1, 1]}, "sum to"),
        ({"axis": 0, "sections": 0}, "positive"),
        ({"axis": 1, "sections": 2, "names": ["a", "b"]}, "names"),
    ],
)
def test_errors_are_typed_and_name_the_node(kwargs, words):
    x = _array(3, 5, name="resid")
    with pytest.raises(PassError) as info:
        split_to_concat(x, **kwargs)
    assert isinstance(info.value, CircuitError)
    assert "'resid'" in str(info.value) and words in str(info.value)


def test_zero_ablating_one_position_of_the_residual_stream():
    w, toks = ref.weights(), ref.tokens(3, batch=None)
    circuit = ref.split_circuit(w, toks)
    b0 = circuit.get_unique("b0")
    position_axis = 0
    split = circuit.update("b0", lambda node: split_to_concat(node, position_axis, 1))
    torch.testing.assert_close(split.evaluate(), circuit.evaluate(), rtol=1e-12, atol=1e-12)

    ablated = zero_ablate(split, "b0.at_pos2")
    zeroed = b0.evaluate().clone()
    zeroed[2] = 0
    patched = circuit.update("b0", lambda node: Array(zeroed, name="b0"))
    torch.testing.assert_close(ablated.evaluate(), patched.evaluate(), rtol=1e-12, atol=1e-12)
    assert not torch.allclose(ablated.evaluate(), circuit.evaluate())


def test_exported_at_the_top_level():
    assert cc.passes.split_to_concat is split_to_concat and cc.passes.concat_elim_split is concat_elim_split
    assert cc.passes.pull_concat is pull_concat and cc.passes.push_down_concat is push_down_concat
    assert cc.passes.concat_drop_size_zero is concat_drop_size_zero


def _einsum_with_split(string, split_at=0, sections=1, axis=0, seed=3):
    """``Einsum(string)`` over seeded arrays, operand ``split_at`` split along ``axis``."""
    operands = []
    sizes = {}
    for position, letters in enumerate(string.split("->")[0].split(",")):
        shape = [sizes.setdefault(c, 2 + len(sizes) % 3) for c in letters]
        operands.append(_array(*shape, name=f"o{position}", seed=seed + position))
    operands[split_at] = split_to_concat(operands[split_at], axis, sections)
    return cc.Einsum.from_einsum_string(string, *operands, name="e"), operands


@pytest.mark.parametrize(
    ("string", "split_at", "axis", "sections"),
    [
        ("ab,bc->ac", 0, 0, 1),  # kept letter: a Concat of per-position Einsums
        ("ab,bc->ac", 0, 1, [1, 2]),  # summed letter: an Add of partial contractions
        ("ab,bc->ac", 1, 1, [2, 1, 1]),
        ("ab,ab->b", 1, 1, 1),  # the other operand carries the letter: sliced
        ("ab,ab,bb->ab", 0, 1, [1, 2]),  # a diagonal in another operand is sliced on both axes
        ("a->", 0, 0, 2),
    ],
)
def test_pull_concat_through_einsums(string, split_at, axis, sections):
    einsum, operands = _einsum_with_split(string, split_at, sections, axis)
    letter = string.split(",")[split_at][axis] if "," in string else string[axis]
    pulled = pull_concat(einsum)
    kept = letter in string.split("->")[1]
    assert isinstance(pulled, Concat if kept else Add) and pulled.name == "e"
    assert len(pulled.children) == len(operands[split_at].children)
    assert all(isinstance(c, cc.Einsum) and c.name is None for c in pulled.children)
    expected = torch.einsum(string, *[o.evaluate() for o in operands])
    torch.testing.assert_close(pulled.evaluate(), expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(pulled.evaluate(), einsum.evaluate(), rtol=1e-10, atol=1e-10)


def test_pull_concat_einsum_pairs_concats_split_the_same_way():
    x, y = _array(3, 4), _array(3, 4, name="y", seed=1)
    both = cc.Einsum.from_einsum_string("ab,ab->a", split_to_concat(x, 0, 1), split_to_concat(y, 0, 1))
    pulled = pull_concat(both)
    assert [c.children for c in pulled.children] == [
        (split_to_concat(x, 0, 1).children[i], split_to_concat(y, 0, 1).children[i]) for i in range(3)
    ]
    expected = (x.evaluate() * y.evaluate()).sum(1)
    torch.testing.assert_close(pulled.evaluate(), expected, rtol=1e-10, atol=1e-10)
    # Concats on two letters: the first is pulled; the second (it does not carry 'a') stays
    # whole in every piece, and a second pull_concat pulls it
    z = _array(4, 2, name="z", seed=2)
    two = cc.Einsum.from_einsum_string("ab,bc->ac", split_to_concat(x, 0, 1), split_to_concat(z, 1, 1))
    pulled = pull_concat(two)
    assert isinstance(pulled, Concat) and isinstance(pulled.children[0].children[1], Concat)
    twice = pull_concat(pulled)
    assert all(isinstance(c, Concat) and c.axis == 1 for c in twice.children)
    expected = x.evaluate() @ z.evaluate()
    for circuit in (pulled, twice):
        torch.testing.assert_close(circuit.evaluate(), expected, rtol=1e-10, atol=1e-10)


def test_pull_concat_leaves_a_diagonal_across_the_joined_axis_alone():
    x = _array(3, 3)
    diagonal = cc.Einsum.from_einsum_string("aa->a", split_to_concat(x, 0, 1))
    assert pull_concat(diagonal) is diagonal


def test_pull_concat_einsum_with_size_zero_pieces():
    x, y = _array(3, 2), _array(2, 4, name="y", seed=1)
    concat = Concat(Index(x, (slice(0, 0),)), x, Index(x, (slice(3, 3),)), axis=0)
    for string, operands in (("ab,bc->ac", (concat, y)), ("ba,bc->ac", (concat, _array(3, 4, name="z")))):
        einsum = cc.Einsum.from_einsum_string(string, *operands)
        expected = torch.einsum(string, *[o.evaluate() for o in operands])
        torch.testing.assert_close(pull_concat(einsum).evaluate(), expected, rtol=1e-10, atol=1e-10)


@st.composite
def einsums_over_concats(draw) -> tuple[cc.Einsum, list]:
    """An Einsum (letters may repeat) with one to three operands, at least one a Concat of
    arrays cut at random places (size-0 pieces included) along a random axis; and the
    operands' tensors, for torch.einsum."""
    sizes = {a: draw(st.integers(0, 3)) for a in range(5)}
    seeds = iter(range(draw(st.integers(0, 1000)), 10_000))
    all_axes = [
        tuple(draw(st.lists(st.integers(0, 4), min_size=1, max_size=3)))
        for _ in range(draw(st.integers(1, 3)))
    ]
    operands = [_array(*[sizes[a] for a in axes], seed=next(seeds)) for axes in all_axes]
    for position in draw(st.sets(st.integers(0, len(all_axes) - 1), min_size=1)):
        axes = all_axes[position]
        axis = draw(st.integers(0, len(axes) - 1))
        cuts = sorted(draw(st.lists(st.integers(0, sizes[axes[axis]]), max_size=3)))
        bounds = list(zip([0, *cuts], [*cuts, sizes[axes[axis]]]))
        shape = [sizes[a] for a in axes]
        pieces = [_array(*shape[:axis], b - a, *shape[axis + 1 :], seed=next(seeds)) for a, b in bounds]
        operands[position] = Concat(*pieces, axis=axis)
    used = sorted({a for axes in all_axes for a in axes})
    out = draw(st.permutations(used).flatmap(lambda p: st.integers(0, len(p)).map(lambda k: tuple(p[:k]))))
    einsum = cc.Einsum(*zip(operands, all_axes), out_axes=out, name="e")
    return einsum, [o.evaluate() for o in operands]


@settings(max_examples=150, deadline=None)
@given(einsums_over_concats())
def test_pull_concat_keeps_the_value_of_random_einsums(drawn):
    einsum, tensors = drawn
    expected = torch.einsum(einsum.einsum_string, *tensors)
    pulled = pull_concat(einsum)
    torch.testing.assert_close(pulled.evaluate(), expected, rtol=1e-10, atol=1e-10)
    first = next(i for i, c in enumerate(einsum.children) if isinstance(c, Concat))
    axes = einsum.operand_axes[first]
    letter = axes[einsum.children[first].axis]
    if axes.count(letter) > 1:
        assert pulled is einsum
    else:
        assert isinstance(pulled, Concat if letter in einsum.out_axes else Add) and pulled.name == "e"
    pushed = push_down_concat(pulled)
    torch.testing.assert_close(pushed.evaluate(), expected, rtol=1e-10, atol=1e-10)
    once_only = all(axes.count(letter) <= 1 for axes in einsum.operand_axes)
    if letter in einsum.out_axes and once_only:
        # the round trip gives back the structure, up to the splits that pulling made
        assert concat_elim_split(pushed) == concat_elim_split(einsum)


def test_push_down_concat_merges_per_piece_functions_adds_and_einsums():
    x, y = _array(3, 4), _array(3, 4, name="y", seed=1)
    w = _array(4, 2, name="w", seed=2)
    tx, ty, tw = x.evaluate(), y.evaluate(), w.evaluate()
    halves = [(slice(0, 1),), (slice(1, 3),)]
    relus = Concat(*[GeneralFunction(Index(x, h), spec="relu", name="r") for h in halves], axis=0, name="c")
    adds = Concat(*[Add(Index(x, h), Index(y, h), name="s") for h in halves], axis=0, name="c")
    einsums = Concat(
        *[cc.Einsum.from_einsum_string("ab,bc->ac", Index(x, h), w, name="e") for h in halves],
        axis=0,
        name="c",
    )
    expected = [torch.relu(tx), tx + ty, tx @ tw]
    for concat, want, kind in zip((relus, adds, einsums), expected, (GeneralFunction, Add, cc.Einsum)):
        pushed = push_down_concat_once(concat)
        assert isinstance(pushed, kind) and pushed.name == "c"
        torch.testing.assert_close(pushed.evaluate(), want, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(pushed.evaluate(), concat.evaluate(), rtol=1e-10, atol=1e-10)
        assert concat_elim_split(pushed).children[0] is x
    inside = push_down_concat(GeneralFunction(einsums, spec="relu"))
    assert isinstance(inside.children[0], cc.Einsum) and inside.children[0].name == "c"


def test_push_down_concat_leaves_what_it_cannot_merge_alone():
    x, y, w = _array(3, 4), _array(3, 4, name="y", seed=1), _array(4, 2, name="w", seed=2)
    top, rest = Index(x, (slice(0, 1),)), Index(x, (slice(1, 3),))
    unmergeable = [
        Concat(GeneralFunction(top, spec="relu"), GeneralFunction(rest, spec="tanh"), axis=0),
        Concat(  # softmax's last axis is not a batch axis
            *[
                GeneralFunction(Index(x, (slice(None), s)), spec="softmax")
                for s in (slice(0, 1), slice(1, 4))
            ],
            axis=1,
        ),
        Concat(GeneralFunction(top, spec="relu"), Add(rest), axis=0),
        Concat(Add(top, top), Add(rest), axis=0),
        Concat(Add(top, _array(4, name="b")), Add(rest, Index(y, (slice(1, 3),))), axis=0),
        Concat(  # the operand without the joined letter differs between the pieces
            cc.Einsum.from_einsum_string("ab,bc->ac", top, w),
            cc.Einsum.from_einsum_string("ab,bc->ac", rest, _array(4, 2, seed=5)),
            axis=0,
        ),
        Concat(  # different einsum strings
            cc.Einsum.from_einsum_string("ab,bc->ac", top, w),
            cc.Einsum.from_einsum_string("ab,cb->ac", rest, _array(2, 4, seed=6)),
            axis=0,
        ),
        Concat(  # a summed letter of different sizes in the pieces
            cc.Einsum.from_einsum_string("ab->a", top),
            cc.Einsum.from_einsum_string("ab->a", Index(x, (slice(1, 3), slice(0, 2)))),
            axis=0,
        ),
        x,
    ]
    for node in unmergeable:
        assert push_down_concat_once(node) is node and push_down_concat(node) is node


def test_push_down_after_pull_gives_back_the_structure():
    x, y, w = _array(3, 4), _array(3, 4, name="y", seed=1), _array(4, 2, name="w", seed=2)
    circuits = [
        GeneralFunction(split_to_concat(x, 0, 1), spec="relu", name="r"),
        GeneralFunction(split_to_concat(x, 0, [1, 2]), spec="softmax", name="r"),
        Add(split_to_concat(x, 0, 1), y, name="s"),
        cc.Einsum.from_einsum_string("ab,bc->ac", split_to_concat(x, 0, 1), w, name="e"),
        cc.Einsum.from_einsum_string("ab,ab->ab", y, split_to_concat(x, 1, [3, 1]), name="e"),
    ]
    for circuit in circuits:
        pulled = pull_concat(circuit)
        assert isinstance(pulled, Concat)
        back = push_down_concat(pulled)
        assert type(back) is type(circuit) and back.name == circuit.name
        assert concat_elim_split(back) == concat_elim_split(circuit)
        torch.testing.assert_close(back.evaluate(), circuit.evaluate(), rtol=1e-10, atol=1e-10)
    # a summed letter pulls into an Add of partial contractions, which push_down_concat keeps
    summed = cc.Einsum.from_einsum_string("ab,bc->ac", split_to_concat(x, 1, 2), w, name="e")
    partial_sums = pull_concat(summed)
    assert isinstance(partial_sums, Add) and push_down_concat(partial_sums) is partial_sums


def test_drop_size_zero_pieces():
    x, y = _array(3, 4), _array(2, 4, name="y", seed=1)
    empty, empty_too = _array(0, 4, name="none"), Index(x, (slice(2, 2),))
    concat = Concat(empty, x, empty_too, y, axis=0, name="c")
    dropped = concat_drop_size_zero(concat)
    assert dropped.name == "c" and dropped.children == (x, y)
    torch.testing.assert_close(dropped.evaluate(), torch.cat([x.evaluate(), y.evaluate()]), rtol=0, atol=0)
    torch.testing.assert_close(dropped.evaluate(), concat.evaluate(), rtol=0, atol=0)
    # one piece left: still a Concat of one, so 'c' and 'x' both still name it
    one = concat_drop_size_zero(Add(Concat(empty, x, axis=0, name="c"), x))
    assert isinstance(one.children[0], Concat) and one.children[0].children == (x,)
    all_empty = Concat(empty, empty_too, axis=0, name="c")
    assert concat_drop_size_zero(all_empty).children == (empty,)
    assert concat_drop_size_zero(dropped) is dropped and concat_drop_size_zero(x) is x
