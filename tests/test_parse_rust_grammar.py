"""Texts written the way rust_circuit prints them parse to the circuits they describe.

Each text copies the shape of an example in rust_circuit's
python/tests/test_rust_printing.py (with our node names); the expected
circuit is built independently with the node constructors, and each parsed
circuit reprints in our canonical form and reads back equal.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from parse_helpers import parse_error, parsed


# ------------------------------------------------------- an indented block


def test_block_indented_as_a_whole():
    text = """
        0 'hi' Add
          1 '0' [1, 3, 6] Scalar 7
          2 'name stuff  ' Concat 0
            3 '###$' [2, 3, 6] Scalar 1.2
            4 [3, 3, 6] Scalar 1.5
          5 'eins' Einsum ab->
            6 '# 43' [2, 1] Scalar 1
        """
    concat = cc.Concat(
        cc.Scalar(1.2, shape=(2, 3, 6), name="###$"),
        cc.Scalar(1.5, shape=(3, 3, 6)),
        axis=0,
        name="name stuff  ",
    )
    eins = cc.Einsum.from_einsum_string("ab->", cc.Scalar(1.0, shape=(2, 1), name="# 43"), name="eins")
    expected = cc.Add(cc.Scalar(7.0, shape=(1, 3, 6), name="0"), concat, eins, name="hi")
    circuit = parsed(text)
    assert circuit == expected
    assert torch.equal(circuit.evaluate(), torch.full((5, 3, 6), 7.0) + concat.evaluate() + 2.0)


def test_indented_block_with_repeats_and_comments():
    text = "\n".join(
        [
            "# a comment less indented than the block",
            "    'e' Einsum ab,bc->ac",
            "      'x' [3,4] Symbol",
            "  # another",
            "      'y' [4,2] Symbol",
            "    'f' Add",
            "      'x'",
        ]
    )
    x, y = cc.Symbol((3, 4), name="x"), cc.Symbol((4, 2), name="y")
    roots = cc.parse_many(text)
    assert roots == [cc.Einsum.from_einsum_string("ab,bc->ac", x, y, name="e"), cc.Add(x, name="f")]


def test_dedent_below_the_first_line_is_an_error_at_that_line():
    text = "    'a' Add\n      'x' [3] Symbol\n  'y' [3] Symbol"
    error = parse_error(text)
    assert error.line_number == 3
    assert error.line == "  'y' [3] Symbol"
    assert "first line" in str(error)


def test_second_root_of_an_indented_block_is_named():
    error = parse_error("  'x' [3] Symbol\n  'y' [3] Symbol")
    assert error.line_number == 2
    assert "top-level" in str(error)


# ------------------------------------------------------- tabs and whitespace


@pytest.mark.parametrize("line", ["\t'x' [3,4] Symbol", "  \t'x' [3,4] Symbol", "\t  'x' [3,4] Symbol"])
def test_tabs_in_the_indent_are_refused(line):
    text = "'a' Add\n" + line
    error = parse_error(text)
    assert error.line_number == 2
    assert error.line == line
    assert "tab" in error.message


def test_spaces_after_commas_in_shapes_and_index_items():
    text = "'i' [2, 3] Index [0, :2, [2, 0, 1]]\n  'x' [3, 4, 3] Symbol"
    x = cc.Symbol((3, 4, 3), name="x")
    expected = cc.Index(x, (0, slice(None, 2), torch.tensor([2, 0, 1])), name="i")
    circuit = parsed(text)
    assert circuit == expected
    value = torch.arange(36.0).reshape(3, 4, 3)
    assert torch.equal(circuit.evaluate({x: value}), value[0, :2][:, [2, 0, 1]])


# ------------------------------------------------------- only-child markers


def test_only_child_marker_puts_the_child_under_the_line_above():
    # rust_circuit's PrintOptions(arrows=True, only_child_below=True), as in its regression test
    circuit = parsed("0 Add\n▼\n1 [1] Scalar 0.7")
    assert circuit == cc.Add(cc.Scalar(0.7, shape=(1,)))


def test_only_child_markers_with_arrows():
    text = "\n".join(
        [
            "0 Add",
            "├‣1 Add",
            "│ ▼",
            "│ 2 [1] Scalar 0.7",
            "└‣3 Add",
            "  ├‣4 [1] Scalar 0.5",
            "  └‣5 [1] Scalar 6.3",
        ]
    )
    expected = cc.Add(
        cc.Add(cc.Scalar(0.7, shape=(1,))),
        cc.Add(cc.Scalar(0.5, shape=(1,)), cc.Scalar(6.3, shape=(1,))),
    )
    assert parsed(text) == expected


def test_chain_of_only_children_then_a_sibling():
    text = "\n".join(
        [
            "'r' Add",
            "  'a' GeneralFunction rsqrt",
            "  ▼",
            "  'b' Add",
            "  |/",
            "  'c' Einsum ab->a",
            "    'x' [3,4] Symbol",
            "  'y' [3] Symbol",
        ]
    )
    x = cc.Symbol((3, 4), name="x")
    c = cc.Einsum.from_einsum_string("ab->a", x, name="c")
    a = cc.GeneralFunction(cc.Add(c, name="b"), spec="rsqrt", name="a")
    assert parsed(text) == cc.Add(a, cc.Symbol((3,), name="y"), name="r")


@pytest.mark.parametrize(
    ("text", "line_number"),
    [
        ("'a' Add\n  'x' [3] Symbol\n  ▼\n  'y' [3] Symbol", 3),  # after a leaf
        ("'a' Add\n  'x' [3] Symbol\n  'b' Add\n    'x'\n    ▼\n    'y' [3] Symbol", 5),  # after a repeat
        ("'a' Add\n▼", 2),  # nothing follows
        ("'a' Add\n▼\n▼\n'x' [3] Symbol", 3),  # two in a row
        ("'a' Add\n▼\n  'x' [3] Symbol", 3),  # child not at the parent's indent
    ],
)
def test_misplaced_only_child_marker(text, line_number):
    assert parse_error(text).line_number == line_number


# ------------------------------------------------------- einsum


def test_fancy_einsum_with_named_axes():
    text = "0 Einsum fancy: first second, first third -> first\n  1 [3, 1] Scalar 1.0\n  2 [3, 1] Scalar 1.5"
    expected = cc.Einsum.from_einsum_string(
        "ab,ac->a", cc.Scalar(1.0, shape=(3, 1)), cc.Scalar(1.5, shape=(3, 1))
    )
    circuit = parsed(text)
    assert circuit == expected
    assert torch.equal(circuit.evaluate(), torch.full((3,), 1.5))


def test_fancy_einsum_without_space_and_with_a_scalar_operand():
    x = cc.Symbol((2,), name="x")
    w = cc.Symbol((2, 3), name="w")
    s = cc.Scalar(2.0, name="s")
    text = "'e' Einsum fancy: ay, ay bee,->bee\n  'x' [2] Symbol\n  'w' [2,3] Symbol\n  's' [] Scalar 2"
    assert parsed(text) == cc.Einsum.from_einsum_string("a,ab,->b", x, w, s, name="e")
    text = "'e' Einsum fancy:first second -> second\n  'w' [2,3] Symbol"
    assert parsed(text) == cc.Einsum.from_einsum_string("ab->b", w, name="e")


def test_malformed_fancy_einsum():
    assert "'->'" in parse_error("'e' Einsum fancy: a b\n  'w' [2,3] Symbol").message


# ------------------------------------------------------- what is not supported


def test_module_is_refused_by_name():
    text = "'outer_b.bilinear_mlp' Module\n  'bilinear_mlp' Einsum h,h->\n    'x' [2] Symbol\n    'x'"
    error = parse_error(text)
    assert error.line_number == 1
    assert "Module" in error.message and "not supported" in error.message


@pytest.mark.parametrize("size", ["0s", "2*1s"])
def test_symbolic_size_is_refused_by_name(size):
    text = f"'a' Add\n  'bilinear_mlp.input' [{size},3] Symbol 873a937e-2bb9-4f7f-b55e-a100db3dde52"
    error = parse_error(text)
    assert error.line_number == 2
    assert repr(size) in error.message and "not supported" in error.message
