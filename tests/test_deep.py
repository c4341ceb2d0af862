"""Nothing recurses over depth: 50,000 nested Adds build, hash, print, parse, compare.

The text of a chain is quadratic in its depth (two spaces of indent per
level): 50,000 levels print to 2.5 GB, which this test really writes and
reads back, so it takes several seconds and a few GB of memory.
"""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits.core.traversal import postorder

DEPTH = 50_000
#: the printed chain indents each line two spaces deeper, so its text grows with the square of the
#: depth: 25,000 (25 times Python's recursion limit) keeps the print and parse test at a quarter
PRINT_DEPTH = 25_000


def chain(depth: int, with_leaf_operand: bool) -> cc.Circuit:
    leaf = cc.Array(torch.ones(2), name="leaf")
    node = leaf
    for _ in range(depth):
        node = cc.Add(node, leaf) if with_leaf_operand else cc.Add(node)
    return node


def test_deep_chain_builds_hashes_compares_and_walks():
    first = chain(DEPTH, with_leaf_operand=True)
    second = chain(DEPTH, with_leaf_operand=True)
    assert first is not second and first == second and hash(first) == hash(second)
    assert first != chain(DEPTH - 1, with_leaf_operand=True)
    assert len(cc.unique_nodes([first])) == DEPTH + 1
    order = postorder([first])
    assert len(order) == DEPTH + 1 and order[0].name == "leaf" and order[-1] is first
    shallow = first.repr(depth=3)
    # four Adds, the elision line under the deepest, then the leaf in full once and twice by reference
    assert shallow.split("\n")[:5] == [
        "0 Add",
        "  1 Add",
        "    2 Add",
        "      3 Add",
        "        ... 2 children not shown",
    ]
    assert shallow.split("\n")[5].startswith("      'leaf' [2] Array ")
    assert shallow.split("\n")[6:] == ["    'leaf'", "  'leaf'"]


@pytest.mark.slow
def test_deep_chain_prints_and_parses():
    deep = chain(PRINT_DEPTH, with_leaf_operand=False)
    text = deep.repr()
    lines = text.count("\n") + 1
    assert lines == PRINT_DEPTH + 1
    assert text.startswith("0 Add\n  1 Add\n")
    last_line = text[text.rindex("\n") + 1 :]
    assert last_line.startswith("  " * PRINT_DEPTH + "'leaf' [2] Array ")
    again = cc.parse(text)
    assert again == deep
    del text
