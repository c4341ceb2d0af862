"""rust_circuit's Tag and Scatter nodes, Symbols with a uuid, and its two other Einsum forms.

Texts are written as rust_circuit prints them (the spellings come from its
``print.rs`` and ``parsing.rs``, several straight from its
``test_rust_printing.py``); every expected value is computed here with
torch, element by element or with torch's own ops, never with this
library's evaluator; every parsed circuit is reprinted and read back equal.
"""

from __future__ import annotations

import copy
import functools
import pickle
import uuid

import pytest
import torch

import circuits as cc
from parse_helpers import parse_error
from parse_helpers import parsed as _parsed

U1 = "1a280c74-fa9f-4dd9-94f4-5cca4a0cf243"  # the uuid of rust_circuit's own tests
U2 = "6c6805a0-3aaf-492c-93a3-00851eacaacf"


#: parsed, and the circuit read back from our reprint reprints the same
parsed = functools.partial(_parsed, same_reprint=True)


def values(shape, seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


# ------------------------------------------------------------------ Tag


def test_tag_as_rust_circuit_prints_it():
    tag = parsed(f"3 Tag {U1}\n  2 [3, 3, 3] Scalar 1.2")
    assert isinstance(tag, cc.Tag) and tag.uuid == uuid.UUID(U1)
    assert tag.repr() == f"0 Tag {U1}\n  1 [3,3,3] Scalar 1.2"
    assert torch.equal(tag.evaluate(), torch.full((3, 3, 3), 1.2))


def test_tag_value_is_its_child_and_gradients_pass():
    x = values((2, 3)).requires_grad_()
    tag = cc.Tag(cc.Array(x, name="x"), U1, name="t")
    result = tag.evaluate()
    assert torch.equal(result, x)
    (result * result).sum().backward()
    assert torch.equal(x.grad, 2 * x.detach())


def test_tags_keep_equal_subtrees_apart():
    x = cc.Symbol((2,), name="x")
    first, second = cc.Tag(x, U1), cc.Tag(x, U2)
    assert first != second and first.hash != second.hash
    assert first == cc.Tag(cc.Symbol((2,), name="x"), uuid.UUID(U1))
    assert first != x and cc.Tag(x, U1, name="n") != first
    both = cc.Add(first, second)
    text = both.repr()
    assert text == f"0 Add\n  1 Tag {U1}\n    'x' [2] Symbol\n  2 Tag {U2}\n    'x'"
    assert cc.parse(text) == both


def test_tag_uuid_spellings_read_as_one_uuid():
    x = cc.Scalar(1.0, (2,), name="x")
    spellings = [U1, U1.upper(), "{" + U1 + "}", "urn:uuid:" + U1, U1.replace("-", ""), uuid.UUID(U1)]
    tags = {cc.Tag(x, spelling) for spelling in spellings}
    assert len(tags) == 1 and next(iter(tags)).extra == U1
    line = cc.parse(f"0 Tag {U1.upper()}\n  'x' [2] Scalar 1")
    assert line == cc.Tag(x, U1)


def test_new_with_random_uuid_differs_each_time():
    x = cc.Scalar(1.0, (2,))
    tags = [cc.Tag.new_with_random_uuid(x, name="t") for _ in range(3)]
    assert len({t.uuid for t in tags}) == 3 and all(t.name == "t" and t.node is x for t in tags)


def test_tag_rebuilds_keep_the_uuid():
    x, y = cc.Scalar(1.0, (2,), name="x"), cc.Scalar(2.0, (2,), name="y")
    tag = cc.Tag(x, U1, name="t")
    assert tag.with_children([y]) == cc.Tag(y, U1, name="t")
    assert tag.with_children([cc.Scalar(2.0, (5,))]).shape == (5,)
    assert tag.evolve(uuid=U2) == cc.Tag(x, U2, name="t")
    assert tag.update("x", lambda n: y).uuid == uuid.UUID(U1)


def test_tag_errors_name_the_node():
    x = cc.Scalar(1.0, (2,))
    with pytest.raises(cc.errors.TagError, match=r"Tag 't'.*'not-a-uuid'"):
        cc.Tag(x, "not-a-uuid", name="t")
    with pytest.raises(cc.errors.TagError, match=r"Tag 't'.*int"):
        cc.Tag(x, 5, name="t")
    with pytest.raises(cc.errors.NodeTypeError, match="Tag 't'"):
        cc.Tag(torch.ones(2), U1, name="t")
    with pytest.raises(cc.errors.TagError, match="exactly one child"):
        cc.Tag(x, U1).evolve(children=(x, x))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0 Tag 1a280c74\n  1 [2] Scalar 1", "not a uuid"),
        ("0 Tag\n  1 [2] Scalar 1", "Tag needs its uuid"),
        (f"0 Tag {U1}", "Tag takes one child, found 0"),
        (f"0 Tag {U1}\n  1 [2] Scalar 1\n  2 [2] Scalar 1", "Tag takes one child, found 2"),
        (f"0 [3] Tag {U1}\n  1 [2] Scalar 1", "shape [3]"),
    ],
)
def test_tag_parse_errors_name_the_line(text, expected):
    error = parse_error(text)
    assert error.line_number == 1 and expected in error.message


# ------------------------------------------------------------------ Scatter

RUST_SCATTERS = """
0 [5, 3, 6] Add
  1 [3, 1] Scatter [0:2,0:1]
    2 [2, 1] Scalar 1.0
  10 [5, 3, 6] Scatter [0:5,0:3,0:3]
    4 [5, 3, 3] Concat 0
      5 [2, 3, 3] Scalar 1.2
      6 [3, 3, 3] Scalar 1.2"""


def test_scatter_as_rust_circuit_prints_it():
    circuit = parsed(RUST_SCATTERS)
    small = torch.zeros(3, 1)
    small[0:2, 0:1] = torch.ones(2, 1)
    big = torch.zeros(5, 3, 6)
    big[0:5, 0:3, 0:3] = torch.full((5, 3, 3), 1.2)
    torch.testing.assert_close(circuit.evaluate(), small + big, rtol=0, atol=0)
    scatter = circuit.children[0]
    assert isinstance(scatter, cc.Scatter) and scatter.shape == (3, 1) and scatter.extra == "[0:2,0:1]"


def test_rust_circuits_own_reprint_of_scatters_byte_for_byte():
    """rust_circuit's test_rust_printing_bijection_many: its printer's output for these circuits."""
    text = """
# extra
3 '0' [1, 3, 6] Scalar 7
4 '1' [5, 3, 6] Scatter [0:5,0:3,0:3]
  5 Concat 0
    6 [2, 3, 3] Scalar 1.2
    7 [3, 3, 3] Scalar 1.2
# we can include newlines between

0 Add
  1 [3, 1] Scatter [0:2,0:1]
    2 [2, 1] Scalar 1
  # now below is repeated
  3
  4
  8 'ein' Einsum abc->abc
    4
  3"""
    rust_printed = """'0' [1,3,6] Scalar 7
'1' [5,3,6] Scatter [0:5,0:3,0:3]
  0 Concat 0
    1 [2,3,3] Scalar 1.2
    2 [3,3,3] Scalar 1.2
3 Add
  4 [3,1] Scatter [0:2,0:1]
    5 [2,1] Scalar 1
  '0'
  '1'
  'ein' Einsum abc->abc
    '1'
  '0'"""
    roots = cc.parse_many(text)
    assert cc.repr_many(roots) == rust_printed
    assert cc.parse_many(rust_printed) == roots


@pytest.mark.parametrize("index", ["[1:3,2:4]", "[1:3, 2:4]", "[-3:3,2:]", "[1:-1,-2:4]", "[ 1 : 3 , 2 : ]"])
def test_scatter_index_spellings_are_one_node(index):
    x = values((2, 2))
    scatter = parsed(f"'s' [4,4] Scatter {index}\n  'x' [2,2] Array rand")
    assert scatter.extra == "[1:3,2:4]"
    expected = torch.zeros(4, 4, dtype=scatter.node.value.dtype)
    expected[1:3, 2:4] = scatter.node.value
    assert torch.equal(scatter.evaluate(), expected)
    assert cc.Scatter(cc.Array(x), (slice(1, 3), slice(2, None)), (4, 4)) == cc.Scatter(
        cc.Array(x), (slice(-3, -1), slice(-2, 4)), (4, 4)
    )


def test_scatter_pads_missing_items_with_full_slices():
    x = values((2, 3))
    scatter = cc.Scatter(cc.Array(x, name="x"), slice(1, 3), (4, 3), name="s")
    assert scatter.index == (slice(1, 3), slice(0, 3)) and scatter.extra == "[1:3,0:3]"
    expected = torch.cat([torch.zeros(1, 3, dtype=x.dtype), x, torch.zeros(1, 3, dtype=x.dtype)])
    assert torch.equal(scatter.evaluate(), expected)


def test_scatter_keeps_dtype_and_gradients():
    x = values((2, 3)).requires_grad_()
    scatter = cc.Scatter(cc.Array(x, name="x"), (slice(1, 3), slice(0, 3)), (3, 5))
    weights = values((3, 5), seed=1)
    (scatter.evaluate() * weights).sum().backward()
    assert torch.equal(x.grad, weights[1:3, 0:3])
    ints = cc.Scatter(cc.Array(torch.tensor([4, 5])), slice(1, 3), (4,))
    assert torch.equal(ints.evaluate(), torch.tensor([0, 4, 5, 0]))


@pytest.mark.parametrize(
    ("index", "shape", "expected"),
    [
        ((0, slice(None)), (3, 1), "0 is not a slice"),
        ((torch.tensor([0, 1]),), (3,), "not a slice"),
        ((slice(0, 5),), (3,), "out of range"),
        ((slice(2, 1),), (3,), "ends before it starts"),
        ((slice(0, 3, 2),), (3,), "step 2"),
        ((slice(0, 1),), (3,), "selects shape [1], but the child has shape [2]"),
        ((slice(0, 2), slice(None), slice(None)), (3,), "rank 1"),
    ],
)
def test_scatter_errors_name_the_node(index, shape, expected):
    with pytest.raises(cc.errors.IndexSpecError, match="Scatter 's'") as info:
        cc.Scatter(cc.Scalar(1.0, (2,) + (1,) * (len(index) > 1 and len(shape) > 1)), index, shape, name="s")
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0 [3,1] Scatter [0,0:1]\n  1 [1] Scalar 1", "not a slice"),
        ("0 Scatter [0:2]\n  1 [2] Scalar 1", "Scatter needs its shape"),
        ("0 [3] Scatter [0:1]\n  1 [2] Scalar 1", "child has shape [2]"),
        ("0 [3] Scatter [0:9]\n  1 [2] Scalar 1", "out of range"),
        ("0 [3] Scatter 0:2\n  1 [2] Scalar 1", "[...]"),
        ("0 [3] Scatter [0:2]", "Scatter takes one child, found 0"),
        ("0 [3] Scatter [t292d9fdb22 [2]]\n  1 [2] Scalar 1", "t292d9fdb22"),
    ],
)
def test_scatter_parse_errors_name_the_line(text, expected):
    error = parse_error(text)
    assert error.line_number == 1 and expected in error.message


# ------------------------------------------------------------------ Symbol uuids


def test_symbol_with_a_uuid_as_rust_circuit_prints_it():
    symbol = parsed(f"'x' [2, 3] Symbol {U1}")
    assert symbol.uuid == uuid.UUID(U1) and symbol.repr() == f"'x' [2,3] Symbol {U1}"
    assert symbol != cc.Symbol((2, 3), name="x")
    assert symbol == cc.Symbol((2, 3), name="x", uuid=U1)
    assert cc.Symbol((2, 3), name="x").repr() == "'x' [2,3] Symbol"  # no uuid: printed as before


def test_nil_uuid_is_no_uuid_as_in_rust_circuit():
    nil = "00000000-0000-0000-0000-000000000000"
    assert cc.Symbol((2,), name="x", uuid=nil) == cc.Symbol((2,), name="x")
    assert cc.Symbol.new_with_none_uuid((2,), name="x").uuid is None
    assert cc.parse(f"'x' [2] Symbol {nil}").repr() == "'x' [2] Symbol"


def test_symbols_differing_only_in_uuid_are_two_inputs():
    a, b = cc.Symbol((3,), name="x", uuid=U1), cc.Symbol((3,), name="x", uuid=U2)
    total = cc.Add(a, b, name="sum")
    text = total.repr()
    assert text == f"'sum' Add\n  0 'x' [3] Symbol {U1}\n  1 'x' [3] Symbol {U2}"
    assert cc.parse(text) == total
    one, two = torch.tensor([1.0, 2, 3]), torch.tensor([10.0, 20, 30])
    assert torch.equal(total.evaluate(inputs={a: one, b: two}), one + two)


def test_symbol_rand_draws_a_uuid_from_the_line():
    first = cc.parse("'x' [2] Symbol rand")
    assert first.uuid is not None and first.uuid.version == 4
    assert cc.parse("'x' [2] Symbol rand") == first  # the same text, the same uuid
    assert cc.parse("'y' [2] Symbol rand").uuid != first.uuid
    assert cc.parse(first.repr()) == first and "rand" not in first.repr()
    assert len({cc.Symbol.new_with_random_uuid((2,), name="x") for _ in range(3)}) == 3


def test_symbol_uuid_errors():
    with pytest.raises(cc.errors.LeafError, match="Symbol 'x'.*not a uuid"):
        cc.Symbol((2,), name="x", uuid="xyz")
    error = parse_error("'x' [2] Symbol 1a28-nope")
    assert error.line_number == 1 and "not a uuid" in error.message


# ------------------------------------------------------------------ diagonal-output Einsums


def test_diagonal_embedding_ab_abaa():
    node = parsed("'e' Einsum ab->abaa\n  'x' [2,3] Array rand")
    x = node.children[0].value
    expected = torch.zeros(2, 3, 2, 2, dtype=x.dtype)
    for a in range(2):
        for b in range(3):
            expected[a, b, a, a] = x[a, b]
    assert node.shape == (2, 3, 2, 2)
    assert torch.equal(node.evaluate(), expected)


def test_diagonal_embedding_matches_torch_diag_and_gradients():
    x = values((4,)).requires_grad_()
    node = cc.Einsum.from_einsum_string("a->aa", cc.Array(x, name="x"))
    result = node.evaluate()
    assert torch.equal(result, torch.diag(x.detach()))
    weights = values((4, 4), seed=3)
    (result * weights).sum().backward()
    assert torch.equal(x.grad, torch.diagonal(weights))


def test_diagonal_embedding_of_a_contraction():
    x, y = values((2, 3)), values((3, 4), seed=1)
    node = cc.Einsum.from_einsum_string("ab,bc->acaa", cc.Array(x), cc.Array(y))
    product = x @ y
    expected = torch.zeros(2, 4, 2, 2, dtype=x.dtype)
    for a in range(2):
        expected[a, :, a, a] = product[a]
    torch.testing.assert_close(node.evaluate(), expected)
    assert node.repeats_output_axes and node.extra == "ab,bc->acaa"


def test_diagonal_embedding_in_fancy_spelling_and_size_zero():
    node = parsed("'e' Einsum fancy: row col -> row col row\n  'x' [2,0] Array rand")
    assert node.extra == "ab->aba" and node.shape == (2, 0, 2)
    assert node.evaluate().shape == (2, 0, 2)


def test_diagonal_embedding_through_passes_keeps_its_value():
    x = cc.Array(values((3,)), name="x")
    two = cc.Scalar(2.0, name="two")
    inner = cc.Einsum.from_einsum_string("a,->aa", x, two, name="diag")
    outer = cc.Einsum.from_einsum_string("ab,->ab", inner, cc.Scalar(0.5), name="outer")
    expected = torch.diag(x.value)
    for rewritten in (
        cc.passes.simplify(outer),
        cc.passes.canonicalize(outer),
        cc.passes.push_down_index(cc.Index(outer, (0,))),
    ):
        got = rewritten.evaluate()
        torch.testing.assert_close(got, expected if got.ndim == 2 else expected[0])
    assert (
        cc.passes.simplify(cc.Einsum.from_einsum_string("a->aa", cc.Scalar(2.0, (3,))))
        .evaluate()
        .equal(torch.diag(torch.full((3,), 2.0)))
    )


def test_diagonal_embedding_letter_sizes_must_agree():
    with pytest.raises(cc.errors.EinsumError, match="Einsum 'e'.*'a'"):
        cc.Einsum.from_einsum_string("ab,a->aa", cc.Scalar(1.0, (2, 3)), cc.Scalar(1.0, (3,)), name="e")


# ------------------------------------------------------------------ the empty product


def test_zero_operand_einsum_as_rust_circuit_parses_it():
    """rust_circuit's test_empty_einsum_parse: ``0 [] Einsum ->`` is ``Einsum(out_axes=())``."""
    node = parsed("0 [] Einsum ->")
    assert node == cc.Einsum(out_axes=()) == cc.Einsum.from_einsum_string("->")
    assert node.children == () and node.shape == () and node.repr() == "0 Einsum ->"
    assert torch.equal(node.evaluate(), torch.tensor(1.0))
    assert node.evaluate(dtype=torch.float64).dtype == torch.float64


def test_zero_operand_einsum_is_not_the_one_operand_einsum():
    one_operand = parsed("0 Einsum ->\n  1 [] Scalar 3")
    assert len(one_operand.children) == 1 and torch.equal(one_operand.evaluate(), torch.tensor(3.0))
    assert one_operand != cc.Einsum(out_axes=())


def test_zero_operand_einsum_as_an_operand_and_a_root():
    x = values((3,))
    node = cc.Einsum.from_einsum_string("a,->a", cc.Array(x, name="x"), cc.Einsum(out_axes=(), name="one"))
    assert torch.equal(node.evaluate(), x)
    root = cc.Einsum(out_axes=(), name="one").evaluate()
    root.add_(1)  # a root's value is its own memory
    assert torch.equal(cc.Einsum(out_axes=(), name="one").evaluate(), torch.tensor(1.0))
    assert cc.cost(node).total.flop_count == 3


def test_zero_operand_einsum_errors():
    with pytest.raises(cc.errors.EinsumError, match="Einsum 'e'"):
        cc.Einsum(out_axes="a", name="e")
    error = parse_error("0 [2] Einsum ->")
    assert error.line_number == 1 and "shape [2]" in error.message


# ------------------------------------------------------------------ every kind together

EVERY_KIND = f"""'all' Add
  'scatter' [3,3] Scatter [1:3,0:3]
    'x' [2,3] Array rand
  'tag' Tag {U1}
    'diag' Einsum b->bb
      'v' [3] Array rand
  'sym' [3,3] Symbol {U2}
  'one' Einsum ->"""


def every_kind_reference(circuit: cc.Circuit, bound: torch.Tensor) -> torch.Tensor:
    x, v = circuit.get_unique("x").value, circuit.get_unique("v").value
    scattered = torch.zeros(3, 3, dtype=x.dtype)
    scattered[1:3, 0:3] = x
    return scattered + torch.diag(v) + bound + 1


def test_every_kind_evaluates_and_round_trips_through_files(tmp_path):
    circuit = parsed(EVERY_KIND)
    bound = values((3, 3), seed=7).float()
    expected = every_kind_reference(circuit, bound)
    torch.testing.assert_close(circuit.evaluate(inputs={circuit.get_unique("sym"): bound}), expected)
    path = cc.save(circuit, tmp_path / "every.circ")
    loaded = cc.load(path)
    assert loaded == circuit and loaded.repr() == circuit.repr()
    torch.testing.assert_close(loaded.evaluate(inputs={"sym": bound}), expected)
    for copied in (pickle.loads(pickle.dumps(circuit)), copy.deepcopy(circuit)):
        assert copied == circuit and copied.repr() == circuit.repr()


def test_every_kind_expands_over_a_batch():
    circuit = cc.parse(EVERY_KIND)
    batch = values((2, 2, 3), seed=4).float()
    expanded = cc.expand(circuit, {"x": cc.Array(batch, name="x")})
    assert expanded.shape == (2, 3, 3)
    bound = values((3, 3), seed=5).float()
    got = expanded.evaluate(inputs={"sym": bound})
    v = circuit.get_unique("v").value
    for b in range(2):
        scattered = torch.zeros(3, 3)
        scattered[1:3] = batch[b]
        torch.testing.assert_close(got[b], scattered + torch.diag(v) + bound + 1)
    tag = expanded.get_unique("tag")
    assert tag.uuid == uuid.UUID(U1)


def test_every_kind_has_a_cost():
    circuit = cc.parse(EVERY_KIND)
    costs = cc.cost(circuit)
    tag, scatter = (
        costs.by_hash[circuit.get_unique("tag").hash],
        costs.by_hash[circuit.get_unique("scatter").hash],
    )
    assert tag.view and tag.allocated_bytes == 0
    assert not scatter.view and scatter.written_bytes == 9 * 4 and scatter.flop_count == 0
    assert costs.by_hash[circuit.get_unique("one").hash].allocated_bytes == 0
