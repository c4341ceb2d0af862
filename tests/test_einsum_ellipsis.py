"""``Einsum.from_einsum_string`` reads ``...`` as torch.einsum does: batch axes broadcast right-aligned
(a size-1 axis repeated), summed when the output has no ``...``; checked against torch.einsum itself."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import circuits as cc
from circuits.errors import EinsumError

CASES = [
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 5)]),
    ("...ij,...jk->...ik", [(1, 3, 4), (5, 4, 2)]),  # a size-1 batch axis broadcast
    ("...ij,jk->...ik", [(2, 6, 3, 4), (4, 5)]),
    ("...ij,...jk->ik", [(2, 3, 4), (4, 5)]),  # no '...' in the output: the batch axes summed
    ("...i,...i->...", [(2, 3), (3,)]),  # fewer '...' axes: right-aligned
    ("i...->...", [(3, 4, 5)]),
    ("b...d,b...d->b...", [(2, 3, 1, 4), (2, 1, 5, 4)]),  # both broadcast, on different axes
    ("...->...", [()]),
    ("ij->...ij", [(2, 3)]),  # an empty '...'
]


@pytest.mark.parametrize("spec, shapes", CASES, ids=[f"{spec} {shapes}" for spec, shapes in CASES])
def test_the_ellipsis_is_torch_einsums(spec, shapes):
    tensors = [torch.randn(shape) for shape in shapes]
    nodes = [cc.Array(tensor, name=f"x{i}") for i, tensor in enumerate(tensors)]
    einsum = cc.Einsum.from_einsum_string(spec, *nodes, name="e")
    expected = torch.einsum(spec, *tensors)
    assert einsum.shape == tuple(expected.shape)
    torch.testing.assert_close(einsum.evaluate(), expected, atol=1e-5, rtol=1e-5)
    assert "." not in einsum.einsum_string  # written out in letters: it prints and parses back
    assert cc.parse(einsum.repr()) == einsum


@given(
    batch=st.lists(st.integers(1, 3), max_size=3),
    drops=st.lists(st.booleans(), min_size=3, max_size=3),
    lead=st.integers(0, 2),
)
def test_broadcast_batch_axes_against_torch(batch, drops, lead):
    """The second operand's batch axes: some set to 1 (broadcast), ``lead`` of them left off."""
    other = [1 if drop else size for size, drop in zip(batch, drops)][min(lead, len(batch)) :]
    a, b = torch.randn(*batch, 2, 3), torch.randn(*other, 3, 4)
    einsum = cc.Einsum.from_einsum_string(
        "...ij,...jk->...ik", cc.Array(a, name="a"), cc.Array(b, name="b"), name="e"
    )
    torch.testing.assert_close(
        einsum.evaluate(), torch.einsum("...ij,...jk->...ik", a, b), atol=1e-5, rtol=1e-5
    )


def test_inconsistent_ellipsis_axes_are_refused():
    a, b = cc.Array(torch.randn(2, 3, 4), name="a"), cc.Array(torch.randn(5, 4, 2), name="b")
    with pytest.raises(EinsumError, match=r"'\.\.\.' axes of '\.\.\.ij,\.\.\.jk->\.\.\.ik' do not broadcast"):
        cc.Einsum.from_einsum_string("...ij,...jk->...ik", a, b)
    with pytest.raises(EinsumError, match="has shape \\[2\\] \\(rank 1\\) but '\\.\\.\\.ij'"):
        cc.Einsum.from_einsum_string("...ij->...", cc.Array(torch.randn(2), name="v"))
    with pytest.raises(EinsumError, match="not one '...'"):
        cc.Einsum.from_einsum_string("....i->i", cc.Array(torch.randn(2), name="v"))
    with pytest.raises(EinsumError, match="2 operands but 1 were given"):
        cc.Einsum.from_einsum_string("...i,...i->...", cc.Array(torch.randn(2), name="v"))


def test_an_imported_einsum_with_broadcast_batch_axes_is_one_einsum():
    from circuits import models

    class Batched(torch.nn.Module):
        def forward(self, x, y):
            return torch.einsum("...ij,...jk->...ik", x, y)

    x, y = torch.randn(1, 3, 4), torch.randn(5, 4, 2)
    circuit = models.from_torch(Batched(), (x, y), strict=True)  # strict: no aten op kept
    assert isinstance(circuit, cc.Einsum)
    torch.testing.assert_close(
        circuit.evaluate(), torch.einsum("...ij,...jk->...ik", x, y), atol=1e-5, rtol=1e-5
    )
