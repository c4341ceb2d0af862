"""Evaluation against torch written out in this file.

Every expected value here is computed by torch code in the test itself
(explicit loops, broadcasting products, formulas), never by the library.
Random shapes and values come from hypothesis; tensors are drawn from a
seeded torch.Generator so that examples shrink and replay.

Tolerances (``close``): results must agree within
- float32: rtol 1e-5, atol 1e-6 for elementwise and gather results, and
  rtol 1e-4, atol 1e-5 where a reduction sums in a different order
  (Einsum, softmax, log_softmax);
- float64: rtol 1e-12, atol 1e-12 (reductions: rtol 1e-10, atol 1e-10).
Pure data movement (Index, Rearrange, Concat, gen_index, Array, Scalar,
Symbol) must be exact.
"""

from __future__ import annotations

import functools
import itertools
import math
import operator

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import index_items, seeds, shapes
from torch.overrides import TorchFunctionMode

import circuits as cc
from circuits.core.functions import get_function, registered_names

DTYPES = [torch.float32, torch.float64]
EXACT = dict(rtol=0.0, atol=0.0)
ELEMENTWISE_TOL = {torch.float32: dict(rtol=1e-5, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-12)}
EXACT_TOL = {torch.float32: EXACT, torch.float64: EXACT}
REDUCTION_TOL = {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}


def rand(seed: int, shape, dtype, low=None) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    value = torch.randn(tuple(shape), generator=generator, dtype=dtype)
    if low is not None:
        value = value.abs() + low
    return value


def close(actual: torch.Tensor, expected: torch.Tensor, tol) -> None:
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    torch.testing.assert_close(actual, expected, **tol)


# ------------------------------------------------------------------ leaves


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=15)
@given(shape=shapes(), seed=seeds)
def test_array(dtype, shape, seed):
    value = rand(seed, shape, dtype)
    close(cc.Array(value, name="x").evaluate(), value.clone(), EXACT)


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=15)
@given(shape=shapes(), value=st.floats(-1e6, 1e6, allow_nan=False, width=32))
def test_scalar_is_a_full_tensor(dtype, shape, value):
    result = cc.Scalar(value, shape=shape, name="s").evaluate(dtype=dtype)
    expected = torch.empty(shape, dtype=dtype)
    expected.fill_(value)
    close(result, expected, EXACT)
    result.add_(1)  # a root Scalar owns its storage (not a stride-0 view)


def test_scalar_roots_do_not_share_storage():
    a, b = cc.evaluate_many([cc.Scalar(1.0, shape=(2,)), cc.Scalar(1.0, shape=(2,), name="b")])
    a.add_(1)
    close(b, torch.ones(2), EXACT)


def test_scalar_defaults_to_the_circuits_floating_dtype():
    x = cc.Array(torch.ones(2, dtype=torch.float64), name="x")
    y = cc.Einsum.from_einsum_string("a,->a", x, cc.Scalar(0.5, name="half"))
    assert y.evaluate().dtype == torch.float64
    assert cc.Scalar(2.0).evaluate().dtype == torch.get_default_dtype()


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=10)
@given(shape=shapes(min_size=1), seed=seeds)
def test_symbol_bound_by_name_and_by_node(dtype, shape, seed):
    value = rand(seed, shape, dtype)
    toks = cc.Symbol(shape, name="toks")
    doubled = cc.Add(toks, toks, name="doubled")
    close(doubled.evaluate(inputs={"toks": value}), value + value, EXACT)
    close(doubled.evaluate(inputs={toks: value}), value + value, EXACT)
    close(cc.evaluate(toks, inputs={cc.Symbol(shape, name="toks"): value}), value, EXACT)


def test_symbol_binding_by_node_wins_over_name():
    toks = cc.Symbol((2,), name="toks")
    out = cc.evaluate(toks, inputs={"toks": torch.zeros(2), toks: torch.ones(2)})
    close(out, torch.ones(2), EXACT)


def test_unbound_symbol_is_an_error_naming_it():
    toks = cc.Symbol((3,), name="toks")
    root = cc.GeneralFunction.new_by_name(cc.Add(toks, toks, name="sum"), spec_name="exp", name="root")
    with pytest.raises(cc.errors.EvaluationError) as info:
        root.evaluate()
    assert info.value.node == toks
    assert [n.name for n in info.value.path] == ["root", "sum", "toks"]
    assert "'root' > Add 'sum' > Symbol 'toks'" in str(info.value)


def test_bound_tensor_of_the_wrong_shape_is_an_error():
    toks = cc.Symbol((3,), name="toks")
    # the message quotes the shape given
    with pytest.raises(cc.errors.EvaluationError, match=r"the tensor bound to it has shape \[4\]") as info:
        cc.evaluate(cc.Add(toks, toks), inputs={"toks": torch.zeros(4)})
    assert info.value.node == toks


def test_inputs_that_match_no_symbol_are_an_error():
    toks = cc.Symbol((3,), name="toks")
    with pytest.raises(cc.errors.EvaluationError, match=r"'tokz'.*matches no Symbol.*Symbol 'toks' \[3\]"):
        cc.evaluate(toks, inputs={"toks": torch.zeros(3), "tokz": torch.zeros(3)})
    x = cc.Array(torch.zeros(3), name="x")
    with pytest.raises(cc.errors.EvaluationError, match=r"binds Symbols, but key Array 'x'"):
        cc.evaluate(x, inputs={x: torch.zeros(3)})


# -------------------------------------------------------------------- Add


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=25)
@given(data=st.data(), seed=seeds)
def test_add_broadcasts(dtype, data, seed):
    out_shape = data.draw(shapes())
    count = data.draw(st.integers(1, 4))
    operands = []
    for i in range(count):
        rank = data.draw(st.integers(0, len(out_shape)))
        shape = tuple(size if data.draw(st.booleans()) else 1 for size in out_shape[len(out_shape) - rank :])
        operands.append(rand(seed + i, shape, dtype))
    node = cc.Add(*[cc.Array(t, name=f"x{i}") for i, t in enumerate(operands)], name="sum")
    expected = functools.reduce(operator.add, operands)
    close(node.evaluate(), expected, ELEMENTWISE_TOL[dtype])


# ----------------------------------------------------------------- Einsum


def einsum_by_broadcasting(tensors, letters_per_operand, out_letters, sizes):
    """Multiply every operand broadcast over all letters, sum the letters not in the output."""
    letters = sorted(sizes)
    total = torch.ones([sizes[l] for l in letters], dtype=tensors[0].dtype)
    for tensor, letters_here in zip(tensors, letters_per_operand):
        present = [l for l in letters if l in letters_here]
        aligned = tensor.permute([letters_here.index(l) for l in present]) if present else tensor
        total = total * aligned.reshape([sizes[l] if l in letters_here else 1 for l in letters])
    summed_axes = [i for i, l in enumerate(letters) if l not in out_letters]
    if summed_axes:
        total = total.sum(dim=summed_axes)
    kept = [l for l in letters if l in out_letters]
    return total.permute([kept.index(l) for l in out_letters]) if kept else total


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=40)
@given(data=st.data(), seed=seeds)
def test_einsum(dtype, data, seed):
    letter_count = data.draw(st.integers(1, 4))
    pool = "qkvhd"[:letter_count]
    sizes = {l: data.draw(st.integers(1, 4)) for l in pool}
    operand_count = data.draw(st.integers(1, 4))
    letters_per_operand = [
        "".join(data.draw(st.permutations(pool))[: data.draw(st.integers(0, letter_count))])
        for _ in range(operand_count)
    ]
    used = sorted(set("".join(letters_per_operand)))
    out = "".join(data.draw(st.permutations(used))[: data.draw(st.integers(0, len(used)))])
    tensors = [rand(seed + i, [sizes[l] for l in ls], dtype) for i, ls in enumerate(letters_per_operand)]
    spec = ",".join(letters_per_operand) + "->" + out
    node = cc.Einsum.from_einsum_string(spec, *[cc.Array(t) for t in tensors], name="e")
    expected = einsum_by_broadcasting(tensors, letters_per_operand, out, {l: sizes[l] for l in used})
    close(node.evaluate(), expected, REDUCTION_TOL[dtype])


def test_einsum_repeated_letter_is_a_diagonal():
    x = torch.arange(9.0).reshape(3, 3)
    node = cc.Einsum.from_einsum_string("aa->a", cc.Array(x))
    close(node.evaluate(), torch.tensor([x[i, i] for i in range(3)]), EXACT)


def test_opt_einsum_path_finding_is_on():
    assert torch.backends.opt_einsum.is_available()
    assert torch.backends.opt_einsum.enabled


# -------------------------------------------------------- GeneralFunction


def _softmax(x):
    shifted = x - x.max(dim=-1, keepdim=True).values if x.shape[-1] else x
    e = torch.exp(shifted)
    return e / e.sum(dim=-1, keepdim=True)


def _log_softmax(x):
    if not x.shape[-1]:
        return x.clone()
    shifted = x - x.max(dim=-1, keepdim=True).values
    return shifted - torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))


# name -> (reference written here, input domain: None for any real, else the
# smallest |x| used), minimum rank, tolerance table
REFERENCES = {
    "abs": (lambda x: torch.where(x < 0, -x, x), None, 0, ELEMENTWISE_TOL),
    "cos": (torch.cos, None, 0, ELEMENTWISE_TOL),
    "exp": (torch.exp, None, 0, ELEMENTWISE_TOL),
    "gelu": (lambda x: 0.5 * x * (1 + torch.erf(x / math.sqrt(2.0))), None, 0, ELEMENTWISE_TOL),
    "gelu_new": (
        lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3))),
        None,
        0,
        ELEMENTWISE_TOL,
    ),
    "last_dim_size": (
        lambda x: torch.ones(x.shape[:-1], dtype=x.dtype) * x.shape[-1],
        None,
        1,
        ELEMENTWISE_TOL,
    ),
    "log": (torch.log, 0.1, 0, ELEMENTWISE_TOL),
    "log_softmax": (_log_softmax, None, 1, REDUCTION_TOL),
    "log_exp_p_1": (
        lambda x: torch.where(x < 0, torch.log1p(torch.exp(x)), x + torch.log1p(torch.exp(-x))),
        None,
        0,
        ELEMENTWISE_TOL,
    ),
    "logit": (lambda x: torch.log(x / (1 - x)), None, 0, REDUCTION_TOL),  # inputs mapped into (0, 1) below
    "gaussian_pdf": (lambda x: torch.exp(-(x**2) / 2) / math.sqrt(2 * math.pi), None, 0, ELEMENTWISE_TOL),
    "gaussian_cdf": (lambda x: 0.5 * (1 + torch.erf(x / math.sqrt(2.0))), None, 0, ELEMENTWISE_TOL),
    "max": (
        lambda x: torch.stack([r.max() for r in x.reshape(-1, x.shape[-1])]).reshape(x.shape[:-1]),
        None,
        1,
        EXACT_TOL,
    ),
    "min": (
        lambda x: torch.stack([r.min() for r in x.reshape(-1, x.shape[-1])]).reshape(x.shape[:-1]),
        None,
        1,
        EXACT_TOL,
    ),
    "reciprocal": (lambda x: 1.0 / x, 0.5, 0, ELEMENTWISE_TOL),
    "relu": (lambda x: torch.where(x > 0, x, torch.zeros_like(x)), None, 0, ELEMENTWISE_TOL),
    "rsqrt": (lambda x: 1.0 / torch.sqrt(x), 0.1, 0, ELEMENTWISE_TOL),
    "sigmoid": (lambda x: 1.0 / (1.0 + torch.exp(-x)), None, 0, ELEMENTWISE_TOL),
    "silu": (lambda x: x / (1.0 + torch.exp(-x)), None, 0, ELEMENTWISE_TOL),
    "sin": (torch.sin, None, 0, ELEMENTWISE_TOL),
    "softmax": (_softmax, None, 1, REDUCTION_TOL),
    "sqrt": (torch.sqrt, 0.1, 0, ELEMENTWISE_TOL),
    "step": (lambda x: torch.where(x > 0, torch.ones_like(x), torch.zeros_like(x)), None, 0, EXACT_TOL),
    "tanh": (torch.tanh, None, 0, ELEMENTWISE_TOL),
    # float32 and float64 pass unchanged (bfloat16 and float16: tests/test_reduced_precision.py)
    "upcast_float32": (lambda x: x, None, 0, EXACT_TOL),
}


def test_every_function_the_library_registers_has_a_reference_here():
    # user functions registered by other test modules are not the library's
    library = {
        name
        for name in registered_names()
        if get_function(name).shape_fn.__module__ == "circuits.core.functions"
        and get_function(name).num_inputs == 1  # pow: tests/test_rust_functions.py
    }
    assert library == set(REFERENCES)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(REFERENCES))
@settings(max_examples=8)
@given(data=st.data(), seed=seeds)
def test_registered_function(name, dtype, data, seed):
    reference, low, min_rank, tol = REFERENCES[name]
    shape = data.draw(shapes(min_rank, 3, min_size=1, max_size=5))
    value = rand(seed, shape, dtype, low=low)
    if name == "reciprocal":
        value = value * torch.where(rand(seed + 1, shape, dtype) < 0, -1.0, 1.0).to(dtype)
    if name == "logit":
        value = torch.sigmoid(value)
    node = cc.GeneralFunction.new_by_name(cc.Array(value, name="x"), spec_name=name, name="f")
    close(node.evaluate(), reference(value), tol[dtype])


# --------------------------------------------------------------- gen_index


def gen_index_by_loops(x, index, dim, batch_x, batch_index):
    """docs/format.md's gen_index rules written as loops over every output position."""
    if batch_x:
        batch = index.shape if batch_index else index.shape[:-1]
    else:
        batch = ()
    b = len(batch)
    rest = x.shape[b:]
    d = dim % len(rest)
    looked_up = index.shape[b:]
    if batch_index:
        out_shape = tuple(batch) + tuple(looked_up) + tuple(rest[:d]) + tuple(rest[d + 1 :])
    else:
        out_shape = tuple(batch) + tuple(rest[:d]) + tuple(looked_up) + tuple(rest[d + 1 :])
    out = torch.zeros(out_shape, dtype=x.dtype)
    for position in itertools.product(*[range(s) for s in out_shape]):
        bpos = position[:b]
        if batch_index:
            ipos = position[b : b + len(looked_up)]
            others = position[b + len(looked_up) :]
            before, after = others[:d], others[d:]
        else:
            before = position[b : b + d]
            ipos = position[b + d : b + d + len(looked_up)]
            after = position[b + d + len(looked_up) :]
        i = int(index[tuple(bpos) + tuple(ipos)])
        if i < 0:
            i += rest[d]
        out[position] = x[tuple(bpos) + tuple(before) + (i,) + tuple(after)]
    return out


def gen_index_name(dim, batch_x, batch_index, check):
    return (
        f"gen_index_at_{dim}"
        + ("_batch_x" if batch_x else "")
        + ("" if batch_index else "_no_batch_index")
        + ("_c" if check else "")
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "batch_x,batch_index",
    [(False, True), (True, True), (False, False), (True, False)],
    ids=["default", "batch_x", "no_batch_index", "batch_x_no_batch_index"],
)
@pytest.mark.parametrize("check", [True, False], ids=["_c", "unchecked"])
@settings(max_examples=10)
@given(data=st.data(), seed=seeds)
def test_gen_index_variants(dtype, batch_x, batch_index, check, data, seed):
    batch_rank = data.draw(st.integers(1, 2)) if batch_x else 0
    batch = data.draw(shapes(batch_rank, batch_rank, min_size=1, max_size=3))
    rest = data.draw(shapes(1, 3, min_size=1, max_size=3))
    dim = data.draw(st.integers(-len(rest), len(rest) - 1))
    size = rest[dim % len(rest)]
    if batch_x and not batch_index:
        index_shape = batch + (data.draw(st.integers(0, 3)),)
    elif batch_x:
        index_shape = batch
    else:
        index_shape = data.draw(shapes(max_rank=2, max_size=3))
    low = 0 if check else -size  # unchecked indices wrap negatives, like Python
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(low, size, index_shape, generator=generator)
    x = rand(seed, batch + rest, dtype)
    name = gen_index_name(dim, batch_x, batch_index, check)
    node = cc.GeneralFunction.new_by_name(cc.Array(x, name="x"), cc.Array(index, name="i"), spec_name=name)
    expected = gen_index_by_loops(x, index, dim, batch_x, batch_index)
    assert node.shape == expected.shape
    close(node.evaluate(), expected, EXACT)


@pytest.mark.parametrize("bad", [5, -1, 7])
def test_checked_gen_index_out_of_range_is_an_evaluation_error(bad):
    emb = cc.Array(torch.randn(5, 3), name="emb")
    toks = cc.Symbol((4,), name="toks")
    looked_up = cc.GeneralFunction.new_by_name(emb, toks, spec_name="gen_index_at_0_c", name="idxed")
    root = cc.Einsum.from_einsum_string("sd->s", looked_up, name="root")
    with pytest.raises(cc.errors.EvaluationError) as info:
        root.evaluate(inputs={"toks": torch.tensor([0, bad, 2, 1])})
    message = str(info.value)
    assert f"[{bad}]" in message and "out of range [0, 5)" in message
    assert "path from the root: Einsum 'root' > GeneralFunction 'idxed'" in message
    assert isinstance(info.value.__cause__, ValueError)
    assert info.value.node == looked_up and info.value.path == (root, looked_up)


def test_golden_gen_index_uses_on_small_tensors(golden_text):
    """The golden file's two gen_index uses, rebuilt small, against hand indexing."""
    golden = cc.parse(golden_text)
    used = {
        n.spec.name: n
        for n in cc.unique_nodes([golden])
        if isinstance(n, cc.GeneralFunction) and n.spec.name.startswith("gen_index")
    }
    assert set(used) == {"gen_index_at_0_c", "gen_index_at_0_batch_x_c"}
    assert used["gen_index_at_0_c"].name == "idxed_embeds"
    assert used["gen_index_at_0_batch_x_c"].name == "ll"

    vocab, d_model, seq = 7, 4, 5
    emb = torch.randn(vocab, d_model, dtype=torch.float64)
    toks_var = torch.tensor([3, 0, 6, 6, 2, 5, 1])  # seq + 2, as 'toks_int_var' is [302] for 300
    toks = cc.Array(toks_var, name="toks_int_var")
    input_toks = cc.Index(toks, slice(None, -2), name="input_toks_int")
    true_toks = cc.Index(toks, slice(1, -1), name="true_toks_int")
    idxed = cc.GeneralFunction.new_by_name(
        cc.Array(emb, name="t.w.tok_embeds"), input_toks, spec_name="gen_index_at_0_c", name="idxed_embeds"
    )
    unembed = torch.randn(vocab, d_model, dtype=torch.float64)
    logits = cc.Einsum.from_einsum_string("sh,vh->sv", idxed, cc.Array(unembed, name="t.w.unembed"))
    log_probs = cc.GeneralFunction.new_by_name(logits, spec_name="log_softmax", name="log_probs")
    ll = cc.GeneralFunction.new_by_name(log_probs, true_toks, spec_name="gen_index_at_0_batch_x_c", name="ll")

    got_embeds, got_log_probs, got_ll = cc.evaluate_many([idxed, log_probs, ll])
    inp = toks_var[:-2]
    true = toks_var[1:-1]
    expected_embeds = torch.stack([emb[int(t)] for t in inp])  # emb[toks]
    close(got_embeds, expected_embeds, EXACT)
    expected_logits = torch.tensor(
        [[float((expected_embeds[s] * unembed[v]).sum()) for v in range(vocab)] for s in range(seq)],
        dtype=torch.float64,
    )
    close(got_log_probs, _log_softmax(expected_logits), REDUCTION_TOL[torch.float64])
    expected_ll = torch.stack([got_log_probs[s, int(true[s])] for s in range(seq)])  # log_probs[s, toks[s]]
    close(got_ll, expected_ll, EXACT)


# ------------------------------------------------------------------ Index


@st.composite
def index_cases(draw):
    shape = draw(shapes(min_rank=1))
    return shape, draw(index_items(shape))


def index_by_loops(x, items):
    """Outer indexing written out: each axis picks independently, ints drop their axis."""
    picks, keep = [], []
    for axis, size in enumerate(x.shape):
        item = items[axis] if axis < len(items) else slice(None)
        if isinstance(item, int):
            picks.append([item % size])
            keep.append(False)
        elif isinstance(item, slice):
            picks.append(list(range(size))[item])
            keep.append(True)
        else:
            picks.append([i % size for i in item])
            keep.append(True)
    out_shape = [len(p) for p, k in zip(picks, keep) if k]
    out = torch.zeros(out_shape, dtype=x.dtype)
    for position in itertools.product(*[range(len(p)) for p in picks]):
        source = tuple(p[i] for p, i in zip(picks, position))
        target = tuple(i for i, k in zip(position, keep) if k)
        out[target] = x[source]
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=40)
@given(case=index_cases(), seed=seeds)
def test_index_is_outer_indexing(dtype, case, seed):
    shape, items = case
    x = rand(seed, shape, dtype)
    node = cc.Index(cc.Array(x, name="x"), items, name="idx")
    loop_items = tuple(i.tolist() if isinstance(i, torch.Tensor) else i for i in items)
    close(node.evaluate(), index_by_loops(x, loop_items), EXACT)


def test_two_tensor_indices_pick_axes_independently():
    x = torch.arange(12.0).reshape(3, 4)
    node = cc.Index(cc.Array(x), (torch.tensor([2, 0]), torch.tensor([1, 3, 3])))
    expected = torch.tensor([[x[2, 1], x[2, 3], x[2, 3]], [x[0, 1], x[0, 3], x[0, 3]]])
    close(node.evaluate(), expected, EXACT)


# --------------------------------------------------------------- Rearrange

REARRANGE_CASES = [
    # pattern, sizes, reference
    ("a b c -> c a b", {}, lambda x: x.permute(2, 0, 1)),
    ("a b c -> a (b c)", {}, lambda x: x.reshape(x.shape[0], -1)),
    ("a b c -> (a b c)", {}, lambda x: x.reshape(-1)),
    ("a b (c d) -> a b c d", {"d": 1}, lambda x: x.unsqueeze(-1)),
    ("a b c -> a b c r", {"r": 3}, lambda x: torch.stack([x, x, x], dim=-1)),
    ("a b c -> b (r a) c", {"r": 2}, lambda x: torch.cat([x.transpose(0, 1), x.transpose(0, 1)], dim=1)),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", range(len(REARRANGE_CASES)))
@settings(max_examples=6)
@given(shape=shapes(3, 3, min_size=1), seed=seeds)
def test_rearrange(dtype, case, shape, seed):
    pattern, sizes, reference = REARRANGE_CASES[case]
    x = rand(seed, shape, dtype)
    node = cc.Rearrange(cc.Array(x, name="x"), pattern, **sizes)
    close(node.evaluate(), reference(x), EXACT)


# ----------------------------------------------------------------- Concat


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=25)
@given(data=st.data(), seed=seeds)
def test_concat(dtype, data, seed):
    shape = list(data.draw(shapes(1, 3, min_size=1, max_size=3)))
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    lengths = data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=4))
    parts = []
    for i, length in enumerate(lengths):
        part_shape = list(shape)
        part_shape[axis] = length
        parts.append(rand(seed + i, part_shape, dtype))
    out_shape = list(shape)
    out_shape[axis] = sum(lengths)
    expected = torch.zeros(out_shape, dtype=dtype)
    start = 0
    for part, length in zip(parts, lengths):
        target = [slice(None)] * len(shape)
        target[axis] = slice(start, start + length)
        expected[tuple(target)] = part
        start += length
    node = cc.Concat(*[cc.Array(p) for p in parts], axis=axis, name="cat")
    close(node.evaluate(), expected, EXACT)


# ---------------------------------------------------- sharing, many roots


def _counting_spec(calls: list) -> cc.FunctionSpec:
    def double(x):
        calls.append(1)
        return x * 2

    return cc.FunctionSpec("test_eval.count_calls", 1, lambda shapes: shapes[0], double)


def test_evaluate_many_computes_shared_subtrees_once():
    calls: list = []
    spec = _counting_spec(calls)
    x = torch.randn(3)
    leaf = cc.Array(x, name="x")
    shared = cc.GeneralFunction(leaf, spec=spec, name="shared")
    equal_but_distinct_object = cc.GeneralFunction(cc.Array(x.clone(), name="x"), spec=spec, name="shared")
    assert equal_but_distinct_object is not shared and equal_but_distinct_object == shared
    a = cc.Add(shared, equal_but_distinct_object, name="a")
    b = cc.Einsum.from_einsum_string("i,i->", shared, shared, name="b")
    got_a, got_b, got_shared = cc.evaluate_many([a, b, shared])
    assert len(calls) == 1
    close(got_a, x * 2 + x * 2, EXACT)
    close(got_b, (x * 2 * x * 2).sum(), REDUCTION_TOL[torch.float32])
    close(got_shared, x * 2, EXACT)
    assert cc.evaluate_many([]) == []


def test_evaluate_many_with_a_root_inside_another():
    x = torch.randn(4)
    inner = cc.GeneralFunction.new_by_name(cc.Array(x, name="x"), spec_name="exp", name="inner")
    outer = cc.Add(inner, inner, name="outer")
    got_outer, got_inner, again = cc.evaluate_many([outer, inner, inner])
    close(got_inner, torch.exp(x), ELEMENTWISE_TOL[torch.float32])
    close(got_outer, torch.exp(x) * 2, ELEMENTWISE_TOL[torch.float32])
    assert again is got_inner


# ------------------------------------------------------- device and dtype


class _CountTo(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.to:
            self.calls += 1
        return func(*args, **(kwargs or {}))


def test_dtype_casts_floating_tensors_once_and_keeps_integer_indices():
    emb = torch.randn(6, 3)
    w = torch.randn(3, 3)
    toks = torch.tensor([4, 0, 5, 5])
    e = cc.Array(emb, name="emb")
    w_node = cc.Array(w, name="w")
    looked_up = cc.GeneralFunction.new_by_name(e, cc.Array(toks, name="toks"), spec_name="gen_index_at_0_c")
    h = cc.Einsum.from_einsum_string("sd,ed->se", looked_up, w_node)
    h2 = cc.Einsum.from_einsum_string("sd,ed,,->se", h, w_node, cc.Scalar(0.5), cc.Scalar(2.0))
    root = cc.Add(h2, cc.Einsum.from_einsum_string("ed,ed->e", w_node, w_node))
    with _CountTo() as counter:
        got = root.evaluate(dtype=torch.float64)
    assert counter.calls == 2  # emb and w once each; the int64 token ids are not cast
    assert got.dtype == torch.float64
    emb64, w64 = emb.double(), w.double()
    hh = emb64[toks] @ w64.T
    expected = (hh @ w64.T) * 0.5 * 2.0 + (w64 * w64).sum(dim=1)
    close(got, expected, REDUCTION_TOL[torch.float64])


def test_integer_dtype_option_is_refused():
    with pytest.raises(cc.errors.EvaluationError, match="not a floating torch dtype"):
        cc.Array(torch.ones(2)).evaluate(dtype=torch.int64)


def test_device_option_moves_the_whole_computation():
    x = cc.Array(torch.randn(2, 3), name="x")
    root = cc.GeneralFunction.new_by_name(
        cc.Einsum.from_einsum_string("ab,->ab", x, cc.Scalar(2.0)), spec_name="softmax"
    )
    got = root.evaluate(device="meta")
    assert got.device.type == "meta" and got.shape == (2, 3)
    toks = cc.Symbol((3,), name="toks")
    meta_input = {"toks": torch.zeros(3, device="meta")}
    got = cc.evaluate(cc.Add(toks, cc.Scalar(1.0)), inputs=meta_input, device="meta")
    assert got.device.type == "meta"


def test_bound_tensor_on_another_device_is_an_error():
    toks = cc.Symbol((3,), name="toks")
    x = cc.Array(torch.randn(3), name="x")
    root = cc.Add(x, toks, name="root")
    # the message names both devices
    with pytest.raises(cc.errors.EvaluationError, match=r"on device meta.*runs on cpu") as info:
        root.evaluate(inputs={"toks": torch.zeros(3, device="meta")})
    assert info.value.node == toks
    with pytest.raises(cc.errors.EvaluationError, match=r"on device cpu.*runs on meta") as info:
        root.evaluate(inputs={"toks": torch.zeros(3)}, device="meta")
    assert info.value.node == toks and [n.name for n in info.value.path] == ["root", "toks"]


# ----------------------------------------------------------------- errors


def test_exception_in_a_function_names_the_node_and_its_path():
    def broken(x):
        raise RuntimeError("kaboom")

    spec = cc.FunctionSpec("test_eval.broken", 1, lambda shapes: shapes[0], broken)
    x = cc.Array(torch.randn(2), name="x")
    bad = cc.GeneralFunction(cc.Add(x, x, name="sum"), spec=spec, name="bad")
    root = cc.Add(cc.Einsum.from_einsum_string("a->a", bad, name="mid"), x, name="root")
    with pytest.raises(cc.errors.EvaluationError) as info:
        root.evaluate()
    message = str(info.value)
    assert "GeneralFunction 'bad' (function test_eval.broken) [2]" in message
    assert "RuntimeError: kaboom" in message
    assert "path from the root: Add 'root' > Einsum 'mid' > GeneralFunction 'bad'" in message
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(info.value, cc.CircuitError)


def test_missing_array_tensor_names_the_array_and_its_path(golden_text):
    golden = cc.parse(golden_text)
    with pytest.raises(cc.errors.MissingTensorEvaluationError) as info:
        golden.evaluate()
    node = info.value.node
    assert isinstance(node, cc.Array) and not node.is_loaded
    assert f"Array {node.name!r}" in str(info.value)
    assert info.value.path[0] == golden and info.value.path[-1] == node
    assert "path from the root: Einsum 't.loss' > GeneralFunction 'll'" in str(info.value)
    assert isinstance(info.value.__cause__, cc.errors.MissingTensorError)
    assert isinstance(info.value, cc.errors.MissingTensorError)  # catchable as either type


def test_torch_error_in_an_op_is_wrapped():
    toks = cc.Array(torch.tensor([[1, 2]]), name="toks")  # int64: torch has no integer softmax
    with pytest.raises(NotImplementedError):
        torch.softmax(torch.tensor([[1, 2]]), dim=-1)
    node = cc.GeneralFunction.new_by_name(toks, spec_name="softmax", name="p")
    root = cc.Einsum.from_einsum_string("ab->a", node, name="root")
    with pytest.raises(cc.errors.EvaluationError) as info:
        root.evaluate()
    assert info.value.node == node and isinstance(info.value.__cause__, NotImplementedError)


def test_non_circuit_root_is_refused():
    with pytest.raises(cc.errors.NodeTypeError, match="root 0 is a Tensor"):
        cc.evaluate(torch.ones(2))


# --------------------------------------------------------------- autograd


def test_gradients_flow_to_array_tensors_and_bound_inputs():
    w = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    x = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    w_node = cc.Array(w, name="w")
    x_node = cc.Symbol((5, 4), name="x")
    h = cc.GeneralFunction.new_by_name(
        cc.Einsum.from_einsum_string("sd,ed->se", x_node, w_node), spec_name="tanh"
    )
    loss = cc.Einsum.from_einsum_string("se,se->", h, h)
    loss.evaluate(inputs={"x": x}).backward()
    got_w, got_x = w.grad.clone(), x.grad.clone()
    w.grad = x.grad = None
    (torch.tanh(x @ w.T) ** 2).sum().backward()
    close(got_w, w.grad, REDUCTION_TOL[torch.float64])
    close(got_x, x.grad, REDUCTION_TOL[torch.float64])


def test_degenerate_arities():
    x = torch.tensor([0.5, -1.0, 2.0])
    leaf = cc.Array(x, name="x")
    close(cc.Add().evaluate(), torch.zeros(()), EXACT)  # the empty sum
    close(cc.Add(leaf).evaluate(), x, EXACT)
    close(cc.Concat(leaf, axis=0).evaluate(), x, EXACT)
    close(cc.Index(leaf, ()).evaluate(), x, EXACT)
    close(cc.Rearrange(leaf, "a -> a").evaluate(), x, EXACT)
    converted = cc.evaluate_many([leaf, cc.Add(leaf, leaf, leaf)], dtype=torch.float64)
    close(converted[0], x.double(), EXACT)
    close(converted[1], x.double() * 3, EXACT)
    close(cc.Symbol((3,), name="s").evaluate(inputs={"s": [1, 2, 3]}), torch.tensor([1, 2, 3]), EXACT)


# ------------------------------------------ random DAGs, several roots


@pytest.mark.parametrize("dtype", DTYPES)
@settings(max_examples=30)
@given(data=st.data(), seed=seeds)
def test_random_dags_with_sharing_and_several_roots(dtype, data, seed):
    """A DAG grown op by op, its torch value computed beside it in this test.

    Nodes pick earlier nodes as children (often the same one twice, or one
    already used elsewhere), so schedules share subtrees and release values
    whose consumers are far apart; evaluate_many on a random subset of roots
    must give every expected value.
    """
    generator = torch.Generator().manual_seed(seed)
    leaves = [torch.randn(3, 4, generator=generator, dtype=dtype) for _ in range(3)]
    nodes = [cc.Array(t, name=f"x{i}") for i, t in enumerate(leaves)]
    values = list(leaves)
    row = torch.randn(4, generator=generator, dtype=dtype)
    row_node = cc.Array(row, name="row")
    for step in range(data.draw(st.integers(1, 25))):
        i = data.draw(st.integers(0, len(nodes) - 1))
        j = data.draw(st.integers(0, len(nodes) - 1))
        a, b, va, vb = nodes[i], nodes[j], values[i], values[j]
        op = data.draw(st.sampled_from(["add", "mul", "row", "tanh", "cat_index", "rearrange", "add3"]))
        if op == "add":
            node, value = cc.Add(a, b), va + vb
        elif op == "mul":
            node, value = cc.Einsum.from_einsum_string("ab,ab->ab", a, b), va * vb
        elif op == "row":
            node, value = cc.Einsum.from_einsum_string("ab,b->ab", a, row_node), va * row
        elif op == "tanh":
            node, value = cc.GeneralFunction.new_by_name(a, spec_name="tanh"), torch.tanh(va)
        elif op == "cat_index":
            node = cc.Index(cc.Concat(a, b, axis=0), slice(2, 5))
            value = torch.stack([va[2], vb[0], vb[1]])
        elif op == "rearrange":
            node = cc.Rearrange(cc.Rearrange(a, "a b -> (b a)"), "(b a) -> a b", a=3)
            value = va
        else:
            k = data.draw(st.integers(0, len(nodes) - 1))
            node, value = cc.Add(a, b, nodes[k]), va + vb + values[k]
        nodes.append(node.rename(f"n{step}") if data.draw(st.booleans()) else node)
        values.append(value)
    picks = data.draw(st.lists(st.integers(0, len(nodes) - 1), min_size=1, max_size=4))
    results = cc.evaluate_many([nodes[p] for p in picks])
    for p, result in zip(picks, results):
        close(result, values[p], REDUCTION_TOL[dtype])
