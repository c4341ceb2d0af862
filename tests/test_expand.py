"""expand: batch axes added to a replaced node and carried by every ancestor.

Every check is the defining property: element ``b`` of the expanded
circuit's value equals the original circuit evaluated with element ``b`` of
the replacement (float32 or float64 as noted; tolerances stated per test).
"""

from __future__ import annotations

import itertools

import pytest
import torch

import circuits as cc
from circuits.core.functions import FunctionSpec, register_function


def per_element(circuit: cc.Circuit, key, batch: torch.Tensor, batch_rank: int = 1, **tolerance):
    """Check expand(circuit, {key: batch}) elementwise against the unbatched circuit."""
    old = circuit.get_unique(key)
    before = (circuit.hash, circuit.repr())
    expanded = cc.expand(circuit, {key: cc.Array(batch, name=old.name)})
    assert (circuit.hash, circuit.repr()) == before
    assert expanded.shape == tuple(batch.shape[:batch_rank]) + circuit.shape
    out = expanded.evaluate()
    for index in itertools.product(*(range(n) for n in batch.shape[:batch_rank])):
        single = circuit.replace({old: cc.Array(batch[index], name=old.name)})
        torch.testing.assert_close(out[index], single.evaluate(), **tolerance)
    return expanded


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------ node rules


def test_einsum_gains_fresh_letters_and_unbatched_operands_stay():
    x = cc.Array(randn(3, 4), name="x")
    w = cc.Array(randn(4, 5, seed=1), name="w")
    # 'a' and 'b' are taken, so the batch letters must be others
    e = cc.Einsum.from_einsum_string("ab,bc->ac", x, w, name="e")
    root = cc.Einsum.from_einsum_string("ac,ac->a", e, e, name="root")
    expanded = per_element(root, "x", randn(2, 3, 3, 4, seed=2), batch_rank=2)
    assert expanded.get_unique("e").extra == "deab,bc->deac"
    assert expanded.get_unique("e").children[1] is w  # unbatched operand untouched
    assert expanded.get_unique("root").extra == "bdac,bdac->bda"  # letters fresh per einsum


def test_add_pads_batched_operands_of_lower_rank():
    # batch size 2 equals the last axis: without padding numpy broadcasting would
    # silently line the batch axis up with the matrix's axis 0
    v = cc.Array(randn(2), name="v")
    m = cc.Array(randn(2, 2, seed=1), name="m")
    root = cc.Add(v, m, cc.Scalar(1.0), name="root")
    expanded = per_element(root, "v", randn(2, 2, seed=2))
    assert expanded.shape == (2, 2, 2)
    assert expanded.get_unique("root").children[1] is m
    pad = expanded.get_unique("root").children[0]
    assert pad.kind == "Rearrange" and pad.extra == "B0 x0 -> B0 1 x0"
    # both batched at different ranks, and a batched operand of full rank
    root = cc.Add(cc.Einsum.from_einsum_string("a->", v), cc.Add(m, v), name="both")
    per_element(root, "v", randn(3, 2, seed=3))


def test_index_gains_leading_slices():
    x = cc.Array(randn(5, 6), name="x")
    root = cc.Index(cc.Index(x, (slice(1, -1), torch.tensor([4, 0, 2]))), (2,), name="idx")
    expanded = per_element(root, "x", randn(3, 5, 6, seed=1))
    assert expanded.get_unique("idx").extra == "[:,2,:]"


def test_rearrange_gains_fresh_axes_on_both_sides():
    x = cc.Array(randn(6, 4), name="x")
    root = cc.Rearrange(x, "(batch0 b) c -> c batch0 b 1", name="r", batch0=2)
    expanded = per_element(root, "x", randn(2, 3, 6, 4, seed=1), batch_rank=2)
    assert expanded.get_unique("r").extra == (
        "batch1 batch2 (batch0 b) c -> batch1 batch2 c batch0 b 1, batch0=2"
    )
    # a pattern that makes new axes (repeat) and one over a rank-0 child
    s = cc.Array(randn(()), name="s")
    per_element(cc.Rearrange(s, "-> k", k=3), "s", randn(4, seed=2))
    per_element(cc.Rearrange(x, "a c -> c k a", k=2), "x", randn(2, 6, 4, seed=3))


def test_concat_shifts_its_axis_and_repeats_unbatched_operands():
    x = cc.Array(randn(2, 3), name="x")
    y = cc.Array(randn(4, 3, seed=1), name="y")
    root = cc.Concat(x, y, x, axis=0, name="cat")
    expanded = per_element(root, "x", randn(5, 2, 3, seed=2))
    assert expanded.get_unique("cat").extra == "1"
    per_element(cc.Concat(x, cc.Array(randn(2, 1, seed=3)), axis=-1), "x", randn(2, 2, 3, seed=4))


def test_elementwise_and_last_axis_functions():
    x = cc.Array(randn(3, 4), name="x")
    half = cc.Einsum.from_einsum_string(
        "a,->a", cc.GeneralFunction.new_by_name(x, spec_name="last_dim_size"), cc.Scalar(0.5), name="half"
    )
    root = cc.Add(
        cc.GeneralFunction.new_by_name(x, spec_name="softmax"),
        cc.GeneralFunction.new_by_name(
            cc.GeneralFunction.new_by_name(x, spec_name="exp"), spec_name="log_softmax"
        ),
        cc.Rearrange(half, "a -> a 1"),
        name="root",
    )
    per_element(root, "x", randn(2, 3, 4, seed=1))


def test_multi_input_function_with_declared_batchability():
    def scaled(x, scale):
        return x * scale.unsqueeze(-1)

    spec = register_function(
        FunctionSpec(
            "test_expand.scaled",
            2,
            lambda shapes: shapes[0],
            scaled,
            num_non_batchable_output_dims=1,
            input_batchability=(True, True),
        ),
        replace=True,
    )
    x = cc.Array(randn(3, 4), name="x")
    s = cc.Array(randn(3, seed=1), name="s")
    root = cc.GeneralFunction(x, s, spec=spec, name="f")
    per_element(root, "x", randn(2, 3, 4, seed=2))  # s is repeated over the batch
    per_element(root, "s", randn(2, 3, seed=3))
    frozen = register_function(
        FunctionSpec(
            "test_expand.scaled_frozen",
            2,
            lambda shapes: shapes[0],
            scaled,
            num_non_batchable_output_dims=1,
            input_batchability=(True, False),
        ),
        replace=True,
    )
    root = cc.GeneralFunction(x, s, spec=frozen, name="g")
    per_element(root, "x", randn(2, 3, 4, seed=4))  # s is not batchable: passed as is
    refused = r"GeneralFunction 'g': input 1 of function 'test_expand.scaled_frozen'"
    with pytest.raises(cc.errors.ExpandError, match=refused):
        cc.expand(root, {"s": cc.Array(randn(2, 3))})


# -------------------------------------------------------------- gen_index


def gen_index_cases():
    for dim, batch_x, batch_index, check in itertools.product(
        (0, 1, -1), (False, True), (True, False), (True, False)
    ):
        name = (
            f"gen_index_at_{dim}"
            + ("_batch_x" if batch_x else "")
            + ("" if batch_index else "_no_batch_index")
            + ("_c" if check else "")
        )
        if batch_x:
            index_shapes = [(2, 3)] if batch_index else [(2, 3, 4)]
            x_shape = (2, 3, 5, 6)
        else:
            index_shapes = [(), (4,), (2, 3)]
            x_shape = (5, 6, 7)
        for index_shape in index_shapes:
            for batched in ("x", "index", "both"):
                yield name, x_shape, index_shape, batched


@pytest.mark.parametrize("name,x_shape,index_shape,batched", list(gen_index_cases()))
def test_gen_index_family(name, x_shape, index_shape, batched):
    generator = torch.Generator().manual_seed(0)
    x = cc.Array(torch.randn(x_shape, generator=generator, dtype=torch.float64), name="x")
    probe = cc.GeneralFunction(x, cc.Symbol(index_shape), spec=name)
    size = probe.children[0].shape[_looked_up_axis(probe)]
    index = cc.Array(torch.randint(0, size, index_shape, generator=generator), name="index")
    root = cc.Add(cc.GeneralFunction(x, index, spec=name, name="g"), name="root")
    batch = (3,)
    tensors = {}
    if batched in ("x", "both"):
        tensors["x"] = torch.randn(batch + x_shape, generator=generator, dtype=torch.float64)
    if batched in ("index", "both"):
        tensors["index"] = torch.randint(0, size, batch + index_shape, generator=generator)
    expanded = cc.expand(root, {key: cc.Array(value, name=key) for key, value in tensors.items()})
    assert expanded.shape == batch + root.shape
    out = expanded.evaluate()
    for b in range(batch[0]):
        single = root.replace(
            {root.get_unique(key): cc.Array(value[b], name=key) for key, value in tensors.items()}
        )
        torch.testing.assert_close(out[b], single.evaluate(), rtol=0, atol=0)


def _looked_up_axis(node: cc.GeneralFunction) -> int:
    from circuits.core.functions import GEN_INDEX_NAME, gen_index_layout

    match = GEN_INDEX_NAME.fullmatch(node.spec.name)
    x, index = node.children
    return gen_index_layout(
        x.shape, index.shape, int(match["dim"]), bool(match["batch_x"]), not match["no_batch_index"]
    ).axis


# ---------------------------------------------------------------- errors


def test_replacement_must_keep_the_trailing_shape():
    x = cc.Array(randn(3, 4), name="x")
    root = cc.Add(x, name="root")
    with pytest.raises(
        cc.errors.ExpandError, match=r"Array 'x' \[3,4\] cannot be replaced by Array 'x2' \[2,4,3\]"
    ):
        cc.expand(root, {"x": cc.Array(randn(2, 4, 3), name="x2")})
    with pytest.raises(cc.errors.ExpandError, match=r"cannot be replaced by .* \[4\]"):
        cc.expand(root, {"x": cc.Array(randn(4))})


def test_batch_shapes_must_agree_and_functions_must_declare_batching():
    x = cc.Array(randn(3), name="x")
    y = cc.Array(randn(3), name="y")
    root = cc.Add(x, y, name="root")
    with pytest.raises(cc.errors.ExpandError, match=r"different batch shapes: \[2\] .* and \[5\]"):
        cc.expand(root, {"x": cc.Array(randn(2, 3)), "y": cc.Array(randn(5, 3))})
    opaque = register_function(
        FunctionSpec("test_expand.opaque", 1, lambda s: s[0], lambda t: t), replace=True
    )
    root = cc.GeneralFunction(x, spec=opaque, name="f")
    refused = r"GeneralFunction 'f' cannot carry batch axes: its function 'test_expand.opaque'"
    with pytest.raises(cc.errors.ExpandError, match=refused):
        cc.expand(root, {"x": cc.Array(randn(2, 3))})
    with pytest.raises(cc.errors.ExpandError, match="path-restricted"):
        cc.expand(root, {cc.IterativeMatcher("x"): cc.Array(randn(2, 3))})


def test_same_shape_replacement_and_callable_values_and_sharing():
    x = cc.Array(randn(3), name="x")
    w = cc.Array(randn(3, seed=1), name="w")
    untouched = cc.Add(w, name="untouched")
    root = cc.Add(cc.Einsum.from_einsum_string("a,a->a", x, w), untouched, name="root")
    assert cc.expand(root, {}) is root
    assert cc.expand(root, {"nothing": x}) is root
    plain = cc.expand(root, {"x": lambda old: cc.Array(torch.zeros(3), name="x0")})  # no batch axes
    assert plain.children[1] is untouched and plain.get_unique("x0").shape == (3,)
    batched = cc.expand(
        root, {cc.Array & cc.Matcher("x"): lambda old: cc.Array(torch.stack([old.tensor()] * 2))}
    )
    assert batched.shape == (2, 3) and batched.children[1] is untouched


def test_fifty_thousand_deep_chain_expands_without_recursion():
    depth = 50_000
    side = cc.Array(torch.ones(2), name="side")
    node = cc.Array(torch.zeros(2), name="leaf")
    for _ in range(depth):
        node = cc.Add(node, side)
    batch = cc.Array(torch.tensor([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]]), name="leaf")
    expanded = cc.expand(node, {"leaf": batch})
    assert expanded.shape == (3, 2)
    bottom = expanded
    for _ in range(depth):
        assert bottom.children[1] is side
        bottom = bottom.children[0]
    assert bottom.shape == (3, 2)


# ----------------------------------------------------------------- golden


def golden_with_tensors(text: str) -> cc.Circuit:
    """The golden circuit with random float32 weights of the printed shapes.

    'toks_int_var' holds int64 tokens in [0, vocab) and 't.a.c.causal_mask' a
    0/1 lower-triangular mask, as the circuit's semantics need.
    """
    circuit = cc.parse(text)
    generator = torch.Generator().manual_seed(0)
    vocab = circuit.get_unique("t.w.tok_embeds").shape[0]

    def fill(node: cc.Array) -> cc.Array:
        if node.name == "toks_int_var":
            return cc.Array(torch.randint(0, vocab, node.shape, generator=generator), name=node.name)
        if node.name == "t.a.c.causal_mask":
            return cc.Array(torch.tril(torch.ones(node.shape)), name=node.name)
        return cc.Array(torch.randn(node.shape, generator=generator) * 0.02, name=node.name)

    return circuit.update(cc.Matcher(cc.Array) & (lambda n: not n.is_loaded), fill)


@pytest.mark.slow
def test_golden_circuit_runs_on_a_batch_of_sequences(golden_text):
    """Four token sequences at once equal four unbatched evaluations.

    float32 throughout; the per-position losses are compared with
    atol 1e-5 + rtol 1e-5 (losses are about ln(50259) ~ 10.8, so this is
    ~1e-6 relative), and the loss summed over positions with rtol 1e-5.
    """
    circuit = golden_with_tensors(golden_text)
    before = (circuit.hash, circuit.repr())
    toks = circuit.get_unique("toks_int_var")
    vocab = circuit.get_unique("t.w.tok_embeds").shape[0]
    batch = torch.randint(0, vocab, (4,) + toks.shape, generator=torch.Generator().manual_seed(1))
    batch[0] = toks.tensor()  # element 0 is the circuit's own sequence

    expanded = cc.expand(circuit, {"toks_int_var": cc.Array(batch, name="toks_int_var")})
    assert (circuit.hash, circuit.repr()) == before
    assert expanded.shape == (4,) + circuit.shape == (4, 300)
    # the embedding lookup keeps its function, with the batch axes first
    assert expanded.get_unique("idxed_embeds").extra == "gen_index_at_0_c"
    assert expanded.get_unique("idxed_embeds").shape == (4, 300, 256)
    assert expanded.get_unique("ll").extra == "gen_index_at_0_batch_x_c"
    # weights are shared, not copied: the same objects as in the input
    assert expanded.get_unique("t.w.unembed") is circuit.get_unique("t.w.unembed")
    # what expand built reads back from its own text
    assert cc.parse(expanded.repr()) == expanded

    out = expanded.evaluate()
    assert out.dtype == torch.float32
    for b in range(4):
        single = circuit if b == 0 else circuit.replace({toks: cc.Array(batch[b], name="toks_int_var")})
        expected = single.evaluate()
        torch.testing.assert_close(out[b], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(out[b].sum(), expected.sum(), atol=0, rtol=1e-5)
    assert not torch.allclose(out[0], out[1])
