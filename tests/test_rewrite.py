"""update / replace / substitute: bottom-up semantics, sharing kept, path-restricted patching."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
from circuits import IterativeMatcher, Matcher


def unchanged(*circuits):
    """Snapshot of hashes and texts, to check a rewrite left its input alone."""
    return [(c.hash, c.repr()) for c in circuits]


@pytest.fixture
def diamond():
    """A shared subtree 's' used by two parents, both under the root."""
    x = cc.Array(torch.arange(3.0), name="x")
    w = cc.Array(torch.ones(3), name="w")
    s = cc.Einsum.from_einsum_string("a,a->a", x, w, name="s")
    left = cc.GeneralFunction.new_by_name(s, spec_name="relu", name="left")
    right = cc.Add(s, w, name="right")
    other = cc.Array(torch.full((3,), 7.0), name="other")
    root = cc.Add(left, right, cc.Add(other, name="o"), name="root")
    return dict(x=x, w=w, s=s, left=left, right=right, other=other, root=root)


def test_update_rebuilds_ancestors_only_and_keeps_sharing(diamond):
    root = diamond["root"]
    before = unchanged(root)
    new_x = cc.Array(torch.full((3,), 2.0), name="x")
    out = root.update("x", lambda n: new_x)
    assert unchanged(root) == before
    assert out is not root
    new_left, new_right, o = out.children
    # the shared subtree was rewritten once and is still shared
    assert new_left.children[0] is new_right.children[0]
    assert new_left.children[0].children[0] is new_x
    # untouched subtrees are the very same objects
    assert o is root.children[2]
    assert new_left.children[0].children[1] is diamond["w"]
    assert new_right.children[1] is diamond["w"]
    assert torch.allclose(out.evaluate(), torch.relu(2.0 * torch.ones(3)) + 2.0 + 1.0 + 7.0)


def test_update_without_match_or_with_equal_result_returns_same_object(diamond):
    root = diamond["root"]
    assert root.update("nothing", lambda n: 1 / 0, assert_any_found=False) is root
    assert root.update("x", lambda n: n) is root
    rebuilt = cc.Array(torch.arange(3.0), name="x")  # equal, not the same object
    assert root.update("x", lambda n: rebuilt) is root


def test_update_that_finds_nothing_raises_with_close_names(diamond):
    """A typo in an ablation must not look like "no effect" (issue 28, item 7)."""
    root = diamond["root"]
    zero = lambda n: cc.Scalar(0.0, shape=n.shape, name=n.name)  # noqa: E731
    for call in (lambda: root.update("lft", zero), lambda: cc.update(root, "lft", zero)):
        with pytest.raises(
            cc.errors.NoMatchError, match=r"update\(Matcher\('lft'\)\): no node found in Add 'root'"
        ) as info:
            call()
        assert isinstance(info.value, cc.errors.MatchError) and isinstance(info.value, cc.errors.RewriteError)
        assert info.value.count == 0 and info.value.nodes == []
        assert "names that come close: 'left'" in str(info.value)
        assert "assert_any_found=False" in str(info.value)
    # the same suggestions as an experiment's (one shared function)
    with pytest.raises(cc.errors.ExperimentError, match="names that come close: 'left'"):
        cc.experiments.zero_ablate(root, "lft")
    # an IterativeMatcher: each name it looks for that is absent gets its close names
    with pytest.raises(cc.errors.NoMatchError, match=r"no node is named 'ss' \(names that come close: 's'\)"):
        root.update(IterativeMatcher("left").chain("ss"), zero)
    # names that exist, on no common path: no names to suggest, still an error
    with pytest.raises(
        cc.errors.NoMatchError, match=r"\.chain\(Matcher\('left'\)\)\): no node found in Add 'root'; pass"
    ):
        root.update(IterativeMatcher("right").chain("left"), zero)
    # told that finding nothing is fine: the very same circuit
    assert root.update("lft", zero, assert_any_found=False) is root
    assert cc.update(root, IterativeMatcher("right").chain("left"), zero, assert_any_found=False) is root
    # a matcher that finds something works as before, and fancy_validate checks each part
    assert root.update({"left", "lft"}, zero).get_unique("left").value == 0.0
    with pytest.raises(cc.errors.MatchError, match=r"found nothing: 'lft' \(names that come close: 'left'\)"):
        root.update({"left", "lft"}, zero, fancy_validate=True)


def test_a_path_through_a_head_of_an_unsplit_layer_says_to_split_heads():
    from circuits import models

    unsplit = cc.passes.causal_mask(models.load_demo_model(torch.zeros(1, 6, dtype=torch.int64)))
    path = IterativeMatcher("b1.a.head1").chain("a.v")
    with pytest.raises(
        cc.errors.NoMatchError, match=r"layer 1 is not split into heads .*cc.passes.split_heads\(c\)"
    ):
        unsplit.update(path, lambda n: n)
    assert cc.passes.split_heads(unsplit).update(path, lambda n: n) is not None


def test_replace_of_a_key_that_replaces_nothing_raises(diamond):
    root, x, s = diamond["root"], diamond["x"], diamond["s"]
    other_x = cc.Array(torch.arange(4.0), name="x")  # named like x, but another node
    new = cc.Array(torch.zeros(4), name="x")
    with pytest.raises(cc.errors.NoMatchError) as info:
        root.replace({other_x: new})
    assert info.value.keys == [other_x] and isinstance(info.value, cc.errors.RewriteError)
    assert "the circuit's node(s) named 'x' differ from it: Array 'x' [3]" in str(info.value)
    y = cc.Array(torch.ones(3), name="y")
    with pytest.raises(cc.errors.NoMatchError, match="no node is named 'y'") as info:  # says why
        cc.replace(root, {y: x})
    assert info.value.keys == [y]
    # a key below another key is never reached: replacing it would have no effect
    with pytest.raises(cc.errors.NoMatchError, match="is below another key") as info:  # says why
        root.replace({s: x, x: cc.Array(torch.ones(3), name="x1")})
    assert info.value.keys == [x]
    assert root.replace({other_x: new}, assert_all_found=False) is root
    kept = root.replace({s: x, x: cc.Array(torch.ones(3), name="x1")}, assert_all_found=False)
    torch.testing.assert_close(
        kept.evaluate(), torch.relu(torch.arange(3.0)) + torch.arange(3.0) + 1 + 7, check_dtype=False
    )


def test_update_is_bottom_up_and_fn_sees_updated_children(diamond):
    root = diamond["root"]
    seen = []

    def fn(node):
        seen.append(node)
        if node.name == "x":
            return cc.Array(torch.full((3,), 5.0), name="x5")
        return node.rename(node.name + "!")

    out = root.update(Matcher("x") | "s" | "left", fn)
    assert [n.name for n in seen] == ["x", "s", "left"]  # children before parents, each once
    # s was matched inside nothing, but contains x: fn got s with x already replaced
    assert seen[1].children[0].name == "x5"
    # left contains s: fn got left over the already-updated s
    assert seen[2].children[0].name == "s!" and seen[2].children[0].children[0].name == "x5"
    assert out.get_unique("left!").children[0] is out.get_unique("right").children[0]


def test_update_calls_fn_once_per_distinct_node():
    leaf = cc.Array(torch.ones(2), name="leaf")
    copy = cc.Array(torch.ones(2), name="leaf")  # equal to leaf: one distinct node
    root = cc.Add(cc.Add(leaf, copy), cc.Einsum.from_einsum_string("a->a", leaf))
    calls = []
    out = root.update("leaf", lambda n: calls.append(n) or cc.Array(torch.zeros(2), name="z"))
    assert len(calls) == 1
    z = out.get_unique("z")
    assert out.children[0].children[0] is z and out.children[0].children[1] is z
    assert out.children[1].children[0] is z


def test_update_errors(diamond):
    root = diamond["root"]
    with pytest.raises(cc.errors.RewriteError, match="fn returned a int for Array 'x'"):
        root.update("x", lambda n: 3)
    with pytest.raises(cc.errors.RewriteError, match="must be callable"):
        root.update("x", 3)
    with pytest.raises(cc.errors.EinsumError) as info:
        root.update("x", lambda n: cc.Array(torch.ones(4), name="x"))
    assert "while rebuilding Einsum 's'" in "".join(info.value.__notes__)


def test_update_with_class_and_predicate_matchers(diamond):
    root = diamond["root"]
    doubled = root.update(cc.Array, lambda n: cc.Array(n.tensor() * 2, name=n.name))
    x, w, other = torch.arange(3.0) * 2, torch.ones(3) * 2, torch.full((3,), 14.0)
    assert torch.allclose(doubled.evaluate(), torch.relu(x * w) + x * w + w + other)


def test_replace_by_structure_replaces_whole_subtrees(diamond):
    root = diamond["root"]
    before = unchanged(root)
    s_copy = cc.Einsum.from_einsum_string(
        "a,a->a", cc.Array(torch.arange(3.0), name="x"), cc.Array(torch.ones(3), name="w"), name="s"
    )
    new_s = cc.Array(torch.full((3,), -1.0), name="s.patched")
    out = root.replace({s_copy: new_s})
    assert unchanged(root) == before
    assert out.children[0].children[0] is new_s and out.children[1].children[0] is new_s
    assert out.children[2] is root.children[2]
    assert root.replace({}) is root
    # what replaces a node is used as given, never searched again
    x = diamond["x"]
    wrapped = cc.Add(x, name="wrapped")
    assert root.replace({x: wrapped}).get_unique("wrapped").children[0] is x
    with pytest.raises(cc.errors.RewriteError, match="not a circuit node"):
        root.replace({"x": new_s})
    with pytest.raises(cc.errors.RewriteError, match="replacement for Array 'x'"):
        root.replace({x: torch.ones(3)})


def test_substitute_symbols(diamond):
    toks = cc.Symbol((3,), name="toks")
    scale = cc.Symbol((), name="scale")
    root = cc.Einsum.from_einsum_string("a,->a", cc.Add(toks, diamond["w"]), scale, name="root")
    before = unchanged(root)
    out = cc.substitute(root, {"toks": cc.Array(torch.arange(3.0), name="t"), scale: torch.tensor(2.0)})
    assert unchanged(root) == before
    assert torch.allclose(out.evaluate(), (torch.arange(3.0) + 1) * 2)
    assert out.get_unique("scale").kind == "Array"  # a tensor is wrapped, named like the Symbol
    missing = r"Symbol 'tok' is not in Einsum 'root'; its Symbols are: 'scale' \[\], 'toks' \[3\]"
    with pytest.raises(cc.errors.RewriteError, match=missing):
        cc.substitute(root, {"tok": torch.ones(3)})
    mismatch = r"Symbol 'toks' has shape \[3\] but .* has shape \[4, 3\].*expand"
    with pytest.raises(cc.errors.RewriteError, match=mismatch):
        cc.substitute(root, {"toks": torch.ones(4, 3)})
    with pytest.raises(cc.errors.RewriteError, match="neither a Symbol node nor a name"):
        cc.substitute(root, {3: torch.ones(3)})


# ------------------------------------------------------------ path patching


D, S, H = 6, 5, 4


def attention_head(resid: cc.Circuit, weights: dict, name: str) -> cc.Circuit:
    q = cc.Einsum.from_einsum_string("sd,cd->sc", resid, weights["q"], name=f"{name}.q")
    k = cc.Einsum.from_einsum_string("sd,cd->sc", resid, weights["k"], name=f"{name}.k")
    v = cc.Einsum.from_einsum_string("sd,cd->sc", resid, weights["v"], name=f"{name}.v")
    scores = cc.Einsum.from_einsum_string("qc,kc->qk", q, k, name=f"{name}.scores")
    probs = cc.GeneralFunction.new_by_name(scores, spec_name="softmax", name=f"{name}.probs")
    comb = cc.Einsum.from_einsum_string("qk,kc->qc", probs, v, name=f"{name}.comb_v")
    return cc.Einsum.from_einsum_string("qc,dc->qd", comb, weights["o"], name=name)


def torch_head(q_in, k_in, v_in, w):
    q, k, v = q_in @ w["q"].T, k_in @ w["k"].T, v_in @ w["v"].T
    return torch.softmax(q @ k.T, dim=-1) @ v @ w["o"].T


@pytest.fixture
def two_heads():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(S, D, generator=generator)
    tensors = {
        head: {
            "q": torch.randn(H, D, generator=generator),
            "k": torch.randn(H, D, generator=generator),
            "v": torch.randn(H, D, generator=generator),
            "o": torch.randn(D, H, generator=generator),
        }
        for head in ("h0", "h1")
    }
    resid = cc.Add(cc.Array(x, name="embeds"), name="resid")  # shared by every q, k, v input
    heads = []
    for head, w in tensors.items():
        weights = {key: cc.Array(value, name=f"{head}.w.{key}") for key, value in w.items()}
        heads.append(attention_head(resid, weights, head))
    root = cc.Add(*heads, name="out")
    return root, x, tensors


def test_path_patching_only_the_value_input_of_one_head(two_heads):
    root, x, w = two_heads
    before = unchanged(root)
    corrupted = torch.randn(S, D, generator=torch.Generator().manual_seed(1))
    value_path = IterativeMatcher("h0").children(0).children(1).then("resid")  # h0 -> comb_v -> v -> resid
    assert repr(value_path) == (
        "IterativeMatcher(Matcher('h0')).children(0).children(1).then(Matcher('resid'))"
    )
    corrupt_resid = cc.Add(cc.Array(corrupted, name="embeds.corrupt"), name="resid")
    patched = root.update(value_path, lambda n: corrupt_resid)
    assert unchanged(root) == before

    expected = torch_head(x, x, corrupted, w["h0"]) + torch_head(x, x, x, w["h1"])
    assert torch.allclose(patched.evaluate(), expected, atol=1e-5)
    clean = torch_head(x, x, x, w["h0"]) + torch_head(x, x, x, w["h1"])
    assert torch.allclose(root.evaluate(), clean, atol=1e-5)
    assert not torch.allclose(patched.evaluate(), clean, atol=1e-3)

    # 'resid' is un-shared: the patched copy under h0's value input only
    h0, h1 = patched.children
    old_resid = root.get_unique("resid")
    assert h1 is root.children[1]  # the other head is the same object
    q_in = h0.get_unique("h0.q").children[0]
    k_in = h0.get_unique("h0.k").children[0]
    v_in = h0.get_unique("h0.v").children[0]
    assert q_in is old_resid and k_in is old_resid and v_in is not old_resid
    assert v_in.children[0].name == "embeds.corrupt"
    assert len(patched.get("resid")) == 2


def test_path_patching_query_and_key_only(two_heads):
    root, x, w = two_heads
    corrupted = torch.randn(S, D, generator=torch.Generator().manual_seed(2))
    # h0 -> comb_v (0) -> probs (0) -> scores (0) -> q and k; replace the leaf under them
    qk_path = IterativeMatcher("h0").children(0).children(0).then("embeds")
    patched = root.update(qk_path, lambda n: cc.Array(corrupted, name="embeds.corrupt"))
    expected = torch_head(corrupted, corrupted, x, w["h0"]) + torch_head(x, x, x, w["h1"])
    assert torch.allclose(patched.evaluate(), expected, atol=1e-5)
    # both q and k inputs share one patched resid: rewritten once, still shared between them
    q_in = patched.get_unique("h0.q").children[0]
    k_in = patched.get_unique("h0.k").children[0]
    assert q_in is k_in and q_in is not root.get_unique("resid")


def test_path_restricted_update_with_depth_limits():
    leaf = cc.Array(torch.ones(1), name="leaf")
    level1 = cc.Add(leaf, name="l1")
    root = cc.Add(leaf, level1, name="root")  # leaf at depth 1 and at depth 2
    zero = cc.Array(torch.zeros(1), name="leaf.0")
    out = root.update(IterativeMatcher("leaf", min_depth=2), lambda n: zero)
    assert out.children[0] is leaf
    assert out.children[1].children[0].name == "leaf.0"
    assert out.evaluate().item() == 1.0 and root.evaluate().item() == 2.0


def test_path_restricted_update_calls_fn_once_per_distinct_node():
    w = cc.Array(torch.ones(2), name="w")
    node = cc.Array(torch.zeros(2), name="leaf")
    for depth in range(1, 4):
        node = cc.Add(node, w, name=f"n{depth}")
    root = cc.Add(node, w, name="r")  # w at depths 1, 2, 3 and 4: four distinct path states
    calls = []
    out = root.update(
        IterativeMatcher("w", max_depth=3), lambda n: calls.append(n) or cc.Array(torch.zeros(2), name="w0")
    )
    assert len(calls) == 1
    w0 = out.get_unique("w0")
    assert out.children[1] is w0 and out.children[0].children[1] is w0
    assert out.get_unique("n1").children[1] is w  # depth 4: beyond max_depth, untouched
    assert out.evaluate().tolist() == [1.0, 1.0]


# ---------------------------------------------------------------- depth


def test_fifty_thousand_deep_chain_updates_at_its_leaf():
    depth = 50_000
    leaf = cc.Array(torch.ones(2), name="deep.leaf")
    side = cc.Array(torch.ones(2), name="side")
    node = leaf
    for _ in range(depth):
        node = cc.Add(node, side)
    before = node.hash
    new_leaf = cc.Array(torch.full((2,), 3.0), name="deep.leaf")
    out = node.update("deep.leaf", lambda n: new_leaf)
    assert node.hash == before and out.hash != before
    bottom = out
    for _ in range(depth):
        assert bottom.children[1] is side
        bottom = bottom.children[0]
    assert bottom is new_leaf
    # the same through a path restriction, and a replace
    at_bottom = IterativeMatcher(cc.Array & ~Matcher("side"), min_depth=depth, max_depth=depth)
    restricted = node.update(at_bottom, lambda n: new_leaf)
    assert restricted == out
    assert node.replace({leaf: new_leaf}) == out
