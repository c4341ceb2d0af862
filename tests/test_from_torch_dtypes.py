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

#: (id, function of (x, ids, mask), exact): exact cases compare bit for bit (they compute as torch does).
#: All are outputs of one module (one export); their Scalars evaluate in float32, the Arrays' dtype.
CASES = [
    ("f16 * 1000 overflows", lambda x, ids, m: x.to(F16) * 1000, True),
    ("f16 + number overflows", lambda x, ids, m: x.to(F16) + 65000, True),
    ("f16 - number", lambda x, ids, m: x.half() - 70000.5, True),
    ("f16 / small number", lambda x, ids, m: x.half() / 1e-3, False),
    ("f16 * 0.1 rounds once", lambda x, ids, m: x.half() * 0.1, True),
    ("bf16 * number", lambda x, ids, m: x.to(BF16) * 3.3, True),
    ("neg f16", lambda x, ids, m: -x.half(), True),
    ("f16 mean and sum", lambda x, ids, m: x.half().mean(-1) + x.half().sum(-1), False),
    ("f16 * 0-dim f32 tensor", lambda x, ids, m: x.half() * torch.tensor(1000.0), True),
    ("f16 + bf16 is f32", lambda x, ids, m: x.half() + x.to(BF16), True),
    ("f16 layer norm", lambda x, ids, m: torch.nn.functional.layer_norm(x.half() / 1000, (4,)), False),
    ("f16 softmax", lambda x, ids, m: torch.softmax(x.half() / 1000, -1), False),
    ("f16 matmul", lambda x, ids, m: (x.half() / 1000) @ (x.half() / 1000).T, False),
    ("where f16 with a number", lambda x, ids, m: torch.where(x > 0, x.half(), 2.5), True),
    ("int * int", lambda x, ids, m: ids * 2 + 1, True),
    ("int * float number", lambda x, ids, m: ids * 0.5, True),
    ("int to float, times", lambda x, ids, m: ids.float() * 0.5, True),
    ("int to int32", lambda x, ids, m: ids.to(torch.int32) * 3, True),
    ("float to int truncates", lambda x, ids, m: x.to(torch.int64), True),
    ("bool * float", lambda x, ids, m: m * 1.5 + m.float() * x, True),
    ("bool to f16", lambda x, ids, m: m.half() * 70000, True),
    ("x * True", lambda x, ids, m: x * True + x * False, True),
    ("x + True", lambda x, ids, m: x + True, True),
    ("x / 0", lambda x, ids, m: torch.stack([x / 0, (x - x) / 0]), True),
]
#: Cases whose circuit has a float64 Array, so its Scalars evaluate in float64: a module of their own.
CASES_F64 = [
    ("f32 * 0-dim f64 tensor", lambda x, ids, m: x * torch.tensor(0.1, dtype=F64), True),
    ("f64 inside a f32 module", lambda x, ids, m: x.double() * 0.1 + x.double(), True),
    ("f32 * number beside f64", lambda x, ids, m: x * 0.1, True),
]
#: Cases with a float16 input (the dtype numbers are checked against before they become Scalars).
CASES_F16_INPUT = [
    ("f32 op with a tiny number", lambda x, ids, m: x.float() * 1e-8 + 1e-9, True),
    ("f64 output", lambda x, ids, m: x.double() * 0.1, True),
    ("f16 * number", lambda x, ids, m: x * 0.1, True),
]
GROUPS = {"f32": (CASES, X), "f64": (CASES_F64, X), "f16 input": (CASES_F16_INPUT, X.half())}


@pytest.fixture(scope="module")
def imported():
    """Each group's cases as the outputs of one module, imported once: group -> its circuits."""
    result = {}
    for group, (cases, x) in GROUPS.items():
        functions = [function for _, function, _ in cases]
        module = Lambda(lambda *inputs, functions=functions: tuple(f(*inputs) for f in functions))
        result[group] = models.from_torch(module, (x, IDS, MASK), output=list(range(len(cases))))
    return result


@pytest.mark.parametrize(
    "group, position",
    [(group, position) for group, (cases, _) in GROUPS.items() for position in range(len(cases))],
    ids=[f"{group}: {case[0]}" for group, (cases, _) in GROUPS.items() for case in cases],
)
def test_each_op_evaluates_to_torchs_dtype_and_values(imported, group, position):
    cases, x = GROUPS[group]
    _, function, exact = cases[position]
    expected = function(x, IDS, MASK)
    got = imported[group][position].evaluate()
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


class UnusedWide(torch.nn.Module):
    """A float64 parameter the forward does not use: the Scalars are float32, not float64."""

    def __init__(self):
        super().__init__()
        self.unused = torch.nn.Parameter(torch.ones(2, dtype=F64))

    def forward(self, x):
        return x.double() * 0.1 + x * 0.3


def test_a_number_is_checked_against_the_dtype_the_outputs_scalars_take():
    x = X[0]
    circuit = models.from_torch(UnusedWide(), (x,))
    expected = UnusedWide()(x)
    got = circuit.evaluate()
    assert got.dtype == F64
    torch.testing.assert_close(got, expected.detach(), atol=0, rtol=0)
