"""The GeneralFunctions rust_circuit registers, under its names, with its semantics.

rust_circuit's list is ``gf_gen!`` in ``circuit_base/src/generalfunction.rs``
(redwoodresearch/rust_circuit_public) plus its ``pow`` spec; the values are
its ``py_types.py`` ``generalfunctions`` table.  The references here are
written out with plain torch, independently of ``circuits.core.functions``.
"""

from __future__ import annotations

import itertools
import math
import pickle

import pytest
import torch

import circuits as cc
from circuits.evaluation.costs import FUNCTION_FLOPS
from circuits.core.functions import get_function, registered_names
from circuits.text.store import TensorStore

# gf_gen! in generalfunction.rs: name -> (num_non_batchable_output_dims, removed_from_end).
RUST_SIMPLE_SPECS = {
    "sin": (0, 0),
    "cos": (0, 0),
    "sigmoid": (0, 0),
    "tanh": (0, 0),
    "rsqrt": (0, 0),
    "gelu": (0, 0),
    "gelu_new": (0, 0),
    "relu": (0, 0),
    "step": (0, 0),
    "reciprocal": (0, 0),
    "log_exp_p_1": (0, 0),
    "gaussian_pdf": (0, 0),
    "gaussian_cdf": (0, 0),
    "softmax": (1, 0),
    "log_softmax": (1, 0),
    "min": (0, 1),
    "max": (0, 1),
    "last_dim_size": (0, 1),
    "abs": (0, 0),
    "exp": (0, 0),
    "log": (0, 0),
    "logit": (0, 0),
}


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


# The functions this module adds: name -> reference over float64.
REFERENCES = {
    "step": lambda x: torch.tensor(
        [1.0 if v > 0 else 0.0 for v in x.flatten().tolist()], dtype=x.dtype
    ).reshape(x.shape),
    "logit": lambda x: torch.log(x) - torch.log1p(-x),
    "log_exp_p_1": lambda x: torch.where(x < 0, torch.log1p(torch.exp(x)), x + torch.log1p(torch.exp(-x))),
    "gaussian_pdf": lambda x: torch.exp(-(x**2) / 2) / math.sqrt(2 * math.pi),
    "gaussian_cdf": lambda x: 0.5 * torch.erfc(-x / math.sqrt(2.0)),
    "min": lambda x: torch.stack([min(r.tolist()) * torch.ones((), dtype=x.dtype) for r in _rows(x)]).reshape(
        x.shape[:-1]
    ),
    "max": lambda x: torch.stack([max(r.tolist()) * torch.ones((), dtype=x.dtype) for r in _rows(x)]).reshape(
        x.shape[:-1]
    ),
}

# Points where a function is easy to get wrong: step's 0 and NaN, logit's ends, far tails.
EDGES = {
    "step": ([0.0, -0.0, 1e-300, -1e-300, math.inf, -math.inf, math.nan], [0, 0, 1, 0, 1, 0, 0]),
    "logit": ([0.0, 1.0, 0.5], [-math.inf, math.inf, 0.0]),
    "log_exp_p_1": (
        [1000.0, -1000.0, 0.0, 30.0],
        [1000.0, 0.0, math.log(2.0), 30.0 + math.log1p(math.exp(-30.0))],
    ),
    "gaussian_pdf": ([0.0, 40.0, -math.inf], [1 / math.sqrt(2 * math.pi), 0.0, 0.0]),
    "gaussian_cdf": ([0.0, -math.inf, math.inf, 40.0], [0.5, 0.0, 1.0, 1.0]),
    "min": ([-math.inf, 2.0, 3.0], -math.inf),
    "max": ([math.inf, 2.0, 3.0], math.inf),
}


def _input(name: str, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return torch.sigmoid(x) if name == "logit" else x * 3


def test_every_rust_function_is_registered_with_its_shape_rule():
    """Each name in rust_circuit's list builds a node on a batched input with rust's output shape."""
    x = cc.Symbol((2, 3, 4), name="x")
    for name, (non_batchable, removed) in RUST_SIMPLE_SPECS.items():
        node = cc.GeneralFunction(x, spec=name, name="f")
        assert node.shape == (2, 3, 4)[: 3 - removed], name
        assert get_function(name).num_non_batchable_output_dims == non_batchable, name
    assert "pow" in registered_names()


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("shape", [(5,), (2, 3, 4), (1, 7)])
def test_values_against_torch(name, shape):
    value = _input(name, shape, seed=len(shape))
    node = cc.GeneralFunction(cc.Array(value, name="x"), spec=name, name="f")
    expected = REFERENCES[name](value)
    assert node.shape == expected.shape
    torch.testing.assert_close(node.evaluate(), expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_values(name):
    inputs, outputs = EDGES[name]
    node = cc.GeneralFunction(
        cc.Array(torch.tensor(inputs, dtype=torch.float64), name="x"), spec=name, name="f"
    )
    expected = torch.tensor(outputs, dtype=torch.float64)
    torch.testing.assert_close(node.evaluate(), expected, rtol=1e-15, atol=0.0)


def test_step_keeps_the_input_dtype():
    for dtype in (torch.float32, torch.float64):
        node = cc.GeneralFunction(cc.Array(torch.tensor([-1.0, 2.0], dtype=dtype), name="x"), spec="step")
        assert node.evaluate().dtype == dtype


@pytest.mark.parametrize("name", ["min", "max"])
def test_min_max_refuse_inputs_without_entries_on_the_last_axis(name):
    for shape in [(), (3, 0)]:
        with pytest.raises(cc.errors.FunctionSpecError, match=name):
            cc.GeneralFunction(cc.Symbol(shape, name="x"), spec=name, name="f")


def test_min_max_gradient_goes_to_one_tied_entry():
    """As rust_circuit's ``torch.min(x, dim=-1)[0]``: the whole gradient to one of the tied entries."""
    x = torch.tensor([[1.0, 1.0, 3.0]], dtype=torch.float64, requires_grad=True)
    grad = torch.autograd.grad(get_function("min").function(x).sum(), x)[0]
    assert sorted(grad.flatten().tolist()) == [0.0, 0.0, 1.0]


@pytest.mark.parametrize(
    "base_shape, exponent_shape, out_shape",
    [((2, 3), (), (2, 3)), ((3,), (2, 3), (2, 3)), ((2, 1), (1, 4), (2, 4)), ((), (), ())],
)
def test_pow_broadcasts_like_numpy(base_shape, exponent_shape, out_shape):
    g = torch.Generator().manual_seed(0)
    base = torch.rand(base_shape, generator=g, dtype=torch.float64) + 0.5
    exponent = torch.randn(exponent_shape, generator=g, dtype=torch.float64)
    node = cc.GeneralFunction(cc.Array(base, name="b"), cc.Array(exponent, name="e"), spec="pow", name="p")
    assert node.shape == out_shape
    expected = torch.exp(exponent * torch.log(base))
    torch.testing.assert_close(node.evaluate(), expected, rtol=1e-12, atol=1e-12)


def test_pow_by_a_scalar_and_refused_shapes():
    x = torch.tensor([-2.0, 0.0, 3.0], dtype=torch.float64)
    node = cc.GeneralFunction(cc.Array(x, name="x"), cc.Scalar(2.0, name="two"), spec="pow", name="sq")
    torch.testing.assert_close(node.evaluate(), torch.tensor([4.0, 0.0, 9.0], dtype=torch.float64))
    with pytest.raises(cc.errors.FunctionSpecError, match="broadcast"):
        cc.GeneralFunction(cc.Symbol((2, 3), name="a"), cc.Symbol((4,), name="b"), spec="pow", name="p")
    with pytest.raises(cc.errors.FunctionSpecError):
        cc.GeneralFunction(cc.Symbol((2,), name="a"), spec="pow", name="p")


def _nodes() -> list[cc.Circuit]:
    x = cc.Array(_input("x", (2, 3), seed=1), name="x")
    p = cc.Array(_input("logit", (2, 3), seed=2), name="p")
    nodes = [
        cc.GeneralFunction(p if name == "logit" else x, spec=name, name=f"f_{name}") for name in REFERENCES
    ]
    return nodes + [cc.GeneralFunction(p, x, spec="pow", name="f_pow")]


@pytest.mark.parametrize("node", _nodes(), ids=lambda n: n.name)
def test_prints_under_rust_name_and_parses_back(node, tmp_path):
    store = TensorStore(tmp_path)
    text = node.repr(store=store)
    assert text.splitlines()[0] == f"'{node.name}' GeneralFunction {node.spec.name}"
    again = cc.parse(text, store=store)
    assert again == node
    torch.testing.assert_close(again.evaluate(), node.evaluate(), rtol=0.0, atol=0.0)


def test_rust_printed_text_parses():
    """A circuit as rust_circuit prints it (shapes on every line), using the new names."""
    text = """'m' [2] GeneralFunction max
  'p' [2,3] GeneralFunction pow
    's' [2,3] GeneralFunction step
      'x' [2,3] Scalar 1.5
    'two' [] Scalar 2"""
    node = cc.parse(text)
    torch.testing.assert_close(node.evaluate(), torch.ones(2))


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_flops_from_the_table(name):
    node = cc.GeneralFunction(cc.Array(torch.rand(3, 4), name="x"), spec=name, name="f")
    result = cc.cost(node)
    assert dict(result[node].flops) == {kind: 12 * count for kind, count in FUNCTION_FLOPS[name].items()}
    assert not result[node].unknown_function


def test_pow_flops_are_counted_per_output_element():
    """Per-input-element counting cannot see a broadcast base, so pow is counted per output element."""
    node = cc.GeneralFunction(
        cc.Array(torch.rand(3), name="x"), cc.Array(torch.rand(2, 3), name="e"), spec="pow"
    )
    assert "pow" not in FUNCTION_FLOPS
    result = cc.cost(node)
    assert result.unknown_functions == [] and dict(result[node].flops) == {"pow": 2 * 3}


def test_rust_functions_we_do_not_have_are_refused_by_name():
    for name in ["q_from_qr", "multinomial_[3", "multinomial_[-1]", "Gelu", "explicit_index_at_0"]:
        with pytest.raises(
            cc.errors.FunctionSpecError, match=r"no GeneralFunction named .*registered: .*gaussian_cdf"
        ):
            get_function(name)


# ------------------------------------------------------------------------ casts


def _cast(source: str, target: str) -> str:
    """A cast's name as rust_circuit prints it (``{:?}`` of two TorchDeviceDtypeOps)."""
    (d_in, t_in), (d_out, t_out) = source.split("/"), target.split("/")
    return f"cast_from_{{device:{d_in},dtype:{t_in}}}_to_{{device:{d_out},dtype:{t_out}}}"


@pytest.mark.parametrize(
    "source, target, dtype",
    [
        ("None/None", "None/float64", torch.float64),
        ("cpu/float32", "cpu/float16", torch.float16),
        ("None/float32", "None/int64", torch.int64),
        ("None/None", "None/bool", torch.bool),
        ("None/None", "cpu/None", torch.float32),
    ],
)
def test_cast_values_shape_and_round_trip(source, target, dtype, tmp_path):
    value = torch.tensor([[-1.5, 0.0, 2.7], [3.2, -0.4, 1.0]], dtype=torch.float32)
    name = _cast(source, target)
    node = cc.GeneralFunction(cc.Array(value, name="x"), spec=name, name="c")
    assert node.shape == (2, 3)
    out = node.evaluate()
    assert out.dtype == dtype
    assert torch.equal(out, value.to(dtype))
    store = TensorStore(tmp_path)
    text = node.repr(store=store)
    assert text.splitlines()[0] == f"'c' GeneralFunction {name}"
    again = cc.parse(text, store=store)
    assert again == node and torch.equal(again.evaluate(), out)


def test_cast_on_a_batched_input_is_elementwise():
    node = cc.GeneralFunction(cc.Symbol((4, 2, 3), name="x"), spec=_cast("None/None", "None/float64"))
    assert node.shape == (4, 2, 3) and node.spec.num_non_batchable_output_dims == 0


def test_cast_checks_its_input_requirement_at_evaluation():
    value = torch.zeros(2, dtype=torch.float32)
    node = cc.GeneralFunction(cc.Array(value, name="x"), spec=_cast("None/float64", "None/float32"), name="c")
    # the message says what the cast needs and what it got
    with pytest.raises(cc.errors.EvaluationError, match="needs a float64 input, got torch.float32") as info:
        node.evaluate()
    assert info.value.node is node


def test_cast_names_outside_rust_grammar_are_refused_clearly():
    for name in [_cast("None/float33", "None/float32"), _cast("tpu/None", "None/None"), "cast_from_x_to_y"]:
        with pytest.raises(
            cc.errors.FunctionSpecError, match=r"no GeneralFunction named .*cast_from_\{device:D"
        ):
            get_function(name)


def test_cast_names_are_reserved_and_pickle_by_name():
    name = _cast("None/None", "None/float64")
    assert pickle.loads(pickle.dumps(get_function(name))) is get_function(name)
    with pytest.raises(cc.errors.FunctionSpecError, match="reserved"):
        cc.register_function(cc.FunctionSpec(name, 1, lambda s: s[0], torch.exp))


def test_casts_cost_no_flops_and_take_their_dtype_in_costs():
    node = cc.GeneralFunction(cc.Array(torch.zeros(3), name="x"), spec=_cast("None/None", "None/float64"))
    result = cc.cost(node)
    assert result.unknown_functions == [] and result[node].flop_count == 0
    assert result[node].dtype == torch.float64 and result[node].out_bytes == 3 * 8


# --------------------------------------------------------------- explicit_index


def _explicit_index_by_loops(x, index, dim, non_batch):
    """rust_circuit's rule written as loops: out[b, i, r] = x[b, r_before, index[b, i], r_after]."""
    b = x.ndim - non_batch
    axis = b + dim % non_batch
    rest = x.shape[b:axis] + x.shape[axis + 1 :]
    out = torch.zeros(tuple(index.shape) + tuple(rest), dtype=x.dtype)
    for position in itertools.product(*[range(s) for s in out.shape]):
        bpos, ipos, rpos = position[:b], position[: index.ndim], position[index.ndim :]
        k = int(index[ipos]) % x.shape[axis]
        before, after = rpos[: axis - b], rpos[axis - b :]
        out[position] = x[tuple(bpos) + tuple(before) + (k,) + tuple(after)]
    return out


@pytest.mark.parametrize(
    "x_shape, index_shape, dim, non_batch",
    [
        ((5,), (3,), 0, 1),
        ((5, 4), (2, 3), 0, 2),
        ((5, 4), (2,), -1, 2),
        ((2, 5, 3), (2, 4), 0, 2),
        ((2, 5, 3), (2,), 1, 2),
        ((2, 3, 5), (2, 3, 4, 2), -1, 1),
        ((2, 3, 5), (2, 3), 0, 1),
    ],
)
def test_explicit_index_against_loops(x_shape, index_shape, dim, non_batch, tmp_path):
    g = torch.Generator().manual_seed(len(x_shape) + len(index_shape))
    x = torch.randn(x_shape, generator=g, dtype=torch.float64)
    size = x_shape[len(x_shape) - non_batch + dim % non_batch]
    index = torch.randint(-size, size, index_shape, generator=g)
    name = f"explicit_index_at_{dim}_x_non_b_{non_batch}"
    node = cc.GeneralFunction(cc.Array(x, name="x"), cc.Array(index, name="i"), spec=name, name="e")
    expected = _explicit_index_by_loops(x, index, dim, non_batch)
    assert node.shape == expected.shape
    assert torch.equal(node.evaluate(), expected)
    store = TensorStore(tmp_path)
    again = cc.parse(node.repr(store=store), store=store)
    assert again == node and torch.equal(again.evaluate(), expected)


def test_explicit_index_checked_refuses_out_of_range():
    x = cc.Array(torch.randn(2, 5), name="x")
    good = cc.Array(torch.tensor([[0, 4]]).expand(2, 2).clone(), name="good")
    bad = cc.Array(torch.tensor([[0, -1], [1, 2]]), name="bad")
    checked = "explicit_index_at_0_x_non_b_1_c"
    assert cc.GeneralFunction(x, good, spec=checked).evaluate().shape == (2, 2)
    node = cc.GeneralFunction(x, bad, spec=checked, name="e")
    with pytest.raises(cc.errors.EvaluationError, match=r"out of range \[0, 5\)") as info:  # gives the range
        node.evaluate()
    assert info.value.node is node and isinstance(info.value.__cause__, ValueError)
    node = cc.GeneralFunction(x, cc.Array(torch.zeros(2, 2), name="floats"), spec=checked, name="e")
    with pytest.raises(cc.errors.EvaluationError, match="not an integer type") as info:  # says why
        node.evaluate()
    assert info.value.node is node


@pytest.mark.parametrize(
    "name, x_shape, index_shape, reason",
    [
        ("explicit_index_at_0_x_non_b_0", (3,), (3,), "at least 1"),
        ("explicit_index_at_2_x_non_b_2", (3, 4), (2,), "out of range"),
        ("explicit_index_at_0_x_non_b_3", (3, 4), (2,), "fewer than"),
        ("explicit_index_at_0_x_non_b_1", (3, 4), (2, 4), "must equal"),
        ("explicit_index_at_0_x_non_b_1", (3, 4), (), "must equal"),
    ],
)
def test_explicit_index_shapes_that_do_not_fit(name, x_shape, index_shape, reason):
    x, index = cc.Symbol(x_shape, name="x"), cc.Symbol(index_shape, name="i")
    with pytest.raises(cc.errors.FunctionSpecError, match=reason):
        cc.GeneralFunction(x, index, spec=name, name="e")


def test_explicit_index_names_are_reserved_and_pickle_by_name():
    spec = get_function("explicit_index_at_-1_x_non_b_2_c")
    assert pickle.loads(pickle.dumps(spec)) is spec and spec.num_non_batchable_output_dims is None
    with pytest.raises(cc.errors.FunctionSpecError, match="reserved"):
        cc.register_function(cc.FunctionSpec(spec.name, 2, lambda s: s[0], torch.add))


def test_explicit_index_is_gen_index_batch_x_when_the_index_is_the_batch():
    """rust_circuit computes gen_index_at_D_batch_x as explicit_index_at_D_x_non_b_(x.ndim - index.ndim)."""
    g = torch.Generator().manual_seed(3)
    x = cc.Array(torch.randn(2, 3, 5, 4, generator=g), name="x")
    index = cc.Array(torch.randint(0, 5, (2, 3), generator=g), name="i")
    explicit = cc.GeneralFunction(x, index, spec="explicit_index_at_0_x_non_b_2")
    gen = cc.GeneralFunction(x, index, spec="gen_index_at_0_batch_x")
    assert explicit.shape == gen.shape == (2, 3, 4)
    assert torch.equal(explicit.evaluate(), gen.evaluate())


# ------------------------------------------------------------------ multinomial


@pytest.mark.parametrize(
    "name, printed, sizes, replacement",
    [
        ("multinomial_[3, 4]", "multinomial_[3, 4]", (3, 4), True),
        ("multinomial_[ 3,4, ]", "multinomial_[3, 4]", (3, 4), True),
        ("multinomial_no_replace_[4]", "multinomial_no_replace_[4]", (4,), False),
        ("multinomial_[]", "multinomial_[]", (), True),
    ],
)
def test_multinomial_draws_as_rust_circuit_does(name, printed, sizes, replacement, tmp_path):
    """The same torch call rust_circuit makes, so the same seed gives the same indices."""
    probs = torch.softmax(torch.randn(2, 3, 6, generator=torch.Generator().manual_seed(0)), dim=-1)
    node = cc.GeneralFunction(cc.Array(probs, name="p"), cc.Array(torch.tensor(11), name="seed"), spec=name)
    assert node.spec.name == printed and node.shape == (2, 3) + sizes
    generator = torch.Generator().manual_seed(11)
    expected = torch.multinomial(probs.reshape(6, 6), math.prod(sizes), replacement, generator=generator)
    out = node.evaluate()
    assert out.dtype == torch.int64 and torch.equal(out, expected.reshape((2, 3) + sizes))
    if not replacement:
        assert all(len(set(row.tolist())) == len(row) for row in out.reshape(6, -1))
    store = TensorStore(tmp_path)
    again = cc.parse(node.repr(store=store), store=store)
    assert again == node and torch.equal(again.evaluate(), out)


def test_multinomial_seed_may_be_a_scalar_and_shapes_that_do_not_fit():
    probs = cc.Array(torch.tensor([0.0, 1.0, 0.0]), name="p")
    node = cc.GeneralFunction(probs, cc.Scalar(3.0, name="seed"), spec="multinomial_[2]")
    assert node.evaluate().tolist() == [1, 1]
    with pytest.raises(cc.errors.FunctionSpecError, match="seed must be rank 0"):
        cc.GeneralFunction(probs, cc.Symbol((1,), name="seed"), spec="multinomial_[2]", name="m")
    with pytest.raises(cc.errors.FunctionSpecError, match="rank >= 1"):
        cc.GeneralFunction(
            cc.Symbol((), name="p"), cc.Symbol((), name="seed"), spec="multinomial_[2]", name="m"
        )


def test_multinomial_names_are_reserved_and_pickle_by_name():
    spec = get_function("multinomial_no_replace_[2, 2]")
    assert pickle.loads(pickle.dumps(spec)) is spec and spec.num_non_batchable_output_dims is None
    with pytest.raises(cc.errors.FunctionSpecError, match="reserved"):
        cc.register_function(cc.FunctionSpec("multinomial_[2]", 2, lambda s: s[0], torch.add))


# ------------------------------------------- batching declarations, used by passes

ONE_INPUT = sorted(REFERENCES) + [_cast("None/None", "None/float64")]


@pytest.mark.parametrize("name", ONE_INPUT)
def test_an_index_pushed_below_a_one_input_function_keeps_the_value(name):
    value = _input(name, (3, 4, 5), seed=4)
    node = cc.Index(
        cc.GeneralFunction(cc.Array(value, name="x"), spec=name, name="f"), (1, slice(0, 2)), name="i"
    )
    pushed = cc.passes.push_down_index(node)
    assert isinstance(pushed, cc.GeneralFunction) and pushed.spec.name == name
    torch.testing.assert_close(
        pushed.evaluate(), node.evaluate(), rtol=1e-15, atol=0.0
    )  # vector kernels may round


@pytest.mark.parametrize("name", ONE_INPUT)
def test_expand_batches_a_one_input_function(name):
    node = cc.GeneralFunction(cc.Array(_input(name, (4, 5), seed=5), name="x"), spec=name, name="f")
    batch = _input(name, (2, 4, 5), seed=6)
    expanded = cc.expand(node, {"x": cc.Array(batch, name="x")})
    assert expanded.shape == (2,) + node.shape
    for b in range(2):
        single = cc.GeneralFunction(cc.Array(batch[b], name="x"), spec=name, name="f")
        torch.testing.assert_close(expanded.evaluate()[b], single.evaluate(), rtol=1e-15, atol=0.0)


@pytest.mark.parametrize("name", ["pow", "explicit_index_at_0_x_non_b_1", "multinomial_[2]"])
def test_functions_without_declared_batching_are_left_alone_or_refused(name):
    spec = get_function(name)
    assert spec.num_non_batchable_output_dims is None
    x = cc.Symbol((3, 4), name="x")
    second = cc.Symbol((3, 2) if name.startswith("explicit") else (), name="y")
    node = cc.Index(cc.GeneralFunction(x, second, spec=name, name="f"), (0,), name="i")
    assert cc.passes.push_down_index(node) == node
    with pytest.raises(cc.errors.ExpandError, match="declares no batching"):
        cc.expand(node, {"x": cc.Symbol((2, 3, 4), name="x")})


def test_rust_python_class_functions_are_refused_with_the_reason():
    """rust_circuit's ``NAME at module:Class`` imports code; we name the spelling and say what to do."""
    text = "'f' [3] GeneralFunction rotary at rust_circuit.generalfuncs.rotary_pos_emb:RotarySpec\n  'x' [3] Scalar 1"
    # the message names the spelling and says what to do instead
    with pytest.raises(cc.errors.ParseError, match="NAME at PYTHON_PATH.*register_function") as info:
        cc.parse(text)
    assert info.value.line_number == 1
