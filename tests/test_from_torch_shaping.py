"""The Rearranges from_torch writes for views, against torch's own reshape, permute, expand,
unsqueeze and squeeze on random shapes."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import seeded_tensor, shapes

import circuits as cc
from circuits.models.torch_import import shaping


def _factors(n: int) -> list[int]:
    found, d = [], 2
    while n > 1:
        while n % d == 0:
            found.append(d)
            n //= d
        d += 1
    return found


@st.composite
def reshapes(draw):
    """A shape of nonzero sizes and another of the same size (its prime factors regrouped, 1s put in)."""
    shape = draw(shapes(min_rank=0, max_rank=4, min_size=1, max_size=6))
    factors = draw(st.permutations(_factors(int(torch.tensor(shape).prod()) if shape else 1)))
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(factors) - 1)), max_size=len(factors))))
    groups = [factors[a:b] for a, b in zip([0, *cuts], [*cuts, len(factors)]) if factors[a:b]]
    target = [int(torch.tensor(group).prod()) for group in groups]
    for _ in range(draw(st.integers(0, 2))):
        target.insert(draw(st.integers(0, len(target))), 1)
    return shape, tuple(target)


@settings(max_examples=150)
@given(reshapes(), st.integers(0, 2**31 - 1))
def test_reshape_rearrange_equals_torch_reshape(pair, seed):
    shape, target = pair
    value = seeded_tensor(shape, seed)
    node = shaping.reshaped(cc.Array(value, name="x"), target, "r")
    torch.testing.assert_close(node.evaluate(), value.reshape(target), atol=0, rtol=0)
    assert cc.parse(node.repr()) == node


@settings(max_examples=100)
@given(shapes(min_rank=1, max_rank=4, min_size=1, max_size=4), st.data())
def test_permute_expand_unsqueeze_squeeze_equal_torch(shape, data):
    value = seeded_tensor(shape, data.draw(st.integers(0, 2**31 - 1)))
    x = cc.Array(value, name="x")
    order = data.draw(st.permutations(range(len(shape))))
    torch.testing.assert_close(shaping.permuted(x, order, "p").evaluate(), value.permute(order))
    ones = tuple(1 if data.draw(st.booleans()) else size for size in shape)
    small = cc.Array(seeded_tensor(ones, 3), name="small")
    lead = data.draw(st.lists(st.integers(1, 3), max_size=2))
    sizes = [*lead, *(size if one == 1 else -1 for one, size in zip(ones, shape))]
    expected = small.value.expand(sizes)
    torch.testing.assert_close(shaping.expanded(small, sizes, "e").evaluate(), expected)
    dim = data.draw(st.integers(-len(shape) - 1, len(shape)))
    torch.testing.assert_close(shaping.unsqueezed(x, [dim], "u").evaluate(), value.unsqueeze(dim))
    dims = sorted(data.draw(st.sets(st.integers(0, len(shape) - 1), max_size=3)))
    torch.testing.assert_close(shaping.squeezed(small, dims, "s").evaluate(), small.value.squeeze(dims))
