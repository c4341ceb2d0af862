"""bfloat16 and float16 evaluation: the upcast functions, softmax in float32, einsums of mixed dtypes,
and contractions computed in float32 (chunked) on a CPU without a native kernel for them.

References are written here: float64 arithmetic rounded to the dtype, ``tensor.to``, and torch's own
``einsum`` in float32.  A contraction computed in float32 and rounded once differs from the float64
sum rounded once only where the float32 sum lands on the other side of a rounding boundary: at most
one unit in the last place, and rarely.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits.errors import FunctionSpecError
from circuits.evaluation import reduced
from circuits.evaluation.einsum import einsum_kernel

BF16, F16, F32, F64 = torch.bfloat16, torch.float16, torch.float32, torch.float64
NATIVE = reduced.native_reduced_matmul(BF16)


def randn(*shape: int, seed: int, dtype: torch.dtype = BF16, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=generator, dtype=F64) * scale).to(dtype)


def ulps(ours: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """How many units in the last place of ``reference``'s dtype ``ours`` is from it, per entry."""
    assert ours.dtype == reference.dtype
    spacing = torch.finfo(reference.dtype).eps * reference.double().abs().clamp_min(
        torch.finfo(reference.dtype).tiny
    )
    return ((ours.double() - reference.double()).abs() / spacing).round()


def rounded_once(ours: torch.Tensor, exact: torch.Tensor) -> None:
    """``ours`` is ``exact`` (float64) rounded to ``ours``'s dtype, give or take one unit on a few entries."""
    reference = exact.to(ours.dtype)
    off = ulps(ours, reference)
    assert off.max() <= 1, off.max()
    assert (off > 0).double().mean() < 0.02, (off > 0).double().mean()


def evaluate_einsum(equation: str, *tensors: torch.Tensor) -> torch.Tensor:
    arrays = [cc.Array(t, name=f"x{i}") for i, t in enumerate(tensors)]
    return cc.Einsum.from_einsum_string(equation, *arrays).evaluate()


# ------------------------------------------------------------------ the functions


@pytest.mark.parametrize("dtype", [BF16, F16])
def test_upcast_float32_holds_the_same_numbers_in_float32(dtype):
    x = randn(3, 5, seed=0, dtype=dtype)
    value = cc.GeneralFunction.new_by_name(cc.Array(x), spec_name="upcast_float32").evaluate()
    assert value.dtype == F32
    assert value.tolist() == x.tolist()  # every bfloat16 and float16 number is a float32 number


@pytest.mark.parametrize("dtype", [F32, F64])
def test_upcast_float32_leaves_wider_dtypes_alone(dtype):
    x = randn(4, seed=1, dtype=dtype)
    value = cc.GeneralFunction.new_by_name(cc.Array(x), spec_name="upcast_float32").evaluate()
    assert value.dtype == dtype and torch.equal(value, x)


@pytest.mark.parametrize("like", [BF16, F16, F64])
def test_type_as_rounds_to_the_second_inputs_dtype(like):
    x = randn(6, 7, seed=2, dtype=F32)
    node = cc.GeneralFunction.new_by_name(
        cc.Array(x, name="x"), cc.Array(torch.zeros(6, 7, dtype=like), name="like"), spec_name="type_as"
    )
    value = node.evaluate()
    assert value.dtype == like
    assert value.tolist() == [[float(torch.tensor(v, dtype=like)) for v in row] for row in x.tolist()]


def test_type_as_refuses_inputs_of_different_shapes():
    with pytest.raises(FunctionSpecError, match="type_as.*the shapes must match"):
        cc.GeneralFunction.new_by_name(
            cc.Array(torch.zeros(2, 3)), cc.Array(torch.zeros(3, 2)), spec_name="type_as"
        )


def test_the_upcast_functions_print_and_parse_back():
    x = cc.Array(torch.zeros(2, 3, dtype=BF16), name="x")
    up = cc.GeneralFunction.new_by_name(x, spec_name="upcast_float32", name="x_f32")
    back = cc.GeneralFunction.new_by_name(up, x, spec_name="type_as", name="x_again")
    parsed = cc.parse(back.repr())  # the Arrays without their tensors
    assert parsed.spec is back.spec and parsed.children[0].spec is up.spec
    assert [c.name for c in parsed.children] == ["x_f32", "x"]


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_of_a_reduced_dtype_is_computed_in_float32_and_rounded_once(name, dtype):
    x = randn(8, 33, seed=3, dtype=dtype, scale=4.0)
    value = cc.GeneralFunction.new_by_name(cc.Array(x), spec_name=name).evaluate()
    assert value.dtype == dtype
    exact = x.double() - x.double().logsumexp(-1, keepdim=True)
    rounded_once(value, exact if name == "log_softmax" else exact.exp())


# ------------------------------------------------------------------ einsums of mixed dtypes


@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("ab,bc->ac", [(3, 4), (4, 5)]),  # a product
        ("ab,b,->ab", [(3, 4), (4,), ()]),  # multipliers only
        ("ab,ab->a", [(3, 4), (3, 4)]),  # a batched dot
        ("ab,bc,a->ac", [(3, 4), (4, 5), (3,)]),  # a product, then a multiplier
    ],
)
def test_an_einsum_of_mixed_dtypes_is_computed_in_the_promoted_dtype(equation, shapes):
    """As ``*`` and ``+`` do (``torch.einsum`` refuses mixed dtypes): bfloat16 meets float32 in float32."""
    tensors = [randn(*shape, seed=i, dtype=BF16 if i == 0 else F32) for i, shape in enumerate(shapes)]
    value = evaluate_einsum(equation, *tensors)
    assert value.dtype == F32
    expected = torch.einsum(equation, *[t.double() for t in tensors])
    torch.testing.assert_close(value.double(), expected, rtol=1e-6, atol=1e-6)


def test_an_einsum_of_float32_and_float64_is_float64():
    a, b = randn(3, 4, seed=0, dtype=F32), randn(4, 2, seed=1, dtype=F64)
    value = evaluate_einsum("ab,bc->ac", a, b)
    assert value.dtype == F64
    torch.testing.assert_close(value, a.double() @ b, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ contractions in float32


@pytest.mark.parametrize("dtype", [BF16, F16])
@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("sd,vd->sv", [(48, 64), (40, 64)]),  # an unembedding
        ("bqd,hcd->bhqc", [(2, 16, 32), (3, 8, 32)]),  # a head projection
        ("bhsV,hdV->bsd", [(2, 3, 16, 8), (3, 24, 8)]),  # heads summed into d_model
        ("hqk,hkV->hqV", [(3, 16, 16), (3, 16, 8)]),  # probabilities times values
    ],
)
def test_a_reduced_contraction_is_its_exact_value_rounded_once(equation, shapes, dtype):
    tensors = [randn(*shape, seed=i, dtype=dtype) for i, shape in enumerate(shapes)]
    value = evaluate_einsum(equation, *tensors)
    assert value.dtype == dtype
    rounded_once(value, torch.einsum(equation, *[t.double() for t in tensors]))


@pytest.mark.skipif(NATIVE, reason="this CPU multiplies bfloat16 natively: no float32 path to check")
def test_on_this_cpu_a_reduced_contraction_is_torchs_float32_one_rounded(monkeypatch):
    """The float32 path is taken here (and is torch's float32 einsum rounded); the portable bfloat16
    kernel agrees to one unit in the last place."""
    a, b = randn(48, 64, seed=0), randn(40, 64, seed=1)
    value = evaluate_einsum("sd,vd->sv", a, b)
    assert torch.equal(value, torch.einsum("sd,vd->sv", a.float(), b.float()).to(BF16))
    assert ulps(value, torch.einsum("sd,vd->sv", a, b)).max() <= 1


def test_where_the_cpu_multiplies_natively_torchs_own_kernel_runs(monkeypatch):
    monkeypatch.setattr(reduced, "native_reduced_matmul", lambda dtype: True)
    monkeypatch.setattr(reduced, "contract_in_float32", _not_called)
    a, b = randn(48, 64, seed=0), randn(40, 64, seed=1)
    assert torch.equal(einsum_kernel("sd,vd->sv")(a, b), torch.einsum("sd,vd->sv", a, b))


def _not_called(*args, **kwargs):
    raise AssertionError("computed in float32 where it should not be")


def test_a_single_rows_product_stays_native(monkeypatch):
    """Converting the weight would cost more than the portable kernel saves on one row."""
    monkeypatch.setattr("circuits.evaluation.einsum.contract_in_float32", _not_called)
    x, w = randn(1, 256, seed=0), randn(512, 256, seed=1)
    assert torch.equal(einsum_kernel("sd,vd->sv")(x, w), torch.einsum("sd,vd->sv", x, w))


def test_products_without_a_summed_letter_stay_in_the_dtype(monkeypatch):
    monkeypatch.setattr("circuits.evaluation.einsum.contract_in_float32", _not_called)
    x, cos = randn(2, 3, 16, 8, seed=0), randn(16, 8, seed=1)
    assert torch.equal(einsum_kernel("bhqc,qc->bhqc")(x, cos), x * cos)


@pytest.mark.skipif(NATIVE, reason="this CPU multiplies bfloat16 natively: no float32 path to check")
@pytest.mark.parametrize(
    "equation, shapes",
    [
        ("sd,vd->sv", [(48, 64), (37, 64)]),  # split along v, 37 = a last chunk shorter than the others
        ("bhsV,hdV->bsd", [(2, 3, 16, 8), (3, 29, 8)]),  # split along d: a middle axis of the weight
        ("ab,bc->ac", [(64, 16), (16, 20)]),  # the longest letter is the first operand's a
    ],
)
def test_chunks_give_the_whole_contractions_values_and_gradients(equation, shapes, monkeypatch):
    tensors = [randn(*shape, seed=i).requires_grad_() for i, shape in enumerate(shapes)]
    whole = einsum_kernel(equation)(*tensors)
    whole_grads = torch.autograd.grad(whole.float().square().sum(), tensors)
    monkeypatch.setattr(reduced, "CHUNK_BYTES", 2048)  # a few columns per chunk
    chunked = einsum_kernel(equation)(*tensors)
    assert torch.equal(chunked, whole)
    for ours, theirs in zip(torch.autograd.grad(chunked.float().square().sum(), tensors), whole_grads):
        assert torch.equal(ours, theirs)
    with torch.no_grad():  # the float32 copies go to a buffer kept between calls
        assert torch.equal(einsum_kernel(equation)(*tensors), whole)
    with torch.inference_mode():  # a buffer of its own: an inference tensor cannot be written outside
        assert torch.equal(einsum_kernel(equation)(*tensors), whole)
    with torch.no_grad():
        assert torch.equal(einsum_kernel(equation)(*tensors), whole)


@pytest.mark.skipif(NATIVE, reason="this CPU multiplies float16 natively: no float32 path to check")
def test_a_float16_contraction_that_overflows_is_inf_as_a_native_one():
    a = torch.full((8, 64), 64.0, dtype=F16)
    value = evaluate_einsum("sd,vd->sv", a, a)  # 64 * 64 * 64 = 262144 > 65504
    assert torch.isinf(value).all()


# ------------------------------------------------------------------ the cost model


def test_the_cost_model_gives_the_upcast_nodes_their_dtypes():
    x = cc.Array(randn(4, 6, seed=0), name="x")
    up = cc.GeneralFunction.new_by_name(x, spec_name="upcast_float32", name="up")
    mixed = cc.Einsum.from_einsum_string("ab,ab->ab", up, x, name="mixed")
    back = cc.GeneralFunction.new_by_name(mixed, x, spec_name="type_as", name="back")
    costs = cc.cost(back)
    seen = {}
    cc.evaluation.compile_plan([back]).run(
        on_value=lambda node, value: seen.setdefault(node.name, value.dtype)
    )
    assert seen == {"up": F32, "mixed": F32, "back": BF16}
    assert {
        name: costs.by_hash[node.hash].dtype for name, node in [("up", up), ("mixed", mixed), ("back", back)]
    } == seen
