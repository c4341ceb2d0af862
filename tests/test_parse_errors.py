"""Malformed text raises ParseError at the right line; what docs/format.md allows parses.

Every text here is written by hand; the expected line numbers are counted
by hand (1-based, blank and comment lines included).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import circuits as cc
from parse_helpers import MUTATION_CHARS, check_parse_or_parse_error, mutated

# the same path as conftest.GOLDEN; read at import because hypothesis tests
# cannot take function-scoped fixtures
GOLDEN = Path(__file__).resolve().parent / "data" / "attn_only_2l.circ"
GOLDEN_TEXT = GOLDEN.read_text()

X = "  'x' [3,4] Symbol"  # a child line used by several cases

BAD_TEXTS = {
    # truncated lines
    "truncated shape": ("'a' Add\n  'x' [3", 2),
    "truncated after shape": ("'a' Add\n  'x' [3,4]\n  'y' [3,4] Symbol", 2),
    "truncated variant": ("'a' Add\n  'x' [3,4] Sym", 2),
    "truncated hash": ("'a' Add\n  'w' [3] Array 0258c9f34d", 2),
    "truncated einsum": ("'e' Einsum ab->\n" + X + "\n  'y' [4] Symbol", 1),
    "truncated index": ("'i' [3] Index [0:\n" + X, 1),
    "truncated name": ("'a' Add\n  'x", 2),
    "leaf without shape": ("'a' Add\n  'x' Symbol", 2),
    # indentation
    "odd indentation": ("'a' Add\n   'x' [3,4] Symbol", 2),
    "one space": ("'a' Add\n  'x' [3,4] Symbol\n 'y' [3,4] Symbol", 3),
    "jump two levels": ("'a' Add\n    'x' [3,4] Symbol", 2),
    "jump two levels later": ("'a' Add\n  'b' Add\n    'x' [3,4] Symbol\n        'y' [3,4] Symbol", 4),
    "dedent below an indented block's first line": ("  'a' Add\n    'x' [3,4] Symbol\n 'y' [3,4] Symbol", 3),
    "tab indent": ("'a' Add\n\t'x' [3,4] Symbol", 2),
    "child of a repeat": ("'a' Add\n" + X + "\n  'x'\n    'y' [3,4] Symbol", 4),
    "child of a leaf": ("'a' Add\n" + X + "\n    'y' [3,4] Symbol", 3),
    # variants
    "unknown variant": ("'a' Add\n" + X + "\n  'y' [3,4] Tensor", 3),
    "lowercase variant": ("'a' add\n" + X, 1),
    "no reference": ("Add\n" + X, 1),
    # references
    "repeat of unknown name": ("'a' Add\n" + X + "\n  'nope'", 3),
    "repeat of unknown serial": ("'a' Add\n" + X + "\n  7", 3),
    "repeat of enclosing name": ("'a' Add\n  'b' Add\n    'a'", 3),
    "repeat of enclosing serial": ("0 Add\n  1 Add\n    0", 3),
    "repeat before definition": ("'a' Add\n  'x'\n  'x' [3,4] Symbol", 2),
    "serial names another node": ("'a' Add\n  0 'x' [3,4] Symbol\n  0 'y'", 3),
    "serial used twice": ("'a' Add\n  0 'x' [3,4] Symbol\n  0 'y' [3,4] Symbol", 3),
    "ambiguous repeat": ("'a' Add\n  0 'x' [3,4] Symbol\n  1 'x' [4] Symbol\n  'x'", 4),
    "no space after serial": ("'a' Add\n  0'x' [3,4] Symbol", 2),
    "no space after name": ("'a' Add\n  'x'[3,4] Symbol", 2),
    # shapes
    "wrong shape of index": ("'i' [4] Index [0:2]\n  'x' [3] Symbol", 1),
    "wrong shape with shapes option": ("'a' [5] Add\n  'x' [3] Symbol", 1),
    "wrong rank": ("'a' [3] Add\n" + X, 1),
    "malformed shape": ("'a' Add\n  'x' [3;4] Symbol", 2),
    "negative shape": ("'a' Add\n  'x' [-3] Symbol", 2),
    "empty shape item": ("'a' Add\n  'x' [3,,4] Symbol", 2),
    # what the children must fit
    "einsum letters vs children": ("'e' Einsum ab,bc->ac\n" + X + "\n  'y' [5,2] Symbol", 1),
    "einsum rank vs children": ("'e' Einsum abc->a\n" + X, 1),
    "einsum operand count": ("'e' Einsum ab,bc->ac\n" + X, 1),
    "einsum bad letter": ("'e' Einsum a1->a\n" + X, 1),
    "einsum no arrow": ("'e' Einsum ab\n" + X, 1),
    "add does not broadcast": ("'r' Add\n  'a' Add\n" + "  " + X + "\n    'v' [5] Symbol", 2),
    "unknown function": ("'f' GeneralFunction no_such_fn\n" + X, 1),
    "function without name": ("'f' GeneralFunction\n" + X, 1),
    "function child count": ("'f' GeneralFunction softmax\n" + X + "\n  'y' [3] Symbol", 1),
    "concat mismatch": ("'c' Concat 0\n" + X + "\n  'y' [3,5] Symbol", 1),
    "concat axis": ("'c' Concat one\n" + X, 1),
    "concat no children": ("'a' Add\n  'c' Concat 0", 2),
    "rearrange pattern": ("'r' Rearrange a b c -> a\n" + X, 1),
    "rearrange size": ("'r' Rearrange a b -> a b c, c=two\n" + X, 1),
    "rearrange two children": ("'r' Rearrange a b -> b a\n" + X + "\n  'y' [3,4] Symbol", 1),
    "rearrange huge child": ("'r' Rearrange a b -> (a b)\n  'x' [1099511627776,1099511627776] Symbol", 1),
    "size past int64": ("'r' Rearrange a -> a\n  'x' [99999999999999999999] Symbol", 2),
    "size of 5000 digits": ("'x' [" + "9" * 5000 + "] Symbol", 1),
    "serial of 5000 digits": ("9" * 5000 + " 'x' [3] Symbol", 1),
    "index of 5000 digits": ("'i' Index [" + "9" * 5000 + "]\n  'x' [3] Symbol", 1),
    "scalar too large for a float": ("'s' [] Scalar " + "9" * 5000, 1),
    "scalar too small for a float": ("'s' [] Scalar 0." + "0" * 400 + "1", 1),
    "add with extra": ("'a' Add 3\n" + X, 1),
    "symbol with extra": ("'a' Add\n  'x' [3,4] Symbol 1", 2),
    # leaves
    "leaf with children": ("'x' [3,4] Symbol\n  'y' [3,4] Symbol", 2),
    "array with children": ("'w' [3] Array 0258c9f34dcbf92d6bc407af\n  'y' [3] Symbol", 2),
    "bad hash": ("'a' Add\n  'w' [3] Array 0258c9f34dcbf92d6bc407ag", 2),
    "uppercase hash": ("'a' Add\n  'w' [3] Array 0258C9F34DCBF92D6BC407AF", 2),
    "missing hash": ("'a' Add\n  'w' [3] Array", 2),
    "bad scalar": ("'a' Add\n  'k' [] Scalar one", 2),
    "scalar two dots": ("'a' Add\n  'k' [] Scalar 1.2.3", 2),
    "scalar exponent": ("'a' Add\n  'k' [] Scalar 1e-5", 2),
    "scalar missing": ("'a' Add\n  'k' [] Scalar", 2),
    # index syntax
    "index step": ("'i' Index [0:3:2]\n  'x' [3] Symbol", 1),
    "index letters": ("'i' Index [a]\n  'x' [3] Symbol", 1),
    "index no brackets": ("'i' Index 0:2\n  'x' [3] Symbol", 1),
    "index empty item": ("'i' Index [0,,1]\n" + X, 1),
    "index unbalanced": ("'i' Index [[0,1]\n" + X, 1),
    "index float tensor": ("'i' Index [[0.5]]\n" + X, 1),
    "index out of range": ("'i' [] Index [3,0]\n" + X, 1),
    "index huge tensor": ("'i' Index [[99999999999999999999]]\n" + X, 1),
    "index missing": ("'i' Index\n" + X, 1),
    "index two children": ("'i' Index [0]\n" + X + "\n" + X, 1),
    # quotes
    "unterminated quote": ("'a' Add\n  'x [3,4] Symbol", 2),
    "unterminated escaped quote": ("'a' Add\n  'x\\' [3,4] Symbol", 2),
    "unknown escape": ("'a' Add\n  'x\\q' [3,4] Symbol", 2),
    # several roots where one is expected
    "two roots": ("'x' [3] Symbol\n'y' [3] Symbol", 2),
    "two roots after comments": ("# one\n'x' [3] Symbol\n\n  # two\n'y' [3] Symbol", 5),
    "three roots": ("'a' Add\n" + X + "\n'x'\n'b' Add\n  'x'", 3),
}


@pytest.mark.parametrize("case", sorted(BAD_TEXTS))
def test_malformed_text_raises_parse_error_at_the_right_line(case):
    text, line_number = BAD_TEXTS[case]
    with pytest.raises(cc.errors.ParseError) as info:
        cc.parse(text)
    error = info.value
    assert isinstance(error, cc.CircuitError)
    assert error.line_number == line_number, str(error)
    assert error.line == text.split("\n")[line_number - 1]
    message = str(error)
    assert f"line {line_number}" in message
    assert error.message  # what was expected


def test_error_message_says_what_was_expected():
    def message(text):
        with pytest.raises(cc.errors.ParseError) as info:
            cc.parse(text)
        return str(info.value)

    assert "Tensor" in message("'a' Add\n" + X + "\n  'y' [3,4] Tensor")
    assert "'nope'" in message("'a' Add\n" + X + "\n  'nope'")
    assert "[4]" in message("'i' [4] Index [0:2]\n  'x' [3] Symbol")
    assert "no_such_fn" in message("'f' GeneralFunction no_such_fn\n" + X)


def test_empty_text_and_wrong_types():
    for text in ["", "\n\n", "# only a comment", "   "]:
        with pytest.raises(cc.errors.ParseError):
            cc.parse(text)
        assert cc.parse_many(text) == []
    for value in [None, b"'x' [3] Symbol", 3]:
        with pytest.raises(cc.errors.ParseError):
            cc.parse(value)
        with pytest.raises(cc.errors.ParseError):
            cc.parse_many(value)


@pytest.mark.parametrize("line_number", [2, 100, 300, 484])
def test_error_deep_in_the_golden_file_is_located(line_number):
    lines = GOLDEN_TEXT.split("\n")
    assert len(lines) == 484
    indent = len(lines[line_number - 1]) - len(lines[line_number - 1].lstrip(" "))
    lines[line_number - 1] = " " * indent + "'broken' [3] Bogus"
    with pytest.raises(cc.errors.ParseError) as info:
        cc.parse("\n".join(lines))
    assert info.value.line_number == line_number


def test_wrong_shape_in_the_golden_file_is_located():
    lines = GOLDEN_TEXT.split("\n")
    # the first Index line of the golden file; bump its first size by one
    number = next(i for i, line in enumerate(lines) if " Index " in line)
    before, bracket, after = lines[number].partition("[")
    size, comma, rest = after.partition(",") if "," in after.split("]")[0] else after.partition("]")
    lines[number] = before + bracket + str(int(size) + 1) + comma + rest
    with pytest.raises(cc.errors.ParseError) as info:
        cc.parse("\n".join(lines))
    assert info.value.line_number == number + 1


# ------------------------------------------------------- what the parser accepts


def test_spaces_after_commas_in_shapes():
    x = cc.parse("'x' [3, 4] Symbol")
    assert x == cc.Symbol((3, 4), name="x")
    e = cc.parse("'e' [3, 2] Einsum ab,bc->ac\n  'x' [3, 4] Symbol\n  'y' [4,  2] Symbol")
    assert e.shape == (3, 2)
    assert e.repr() == "'e' Einsum ab,bc->ac\n  'x' [3,4] Symbol\n  'y' [4,2] Symbol"


def test_comments_blank_lines_and_hashes_in_names():
    text = "\n".join(
        [
            "# a circuit with comments",
            "",
            "'a #1' Add  # the sum, named with a '#'",
            "  # a comment between children, indented",
            "  'x' [3,4] Symbol # trailing",
            "",
            "      # a comment at any indent",
            "  'k' [] Scalar 0.5#no space before it",
            "  'it''s' [4] Symbol",
        ]
    )
    # 'it''s' is not an escaped quote: it is the name 'it' then junk
    with pytest.raises(cc.errors.ParseError) as info:
        cc.parse(text)
    assert info.value.line_number == 9
    text = text.replace("'it''s'", "'it\\'s #'")
    a = cc.parse(text + "\n")  # a final newline is a blank line
    expected = cc.Add(
        cc.Symbol((3, 4), name="x"), cc.Scalar(0.5, name="k"), cc.Symbol((4,), name="it's #"), name="a #1"
    )
    assert a == expected
    assert a.repr() == "'a #1' Add\n  'x' [3,4] Symbol\n  'k' [] Scalar 0.5\n  'it\\'s #' [4] Symbol"


def test_several_top_level_circuits():
    text = "\n".join(
        [
            "'x' [3] Symbol",
            "",
            "# second",
            "0 'n' Einsum a->",
            "  'x'",
            "'x'",
            "1 'n' [] Scalar 2",
            "2 GeneralFunction exp",
            "  0 'n'",
        ]
    )
    roots = cc.parse_many(text)
    x = cc.Symbol((3,), name="x")
    n0 = cc.Einsum.from_einsum_string("a->", x, name="n")
    n1 = cc.Scalar(2.0, name="n")
    assert roots == [x, n0, x, n1, cc.GeneralFunction(n0, spec="exp")]
    printed = cc.repr_many(roots)
    assert printed == "\n".join(
        [
            "'x' [3] Symbol",
            "0 'n' Einsum a->",
            "  'x'",
            "'x'",
            "1 'n' [] Scalar 2",
            "2 GeneralFunction exp",
            "  0 'n'",
        ]
    )
    assert cc.parse_many(printed) == roots


def test_serials_may_be_given_for_unique_names_and_shapes_everywhere():
    text = "5 'a' [3,4] Add\n  7 'x' [3,4] Symbol\n  7 'x'"
    x = cc.Symbol((3, 4), name="x")
    a = cc.parse(text)
    assert a == cc.Add(x, x, name="a")
    assert a.repr() == "'a' Add\n  'x' [3,4] Symbol\n  'x'"


def test_array_parsed_without_store_prints_identically_and_fails_when_evaluated():
    text = "'w' [2,3] Array 0123456789abcdef01234567"
    w = cc.parse(text)
    assert w.shape == (2, 3)
    assert w.repr() == text
    with pytest.raises(cc.errors.MissingTensorError) as info:
        w.tensor()
    assert info.value.node is w


def test_index_syntax_accepted():
    x = cc.Symbol((5, 6, 7), name="x")
    node = cc.parse("'i' [2,7] Index [-1, [4,0], :]\n  'x' [5,6,7] Symbol")
    assert node == cc.Index(x, (-1, torch.tensor([4, 0]), slice(None, None)), name="i")
    assert node.repr() == "'i' [2,7] Index [-1,[4,0],:]\n  'x' [5,6,7] Symbol"
    assert cc.parse("'i' [3,6,7] Index [1:4]\n  'x' [5,6,7] Symbol").shape == (3, 6, 7)
    assert cc.parse("'i' [0] Index [[]]\n  'y' [5] Symbol").shape == (0,)


def test_rearrange_with_unicode_axis_names_reads_back():
    x = cc.Symbol((3, 4), name="x")
    node = cc.Rearrange(x, "a b -> a b é", é=2)
    assert node.shape == (3, 4, 2)
    assert cc.parse(node.repr()) == node


# ----------------------------------------------------------------------- fuzzing


def _small_circuits() -> list[str]:
    emb = cc.Array(torch.arange(15.0).reshape(5, 3), name="it's \\ #emb")
    toks = cc.Symbol((4,), name="toks\nx")
    looked = cc.GeneralFunction(emb, toks, spec="gen_index_at_0_c", name="naïve")
    scaled = cc.Einsum.from_einsum_string("sd,->sd", looked, cc.Scalar(-0.25), name="x")
    both = cc.Add(scaled, looked, name="x")
    part = cc.Index(both, (slice(1, -1), torch.tensor([2, 0])))
    flat = cc.Rearrange(part, "s d -> (s d) n", n=2)
    cat = cc.Concat(flat, flat, axis=0, name="cat")
    soft = cc.GeneralFunction(cat, spec="softmax")
    return [
        cat.repr(),
        soft.repr(shapes=True),
        soft.repr(serials=True),
        cc.repr_many([both, cat, toks]),
    ]


SMALL = _small_circuits()
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.slow
@FUZZ
@given(mutated(SMALL))
def test_fuzzed_small_circuits_parse_or_raise_parse_error(text):
    check_parse_or_parse_error(text)


@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated([GOLDEN_TEXT]))
def test_fuzzed_golden_text_parses_or_raises_parse_error(text):
    check_parse_or_parse_error(text)


@FUZZ
@given(st.text(alphabet=st.one_of(st.sampled_from(MUTATION_CHARS), st.characters()), max_size=60))
def test_random_text_parses_or_raises_parse_error(text):
    check_parse_or_parse_error(text)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(SMALL[0].split("\n") + SMALL[3].split("\n") + ["", "# c"]), max_size=12))
def test_shuffled_lines_parse_or_raise_parse_error(lines):
    check_parse_or_parse_error("\n".join(lines))
