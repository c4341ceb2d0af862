"""The side-by-side view of ``diff``/``circuit_diff``: rows for known changes, collapsed
unchanged runs, the printed text, ANSI colours and HTML, and refused options.

Expected rows and texts are written by hand.
"""

from __future__ import annotations

import pytest

import circuits as cc
from circuits.text.diff import Row, SideBySideDiff, side_by_side_rows

RED, GREEN, CYAN, RESET = "\x1b[31m", "\x1b[32m", "\x1b[36m", "\x1b[0m"


def chain(length: int, renamed: int | None = None) -> cc.Circuit:
    """A chain of one-operand Ads 'n{length-1}' ... 'n0' over a scalar 'x'; one may be renamed."""
    node = cc.Scalar(1.0, shape=(2,), name="x")
    for i in range(length):
        node = cc.Add(node, name=f"n{i}_new" if i == renamed else f"n{i}")
    return node


def test_rows_of_plain_lines_pair_changes_and_collapse_far_unchanged_runs():
    old = ["a", "b", "c", "d", "e", "f", "g", "h", "i"]
    new = ["a", "b", "c", "D", "e", "f", "g", "h", "i", "j"]
    assert side_by_side_rows(old, new, context=1) == [
        Row("...", None, None, 2),
        Row(" ", "c", "c"),
        Row("|", "d", "D"),
        Row(" ", "e", "e"),
        Row("...", None, None, 3),
        Row(" ", "i", "i"),
        Row(">", None, "j"),
    ]


def test_a_longer_old_block_leaves_lines_only_on_the_left():
    assert side_by_side_rows(["a", "b", "c", "z"], ["a", "B", "z"], context=0) == [
        Row("...", None, None, 1),
        Row("|", "b", "B"),
        Row("<", "c", None),
        Row("...", None, None, 1),
    ]


def test_a_rename_deep_in_a_chain_is_one_changed_row_with_context_around_it():
    result = cc.circuit_diff(chain(12, renamed=3), chain(12), view="side", context=2)
    assert isinstance(result, SideBySideDiff)
    indent = "  " * 8  # 'n3' is the ninth line: depth 8
    assert result.rows == [
        Row("...", None, None, 6),
        Row(" ", "  " * 6 + "'n5' Add", "  " * 6 + "'n5' Add"),
        Row(" ", "  " * 7 + "'n4' Add", "  " * 7 + "'n4' Add"),
        Row("|", indent + "'n3' Add", indent + "'n3_new' Add"),
        Row(" ", "  " * 9 + "'n2' Add", "  " * 9 + "'n2' Add"),
        Row(" ", "  " * 10 + "'n1' Add", "  " * 10 + "'n1' Add"),
        Row("...", None, None, 2),
    ]


def small_pair() -> tuple[cc.Circuit, cc.Circuit]:
    x = cc.Scalar(1.0, shape=(2,), name="x")
    y = cc.Scalar(2.0, shape=(2,), name="y")
    old = cc.Add(x, y, name="s")
    new = cc.Add(x, cc.Scalar(3.0, shape=(2,), name="y"), x, name="s")
    return new, old


def test_side_by_side_text_of_a_small_change():
    new, old = small_pair()
    # The left column is as wide as the longest old line (18 characters); " m " separates.
    assert cc.diff(new, old, view="side").split("\n") == [
        "old" + " " * 15 + "   " + "new",
        "'s' Add" + " " * 11 + "   " + "'s' Add",
        "  'x' [2] Scalar 1" + "   " + "  'x' [2] Scalar 1",
        "  'y' [2] Scalar 2" + " | " + "  'y' [2] Scalar 3",
        " " * 18 + " > " + "  'x'",
    ]


def test_width_cuts_both_columns():
    new, old = small_pair()
    # (27 - 3) // 2 = 12 characters a column: 11 kept and an ellipsis.
    assert cc.diff(new, old, view="side", width=27).split("\n") == [
        "old" + " " * 9 + "   " + "new",
        "'s' Add" + " " * 5 + "   " + "'s' Add",
        "  'x' [2] S…" + "   " + "  'x' [2] S…",
        "  'y' [2] S…" + " | " + "  'y' [2] S…",
        " " * 12 + " > " + "  'x'",
    ]


def test_colours_mark_the_changed_sides_and_the_collapsed_rows():
    text = cc.diff(chain(12, renamed=3), chain(12), view="side", context=0, color=True)
    column = len("  " * 8 + "'n3' Add")
    assert text.split("\n") == [
        f"{'old':<{column}}   new",
        f"{CYAN}... 8 unchanged lines{RESET}",
        f"{RED}{'  ' * 8}'n3' Add{RESET} | {GREEN}{'  ' * 8}'n3_new' Add{RESET}",
        f"{CYAN}... 4 unchanged lines{RESET}",
    ]


def test_html_is_a_two_column_table_with_tinted_changes():
    new, old = small_pair()
    page = cc.circuit_diff(new, old, view="side")._repr_html_()
    assert page.startswith("<table") and page.endswith("</table>")
    assert page.count("<tr>") == 5  # the header and four rows
    assert page.count("background:#ffebe9") == 1  # the one old line that changed
    assert page.count("background:#dafbe1") == 2  # its new line and the added 'x'
    assert "&#x27;y&#x27; [2] Scalar 3" in page


def test_html_shows_collapsed_rows_across_both_columns():
    page = cc.circuit_diff(chain(12, renamed=3), chain(12), view="side", context=1)._repr_html_()
    assert page.count('colspan="3"') == 2
    assert "&hellip; 7 unchanged lines" in page and "&hellip; 3 unchanged lines" in page


def test_no_change_is_empty_in_both_views():
    c = chain(4)
    assert cc.diff(c, c, view="side") == ""
    assert not cc.circuit_diff(c, c, view="side")
    assert cc.circuit_diff(c, c, view="side")._repr_html_().count("<tr>") == 1  # the header only
    assert cc.diff(c, c) == ""


def test_the_unified_view_stays_the_default():
    new, old = small_pair()
    assert cc.diff(new, old) == cc.diff(new, old, view="unified")
    assert cc.diff(new, old).split("\n")[:3] == ["--- old", "+++ new", "@@ -1,3 +1,4 @@"]


@pytest.mark.parametrize(
    "options, message",
    [
        ({"view": "sideways"}, r"diff view 'sideways': expected one of 'unified', 'side'"),
        ({"view": "unified", "width": 80}, r"width= sets the columns of view='side'"),
        ({"view": "side", "width": 5}, r"width=5: expected a number of characters, 20 or more"),
        ({"view": "side", "context": -1}, r"context=-1: expected a number of lines"),
    ],
)
def test_bad_options_are_refused(options, message):
    new, old = small_pair()
    with pytest.raises(cc.errors.PrintError, match=message):
        cc.diff(new, old, **options)
