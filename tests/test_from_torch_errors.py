"""models.from_torch refuses what a circuit cannot hold with a ModelError naming the op and the module
path it ran in: a value read from the data (.item()), a shape that depends on the data (a boolean mask),
an op outside aten; a bool Python scalar is a number, as torch reads it."""

from __future__ import annotations

import pytest
import torch

from circuits import models
from circuits.errors import ModelError


class Inner(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)
        self.function = function

    def forward(self, x):
        return self.function(self.lin(x))


class Outer(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.block = Inner(function)

    def forward(self, x):
        return self.block(x) + 1


def _error(function) -> str:
    with pytest.raises(ModelError) as caught:
        models.from_torch(Outer(function), (torch.randn(2, 3),))
    return str(caught.value)


def test_item_is_refused_naming_the_module_and_the_op():
    message = _error(lambda y: y * y.sum().item())
    assert "in module 'block'" in message and "aten.item" in message and ".item()" in message
    assert "<root>" not in message


def test_a_boolean_mask_is_refused_naming_the_module_and_the_op():
    message = _error(lambda y: y[y > 0].sum())
    assert "in module 'block'" in message and "aten.index" in message and "torch.where" in message


def test_an_op_of_the_top_module_is_named_by_the_modules_class():
    class Top(torch.nn.Module):
        def forward(self, x):
            return x * x.max().item()

    with pytest.raises(ModelError, match=r"in the top module \(Top\)"):
        models.from_torch(Top(), (torch.randn(2, 3),))


def test_strict_names_the_modules_an_untranslated_op_ran_in():
    with pytest.raises(ModelError) as caught:
        models.from_torch(Outer(lambda y: torch.cumsum(y, -1)), (torch.randn(2, 3),), strict=True)
    assert "aten.cumsum.default (in module 'block')" in str(caught.value)


@pytest.mark.parametrize("flag", [True, False])
def test_a_bool_scalar_is_a_number_as_torch_reads_it(flag):
    model = Outer(lambda y: y * flag + flag)
    x = torch.randn(2, 3)
    circuit = models.from_torch(model, (x,))
    with torch.no_grad():
        expected = model(x)
    torch.testing.assert_close(circuit.evaluate(), expected, atol=0, rtol=0)
