"""The evaluation seams: values known before the run, a callback per computed value, a kernel override.

Every expected value is torch written directly on the same tensors.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits.evaluation import KnownValue, compile_plan, default_kernel


@pytest.fixture
def parts():
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(3, 4, generator=g) for _ in range(3))
    nx, nw, nb = cc.Array(x, name="x"), cc.Array(w, name="w"), cc.Array(b, name="b")
    prod = cc.Einsum.from_einsum_string("ab,ab->ab", nx, nw, name="prod")
    total = cc.Add(prod, nb, name="total")
    out = cc.GeneralFunction.new_by_name(total, spec_name="tanh", name="out")
    return out, prod, total, x, w, b


def test_a_known_value_replaces_its_subtree(parts):
    out, prod, total, x, w, b = parts
    given = torch.full((3, 4), 0.5)
    got = compile_plan([out], known={prod: given}).run()[0]
    torch.testing.assert_close(got, torch.tanh(given + b), rtol=0, atol=0)


def test_nothing_below_a_known_value_is_visited():
    missing = cc.Array.from_hash((2,), "0" * 24, name="unloaded")  # no tensor: evaluating it raises
    node = cc.GeneralFunction.new_by_name(missing, spec_name="tanh", name="t")
    top = cc.Add(node, cc.Scalar(1.0, shape=(2,)), name="top")
    got = compile_plan([top], known={node: torch.tensor([1.0, 2.0])}).run()[0]
    torch.testing.assert_close(got, torch.tensor([2.0, 3.0]), rtol=0, atol=0)
    with pytest.raises(cc.errors.MissingTensorError):
        cc.evaluate(top)


def test_known_as_a_function_is_asked_about_the_nodes_the_walk_enters(parts):
    out, prod, total, x, w, b = parts
    asked = []

    def known(node):
        asked.append(node.name)
        return torch.zeros(3, 4) if node.name == "total" else None

    got = compile_plan([out], known=known).run()[0]
    torch.testing.assert_close(got, torch.zeros(3, 4), rtol=0, atol=0)
    assert asked == ["out", "total"]  # not prod, x, w, b: they are below the known value


def test_a_known_value_counts_for_the_scalars_dtype():
    x64 = cc.Array(torch.ones(2, dtype=torch.float64), name="x")
    inner = cc.GeneralFunction.new_by_name(x64, spec_name="tanh", name="inner")
    top = cc.Add(inner, cc.Scalar(0.1, shape=(2,)), name="top")
    value = torch.tanh(torch.ones(2, dtype=torch.float64))
    assert compile_plan([top], known={inner: value}).run()[0].dtype == torch.float64
    # a KnownValue says which dtype counts: here, as if no floating Array were below it
    plan = compile_plan([top], known=lambda n: KnownValue(value, None) if n is inner else None)
    assert plan.scalar_dtype == torch.get_default_dtype()


def test_bad_known_values_are_refused_naming_the_node(parts):
    out, prod, *_ = parts
    # the message says what was given instead
    with pytest.raises(cc.errors.EvaluationError, match="is shape \\[4,3\\]") as info:
        compile_plan([out], known={prod: torch.zeros(4, 3)})
    assert info.value.node is prod
    with pytest.raises(cc.errors.EvaluationError, match="is list") as info:
        compile_plan([out], known={prod: [0.0]})
    assert info.value.node is prod
    with pytest.raises(cc.errors.EvaluationError, match="keyed by circuit nodes"):
        compile_plan([out], known={"prod": torch.zeros(3, 4)})

    def broken(node):
        raise KeyError("oops")

    with pytest.raises(cc.errors.EvaluationError) as info:
        compile_plan([out], known=broken)
    assert info.value.node is out and isinstance(info.value.__cause__, KeyError)


def test_on_value_sees_every_computed_value_once(parts):
    out, prod, total, x, w, b = parts
    seen = {}

    def on_value(node, value):
        assert node.name not in seen
        seen[node.name] = value.clone()

    got = compile_plan([out]).run(on_value=on_value)[0]
    assert list(seen) == ["prod", "total", "out"]
    torch.testing.assert_close(seen["prod"], x * w, rtol=0, atol=0)
    torch.testing.assert_close(seen["total"], x * w + b, rtol=0, atol=0)
    torch.testing.assert_close(seen["out"], got, rtol=0, atol=0)


def test_on_value_sees_arrays_converted_by_the_call(parts):
    out, *_ = parts
    seen = []
    compile_plan([out], dtype=torch.float64).run(
        on_value=lambda node, value: seen.append((node.name, value.dtype))
    )
    assert ("x", torch.float64) in seen and ("w", torch.float64) in seen and ("b", torch.float64) in seen


def test_an_error_in_on_value_propagates_as_it_is(parts):
    out, *_ = parts

    def on_value(node, value):
        raise KeyError(node.name)

    with pytest.raises(KeyError) as info:
        compile_plan([out]).run(on_value=on_value)
    assert info.value.args == ("prod",)


def test_a_kernel_override_replaces_or_wraps_the_default(parts):
    out, prod, total, x, w, b = parts

    def sigmoid_for_tanh(node, default):
        return torch.sigmoid if node.name == "out" else default

    got = compile_plan([out], kernel=sigmoid_for_tanh).run()[0]
    torch.testing.assert_close(got, torch.sigmoid(x * w + b), rtol=0, atol=0)

    calls = []

    def counted(node, default):
        def run(*values):
            calls.append(node.name)
            return default(*values)

        return run

    got = compile_plan([out], dtype=torch.float64, kernel=counted).run()[0]
    torch.testing.assert_close(got, torch.tanh(x.double() * w.double() + b.double()), rtol=0, atol=0)
    assert calls == ["x", "w", "prod", "b", "total", "out"]  # conversions of Arrays are steps too


def test_default_kernel_is_what_a_step_runs(parts):
    out, prod, total, x, w, b = parts
    torch.testing.assert_close(default_kernel(prod)(x, w), x * w, rtol=0, atol=0)
    torch.testing.assert_close(default_kernel(out)(x), torch.tanh(x), rtol=0, atol=0)


def test_bad_kernel_overrides_are_refused_naming_the_node(parts):
    out, *_ = parts
    with pytest.raises(cc.errors.EvaluationError, match="returned int") as info:  # says what it returned
        compile_plan([out], kernel=lambda node, default: 3)
    assert info.value.node.name == "prod"
    with pytest.raises(cc.errors.EvaluationError, match="kernel must be a function"):
        compile_plan([out], kernel=3)


def test_a_failing_overridden_kernel_is_blamed_on_its_node(parts):
    out, *_ = parts

    def fails(node, default):
        def run(*values):
            raise RuntimeError("boom")

        return run if node.name == "total" else default

    with pytest.raises(cc.errors.EvaluationError) as info:
        compile_plan([out], kernel=fails).run()
    assert info.value.node.name == "total"
    assert isinstance(info.value.__cause__, RuntimeError) and info.value.__cause__.args == ("boom",)


def test_a_plan_runs_once(parts):
    out, *_ = parts
    plan = compile_plan([out])
    assert plan.computed == 3 and [n.name for n in plan.nodes] == ["x", "w", "prod", "b", "total", "out"]
    assert {node.name for node, _ in plan.initial_values()} == {"x", "w", "b"}
    plan.run()
    with pytest.raises(cc.errors.EvaluationError, match="runs once"):
        plan.run()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_empty_sums_take_the_calls_dtype(dtype):
    # Add() is 0, a constant like a Scalar: of the call's dtype, not the default dtype
    empty = cc.Add()
    x = cc.Array(torch.tensor([2.0, 3.0], dtype=dtype), name="x")
    got = cc.Add(x, empty, name="total").evaluate()
    assert got.dtype == dtype
    torch.testing.assert_close(got, torch.tensor([2.0, 3.0], dtype=dtype), rtol=0, atol=0)
    assert empty.evaluate(dtype=dtype).dtype == dtype
    roots = cc.evaluate_many([empty, cc.Scalar(0.0)])
    roots[0].add_(5.0)  # a root has its own memory, not the shared constant
    assert roots[1].item() == 0.0


def test_the_cache_gives_empty_sums_the_calls_dtype():
    top = cc.GeneralFunction.new_by_name(cc.Add(), spec_name="tanh", name="t")
    ev = cc.Evaluator(2**20)
    assert ev.evaluate(top).dtype == torch.get_default_dtype()
    z64 = cc.Array(torch.zeros((), dtype=torch.float64), name="z")
    # with a float64 Array in the call, Scalars (and the empty sum) are float64: the cached float32 value is not
    assert [v.dtype for v in ev.evaluate_many([top, z64])] == [v.dtype for v in cc.evaluate_many([top, z64])]
    assert ev.evaluate_many([top, z64])[0].dtype == torch.float64
