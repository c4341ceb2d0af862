"""The Concat passes: splitting a node into named position pieces, fusing and undoing splits."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits.errors import CircuitError, PassError
from circuits.experiments import zero_ablate
from circuits.nodes import Add, Array, Concat, GeneralFunction, Index
from circuits.passes import concat_elim_split, concat_fuse, pull_concat, split_to_concat

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
    assert cc.split_to_concat is split_to_concat and cc.concat_elim_split is concat_elim_split
