"""rust_circuit's identifiers and line spellings: quoted identifiers, restated repeats, references.

Each text is written the way rust_circuit prints or reads it (``circuit_base/src/parsing.rs``):
a quoted identifier with a separate name, a repeat that restates its node's info, circuits
named from outside the text (``reference_circuits``), names with backslashes as rust_circuit
reads them, named axes and digit separators in shapes, ``AD`` and a bare ``Array``.  The
expected circuit is built with the node constructors; each parsed circuit reprints in our
form and reads back equal.  Each refusal is a ParseError at its line.
"""

from __future__ import annotations

import functools
import itertools
import re

import pytest
import torch

import circuits as cc
from circuits.text.store import TensorStore
from parse_helpers import parse_error_message, parsed


parse_error = functools.partial(parse_error_message, many=True)


def scalar(value: float, shape: tuple[int, ...], name: str | None = None) -> cc.Scalar:
    return cc.Scalar(value, shape=shape, name=name)


# ------------------------------------------------------- quoted identifiers


def test_a_quoted_identifier_with_its_own_name_and_its_repeat():
    text = """
        0 'sum' Add
          1 'pad' [3, 1] Scatter [0:2,0:1]
            '  first one' '# w' [2, 1] Scalar 1
          2 'flat' Einsum ab->
            '  first one'
        """
    w = scalar(1.0, (2, 1), "# w")
    expected = cc.Add(
        cc.Scatter(w, (slice(0, 2), slice(0, 1)), (3, 1), name="pad"),
        cc.Einsum.from_einsum_string("ab->", w, name="flat"),
        name="sum",
    )
    circuit = parsed(text)
    assert circuit == expected
    assert torch.equal(circuit.evaluate(), torch.tensor([[1.0], [1.0], [0.0]]) + 2.0)


def test_a_quoted_identifier_is_looked_up_before_names():
    # 'n' names two equal nodes by identifier; the repeat 'a' is the identifier, not a name
    text = "0 Add\n  'a' 'n' [2] Scalar 3\n  'b' 'a' [2] Scalar 4\n  'a'"
    three, four = scalar(3.0, (2,), "n"), scalar(4.0, (2,), "a")
    assert parsed(text) == cc.Add(three, four, three)


def test_an_identifier_repeat_restating_its_info():
    text = "0 Add\n  'i' 'n' [2] Scalar 1\n  'i' 'n' [2] Scalar 1\n  'i' [2] Scalar\n  'i' 'n'"
    one = scalar(1.0, (2,), "n")
    assert parsed(text) == cc.Add(one, one, one, one)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("'i' 'm'", "identifier 'i' is Scalar 'n', not 'm'"),
        (
            "'i' [3] Scalar 1",
            "restates identifier 'i', defined on line 2, with different info: shape [3] != [2]",
        ),
        (
            "'i' 'n' [2] Scalar 2",
            "restates identifier 'i', defined on line 2, with different info: extra '2' != '1'",
        ),
        (
            "'i' Array",
            "restates identifier 'i', defined on line 2, with different info: variant 'Array' != 'Scalar'",
        ),
    ],
)
def test_an_identifier_repeat_with_different_info(line, says):
    message = parse_error(f"0 Add\n  'i' 'n' [2] Scalar 1\n  {line}", 3)
    assert says in message


def test_identifier_errors():
    assert "no earlier line defines" in parse_error("0 Add\n  'i' 'n'", 2)
    assert "already the name of an earlier line" in parse_error("'x' [2] Scalar 1\n'x' 'y' [2] Scalar 2", 2)
    assert "enclosing node" in parse_error("'i' 'n' Add\n  'i'", 2)


# ------------------------------------------------------- restated repeats


def test_serial_repeats_restating_their_info():
    text = "0 Add\n  1 [2] Scalar 1\n  1 Scalar\n  1 [2] Scalar 1\n  1 [2] Scalar\n  1"
    one = scalar(1.0, (2,))
    assert parsed(text) == cc.Add(one, one, one, one, one)


def test_a_repeated_array_restating_its_variant(tmp_path):
    store = TensorStore(tmp_path)
    tensor = torch.arange(5.0)
    prefix = store.save(tensor)[:24]
    text = f"0 Add # float32\n  1 [5] Array {prefix} # float32\n  1 Array # float32"
    circuit = cc.parse(text, store=store)
    array = cc.Array(tensor)
    assert circuit == cc.Add(array, array)
    assert torch.equal(circuit.evaluate(), 2 * tensor)
    assert cc.parse(circuit.repr()) == circuit


def test_a_restated_shape_is_the_nodes_even_when_it_was_not_printed():
    text = "0 Add\n  1 Einsum ab->a\n    2 [3, 2] Scalar 1\n  1 [3] Einsum ab->a"
    summed = cc.Einsum.from_einsum_string("ab->a", scalar(1.0, (3, 2)))
    assert parsed(text) == cc.Add(summed, summed)


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("1 [3] Scalar 1", "shape [3] != [2]"),
        ("1 Array", "variant 'Array' != 'Scalar'"),
        ("1 Scalar 2", "extra '2' != '1'"),
        ("1 'y' Scalar", "name 'y' != 'x'"),
        ("1 AD Scalar", "AD (autoname disabled) True != False"),
    ],
)
def test_a_serial_repeat_with_different_info(line, says):
    message = parse_error(f"0 Add\n  1 'x' [2] Scalar 1\n  {line}", 3)
    assert "restates serial number 1, defined on line 2, with different info" in message
    assert says in message


def test_restated_repeat_errors():
    assert "a repeat, which has no children" in parse_error(
        "0 Add\n  1 [2] Scalar 1\n  1 Scalar\n    2 [2] Scalar 1", 4
    )
    assert "enclosing node" in parse_error("0 Add\n  1 Add\n    1 Add", 3)
    assert "needs its shape" in parse_error("0 Add\n  1 Scalar", 2)  # not a repeat: serial 1 is new


def test_the_old_unquoted_repeat_is_refused_clearly():
    message = parse_error("0 Add\n  8 'tok_embeds' [2] Scalar 1\n  8 tok_embeds", 3)
    assert "a name is quoted ('tok_embeds')" in message and "on_repeat_check_info_same=False" in message


# ------------------------------------------------------- reference circuits


REFERENCED = scalar(1.5, (2, 1), "outside")


@pytest.mark.parametrize(
    "references",
    [{"outside": REFERENCED}, [REFERENCED], (c for c in [REFERENCED])],
    ids=["mapping", "list", "iter"],
)
def test_reference_circuits_resolve_identifiers_defined_outside_the_text(references):
    text = "0 [3, 1] Add\n  1 [3, 1] Scatter [0:2,0:1]\n    'outside'\n  2 [1] Scalar 2"
    expected = cc.Add(cc.Scatter(REFERENCED, (slice(0, 2), slice(0, 1)), (3, 1)), scalar(2.0, (1,)))
    circuit = parsed(text, reference_circuits=references)
    assert circuit == expected
    assert torch.equal(circuit.evaluate(), torch.tensor([[3.5], [3.5], [2.0]]))
    assert cc.parse_many("'outside'", reference_circuits=[REFERENCED]) == [REFERENCED]


def test_a_reference_may_differ_from_its_name_by_key():
    other = scalar(7.0, (2, 1), "kept")
    assert cc.parse("0 Add\n  'key'", reference_circuits={"key": other}) == cc.Add(other)


def test_reference_circuit_errors():
    refs = {"outside": REFERENCED}
    assert "reference circuit, which has no children" in parse_error(
        "0 Add\n  'outside'\n    1 [2] Scalar 1", 3, reference_circuits=refs
    )
    assert "holds nothing else" in parse_error(
        "0 Add\n  'outside' [2, 1] Scalar 1.5", 2, reference_circuits=refs
    )
    assert "holds nothing else" in parse_error("0 Add\n  'outside' 'x'", 2, reference_circuits=refs)
    assert "holds nothing else" in parse_error("0 Add\n  'outside' AD", 2, reference_circuits=refs)


@pytest.mark.parametrize(
    ("references", "says"),
    [
        ([REFERENCED, scalar(2.0, (1,), "outside")], "names 'outside' twice"),
        ([scalar(1.0, ())], "needs a str name"),
        ({"x": 3}, "not a Circuit"),
        ("outside", "not str"),
    ],
)
def test_bad_reference_circuits(references, says):
    with pytest.raises(cc.errors.ParseError, match=re.escape(says)):
        cc.parse("0 Add\n  'outside'", reference_circuits=references)


# ------------------------------------------------------- names as rust_circuit reads them


def test_names_with_backslashes_as_rust_circuit_reads_them():
    # in rust_circuit a quote after a backslash ends a name only if the line reads on after it
    text = "\n".join(
        [
            "0 [5, 3, 3] Concat 0",
            "  5 '\\\\'\\\\' [2, 3, 3] Scalar 1.2",
            "  6 '\\' hi\\\\' [3, 3, 3] Scalar 1.5  # a comment",
        ]
    )
    expected = cc.Concat(scalar(1.2, (2, 3, 3), "\\'\\"), scalar(1.5, (3, 3, 3), "' hi\\"), axis=0)
    assert parsed(text) == expected


def test_our_own_escapes_still_read_first():
    name = "a\\'b\nc\rd'"
    node = scalar(1.0, (2,), name)
    assert node.repr() == "'a\\\\\\'b\\nc\\rd\\'' [2] Scalar 1"
    assert cc.parse(node.repr()) == node


def _rust_unescaped(raw: str) -> str:
    """rust_circuit's unescape of a name: replace \\' then \\\\ (parsing.rs)."""
    return raw.replace("\\'", "'").replace("\\\\", "\\")


def test_left_to_right_unescaping_gives_rust_circuits_names():
    rust_name = re.compile(r"(?:(?:\\')?[^']*)*")  # rust_circuit's name pattern
    checked = 0
    for size in range(1, 9):
        for chars in itertools.product("\\'a", repeat=size):
            raw = "".join(chars)
            if not rust_name.fullmatch(raw):
                continue
            try:
                name = cc.parse(f"0 '{raw}' [] Scalar 1").name
            except cc.errors.ParseError:
                continue  # a lone backslash, refused as ours are
            assert name == _rust_unescaped(raw), raw
            checked += 1
    assert checked > 500


def test_names_neither_reading_accepts():
    assert "unknown escape \\q" in parse_error("0 Add\n  'x\\q' [2] Scalar 1", 2)
    assert "unterminated quoted name" in parse_error("0 Add\n  'x\\' [2] Scalar 1", 2)
    assert "unterminated quoted name" in parse_error("0 Add\n  'a' 'b [2] Scalar 1", 2)


# ------------------------------------------------------- shapes, AD, bare arrays, '!'


def test_named_axes_digit_separators_and_products_in_shapes():
    text = "\n".join(
        [
            "0 [small:1, large : 3] Einsum fancy: big small, large small -> small large",
            "  1 [big:3,small:1] Scalar 1",
            "  2 [large:3, 1] Scalar 1.5",
            "3 [1_000] Scalar 2",
            "4 [2*3,] Scalar 0.5",
        ]
    )
    product = cc.Einsum.from_einsum_string("ab,cb->bc", scalar(1.0, (3, 1)), scalar(1.5, (3, 1)))
    circuits = cc.parse_many(text)
    assert circuits == [product, scalar(2.0, (1000,)), scalar(0.5, (6,))]
    assert cc.parse_many(cc.repr_many(circuits)) == circuits
    assert torch.equal(circuits[0].evaluate(), torch.full((1, 3), 4.5))


@pytest.mark.parametrize(
    ("shape", "says"),
    [
        ("[a:b:3]", "malformed named axis"),
        ("[a b:3]", "malformed named axis"),
        ("[a:0s]", "symbolic size 'a:0s'"),
        ("[_1]", "malformed shape"),
        ("[,]", "malformed shape"),
    ],
)
def test_bad_shapes(shape, says):
    assert says in parse_error(f"0 Add\n  1 {shape} Scalar 1", 2)


def test_autoname_disabled_is_read_and_ignored():
    text = "0 'total' AD Add\n  1 AD [2] Scalar 1\n  'w' AD [2] Scalar 2"
    assert parsed(text) == cc.Add(scalar(1.0, (2,)), scalar(2.0, (2,), "w"), name="total")


def test_a_bare_array_reads_only_as_random():
    text = "0 Add\n  1 [2, 3] Array\n  2 [5, 2, 3] Array"
    assert "parse with tensors_as_random=True" in parse_error(text, 2)
    circuit = cc.parse(text, tensors_as_random=True)
    first, second = circuit.children
    assert [first.shape, second.shape] == [(2, 3), (5, 2, 3)]
    assert not torch.equal(first.evaluate(), second.evaluate()[0])  # different lines, different seeds
    assert cc.parse(text, tensors_as_random=True) == circuit  # the same text, the same arrays
    assert cc.parse(circuit.repr()) == circuit


def test_child_info_is_refused_as_module_only():
    for text, line in [("0 Add\n  1 [2] Scalar 1 ! 'sym'", 2), ("0 Add\n  1 [2] Scalar 1\n  1 ! 'sym'", 3)]:
        message = parse_error(text, line)
        assert "'!' child info" in message and "Module" in message
