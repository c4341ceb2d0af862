"""Annotated printing: ``traversal=`` cuts the printout where a matcher stops, ``comment=``
and ``color=`` annotate lines; annotated text parses back to the same circuit.

Expected texts are written by hand from docs/format.md, not produced by the printer.
"""

from __future__ import annotations

import pytest

import circuits as cc
from circuits.errors import PrintError
from circuits.text.html import to_html
from circuits.text.printing import repr_many

RED, GREEN, RESET = "\x1b[31m", "\x1b[32m", "\x1b[0m"


def small() -> cc.Circuit:
    """root = t + s with t = einsum(s, b), s = a + b: 's' and 'b' are shared."""
    a = cc.Scalar(1.0, shape=(2,), name="a")
    b = cc.Scalar(2.0, shape=(2,), name="b")
    s = cc.Add(a, b, name="s")
    t = cc.Einsum.from_einsum_string("a,a->a", s, b, name="t")
    return cc.Add(t, s, name="root")


PLAIN = """\
'root' Add
  't' Einsum a,a->a
    's' Add
      'a' [2] Scalar 1
      'b' [2] Scalar 2
    'b'
  's'"""


def test_the_small_circuit_prints_as_written_by_hand():
    assert small().repr() == PLAIN


# ------------------------------------------------------------------ comments


def test_comments_go_at_the_end_of_full_lines_only():
    effects = {"t": 0.25, "s": -1.5, "b": 0.0}
    text = small().repr(comment=lambda n: f"{effects[n.name]:+.3f}" if n.name in effects else None)
    assert text == (
        "'root' Add\n"
        "  't' Einsum a,a->a  # +0.250\n"
        "    's' Add  # -1.500\n"
        "      'a' [2] Scalar 1\n"
        "      'b' [2] Scalar 2  # +0.000\n"
        "    'b'\n"
        "  's'"
    )
    assert cc.parse(text) == small()


def test_an_empty_comment_writes_nothing():
    assert small().repr(comment=lambda n: "") == PLAIN


def test_line_breaks_in_a_comment_are_escaped_and_the_text_still_parses():
    text = small().repr(comment=lambda n: "two\nlines\r" if n.name == "a" else None)
    assert "      'a' [2] Scalar 1  # two\\nlines\\r" in text.split("\n")
    assert len(text.splitlines()) == len(PLAIN.split("\n"))
    assert cc.parse(text) == small()


def test_a_comment_with_quotes_and_hashes_parses_back():
    text = small().repr(comment=lambda n: "it's #1 'quoted'")
    assert text.split("\n")[0] == "'root' Add  # it's #1 'quoted'"
    assert cc.parse(text) == small()


def test_a_comment_that_is_not_text_is_refused_naming_the_node():
    with pytest.raises(PrintError, match=r"comment function returned float for 't' \(Einsum\)"):
        small().repr(comment=lambda n: 0.5 if n.name == "t" else None)


# ------------------------------------------------------------------- colours


def test_colours_wrap_the_line_after_its_indent_and_every_repeat_of_the_node():
    text = small().repr(color=lambda n: {"s": "red", "a": "green"}.get(n.name))
    assert text == (
        "'root' Add\n"
        "  't' Einsum a,a->a\n"
        f"    {RED}'s' Add{RESET}\n"
        f"      {GREEN}'a' [2] Scalar 1{RESET}\n"
        "      'b' [2] Scalar 2\n"
        "    'b'\n"
        f"  {RED}'s'{RESET}"
    )
    assert cc.parse(text) == small()


def test_colour_and_comment_together_parse_back():
    text = small().repr(comment=lambda n: n.kind, color=lambda n: "Yellow" if n.name == "b" else None)
    assert text.split("\n")[4] == "      \x1b[33m'b' [2] Scalar 2  # Scalar\x1b[0m"
    assert text.split("\n")[5] == "    \x1b[33m'b'\x1b[0m"
    assert cc.parse(text) == small()


def test_an_unknown_colour_is_refused_naming_the_node_and_the_known_colours():
    with pytest.raises(
        PrintError, match=r"returned 'pink' for 'a' \(Scalar\); expected None or one of black, red, green"
    ):
        small().repr(color=lambda n: "pink" if n.name == "a" else None)
    with pytest.raises(PrintError, match="returned 3 for 'root'"):
        small().repr(color=lambda n: 3)


def test_the_parser_skips_colour_codes_around_whole_lines_indent_included():
    coloured = "\n".join(f"{RED}{line}{RESET}" for line in PLAIN.split("\n"))
    assert cc.parse(coloured) == small()


def test_colour_codes_inside_a_name_stay_part_of_the_name():
    odd = cc.Add(cc.Scalar(1.0, shape=(), name=f"x{RED}y"), name="top")
    text = odd.repr(color=lambda n: "blue")
    assert cc.parse(text) == odd
    assert cc.parse(text).children[0].name == f"x{RED}y"


def test_golden_round_trip_with_comments_and_colours(golden_text):
    golden = cc.parse(golden_text)
    text = golden.repr(
        comment=lambda n: f"{n.kind} of rank {len(n.shape)}",
        color=lambda n: "magenta" if n.kind == "Einsum" else "cyan" if n.name == "a.attn_probs" else None,
    )
    assert text != golden_text
    assert len(text.split("\n")) == len(golden_text.split("\n"))
    assert cc.parse(text) == golden
    assert cc.parse(text).repr() == golden_text


# ----------------------------------------------------------------- traversal


def test_a_traversal_with_max_depth_cuts_as_depth_does():
    by_depth = small().repr(depth=1)
    assert by_depth == (
        "'root' Add\n"
        "  't' Einsum a,a->a\n"
        "    ... 2 children not shown\n"
        "  's' Add\n"
        "    ... 2 children not shown"
    )
    assert small().repr(traversal=cc.IterativeMatcher(True, max_depth=1)) == by_depth


def test_children_the_traversal_does_not_enter_are_written_without_their_children():
    # Stage 0: the root only; then its child 0 ('t') and below it, one level more.
    traversal = cc.IterativeMatcher("root", max_depth=0).children(0).then(max_depth=1)
    assert small().repr(traversal=traversal) == (
        "'root' Add\n"
        "  't' Einsum a,a->a\n"
        "    's' Add\n"
        "      ... 2 children not shown\n"
        "    'b' [2] Scalar 2\n"
        "  's'"
    )


def test_term_early_at_stops_the_printout_below_the_nodes_it_matches():
    traversal = cc.IterativeMatcher(True, term_early_at="t")
    assert small().repr(traversal=traversal) == (
        "'root' Add\n"
        "  't' Einsum a,a->a\n"
        "    ... 2 children not shown\n"
        "  's' Add\n"
        "    'a' [2] Scalar 1\n"
        "    'b' [2] Scalar 2"
    )


def test_a_traversal_that_never_stops_prints_everything_in_every_form():
    for form in ("s", cc.Matcher("s"), cc.IterativeMatcher("s"), cc.IterativeMatcher("t").chain("a")):
        assert small().repr(traversal=form) == PLAIN, form


def test_traversal_and_depth_together_stop_at_whichever_comes_first():
    traversal = cc.IterativeMatcher(True, term_early_at="s")
    assert small().repr(traversal=traversal, depth=1) == small().repr(depth=1)
    assert small().repr(traversal=traversal, depth=5) == (
        "'root' Add\n"
        "  't' Einsum a,a->a\n"
        "    's' Add\n"
        "      ... 2 children not shown\n"
        "    'b' [2] Scalar 2\n"
        "  's'"
    )


def test_any_object_with_start_and_child_states_is_a_traversal():
    class OnlyLastChild:
        """The printer's protocol without circuits.rewriting.matching: descend into the last child only."""

        start = True

        def child_states(self, node, state):
            return [position == len(node.children) - 1 for position in range(len(node.children))]

    assert repr_many([small()], traversal=OnlyLastChild()) == (
        "'root' Add\n"
        "  't' Einsum a,a->a\n"
        "    ... 2 children not shown\n"
        "  's' Add\n"
        "    'a' [2] Scalar 1\n"
        "    'b' [2] Scalar 2"
    )


def test_a_traversal_that_ends_at_what_it_finds_does_not_show_below_it():
    first_child_of_root = cc.IterativeMatcher("root", max_depth=0).children(0)
    assert repr_many([small()], traversal=first_child_of_root) == (
        "'root' Add\n"
        "  't' Einsum a,a->a\n"
        "    ... 2 children not shown\n"
        "  's' Add\n"
        "    ... 2 children not shown"
    )


def test_a_traversal_giving_the_wrong_number_of_child_states_is_refused():
    class OneState:
        start = True

        def child_states(self, node, state):
            return [True]

    with pytest.raises(PrintError, match=r"gave 1 child states for 'root' \(Add\), which has 2 children"):
        small().repr(traversal=OneState())


def test_a_bad_traversal_form_is_a_matcher_error():
    with pytest.raises(cc.errors.MatcherError):
        small().repr(traversal=2.5)


def test_print_takes_the_same_options(capsys):
    small().print(
        comment=lambda n: "x" if n.name == "root" else None, traversal=cc.IterativeMatcher(max_depth=0)
    )
    assert capsys.readouterr().out == "'root' Add  # x\n  ... 2 children not shown\n"


# ---------------------------------------------------------------------- html


def test_html_shows_comments_and_colours():
    page = to_html(small(), comment=lambda n: "<effect>" if n.name == "s" else None, color=lambda n: "red")
    assert page.count("# &lt;effect&gt;") == 1
    assert page.count('style="color:#cf222e"') == 7  # five full lines and two repeat links
