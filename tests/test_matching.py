"""Matcher forms and combinators, get / get_unique / are_any_found, IterativeMatcher limits."""

from __future__ import annotations

import re

import pytest
import torch

import circuits as cc
from circuits import IterativeMatcher, Matcher


@pytest.fixture
def small():
    x = cc.Array(torch.ones(3), name="x")
    y = cc.Array(torch.zeros(3), name="y")
    a = cc.Add(x, y, name="a.sum")
    b = cc.Einsum.from_einsum_string("a,a->a", a, x, name="b.prod")
    g = cc.GeneralFunction.new_by_name(b, spec_name="relu", name="b.relu")
    root = cc.Add(a, g, cc.Scalar(1.0, shape=(3,)), name="root")
    return dict(x=x, y=y, a=a, b=b, g=g, root=root)


def names(nodes):
    return sorted(n.name for n in nodes)


def test_name_string_is_exact(small):
    root = small["root"]
    assert root.get("x") == {small["x"]}
    assert root.get("b") == set()  # not a prefix match
    assert cc.Matcher("a.sum")(small["a"]) and not cc.Matcher("a.sum")(small["b"])


def test_regex_searches_names(small):
    root = small["root"]
    assert names(root.get(Matcher.regex(r"^b\."))) == ["b.prod", "b.relu"]
    assert names(root.get(Matcher.regex(r"sum$"))) == ["a.sum"]
    assert names(root.get(re.compile(r"^[xy]$"))) == ["x", "y"]
    # unnamed nodes never match a regex, even one matching the empty string
    assert None not in {n.name for n in root.get(Matcher.regex(""))}
    with pytest.raises(cc.errors.MatcherError, match="not a valid regular expression"):
        Matcher.regex("(")


def test_class_predicate_set_node_and_bool(small):
    root = small["root"]
    assert names(root.get(cc.Array)) == ["x", "y"]
    assert names(root.get(cc.Add)) == ["a.sum", "root"]
    assert root.get(cc.Scalar) == {small["root"].children[2]}
    assert names(root.get(lambda n: n.shape == (3,) and isinstance(n, cc.Einsum))) == ["b.prod"]
    assert names(root.get({"x", "b.relu"})) == ["b.relu", "x"]
    assert names(root.get(frozenset({"y"}))) == ["y"]
    assert names(root.get({"x", cc.Einsum})) == ["b.prod", "x"]  # mixed forms in a set
    # a node matches by structure: an equal copy built separately matches
    copy = cc.Add(cc.Array(torch.ones(3), name="x"), cc.Array(torch.zeros(3), name="y"), name="a.sum")
    assert copy is not small["a"] and root.get(copy) == {small["a"]}
    assert len(root.get(True)) == 7 and root.get(False) == set()
    assert Matcher.types(cc.Array, cc.Scalar)(small["x"])


def test_combinators(small):
    root = small["root"]
    assert names(root.get(Matcher(cc.Add) & Matcher.regex("^a"))) == ["a.sum"]
    assert names(root.get(Matcher("x") | "y")) == ["x", "y"]
    assert names(root.get("x" | Matcher("y"))) == ["x", "y"]  # plain form on the left
    assert names(root.get(cc.Array & Matcher("x"))) == ["x"]
    named = root.get(~Matcher(cc.Array) & Matcher(lambda n: n.name is not None))
    assert names(named) == ["a.sum", "b.prod", "b.relu", "root"]
    assert names(root.get(~(Matcher("x") | "y") & cc.Array)) == []
    assert "Matcher('x')" in repr(Matcher("x") | "y")


def test_bad_forms_are_clear():
    with pytest.raises(cc.errors.MatcherError, match="cannot make a Matcher from int 3"):
        Matcher(3)
    with pytest.raises(cc.errors.MatcherError, match="circuit node class"):
        Matcher(int)
    with pytest.raises(cc.errors.MatcherError, match="restricts paths"):
        Matcher(IterativeMatcher("x"))


def test_get_unique_and_its_errors(small):
    root = small["root"]
    assert root.get_unique("x") is small["x"]
    assert root.get_unique(cc.Einsum) is small["b"]
    with pytest.raises(cc.errors.MatchError) as info:
        root.get_unique(cc.Array)
    assert info.value.count == 2 and names(info.value.nodes) == ["x", "y"]
    message = str(info.value)
    assert "2 distinct nodes match" in message and "'x'" in message and "'y'" in message
    with pytest.raises(cc.errors.MatchError, match="names that come close: 'a.sum'") as info:  # the hint
        root.get_unique("a.sun")
    assert info.value.count == 0
    assert isinstance(info.value, LookupError) and isinstance(info.value, cc.CircuitError)


def test_get_unique_lists_only_some_of_many():
    leaves = [cc.Array(torch.full((1,), float(i)), name=f"leaf{i}") for i in range(30)]
    root = cc.Add(*leaves)
    with pytest.raises(cc.errors.MatchError, match="and 22 more") as info:  # the message lists 8
        root.get_unique(cc.Array)
    assert info.value.count == 30 and set(info.value.nodes) == set(leaves)
    assert len(str(info.value)) < 600


def test_are_any_found(small):
    root = small["root"]
    assert root.are_any_found("y") and not root.are_any_found("z")
    assert root.are_any_found(IterativeMatcher("b.relu").then("x"))
    assert root.are_any_found(IterativeMatcher("b.relu").then("y"))  # through a.sum
    assert not root.are_any_found(IterativeMatcher("b.prod").children(1).then("y", min_depth=0))


def test_get_dedupes_equal_nodes():
    one = cc.Array(torch.ones(2), name="w")
    other = cc.Array(torch.ones(2), name="w")  # equal, distinct object
    root = cc.Add(cc.Add(one), cc.Einsum.from_einsum_string("a->a", other))
    assert len(root.get("w")) == 1


# --------------------------------------------------------- IterativeMatcher


@pytest.fixture
def tower():
    """A chain r -> n3 -> n2 -> n1 -> leaf, each also holding 'w' as child 1."""
    w = cc.Array(torch.ones(2), name="w")
    node = cc.Array(torch.zeros(2), name="leaf")
    for depth in range(1, 4):
        node = cc.Add(node, w, name=f"n{depth}")
    return cc.Add(node, w, name="r")


def test_depth_range(tower):
    assert names(tower.get(IterativeMatcher(cc.Add, min_depth=1, max_depth=2))) == ["n2", "n3"]
    assert names(tower.get(IterativeMatcher(True, max_depth=0))) == ["r"]
    assert names(tower.get(IterativeMatcher(cc.Array, min_depth=4))) == ["leaf", "w"]
    assert names(tower.get(IterativeMatcher(cc.Array, max_depth=3))) == ["w"]


def test_below_a_node_and_chaining(tower):
    # 'w' strictly below n2 only
    below = IterativeMatcher("n2").then("w")
    assert names(tower.get(below)) == ["w"]
    assert names(tower.get(IterativeMatcher("n2").then(cc.Add))) == ["n1"]
    assert names(tower.get(IterativeMatcher("n2").then(cc.Add, min_depth=0))) == ["n1", "n2"]
    assert names(tower.get(IterativeMatcher("n1").then("n3"))) == []  # n3 is above n1
    # stage depths count from where the previous stage matched
    assert names(tower.get(IterativeMatcher("n3").then(cc.Add, max_depth=1))) == ["n2"]


def test_children_positions(tower):
    assert names(tower.get(IterativeMatcher("n3").children(0))) == ["n2"]
    assert names(tower.get(IterativeMatcher("n3").children(1))) == ["w"]
    assert names(tower.get(IterativeMatcher("n3").children(-1))) == ["w"]
    assert names(tower.get(IterativeMatcher("n3").children(0, 1))) == ["n2", "w"]
    assert names(tower.get(IterativeMatcher("n3").children(5))) == []  # positions not present are skipped
    assert names(tower.get(IterativeMatcher("r").children(0).children(0).children(0))) == ["n1"]
    assert names(tower.get(IterativeMatcher("r").children(0, matcher=cc.Array))) == []
    # then() restricted to positions: below child 0 only
    assert names(tower.get(IterativeMatcher("n3").then("leaf", positions=0))) == ["leaf"]
    assert names(tower.get(IterativeMatcher("n3").then("leaf", positions=1))) == []


def test_stop_at_match(tower):
    every = tower.get(IterativeMatcher(Matcher.regex("^n")))
    first = tower.get(IterativeMatcher(Matcher.regex("^n"), stop_at_match=True))
    assert names(every) == ["n1", "n2", "n3"] and names(first) == ["n3"]


def test_iterative_limits_are_checked():
    with pytest.raises(cc.errors.MatcherError, match="min_depth"):
        IterativeMatcher("x", min_depth=-1)
    with pytest.raises(cc.errors.MatcherError, match="max_depth"):
        IterativeMatcher("x", min_depth=3, max_depth=2)
    with pytest.raises(cc.errors.MatcherError, match="at least one child position"):
        IterativeMatcher("x").children()
    with pytest.raises(cc.errors.MatcherError, match="positions"):
        IterativeMatcher("x").then("y", positions=("a",))


def test_iterative_matcher_is_immutable_and_readable():
    base = IterativeMatcher("head")
    longer = base.children(0).then("x")
    assert repr(base) == "IterativeMatcher(Matcher('head'))"
    assert repr(longer) == "IterativeMatcher(Matcher('head')).children(0).then(Matcher('x'))"
    assert base.is_plain and not longer.is_plain


def test_deep_chain_is_searched_without_recursion():
    leaf = cc.Array(torch.ones(1), name="deep.leaf")
    node = leaf
    for _ in range(50_000):
        node = cc.Add(node)
    assert node.get_unique(Matcher.regex("leaf$")) is leaf
    assert node.get(IterativeMatcher(cc.Array, min_depth=50_000)) == {leaf}
    assert node.get(IterativeMatcher(cc.Array, max_depth=49_999)) == set()


def test_a_union_of_classes_is_a_class_matcher():
    x = cc.Array(torch.ones(2), name="x")
    root = cc.Add(cc.Einsum.from_einsum_string("a->a", x, name="e"), x, name="r")
    assert {n.name for n in root.get(cc.Einsum | cc.Add)} == {"e", "r"}
    assert {n.name for n in root.get(cc.Einsum | cc.Array)} == {"e", "x"}
