"""rust_circuit's names that its users reach for: Regex, Einsum.scalar_mul, Add.minus, the matcher
methods (m.get, m.update, ...), Getter, Updater, Expander, cast_circuit; each against torch written
here or explicit node sets (rust_circuit's own tests, tests/test_rust_get_update.py, as found sets)."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits import IterativeMatcher, Matcher
from circuits.rewriting.operations import Expander, Getter, Updater
from circuits.rewriting.rewrite import cast_circuit


def names(nodes):
    return sorted(n.name for n in nodes)


@pytest.fixture
def added():
    """rust_circuit's test_get circuit: ein = a @ b, soft = softmax(ein), added = ein + soft."""
    a = cc.Array(torch.arange(4.0).reshape(2, 2), name="a")
    b = cc.Array(torch.ones(2, 2), name="b")
    ein = cc.Einsum.from_einsum_string("ij,jk->ik", a, b, name="ein")
    soft = cc.GeneralFunction.new_by_name(ein, spec_name="softmax", name="soft")
    return cc.Add(ein, soft, name="added")


# ---------------------------------------------------------------------- Regex


def test_regex_escapes_dots_by_default_as_rust_circuit_does():
    assert cc.Regex("b1.a").call("b1.a") and not cc.Regex("b1.a").call("b1xa")
    assert cc.Regex(r"b1\.a").call("b1xa")  # \. is the wildcard
    assert cc.Regex("b1.a", escape_dot=False).call("b1xa")
    assert cc.Regex("^a$").call("a") and not cc.Regex("^a$").call("ab")  # anchors as written
    assert cc.Regex("head").call("b0.a.head1")  # a search, not a full match
    x, y = cc.Array(torch.ones(1), name="b1.a"), cc.Array(torch.ones(1), name="b1xa")
    root = cc.Add(x, y, name="r")
    assert root.get(cc.Regex("b1.a")) == {x}
    assert root.get(cc.Regex(r"^b1\.a$")) == {x, y}
    assert root.get(Matcher.regex("b1.a", escape_dot=True)) == {x}
    assert root.get(Matcher.regex("b1.a")) == {x, y}  # Python's reading unless asked
    assert repr(cc.Regex("a.b")) == "Regex('a.b', escape_dot=True)"
    with pytest.raises(cc.errors.MatcherError, match=r"Regex\('\('\): not a valid regular expression"):
        cc.Regex("(")
    with pytest.raises(cc.errors.MatcherError, match="escape_dot 1 is not a bool"):
        cc.Regex("a", escape_dot=1)
    with pytest.raises(cc.errors.MatcherError, match="flags are not taken with escape_dot=True"):
        Matcher.regex("a", 2, escape_dot=True)


# ----------------------------------------------------- Einsum.scalar_mul, Add.minus


def test_einsum_scalar_mul():
    x = torch.randn(2, 3, dtype=torch.float64)
    node = cc.Einsum.scalar_mul(cc.Array(x, name="x"), 2.5, name="x2", scalar_name="two.5")
    torch.testing.assert_close(node.evaluate(), x * 2.5)
    assert node.name == "x2" and node.einsum_string == "ab,->ab"
    scalar = node.children[1]
    assert isinstance(scalar, cc.Scalar) and scalar.name == "two.5" and scalar.value == 2.5
    rank0 = cc.Einsum.scalar_mul(cc.Scalar(3.0), -2)
    torch.testing.assert_close(rank0.evaluate(), torch.tensor(-6.0, dtype=rank0.evaluate().dtype))
    with pytest.raises(cc.errors.EinsumError, match="scalar 'two' is not a real number"):
        cc.Einsum.scalar_mul(cc.Array(x), "two")
    with pytest.raises(cc.errors.NodeTypeError, match="node is a Tensor"):
        cc.Einsum.scalar_mul(x, 2.0)


def test_add_minus():
    a = torch.randn(2, 3, dtype=torch.float64)
    b = torch.randn(3, dtype=torch.float64)
    node = cc.Add.minus(cc.Array(a, name="a"), cc.Array(b, name="b"), name="diff")
    torch.testing.assert_close(node.evaluate(), a - b)
    negated = node.children[1]
    assert node.name == "diff" and negated.name == "neg b" and negated.children[1].name == "neg_1"
    assert cc.Add.minus(cc.Array(a), cc.Array(a)).children[1].name is None
    with pytest.raises(cc.errors.NodeTypeError, match="negative is a float"):
        cc.Add.minus(cc.Array(a), 1.0)


# ---------------------------------------------------------- matcher methods


def test_matchers_get_and_update_as_methods(added):
    ein = added.get_unique("ein")
    assert IterativeMatcher("ein").get(added) == {ein}
    assert Matcher(cc.Array).get(added) == added.get(cc.Array)
    assert IterativeMatcher("soft").chain("a").get_unique(added).name == "a"
    assert Matcher("soft").chain("a").get(added) == IterativeMatcher("soft").chain("a").get(added)
    assert IterativeMatcher("nothing").get_unique_op(added) is None
    assert IterativeMatcher("ein").get_unique_op(added) is ein
    with pytest.raises(cc.errors.MatchError) as info:
        Matcher(cc.Array).get_unique_op(added)
    assert info.value.count == 2 and set(info.value.nodes) == added.get(cc.Array)
    assert IterativeMatcher("b").are_any_found(added) and not Matcher("c").are_any_found(added)
    assert str(IterativeMatcher("soft").chain("b").get_paths(added)) == "added -> soft -> ein -> b"
    zero = cc.Scalar(0.0, shape=(2, 2), name="a")
    # only a's use below soft becomes zero: ein + softmax(0 @ b)
    rewritten = IterativeMatcher("soft").chain("a").update(added, lambda n: zero)
    a, b = torch.arange(4.0).reshape(2, 2), torch.ones(2, 2)
    torch.testing.assert_close(rewritten.evaluate(), a @ b + torch.softmax(torch.zeros(2, 2), -1))
    assert Matcher("a").update(added, lambda n: zero).evaluate().abs().sum() > 0
    with pytest.raises(cc.errors.NoMatchError, match="names that come close: 'a'"):
        Matcher("aa").update(added, lambda n: zero)
    assert Matcher("aa").update(added, lambda n: zero, assert_any_found=False) is added


# -------------------------------------------------------------------- Getter


def test_getter_and_fancy_validate_as_in_rust_circuits_test_get(added):
    ein, soft = added.get_unique("ein"), added.get_unique("soft")
    a, b = added.get_unique("a"), added.get_unique("b")
    assert Getter()(added, cc.Array, fancy_validate=True) == {a, b}
    assert Getter()(added, ein, fancy_validate=True) == {ein}
    assert Getter().get_unique(added, ein, fancy_validate=True) is ein
    assert Getter()(added, ~Matcher(cc.Array), fancy_validate=True) == {ein, soft, added}
    assert added.get(~Matcher(cc.Array), fancy_validate=True) == {ein, soft, added}
    # without validation, a name that finds nothing goes unnoticed; with it, it is named
    assert Getter()(added, {"ein", "eni"}) == {ein}
    with pytest.raises(
        cc.errors.MatchError, match=r"found nothing: 'eni' \(names that come close: 'ein'\)"
    ) as info:
        Getter()(added, {"ein", "eni"}, fancy_validate=True)
    assert info.value.count == 1 and info.value.nodes == [ein]
    for matcher, found in (
        ("sdkfj", []),
        (cc.Cumulant, []),
        (Matcher.types(cc.Einsum, cc.Cumulant), [ein]),
        (cc.Array(torch.ones(1)), []),
    ):
        with pytest.raises(cc.errors.MatchError) as info:
            Getter()(added, matcher, fancy_validate=True)
        assert info.value.count == len(found) and info.value.nodes == found
    with pytest.raises(cc.errors.MatchError, match="found nothing: Cumulant"):
        Matcher.types(cc.Einsum, cc.Cumulant).get(added, fancy_validate=True)
    with pytest.raises(cc.errors.MatchError, match=r"found nothing: <Array 'a' \[2, 2\]>, 'dif'"):
        (Matcher(a) & Matcher("dif")).get(added, fancy_validate=True)  # & finds nothing: neither part
    with pytest.raises(cc.errors.MatchError):
        Matcher("dif").getter(default_fancy_validate=True).get(added)
    assert Matcher("dif").getter(default_fancy_validate=True).get(added, fancy_validate=False) == set()
    with pytest.raises(cc.errors.MatchError):
        Getter(default_fancy_validate=True).bind("dif")(added)
    # of an IterativeMatcher, the last matcher of each chain is checked
    assert Matcher("ein").chain(cc.Array).get(added, fancy_validate=True) == {a, b}
    b_dup = cc.Array(torch.ones(2, 2), name="b_dup")
    assert Matcher("ein").chain(b_dup).get(added) == set()
    with pytest.raises(cc.errors.MatchError, match="b_dup"):
        Matcher("ein").chain(b_dup).get(added, fancy_validate=True)
    either = Matcher("ein").chain(a) | Matcher("soft").chain("b")
    assert either.get(added, fancy_validate=True) == {a, b}
    with pytest.raises(cc.errors.MatchError, match="'c'"):
        (Matcher("ein").chain(a) | Matcher("soft").chain("c")).get(added, fancy_validate=True)
    bound = IterativeMatcher("soft").chain("b").getter()
    assert bound(added) == {b} and bound.get_unique(added) is b
    assert str(bound.get_paths(added)) == "added -> soft -> ein -> b"
    with pytest.raises(cc.errors.MatchError, match="default_fancy_validate 1 is not a bool"):
        Getter(1)


# ------------------------------------------------------------------- Updater


def test_updater_and_assert_any_found_as_in_rust_circuits_test(added):
    a = added.get_unique("a")

    def to_zero(node):
        return cc.Scalar(0.0, shape=node.shape, name=node.name)

    expected = added.update("a", to_zero)
    a_val, b_val = torch.zeros(2, 2), torch.ones(2, 2)
    torch.testing.assert_close(expected.evaluate(), a_val @ b_val + torch.softmax(a_val @ b_val, -1))
    assert Updater(to_zero)(added, "a") == expected
    assert Updater(to_zero)(added, {"a", "q"}) == expected
    assert IterativeMatcher("a").updater(to_zero)(added) == expected
    assert Matcher("a").updater(to_zero).update(added, assert_any_found=True) == expected
    assert a.update("a", to_zero) == to_zero(a)
    with pytest.raises(cc.errors.NoMatchError):
        Updater(to_zero)(added, "q")
    with pytest.raises(cc.errors.NoMatchError):
        IterativeMatcher("q").updater(to_zero)(added)
    assert Updater(to_zero)(added, "q", assert_any_found=False) is added
    assert Updater(to_zero, default_assert_any_found=False)(added, "q") is added
    assert Updater(to_zero, default_assert_any_found=False).bind("q")(added) is added
    with pytest.raises(cc.errors.NoMatchError):
        Updater(to_zero, default_assert_any_found=False)(added, "q", assert_any_found=True)
    with pytest.raises(cc.errors.MatchError, match="found nothing: 'q'"):
        Updater(to_zero, default_fancy_validate=True)(added, {"a", "q"})
    with pytest.raises(cc.errors.RewriteError, match="cache_transform=False is not supported"):
        Updater(to_zero, cache_transform=False)
    with pytest.raises(cc.errors.RewriteError, match="not callable"):
        Updater(3)


# ------------------------------------------------------------------ Expander


def test_expander_batches_as_expand_does():
    x = torch.arange(3.0)
    w = torch.tensor([1.0, -2.0, 0.5])
    root = cc.Einsum.from_einsum_string("a,a->", cc.Array(x, name="x"), cc.Array(w, name="w"), name="dot")
    batch = torch.randn(4, 3)
    batched = Expander(("x", lambda n: cc.Array(batch, name="x")))(root)
    torch.testing.assert_close(batched.evaluate(), batch @ w)
    # the first matcher that matches a node wins; a second expander adds the same batch axes
    scaled = cc.Array(2 * batch, name="x")
    both = Expander((cc.Array & Matcher("x"), lambda n: scaled), (cc.Array, lambda n: n))(root)
    torch.testing.assert_close(both.evaluate(), (2 * batch) @ w)
    with pytest.raises(cc.errors.ExpandError, match="matched by 2 matchers"):
        Expander(("x", lambda n: scaled), (cc.Array, lambda n: n), ban_multiple_matches_on_node=True)(root)
    with pytest.raises(cc.errors.NoMatchError, match="names that come close: 'x'"):
        Expander(("xx", lambda n: scaled))(root)
    assert Expander(("xx", lambda n: scaled)).batch(root, assert_any_found=False) is root
    with pytest.raises(cc.errors.MatchError, match="found nothing: 'xx'"):
        Expander(("x", lambda n: scaled), ("xx", lambda n: scaled), default_fancy_validate=True)(root)
    with pytest.raises(cc.errors.ExpandError, match="suffix='b' is not supported"):
        Expander(("x", lambda n: scaled), suffix="b")
    with pytest.raises(cc.errors.ExpandError, match="restricts paths"):
        Expander((IterativeMatcher("dot").chain("x"), lambda n: scaled))


# -------------------------------------------------------------- cast_circuit


def test_cast_circuit_casts_floating_arrays_and_keeps_integer_ones():
    table = torch.randn(5, 3, dtype=torch.float64)
    bias = torch.randn(3, dtype=torch.float64)
    rows = cc.Index(cc.Array(table, name="table"), (torch.tensor([1, 3]),), name="rows")
    root = cc.Add(rows, cc.Array(bias, name="bias"), name="root")
    cast = cast_circuit(root, dtype=torch.float32)
    value = cast.evaluate()
    assert value.dtype == torch.float32
    torch.testing.assert_close(value, (table[[1, 3]] + bias).float())
    assert {n.value.dtype for n in cast.get(cc.Array)} == {torch.float32}
    assert cast.get_unique("rows").index[0].dtype == torch.int64  # an index stays integer
    # integer tensors keep their dtype
    toks = cc.Array(torch.tensor([4, 0, 2]), name="toks")
    assert cast_circuit(toks, dtype=torch.float16) is toks

    # already fitting: the same objects; device_dtype as rust_circuit's TorchDeviceDtypeOp
    class DeviceDtype:
        device, dtype = "cpu", "float64"

    assert cast_circuit(root, DeviceDtype()) is root
    assert cast_circuit(root, dtype=torch.float64) is root
    with pytest.raises(cc.errors.RewriteError, match="not a floating torch dtype"):
        cast_circuit(root, dtype=torch.int32)
    with pytest.raises(cc.errors.RewriteError, match="not both"):
        cast_circuit(root, DeviceDtype(), dtype=torch.float32)
    with pytest.raises(cc.errors.RewriteError, match="not a torch device"):
        cast_circuit(root, device="nowhere")
    with pytest.raises(cc.errors.RewriteError, match="has no tensor to cast"):
        cast_circuit(cc.Array.from_hash((3,), "0" * 32, name="gone"), dtype=torch.float32)
