"""models.from_torch keeps torch's dtypes: each op's circuit evaluates to the dtype torch's op gives,
and to its values (inf and nan included), for Python numbers and 0-dim tensors against tensors,
casts, integer and bool inputs, float16/bfloat16 mixes and float16 models."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits import models

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64


class Lambda(torch.nn.Module):
    def __init__(self, function):
        super().__init__()
        self.function = function

    def forward(self, *args):
        return self.function(*args)


X = torch.tensor([[100.0, 1.0, -3.0e5, 0.3], [70.0, -0.1, 2.5, 1e-3]])
IDS = torch.tensor([[1, 5, 0, 3], [2, 2, 7, 4]])
MASK = torch.tensor([[True, False, True, True], [False, False, True, False]])

#: (id, function, inputs, exact): exact cases compare bit for bit (they compute as torch does).
CASES = [
    ("f16 * 1000 overflows", lambda x: x.to(F16) * 1000, (X,), True),
    ("f16 + number overflows", lambda x: x.to(F16) + 65000, (X,), True),
    ("f16 - number", lambda x: x.half() - 70000.5, (X,), True),
    ("f16 / small number", lambda x: x.half() / 1e-3, (X,), False),
    ("f16 * 0.1 rounds once", lambda x: x.half() * 0.1, (X,), True),
    ("bf16 * number", lambda x: x.to(BF16) * 3.3, (X,), True),
    ("neg f16", lambda x: -x.half(), (X,), True),
    ("f16 mean and sum", lambda x: x.half().mean(-1) + x.half().sum(-1), (X,), False),
    ("f16 * 0-dim f32 tensor", lambda x: x.half() * torch.tensor(1000.0), (X,), True),
    ("f32 * 0-dim f64 tensor", lambda x: x * torch.tensor(0.1, dtype=F64), (X,), True),
    ("f64 inside a f32 module", lambda x: x.double() * 0.1 + x.double(), (X,), True),
    ("f16 + bf16 is f32", lambda x: x.half() + x.to(BF16), (X,), True),
    ("f16 layer norm", lambda x: torch.nn.functional.layer_norm(x.half() / 1000, (4,)), (X,), False),
    ("f16 softmax", lambda x: torch.softmax(x.half() / 1000, -1), (X,), False),
    ("f16 matmul", lambda x: (x.half() / 1000) @ (x.half() / 1000).T, (X,), False),
    ("where f16 with a number", lambda x: torch.where(x > 0, x.half(), 2.5), (X,), True),
    ("int * int", lambda ids: ids * 2 + 1, (IDS,), True),
    ("int * float number", lambda ids: ids * 0.5, (IDS,), True),
    ("int to float, times", lambda ids: ids.float() * 0.5, (IDS,), True),
    ("int to int32", lambda ids: ids.to(torch.int32) * 3, (IDS,), True),
    ("float to int truncates", lambda x: x.to(torch.int64), (X,), True),
    ("bool * float", lambda x, m: m * 1.5 + m.float() * x, (X, MASK), True),
    ("bool to f16", lambda m: m.half() * 70000, (MASK,), True),
    ("x * True", lambda x: x * True + x * False, (X,), True),
    ("x + True", lambda x: x + True, (X,), True),
    ("x / 0", lambda x: torch.stack([x / 0, (x - x) / 0]), (X,), True),
    ("f16 input, f32 op with a tiny number", lambda x: x.float() * 1e-8 + 1e-9, (X.half(),), True),
    ("f16 input, f64 output", lambda x: x.double() * 0.1, (X.half(),), True),
]


@pytest.mark.parametrize("function, inputs, exact", [case[1:] for case in CASES], ids=[c[0] for c in CASES])
def test_each_op_evaluates_to_torchs_dtype_and_values(function, inputs, exact):
    circuit = models.from_torch(Lambda(function), inputs)
    expected = function(*inputs)
    got = circuit.evaluate()
    assert got.dtype == expected.dtype
    if exact:
        torch.testing.assert_close(got, expected, atol=0, rtol=0, equal_nan=True)
    else:
        torch.testing.assert_close(got, expected, equal_nan=True)


def test_the_issues_example_overflows_to_inf_in_float16():
    circuit = models.from_torch(Lambda(lambda x: x.to(F16) * 1000), (torch.tensor([100.0, 1.0]),))
    value = circuit.evaluate()
    assert value.dtype == F16 and value.tolist() == [float("inf"), 1000.0]
    # the product is computed as torch computes it (float32), then cast: the cast has the op's name
    assert circuit.name == "mul" and circuit.children[0].name == "mul.float32"


class HalfMLP(torch.nn.Module):
    """A float16 model that computes its norm in float32, as Llama's RMSNorm does."""

    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(4, 6)
        self.down = torch.nn.Linear(6, 4)

    def forward(self, x):
        h = self.up(x)
        variance = h.float().pow(2).mean(-1, keepdim=True)
        h = (h.float() * torch.rsqrt(variance + 1e-6)).to(x.dtype)
        return self.down(torch.relu(h)) * 0.5


def test_a_float16_model_with_a_float32_norm_equals_torch():
    torch.manual_seed(0)
    model = HalfMLP().half().eval()
    x = torch.randn(3, 4).half()
    circuit = models.from_torch(model, (x,))
    with torch.no_grad():
        expected = model(x)
    got = circuit.evaluate()
    assert got.dtype == F16
    # a Linear's product and bias are two float16 roundings in the circuit, one in torch's addmm
    torch.testing.assert_close(got, expected, atol=1e-3, rtol=1e-3)
    # the norm's 1e-6 would round in float16 (the Scalars' dtype here): it is a float32 Array instead
    eps = [n for n in cc.unique_nodes([circuit]) if n.name == "add.scalar"]
    assert len(eps) == 1 and isinstance(eps[0], cc.Array) and eps[0].value.dtype == F32
