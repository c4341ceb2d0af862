"""More of rust_circuit's printed spellings: sized rearranges, index tensors by hash, random arrays.

Each text is written as rust_circuit prints it (the spellings come from its
parser, printer and tests); the expected circuit or value is built
independently with the node constructors, einops or torch.  Each parsed
circuit reprints in our canonical form and reads back equal.
"""

from __future__ import annotations

import einops
import pytest
import torch

import circuits as cc
from circuits.text.store import TensorStore
from parse_helpers import parse_error, parsed


@pytest.fixture
def store(tmp_path) -> TensorStore:
    return TensorStore(tmp_path / "tensors")


X = torch.arange(6.0)


def saved(store: TensorStore, tensor: torch.Tensor) -> str:
    """The hash prefix a printed Array carries for ``tensor``, after saving it."""
    return store.save(tensor)[:24]


# ------------------------------------------------------------ sized rearranges


@pytest.mark.parametrize(
    ("spec", "einops_pattern", "sizes"),
    [
        ("(a:2 b) -> a:2 b", "(a b) -> a b", {"a": 2}),  # rust_circuit's bilinear_mlp fold
        ("(a:2 b:3) -> b a", "(a b) -> b a", {"a": 2, "b": 3}),
        ("(a b:3) -> (b:3 a)", "(a b) -> (b a)", {"b": 3}),
        ("a -> a c:4", "a -> a c", {"c": 4}),  # a new axis, sized where it appears
        ("a -> (c:2 a)", "a -> (c a)", {"c": 2}),
        ("( a:3 b ) -> b a", "(a b) -> b a", {"a": 3}),
        ("a -> 3 a", "a -> 3 a", {}),  # anonymous sized axes read as einops reads them
        ("(a:3 b) -> a 1 b", "(a b) -> a 1 b", {"a": 3}),
    ],
)
def test_rearrange_with_sized_axes(store, spec, einops_pattern, sizes):
    text = f"'r' Rearrange {spec}\n  'x' [6] Array {saved(store, X)}"
    circuit = parsed(text, store)
    assert circuit == cc.Rearrange(cc.Array(X, name="x"), einops_pattern, name="r", sizes=sizes)
    assert torch.equal(circuit.evaluate(), einops.repeat(X, einops_pattern, **sizes))


def test_sized_rearrange_values_match_torch(store):
    text = f"0 Rearrange (a:2 b:3) -> b a\n  1 [6] Array {saved(store, X)}"
    assert torch.equal(parsed(text, store).evaluate(), X.reshape(2, 3).T)


def test_rearrange_size_in_both_spellings_agrees():
    circuit = parsed("'r' Rearrange (a:2 b) -> a b, a=2\n  'x' [6] Scalar 1")
    assert circuit == cc.Rearrange(cc.Scalar(1.0, shape=(6,), name="x"), "(a b) -> a b", name="r", a=2)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("(a:2 b) -> a:3 b", "two sizes"),
        ("(a:2 b) -> a b, a=3", "two sizes"),
        ("(a:0s b) -> a b", "symbolic size"),
        ("(a:x b) -> a b", "int size"),
        ("(a:² b) -> a b", "int size"),
        ("(1a:2 b) -> a b", "expected a name"),
    ],
)
def test_bad_sized_axes_are_parse_errors(spec, expected):
    error = parse_error(f"'r' Rearrange {spec}\n  'x' [6] Scalar 1")
    assert expected in str(error)
    assert error.line_number == 1


# ------------------------------------------------------ index tensors by hash


def test_index_tensor_by_hash_loads_from_the_store(store):
    table = torch.arange(100.0).reshape(10, 10)
    rows = torch.tensor([1, 2, 3, 3, 2, 1], dtype=torch.int64)
    prefix = store.save(rows)[:10]  # rust_circuit prints t + 10 hex digits and the length
    text = f"0 [6] Index [t{prefix} [6],0]\n  'x' [10,10] Array {saved(store, table)}"
    circuit = parsed(text, store)
    assert circuit == cc.Index(cc.Array(table, name="x"), (rows, 0))
    assert torch.equal(circuit.evaluate(), table[rows, 0])


def test_index_tensor_by_hash_with_spaces_and_other_items(store):
    table = torch.arange(24.0).reshape(2, 3, 4)
    picks = torch.tensor([3, 0], dtype=torch.int64)
    prefix = store.save(picks)[:10]
    text = f"'i' Index [1, :2, t{prefix} [2]]\n  'x' [2,3,4] Array {saved(store, table)}"
    circuit = parsed(text, store)
    assert circuit == cc.Index(cc.Array(table, name="x"), (1, slice(None, 2), picks), name="i")
    assert torch.equal(circuit.evaluate(), table[1, :2][:, picks])


def test_index_tensor_without_the_store_names_the_hash():
    error = parse_error("0 [6] Index [t292d9fdb22 [6],0]\n  1 [10,10] Scalar 1")
    assert "t292d9fdb22" in str(error) and "store=" in str(error)
    assert error.line_number == 1


def test_index_tensor_of_the_wrong_length_is_refused(store):
    prefix = store.save(torch.tensor([0, 1], dtype=torch.int64))[:10]
    error = parse_error(f"0 Index [t{prefix} [3]]\n  1 [4] Scalar 1", store)
    assert "[3]" in str(error) and "[2]" in str(error)


def test_index_tensor_missing_from_the_store_is_a_parse_error(store):
    error = parse_error("0 Index [t0123456789 [3]]\n  1 [4] Scalar 1", store)
    assert "0123456789" in str(error)


# ------------------------------------------------------------- random arrays


def test_array_rand_has_the_printed_shape_and_is_deterministic():
    text = "'w' [3,4] Array rand"
    first, second = parsed(text), cc.parse(text)
    assert first.shape == (3, 4) and first.name == "w"
    assert torch.equal(first.evaluate(), second.evaluate())
    assert first.evaluate().std() > 0  # not a constant


def test_random_arrays_differ_by_name_and_serial():
    one, two, three = cc.parse_many("'a' [5] Array rand\n'b' [5] Array rand\n0 [5] Array rand")
    four = cc.parse("1 [5] Array rand")
    values = [node.evaluate() for node in (one, two, three, four)]
    for i in range(len(values)):
        for j in range(i):
            assert not torch.equal(values[i], values[j])


def test_random_arrays_evaluate_in_a_circuit():
    text = "'y' Einsum ab,b->a\n  'w' [3,4] Array rand\n  'v' [4] Array rand"
    circuit = parsed(text)
    w, v = circuit.children
    assert torch.allclose(circuit.evaluate(), w.evaluate() @ v.evaluate())


def test_tensors_as_random_reads_arrays_by_hash_without_their_tensors():
    text = (
        "'y' Einsum ab,b->a\n  'w' [3,4] Array 0258c9f34dcbf92d6bc407af\n  'v' [4] Array rand\n  # a comment"
    )
    circuit = cc.parse(text, tensors_as_random=True)
    again = cc.parse_many(text, tensors_as_random=True)[0]
    assert circuit == again
    w, v = circuit.children
    assert w.shape == (3, 4) and w.value is not None
    assert torch.allclose(circuit.evaluate(), w.evaluate() @ v.evaluate())
    with pytest.raises(cc.errors.MissingTensorError):
        cc.parse(text).evaluate()  # without the option, the hash stays a placeholder


def test_a_huge_random_array_is_refused_not_allocated():
    error = parse_error("'w' [100000,100000] Array rand")
    assert "more than" in str(error) and error.line_number == 1


def test_random_array_needs_its_shape():
    assert "needs its shape" in str(parse_error("'w' Array rand"))
    with pytest.raises(cc.errors.ParseError, match="needs its shape") as info:  # says what is missing
        cc.parse("'w' Array 0258c9f34dcbf92d6bc407af", tensors_as_random=True)
    assert info.value.line_number == 1


# ----------------------------------------------------- leaves without a shape


def test_array_without_shape_takes_the_stored_tensors(store):
    tensor = torch.arange(6.0).reshape(2, 3)
    circuit = parsed(f"'w' Array {saved(store, tensor)}", store)
    assert circuit == cc.Array(tensor, name="w")
    assert circuit.shape == (2, 3)


def test_array_without_shape_and_without_store_is_a_parse_error():
    error = parse_error("'w' Array 0258c9f34dcbf92d6bc407af")
    assert "store=" in str(error) and "0258c9f34dcbf92d6bc407af" in str(error)


def test_array_printed_shape_must_match_the_stored_tensor(store):
    error = parse_error(f"'w' [3] Array {saved(store, torch.zeros(2, 3))}", store)
    assert "[3]" in str(error) and "[2, 3]" in str(error)


@pytest.mark.parametrize("kind", ["Scalar 1", "Symbol"])
def test_scalars_and_symbols_need_their_shape_as_in_rust_circuit(kind):
    assert "needs its shape" in str(parse_error(f"'s' {kind}"))


def test_the_golden_file_reads_with_random_weights(golden_text):
    """The use case: a printed model whose weights are not at hand gets stand-ins of the same shapes."""
    random = cc.parse(golden_text, tensors_as_random=True)
    placeholders = cc.parse(golden_text)

    def leaves(circuit: cc.Circuit) -> list:
        return sorted((array.name, array.shape) for array in circuit.get(cc.Array))

    assert leaves(random) == leaves(placeholders)
    assert all(array.value is not None for array in random.get(cc.Array))
    assert random.shape == placeholders.shape
