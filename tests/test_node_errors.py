"""Construction errors, structural equality, gen_index shapes and user specs.

Every error test asserts the error's type, that it is a ``CircuitError``,
that the message names the node by its quoted name, and that it shows the
offending shapes (written ``[3, 4]`` or ``[3,4]``).
"""

from __future__ import annotations

import re

import attrs
import pytest
import torch

import circuits as cc
from circuits.core.functions import get_function, registered_names

ERROR_KINDS = [
    cc.errors.EinsumError,
    cc.errors.BroadcastError,
    cc.errors.IndexSpecError,
    cc.errors.FunctionSpecError,
    cc.errors.RearrangeError,
    cc.errors.ConcatError,
    cc.errors.LeafError,
    cc.errors.NodeTypeError,
    cc.errors.ParseError,
]


def shape_pattern(shape) -> str:
    """A regex for a shape as a list, with or without spaces after commas."""
    return r"\[" + r",\s*".join(str(s) for s in shape) + r"\]"


def raises(kind, fn, name=None, shapes=(), also=()):
    """Call fn, check the error's type and that its message names node and shapes."""
    with pytest.raises(kind) as info:
        fn()
    error = info.value
    assert isinstance(error, cc.CircuitError)
    message = str(error)
    if name is not None:
        assert f"'{name}'" in message, message
    for shape in shapes:
        assert re.search(shape_pattern(shape), message), (shape, message)
    for text in also:
        assert text in message, (text, message)
    return message


@pytest.mark.parametrize("kind", ERROR_KINDS)
def test_every_error_kind_is_a_circuit_error(kind):
    assert issubclass(kind, cc.CircuitError)
    assert issubclass(cc.CircuitError, Exception)


x34 = cc.Symbol((3, 4), name="x")
y52 = cc.Symbol((5, 2), name="y")
v5 = cc.Symbol((5,), name="v")


# ---------------------------------------------------------------------- Einsum


@pytest.mark.parametrize(
    "string",
    ["ab,bc", "ab,bc->ac->a", "a1,bc->ac", "ab,b c->a.c", "ab,bc=>ac"],
)
def test_einsum_malformed_string(string):
    raises(
        cc.errors.EinsumError,
        lambda: cc.Einsum.from_einsum_string(string, x34, y52, name="e.bad"),
        name="e.bad",
        shapes=[(3, 4), (5, 2)],
    )


def test_einsum_mismatched_letter_sizes():
    # b is 4 in x and 5 in y
    message = raises(
        cc.errors.EinsumError,
        lambda: cc.Einsum.from_einsum_string("ab,bc->ac", x34, y52, name="e.sizes"),
        name="e.sizes",
        shapes=[(3, 4), (5, 2)],
    )
    assert "'b'" in message


def test_einsum_operand_rank_does_not_match_letters():
    raises(
        cc.errors.EinsumError,
        lambda: cc.Einsum.from_einsum_string("abc->a", x34, name="e.rank"),
        name="e.rank",
        shapes=[(3, 4)],
    )


def test_einsum_output_letter_missing():
    message = raises(
        cc.errors.EinsumError,
        lambda: cc.Einsum.from_einsum_string("ab->ac", x34, name="e.out"),
        name="e.out",
        shapes=[(3, 4)],
    )
    assert "c" in message


def test_einsum_output_letter_repeated_needs_one_size():
    # a repeated output letter is a diagonal embedding (tests/test_parse_rust_nodes.py); its axes
    # are one letter, so the letter's sizes must still agree across the operands
    raises(
        cc.errors.EinsumError,
        lambda: cc.Einsum.from_einsum_string("ab,a->aa", x34, cc.Symbol((4,), name="v"), name="e.rep"),
        name="e.rep",
        shapes=[(3, 4), (4,)],
    )


@pytest.mark.parametrize("string", ["ab->a", "ab,ab,ab->a"])
def test_einsum_wrong_operand_count(string):
    raises(
        cc.errors.EinsumError,
        lambda: cc.Einsum.from_einsum_string(string, x34, x34, name="e.count"),
        name="e.count",
        shapes=[(3, 4)],
    )


def test_einsum_with_no_operands_has_no_output_letters():
    # Einsum(out_axes=()) is the empty product (tests/test_parse_rust_nodes.py); a letter has no size
    message = raises(cc.errors.EinsumError, lambda: cc.Einsum(out_axes=(0,), name="e.none"), name="e.none")
    assert "'a'" in message


def test_einsum_axis_integers_out_of_range_and_bad_pairs():
    raises(
        cc.errors.EinsumError, lambda: cc.Einsum((x34, (0, 60)), out_axes=(0,), name="e.int"), name="e.int"
    )
    raises(cc.errors.EinsumError, lambda: cc.Einsum(x34, out_axes=(0,), name="e.pair"), name="e.pair")


def test_einsum_direct_constructor_checks_sizes():
    raises(
        cc.errors.EinsumError,
        lambda: cc.Einsum((x34, (0, 1)), (y52, (1, 2)), out_axes=(0, 2), name="e.direct"),
        name="e.direct",
        shapes=[(3, 4), (5, 2)],
    )


# ------------------------------------------------------------------------- Add


def test_add_unbroadcastable():
    raises(
        cc.errors.BroadcastError,
        lambda: cc.Add(x34, v5, name="a.bad"),
        name="a.bad",
        shapes=[(3, 4), (5,)],
    )


def test_add_unbroadcastable_third_operand():
    # (2,1)+(1,3) is (2,3); (4,3) then clashes on axis -2
    a, b, c = cc.Symbol((2, 1)), cc.Symbol((1, 3)), cc.Symbol((4, 3))
    raises(
        cc.errors.BroadcastError,
        lambda: cc.Add(a, b, c, name="a.three"),
        name="a.three",
        shapes=[(2, 1), (1, 3), (4, 3)],
    )


def test_add_broadcasts_like_numpy():
    assert cc.Add(cc.Symbol((2, 1)), cc.Symbol((1, 3)), cc.Symbol((3,))).shape == (2, 3)
    assert cc.Add(cc.Symbol((4, 1, 5)), cc.Symbol(())).shape == (4, 1, 5)
    assert cc.Add(cc.Symbol((0, 1)), cc.Symbol((7,))).shape == (0, 7)
    assert cc.Add().shape == ()


# ----------------------------------------------------------------------- Index


@pytest.mark.parametrize(
    "index",
    [
        3,
        -4,
        (0, 4),
        (slice(0, 4),),
        (slice(-4, None),),
        (slice(None, 5),),
        (slice(2, 1),),
        (torch.tensor([0, 3]),),
        (torch.tensor([-4]),),
        (0, [4]),
        (0, 0, 0),
    ],
)
def test_index_out_of_range(index):
    raises(
        cc.errors.IndexSpecError,
        lambda: cc.Index(x34, index, name="i.range"),
        name="i.range",
        shapes=[(3, 4)],
    )


@pytest.mark.parametrize(
    "index",
    [
        torch.tensor([0.5]),
        torch.tensor([[0]]),
        torch.tensor([True]),
        slice(0, 2, 2),
        0.5,
        "a",
        True,
        [10**20],
        slice(0.5, 2),
    ],
)
def test_index_of_wrong_kind(index):
    raises(
        cc.errors.IndexSpecError, lambda: cc.Index(x34, index, name="i.kind"), name="i.kind", shapes=[(3, 4)]
    )


def test_index_shapes_by_hand():
    assert cc.Index(x34, 1).shape == (4,)
    assert cc.Index(x34, (-1, -1)).shape == ()
    assert cc.Index(x34, (slice(None, -1),)).shape == (2, 4)
    assert cc.Index(x34, (slice(-3, 3), slice(1, None))).shape == (3, 3)
    assert cc.Index(x34, (torch.tensor([2, 2, 0, -1]), 0)).shape == (4,)
    assert cc.Index(x34, (slice(2, 2), [])).shape == (0, 0)
    assert cc.Index(x34, ()).shape == (3, 4)


# ------------------------------------------------------------- GeneralFunction


def test_function_wrong_child_count():
    raises(
        cc.errors.FunctionSpecError,
        lambda: cc.GeneralFunction(x34, v5, spec="softmax", name="f.count"),
        name="f.count",
        shapes=[(3, 4), (5,)],
    )
    raises(
        cc.errors.FunctionSpecError,
        lambda: cc.GeneralFunction.new_by_name(x34, spec_name="gen_index_at_0_c", name="f.gen"),
        name="f.gen",
        shapes=[(3, 4)],
    )


def test_function_unknown_spec_name():
    raises(
        cc.errors.FunctionSpecError,
        lambda: cc.GeneralFunction(x34, spec="no_such_function", name="f.unknown"),
        name="f.unknown",
        shapes=[(3, 4)],
        also=["no_such_function"],
    )


def test_function_spec_that_is_not_a_spec():
    raises(
        cc.errors.FunctionSpecError, lambda: cc.GeneralFunction(x34, spec=3, name="f.three"), name="f.three"
    )


@pytest.mark.parametrize(
    "spec, shapes",
    [
        ("softmax", [()]),
        ("last_dim_size", [()]),
        ("gen_index_at_2_c", [(3, 4), (5,)]),  # x has no axis 2
        ("gen_index_at_0_batch_x_c", [(3, 4), (5,)]),  # batch 3 vs 5
        ("gen_index_at_0_batch_x", [(3, 4), (3, 4)]),  # nothing left to index
    ],
)
def test_function_shapes_that_do_not_fit(spec, shapes):
    nodes = [cc.Symbol(s) for s in shapes]
    raises(
        cc.errors.FunctionSpecError,
        lambda: cc.GeneralFunction(*nodes, spec=spec, name="f.fit"),
        name="f.fit",
        shapes=shapes,
    )


def test_registering_bad_specs():
    with pytest.raises(cc.errors.FunctionSpecError):
        cc.FunctionSpec("has space", 1, lambda s: s[0], torch.exp)
    with pytest.raises(cc.errors.FunctionSpecError):
        cc.register_function(cc.FunctionSpec("softmax", 1, lambda s: s[0], torch.exp))
    with pytest.raises(cc.errors.FunctionSpecError):
        cc.register_function(cc.FunctionSpec("gen_index_at_0", 2, lambda s: s[0], torch.exp))


def test_required_spec_names_are_registered():
    required = """softmax log_softmax rsqrt reciprocal last_dim_size gelu gelu_new relu silu
    sigmoid tanh exp log sqrt sin cos abs""".split()
    assert set(required) <= set(registered_names())
    for name in required:
        assert cc.GeneralFunction(x34, spec=name).shape == ((3,) if name == "last_dim_size" else (3, 4))


# ------------------------------------------------------------------- Rearrange


@pytest.mark.parametrize(
    "pattern, sizes",
    [
        ("a b c -> a", {}),  # three axes for a rank-2 child
        ("a b -> a b (", {}),  # unbalanced parenthesis
        ("a b -> a c", {}),  # c has no size
        ("(a b) c -> a b c", {"a": 5}),  # 3 is not divisible by 5
        ("a b", {}),  # no arrow
        ("a a -> a", {}),  # repeated axis
    ],
)
def test_rearrange_bad_pattern(pattern, sizes):
    raises(
        cc.errors.RearrangeError,
        lambda: cc.Rearrange(x34, pattern, name="r.bad", **sizes),
        name="r.bad",
        shapes=[(3, 4)],
    )


def test_rearrange_bad_sizes_and_pattern_type():
    raises(
        cc.errors.RearrangeError,
        lambda: cc.Rearrange(x34, "a b -> a b c", name="r.size", c=0),
        name="r.size",
        also=["c=0"],
    )
    raises(cc.errors.RearrangeError, lambda: cc.Rearrange(x34, 3, name="r.type"), name="r.type")


def test_rearrange_of_a_huge_child_is_a_rearrange_error():
    huge = cc.Symbol((2**40, 2**40), name="huge")  # each size fits int64, their product does not
    raises(
        cc.errors.RearrangeError,
        lambda: cc.Rearrange(huge, "a b -> (a b)", name="r.huge"),
        name="r.huge",
        shapes=[(2**40, 2**40)],
    )


def test_a_size_past_int64_is_a_leaf_error():
    raises(cc.errors.LeafError, lambda: cc.Symbol((10**20,), name="huge"), name="huge", also=["int64"])


def test_rearrange_shapes_by_hand():
    assert cc.Rearrange(x34, "a b -> b a").shape == (4, 3)
    assert cc.Rearrange(x34, "a b -> (a b)").shape == (12,)
    assert cc.Rearrange(x34, "a (b c) -> a b c", b=2).shape == (3, 2, 2)
    assert cc.Rearrange(x34, "a b -> a n b", n=5).shape == (3, 5, 4)


# ---------------------------------------------------------------------- Concat


def test_concat_mismatch():
    raises(
        cc.errors.ConcatError,
        lambda: cc.Concat(x34, cc.Symbol((3, 5)), axis=0, name="c.bad"),
        name="c.bad",
        shapes=[(3, 4), (3, 5)],
    )
    raises(
        cc.errors.ConcatError,
        lambda: cc.Concat(x34, cc.Symbol((3,)), axis=0, name="c.rank"),
        name="c.rank",
        shapes=[(3, 4), (3,)],
    )


def test_concat_axis_out_of_range_and_other_misuse():
    raises(
        cc.errors.ConcatError,
        lambda: cc.Concat(x34, x34, axis=2, name="c.axis"),
        name="c.axis",
        shapes=[(3, 4)],
    )
    raises(
        cc.errors.ConcatError, lambda: cc.Concat(cc.Symbol(()), axis=0, name="c.r0"), name="c.r0", shapes=[()]
    )
    raises(cc.errors.ConcatError, lambda: cc.Concat(axis=0, name="c.none"), name="c.none")
    raises(cc.errors.ConcatError, lambda: cc.Concat(x34, axis="0", name="c.str"), name="c.str")


def test_concat_shapes_by_hand():
    assert cc.Concat(x34, cc.Symbol((3, 1)), axis=1).shape == (3, 5)
    assert cc.Concat(x34, x34, x34, axis=-2).shape == (9, 4)
    assert cc.Concat(x34, x34, axis=-1).axis == 1


# ----------------------------------------------------------- leaves and types


def test_leaf_errors():
    raises(cc.errors.LeafError, lambda: cc.Symbol((3, -1), name="s.neg"), name="s.neg", shapes=[(3, -1)])
    raises(
        cc.errors.LeafError, lambda: cc.Scalar(1.0, shape=(-2,), name="k.neg"), name="k.neg", shapes=[(-2,)]
    )
    raises(cc.errors.LeafError, lambda: cc.Symbol("ab", name="s.str"), name="s.str")
    raises(cc.errors.LeafError, lambda: cc.Symbol((2.5,), name="s.float"), name="s.float")
    raises(cc.errors.LeafError, lambda: cc.Symbol((True, 2), name="s.bool"), name="s.bool")
    raises(cc.errors.LeafError, lambda: cc.Scalar("1", name="k.str"), name="k.str")
    raises(cc.errors.LeafError, lambda: cc.Scalar(True, name="k.bool"), name="k.bool")
    raises(cc.errors.LeafError, lambda: cc.Array("not a tensor", name="arr.str"), name="arr.str")
    raises(cc.errors.LeafError, lambda: cc.Array.from_hash((3,), "xyz", name="arr.hash"), name="arr.hash")


def test_node_type_errors():
    raises(cc.errors.NodeTypeError, lambda: cc.Symbol((1,), name=5), also=["5"])
    raises(cc.errors.NodeTypeError, lambda: cc.Add(x34, 3, name="t.add"), name="t.add", also=["child 1"])
    raises(cc.errors.NodeTypeError, lambda: cc.Index(3, 0, name="t.index"), name="t.index")
    raises(cc.errors.NodeTypeError, lambda: cc.Rearrange("x", "a -> a", name="t.re"), name="t.re")
    raises(cc.errors.NodeTypeError, lambda: cc.Einsum((3, "a"), out_axes="a", name="t.ein"), name="t.ein")
    raises(cc.errors.NodeTypeError, lambda: cc.GeneralFunction(3, spec="exp", name="t.gf"), name="t.gf")
    raises(cc.errors.NodeTypeError, lambda: cc.Concat(3, axis=0, name="t.cat"), name="t.cat")


def test_unnamed_nodes_are_described_as_unnamed():
    message = raises(cc.errors.BroadcastError, lambda: cc.Add(x34, v5), shapes=[(3, 4), (5,)])
    assert "unnamed Add" in message


def test_rename_and_evolve_are_checked_like_construction():
    add = cc.Add(x34, name="ok")
    raises(cc.errors.BroadcastError, lambda: add.evolve(children=(x34, v5)), name="ok", shapes=[(3, 4), (5,)])
    raises(cc.errors.NodeTypeError, lambda: add.rename(7))


# ------------------------------------------------------- equality and hashing


def build_small(tensor_fn=lambda: torch.arange(12.0).reshape(3, 4)):
    """A small circuit of every variant, built from scratch on each call."""
    a = cc.Array(tensor_fn(), name="w")
    s = cc.Symbol((4,), name="toks")
    e = cc.Einsum.from_einsum_string("ab,b->a", a, s, name="mv")
    k = cc.Scalar(-1.0, shape=(3,), name="neg")
    add = cc.Add(e, k, name="sum")
    f = cc.GeneralFunction(add, spec="softmax", name="p")
    i = cc.Index(a, (torch.tensor([2, 0]), slice(1, None)), name="idx")
    r = cc.Rearrange(i, "a b -> (a b)")
    c = cc.Concat(f, r, axis=0, name="cat")
    return c


def test_separately_built_equal_circuits_are_equal_and_hash_alike():
    one, two = build_small(), build_small()
    assert one is not two
    assert one == two
    assert one.hash == two.hash
    assert hash(one) == hash(two)
    assert len({one, two}) == 1
    assert {one: 1}[two] == 1
    assert one.shape == (9,)  # softmax over [3] plus (2 rows x 3 cols) flattened


def test_array_hash_is_by_content_not_layout():
    t = torch.arange(12.0).reshape(3, 4)
    assert cc.Array(t.T) == cc.Array(t.T.contiguous())
    assert cc.Array(t.clone()) == cc.Array(t)


@pytest.mark.parametrize(
    "other",
    [
        lambda: cc.Array(torch.arange(12.0).reshape(3, 4), name="v"),  # name
        lambda: cc.Array(torch.arange(12.0).reshape(3, 4)),  # no name
        lambda: cc.Array(torch.arange(12.0).reshape(3, 4), name=""),  # empty name
        lambda: cc.Array(torch.arange(12.0).reshape(3, 4).flip(0), name="w"),  # contents
        lambda: cc.Array(torch.arange(12.0, dtype=torch.float64).reshape(3, 4), name="w"),  # dtype
        lambda: cc.Array(torch.arange(12).reshape(3, 4), name="w"),  # int dtype, same values
        lambda: cc.Array(torch.arange(12.0).reshape(4, 3), name="w"),  # shape, same bytes
        lambda: cc.Array(torch.arange(12.0), name="w"),  # rank, same bytes
    ],
)
def test_arrays_that_differ(other):
    base = cc.Array(torch.arange(12.0).reshape(3, 4), name="w")
    assert base != other()
    assert base.hash != other().hash


def test_nodes_that_differ_in_one_field():
    s = cc.Symbol((3,), name="s")
    pairs = [
        (cc.Symbol((3,)), cc.Symbol((3,), name="")),
        (cc.Symbol((3,), name="s"), cc.Symbol((4,), name="s")),
        (cc.Scalar(1.0), cc.Scalar(-1.0)),
        (cc.Scalar(0.0), cc.Scalar(-0.0)),
        (cc.Scalar(1.0, shape=(3,)), cc.Scalar(1.0, shape=(1, 3))),
        (cc.Einsum.from_einsum_string("a->a", s), cc.Einsum.from_einsum_string("a->", s)),
        (
            cc.Einsum.from_einsum_string("a,a->a", s, cc.Symbol((3,), name="t")),
            cc.Einsum.from_einsum_string("a,a->a", cc.Symbol((3,), name="t"), s),
        ),
        (cc.Add(s, s), cc.Add(s)),
        (cc.GeneralFunction(s, spec="exp"), cc.GeneralFunction(s, spec="log")),
        (cc.Index(s, torch.tensor([0, 1])), cc.Index(s, torch.tensor([1, 0]))),
        (cc.Index(s, 0), cc.Index(s, -3)),  # spelled differently, printed differently
        (cc.Rearrange(s, "a -> a n", n=2), cc.Rearrange(s, "a -> a n", n=3)),
        (cc.Concat(s, s, axis=0), cc.Concat(s, s, s, axis=0)),
        (cc.Add(s, name="x"), cc.Concat(s, axis=0, name="x")),
    ]
    for a, b in pairs:
        assert a != b, (a, b)
        assert a.hash != b.hash


def test_equal_whatever_the_spelling():
    s = cc.Symbol((2, 3), name="s")
    assert cc.Rearrange(s, "a b->b a") == cc.Rearrange(s, "a  b  ->  b a")
    assert cc.Einsum.from_einsum_string("ab->b", s) == cc.Einsum((s, (0, 1)), out_axes=(1,))
    assert cc.Concat(s, s, axis=-1) == cc.Concat(s, s, axis=1)
    assert cc.Index(s, 1) == cc.Index(s, (1, slice(None, None)))
    assert cc.Index(s, (0, [2, 1])) == cc.Index(s, (0, torch.tensor([2, 1], dtype=torch.int32)))
    assert cc.Scalar(2) == cc.Scalar(2.0)


def test_nodes_are_frozen():
    add = cc.Add(x34, name="frozen")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        add.name = "other"


def test_a_node_shared_many_times_is_one_distinct_node():
    shared = cc.Einsum.from_einsum_string("ab->a", x34, name="shared")
    node = shared
    for _ in range(200):
        node = cc.Add(node, shared)
    # 200 Adds + shared + x; a naive tree walk would see 2**k copies
    assert len(cc.unique_nodes([node])) == 202
    # separately built equal nodes also count once
    twin = cc.Add(cc.Symbol((3,), name="q"), cc.Symbol((3,), name="q"), name="twins")
    assert len(cc.unique_nodes([twin])) == 2
    assert twin.repr() == "'twins' Add\n  'q' [3] Symbol\n  'q'"


# --------------------------------------------------------- the gen_index family


@pytest.mark.parametrize(
    "spec, x, index, expected",
    [
        # docs/format.md: embedding lookup, the index's axes come first
        ("gen_index_at_0_c", (7, 5), (3,), (3, 5)),
        ("gen_index_at_0_c", (7, 5), (2, 3), (2, 3, 5)),
        ("gen_index_at_1", (2, 7, 5), (3,), (3, 2, 5)),
        ("gen_index_at_-1", (2, 7), (3,), (3, 2)),
        ("gen_index_at_0", (7,), (), ()),
        # docs/format.md: log_probs[S,V] with toks[S] gives [S]
        ("gen_index_at_0_batch_x_c", (3, 7), (3,), (3,)),
        # _batch_x: D counts within x's remaining axes
        ("gen_index_at_1_batch_x", (3, 2, 7), (3,), (3, 2)),
        ("gen_index_at_0_batch_x", (3, 7, 2), (3,), (3, 2)),
        # _no_batch_index: the index's axes replace axis D in place
        ("gen_index_at_1_no_batch_index", (2, 7, 5), (3,), (2, 3, 5)),
        ("gen_index_at_1_no_batch_index_c", (2, 7, 5), (3, 4), (2, 3, 4, 5)),
        ("gen_index_at_0_no_batch_index", (7, 5), (3,), (3, 5)),
    ],
)
def test_gen_index_shapes_follow_format_md(spec, x, index, expected):
    node = cc.GeneralFunction(cc.Symbol(x, name="x"), cc.Symbol(index, name="i"), spec=spec, name="g")
    assert node.shape == expected
    assert cc.parse(node.repr()) == node


def test_gen_index_values_follow_format_md():
    emb = torch.arange(35.0).reshape(7, 5)
    toks = torch.tensor([6, 0, 3])
    lookup = get_function("gen_index_at_0_c").function(emb, toks)
    assert torch.equal(lookup, emb[toks])
    log_probs = torch.arange(21.0).reshape(3, 7)
    picked = get_function("gen_index_at_0_batch_x_c").function(log_probs, toks)
    assert torch.equal(picked, torch.stack([log_probs[s, toks[s]] for s in range(3)]))
    x = torch.arange(70.0).reshape(2, 7, 5)
    in_place = get_function("gen_index_at_1_no_batch_index").function(x, toks)
    assert torch.equal(in_place, torch.index_select(x, 1, toks))
    first = get_function("gen_index_at_1").function(x, toks)
    assert torch.equal(first, x[:, toks, :].permute(1, 0, 2))
    with pytest.raises(Exception):
        get_function("gen_index_at_0_c").function(emb, torch.tensor([7]))
    with pytest.raises(Exception):
        get_function("gen_index_at_0_c").function(emb, torch.tensor([-1]))


# ------------------------------------------------------------- user functions

USER = "test_errors.cumsum_last"


def _user_shape(shapes):
    (shape,) = shapes
    if not shape:
        raise ValueError("needs at least one axis")
    return shape


cc.register_function(cc.FunctionSpec(USER, 1, _user_shape, lambda t: torch.cumsum(t, dim=-1)), replace=True)
PAIR = "test_errors.outer-pair"
cc.register_function(
    cc.FunctionSpec(PAIR, 2, lambda s: tuple(s[0]) + tuple(s[1]), lambda a, b: torch.einsum("i,j->ij", a, b)),
    replace=True,
)


def test_user_spec_prints_and_parses_by_name():
    node = cc.GeneralFunction.new_by_name(x34, spec_name=USER, name="mine")
    text = "'mine' GeneralFunction test_errors.cumsum_last\n  'x' [3,4] Symbol"
    assert node.repr() == text
    parsed = cc.parse(text)
    assert parsed == node
    assert parsed.spec is get_function(USER)
    assert parsed.shape == (3, 4)
    assert USER in registered_names()

    pair = cc.GeneralFunction(v5, y52, spec=PAIR)
    assert pair.shape == (5, 5, 2)
    text = "0 GeneralFunction test_errors.outer-pair\n  'v' [5] Symbol\n  'y' [5,2] Symbol"
    assert pair.repr() == text
    assert cc.parse(text) == pair


def test_user_spec_shape_rule_errors_name_the_node():
    raises(
        cc.errors.FunctionSpecError,
        lambda: cc.GeneralFunction(cc.Symbol(()), spec=USER, name="mine.bad"),
        name="mine.bad",
        shapes=[()],
        also=["needs at least one axis"],
    )
