"""Complete path matchers: | and & on IterativeMatchers, chain / chain_many, term_early_at and
chain_excluding, get_paths / get_all_paths; on small hand-built circuits and in path patching
against the attention-only model written in torch."""

from __future__ import annotations

import pytest
import torch
from experiments_reference import forward, layer_norm, split_circuit, tokens, weights

import circuits as cc
from circuits import IterativeMatcher, Matcher
from circuits import experiments as ex
from circuits.rewriting.matching import Route, get_all_paths, new_traversal, restrict_sl

TOL = dict(rtol=1e-10, atol=1e-10)


def names(nodes):
    return sorted(n.name for n in nodes)


@pytest.fixture
def tower():
    """A chain r -> n3 -> n2 -> n1 -> leaf, each also holding 'w' as child 1."""
    w = cc.Array(torch.ones(2), name="w")
    node = cc.Array(torch.zeros(2), name="leaf")
    for depth in range(1, 4):
        node = cc.Add(node, w, name=f"n{depth}")
    return cc.Add(node, w, name="r")


@pytest.fixture
def diamond():
    """'s' shared by 'left' and 'right' (which reads it twice) under the root; 's' is x * w."""
    x = cc.Array(torch.arange(3.0), name="x")
    w = cc.Array(torch.ones(3), name="w")
    s = cc.Einsum.from_einsum_string("a,a->a", x, w, name="s")
    left = cc.Add(s, name="left")
    right = cc.Add(s, s, w, name="right")
    return cc.Add(left, right, name="root")


# ------------------------------------------------------------------- | and &


def test_union_finds_what_either_finds(tower):
    below_n3 = IterativeMatcher("n3").children(1)  # w, as n3's child
    under_n1 = IterativeMatcher("n1").children(0)  # leaf
    assert names(tower.get(below_n3 | under_n1)) == ["leaf", "w"]
    # with a plain form on either side
    assert names(tower.get(under_n1 | "n2")) == ["leaf", "n2"]
    assert names(tower.get("n2" | under_n1)) == ["leaf", "n2"]
    assert names(tower.get(Matcher("n2") | under_n1)) == ["leaf", "n2"]
    # two plain ones stay plain (the fast walk)
    assert (IterativeMatcher("n1") | "n2").is_plain


def test_intersection_finds_what_both_find_along_the_same_path(tower):
    adds_deep = IterativeMatcher(cc.Add) & IterativeMatcher(True, min_depth=2)
    assert names(tower.get(adds_deep)) == ["n1", "n2"]
    below_both = IterativeMatcher("n2").then(True) & IterativeMatcher("n3").then(True)
    assert names(tower.get(below_both)) == ["leaf", "n1", "w"]
    assert names(tower.get(IterativeMatcher("n2").then(True) & "w")) == ["w"]
    assert names(tower.get(Matcher("w") & IterativeMatcher("n2").then(True))) == ["w"]
    # 'w' is found by both, but never along one path: children(1) of r vs below n1
    apart = IterativeMatcher("r").children(1) & IterativeMatcher("n1").then("w")
    assert tower.get(apart) == set()
    assert (IterativeMatcher("n1") & cc.Add).is_plain


def test_union_and_intersection_nest(tower):
    either = IterativeMatcher("n3").children(1) | IterativeMatcher("n1").children(0)
    assert names(tower.get(either & Matcher("leaf"))) == ["leaf"]
    assert names(tower.get((either & "leaf") | IterativeMatcher("n2").children(0))) == ["leaf", "n1"]
    assert repr(either & "leaf") == (
        "((IterativeMatcher(Matcher('n3')).children(1) | IterativeMatcher(Matcher('n1')).children(0))"
        " & IterativeMatcher(Matcher('leaf')))"
    )


def test_then_after_a_union_chains_from_every_branch(tower):
    both = (IterativeMatcher("n3") | IterativeMatcher("n1")).children(1)
    assert names(tower.get(both)) == ["w"]
    assert str(get_all_paths(tower, both)) == "r -> n3 -> n2 -> n1 -> w\nr -> n3 -> w"


def test_stages_after_an_intersection_start_where_it_finds(tower):
    n1_only = IterativeMatcher("n2").then(True) & cc.Add  # the Adds strictly below n2: n1
    assert names(tower.get(n1_only)) == ["n1"]
    assert names(tower.get(n1_only.children(0))) == ["leaf"]
    assert str(get_all_paths(tower, n1_only.then("w"))) == "r -> n3 -> n2 -> n1 -> w"
    assert repr(n1_only.then("w", max_depth=1)) == (
        "(IterativeMatcher(Matcher('n2')).then(Matcher(True)) & IterativeMatcher(Matcher(Add)))"
        ".then(Matcher('w'), max_depth=1)"
    )
    # a union holding an &, then more stages
    either = (n1_only | IterativeMatcher("r").children(0)).children(1)  # below n1 or n3
    assert str(get_all_paths(tower, either)) == "r -> n3 -> n2 -> n1 -> w\nr -> n3 -> w"
    ten = cc.Array(torch.full((2,), 10.0), name="w")
    rewritten = tower.update(either, lambda n: ten)  # w is read 4 times; twice rewritten
    assert rewritten.evaluate().tolist() == [22.0, 22.0]


def test_union_rewrites_along_either_path_only(diamond):
    via_left = IterativeMatcher("left").then("s")
    via_right = IterativeMatcher("right").then("s")
    ten = cc.Array(torch.full((3,), 10.0), name="s")
    only_left = diamond.update(via_left, lambda n: ten)
    assert only_left.evaluate().tolist() == [11.0, 13.0, 15.0]  # 10 + (2x + 1)
    both = diamond.update(via_left | via_right, lambda n: ten)
    assert both.evaluate().tolist() == [31.0, 31.0, 31.0]
    # & with a path condition un-shares too: 's' found only below 'right'
    right_only = diamond.update(IterativeMatcher("right").then(True) & "s", lambda n: ten)
    assert right_only.evaluate().tolist() == [21.0, 22.0, 23.0]  # x + (10 + 10 + 1)


# -------------------------------------------------------- chains and exclusion


def test_chain_and_chain_many(tower):
    assert names(tower.get(IterativeMatcher("r").chain("n2", "n1"))) == ["n1"]
    assert tower.get(IterativeMatcher("r").chain("n1", "n2")) == set()  # n2 is above n1
    many = IterativeMatcher("r").chain_many(["n2", "leaf"], "w", ("n1",))
    assert names(tower.get(many)) == ["leaf", "n1", "w"]
    assert repr(IterativeMatcher("r").chain_many(["n2"], "w")) == (
        "(IterativeMatcher(Matcher('r')).chain(Matcher('n2')) | IterativeMatcher(Matcher('r')).chain(Matcher('w')))"
    )


def test_term_early_at_excludes_routes_through_a_node(tower):
    # 'w' is a child of r, n3, n2 and n1; not passing through n2 leaves r's and n3's
    routes = get_all_paths(tower, IterativeMatcher("w", term_early_at="n2"))
    assert sorted(str(r) for r in routes[tower.get_unique("w")]) == ["r -> n3 -> w", "r -> w"]
    assert tower.get(IterativeMatcher("leaf", term_early_at="n2")) == set()
    # the excluded node itself can be found; the start of a stage is not excluded
    assert names(tower.get(IterativeMatcher("r").then("n1", term_early_at="n1"))) == ["n1"]
    assert names(tower.get(IterativeMatcher("n2").then("leaf", term_early_at="n2"))) == ["leaf"]


def test_chain_excluding(tower):
    direct = cc.chain_excluding("n3", "w", "n2")
    assert repr(direct) == (
        "restrict(IterativeMatcher(Matcher('n3')).chain(Matcher('w')), term_early_at=Matcher('n2'))"
    )
    assert str(cc.get_paths(tower, direct)) == "r -> n3 -> w"
    assert tower.get(cc.chain_excluding("n3", "leaf", Matcher.regex("^n[12]$"))) == set()
    assert names(tower.get(cc.chain_excluding("n3", "leaf", "n9"))) == ["leaf"]


# --------------------------------------------- rust_circuit's chain and restrict


def path(*names_from_root):
    """One route of single-child Adds, named from the root down; the last name is an Array."""
    node = cc.Array(torch.ones(2), name=names_from_root[-1])
    for name in reversed(names_from_root[:-1]):
        node = cc.Add(node, name=name)
    return node


def test_chain_items_start_at_the_node_found_as_in_rust_circuit(tower):
    # rust_circuit's chain: the next item is run on the node the previous one found, so it may find it
    assert names(tower.get(IterativeMatcher("n2").chain("n2"))) == ["n2"]
    assert names(tower.get(IterativeMatcher("n2").chain(cc.Add))) == ["n1", "n2"]
    assert names(tower.get(IterativeMatcher(True, max_depth=0).chain("r"))) == ["r"]
    assert names(tower.get(IterativeMatcher("n3").chain("n2", cc.Add))) == ["n1", "n2"]
    # must_be_sub=True: strictly below, as then() is
    assert names(tower.get(IterativeMatcher("n2").chain(cc.Add, must_be_sub=True))) == ["n1"]
    assert tower.get(IterativeMatcher("n2").chain("n2", must_be_sub=True)) == set()
    sub = IterativeMatcher("r").chain_many(["n2", cc.Add], ["w"], must_be_sub=True)
    assert names(tower.get(sub)) == ["n1", "w"]
    assert names(tower.get(IterativeMatcher("r").chain_many(["n2", cc.Add], ["w"]))) == ["n1", "n2", "w"]


def test_a_causal_scrubbing_chain_can_map_an_interpretation_node_to_an_input_array():
    """rust_circuit's simple causal-scrubbing demo maps y' to the 'labels' input itself: its
    branch's inputs are ``IterativeMatcher("labels").chain(input names)``, which finds 'labels'."""
    x = cc.Array(torch.tensor([1.0, 5.0]), name="x")
    labels = cc.Array(torch.tensor([0.0, 1.0]), name="labels")
    loss = cc.Add(cc.Add(x, x, name="D"), cc.Einsum.scalar_mul(labels, -1.0), name="loss")
    inputs = Matcher.any("x", "labels")
    assert loss.get(IterativeMatcher("labels").chain(inputs)) == {labels}
    assert loss.get(IterativeMatcher(True, max_depth=0).chain("labels").chain(inputs)) == {labels}
    assert loss.get(IterativeMatcher("D").chain(inputs)) == {x}
    from circuits.causal_scrubbing.hypothesis import corr_root_matcher, to_inputs

    assert loss.get(to_inputs(IterativeMatcher("labels"), {"x", "labels"})) == {labels}
    assert loss.get(to_inputs(corr_root_matcher, {"x", "labels"})) == {x, labels}
    # the branch's input swapped for other data changes only its own use
    other = cc.Array(torch.tensor([3.0, 3.0]), name="labels")
    scrubbed = loss.update(IterativeMatcher("labels").chain(inputs), lambda n: other)
    torch.testing.assert_close(scrubbed.evaluate(), torch.tensor([2.0, 10.0]) - torch.tensor([3.0, 3.0]))


def test_restrict_depths_and_termination_as_in_rust_circuit(tower):
    restrict = cc.restrict
    # depths r 0, n3 1, n2 2, n1 3, leaf 4; end_depth is exclusive
    assert names(tower.get(restrict(cc.Add, start_depth=2))) == ["n1", "n2"]
    assert names(tower.get(restrict(cc.Add, end_depth=2))) == ["n3", "r"]
    assert names(tower.get(restrict(cc.Add, start_depth=1, end_depth=3))) == ["n2", "n3"]
    assert tower.get(restrict(True, end_depth=0)) == set()
    assert tower.get(restrict(True, start_depth=2, end_depth=1)) == set()
    assert names(tower.get(restrict(cc.Add, term_if_matches=True))) == ["r"]
    assert names(tower.get(restrict(Matcher.regex("^n"), term_if_matches=True))) == ["n3"]
    assert names(tower.get(restrict_sl(cc.Add, depth_slice=slice(1, 3)))) == ["n2", "n3"]
    # term_early_at: nothing below a node it matches (the node itself may be found) ...
    routes = get_all_paths(tower, restrict("w", term_early_at="n2"))
    assert sorted(str(r) for r in routes[tower.get_unique("w")]) == ["r -> n3 -> w", "r -> w"]
    assert names(tower.get(restrict(cc.Add, term_early_at="n2"))) == ["n2", "n3", "r"]
    # ... the start node included (a stage's term_early_at skips its start node)
    assert names(tower.get(restrict(True, term_early_at="r"))) == ["r"]
    assert len(tower.get(IterativeMatcher(True, term_early_at="r"))) == 6
    # rust_circuit's test_start_depth_behavior
    b, c = cc.Add(name="B"), cc.Add(name="C")
    a = cc.Add(b, c, name="A")
    assert a.get(new_traversal(term_early_at=cc.Add, start_depth=0)) == {a}
    for depth in range(1, 4):
        assert a.get(new_traversal(term_early_at=cc.Add, start_depth=depth)) == set()
    assert tower.get(restrict(cc.Add, term_early_at=None)) == tower.get(cc.Add)  # None: no termination
    with pytest.raises(cc.errors.MatcherError, match="end_depth -1"):
        restrict("x", end_depth=-1)


def test_where_restrict_sits_in_a_chain_matters(tower):
    restrict = cc.restrict
    assert tower.get(restrict(IterativeMatcher("n2").chain("leaf"), term_early_at="n3")) == set()
    assert names(tower.get(IterativeMatcher("n2").chain(restrict("leaf", term_early_at="n3")))) == ["leaf"]
    assert names(tower.get(restrict(IterativeMatcher("n2"), term_early_at="n1").chain("leaf"))) == ["leaf"]
    assert tower.get(restrict(IterativeMatcher("n2").chain("leaf"), term_early_at="n1")) == set()


def test_chain_of_iterative_matchers_follows_rust_circuits_tests():
    """rust_circuit's test_chain_must_be_sub, as found sets: 'top' then a node matching ``f``
    within one level of it, then 'dog' anywhere below."""
    f = Matcher.any("top", "leaf")  # rust's lambda x: x.shape[-1] == 2 (true of top and leaf)

    def found(route, must_be_sub):
        matcher = IterativeMatcher("top").chain(cc.restrict(f, end_depth=2), "dog", must_be_sub=must_be_sub)
        return names(route.get(matcher))

    assert found(path("top", "dog"), must_be_sub=True) == []
    assert found(path("top", "top", "dog"), must_be_sub=True) == ["dog"]
    assert found(path("top", "leaf", "leaf", "leaf", "dog"), must_be_sub=True) == ["dog"]
    assert found(path("top", "other", "other", "dog"), must_be_sub=True) == []
    # without must_be_sub, f finds 'top' itself at depth 0, and 'dog' may be anywhere below it
    assert found(path("top", "other", "other", "dog"), must_be_sub=False) == ["dog"]
    assert found(path("top", "dog"), must_be_sub=False) == ["dog"]
    # a union with a restrict in it
    route = path("top", "top", "top", "dog")
    either = cc.restrict("top", end_depth=2) | Matcher("dog")
    assert len(route.get(either)) == 3  # the two upper 'top's and 'dog'


def test_chain_takes_unions_and_chains_as_items(tower):
    either = IterativeMatcher("n2") | IterativeMatcher("n3").children(1)
    assert names(tower.get(IterativeMatcher("r").chain(either))) == ["n2", "w"]
    assert names(tower.get(IterativeMatcher("r").chain(either, "leaf"))) == ["leaf"]
    inner = IterativeMatcher("n2").chain("n1").children(1)
    assert names(tower.get(IterativeMatcher("n3").chain(inner))) == ["w"]
    assert str(cc.get_paths(tower, IterativeMatcher("n3").chain(inner))) == "r -> n3 -> n2 -> n1 -> w"
    both = IterativeMatcher("n1") & IterativeMatcher(cc.Add)
    assert names(tower.get(IterativeMatcher("r").chain(both).children(0))) == ["leaf"]


def test_chain_excluding_excludes_on_the_whole_route_as_rust_circuit_does(tower):
    # every route to n1 passes through n2: rust_circuit's restrict(parent.chain(child), ...)
    assert tower.get(cc.chain_excluding("n1", "leaf", "n2")) == set()
    # the child may be the node the parent finds
    assert names(tower.get(cc.chain_excluding("n2", cc.Add, "n9"))) == ["n1", "n2"]
    assert names(tower.get(cc.chain_excluding("n2", cc.Add))) == ["n1", "n2"]


# --------------------------------------------------------------------- routes


def test_get_paths_gives_one_shortest_route_per_found_node(tower):
    paths = cc.get_paths(tower, Matcher("w") | "n1")
    assert {node.name: str(route) for node, route in paths.items()} == {
        "w": "r -> w",
        "n1": "r -> n3 -> n2 -> n1",
    }
    assert str(paths) == "r -> n3 -> n2 -> n1\nr -> w"
    # only routes along which the matcher finds the node
    assert str(cc.get_paths(tower, IterativeMatcher("n2").then("w"))) == "r -> n3 -> n2 -> w"
    assert str(cc.get_paths(tower, "nothing")) == "(no routes: nothing found)"


def test_get_all_paths_lists_every_route_and_is_bounded(tower):
    routes = get_all_paths(tower, IterativeMatcher("n3").then("w"))
    assert str(routes) == "r -> n3 -> n2 -> n1 -> w\nr -> n3 -> n2 -> w\nr -> n3 -> w"
    (found,) = routes
    assert found.name == "w" and all(isinstance(route, Route) for route in routes[found])
    assert [node.name for node in routes[found][0]] == ["r", "n3", "n2", "n1", "w"]
    with pytest.raises(cc.errors.MatcherError, match=r"more than 2 routes in Add 'r'.*limit="):
        get_all_paths(tower, "w", limit=2)
    assert len(get_all_paths(tower, "w", limit=None)[tower.get_unique("w")]) == 4
    with pytest.raises(cc.errors.MatcherError, match="limit 0"):
        get_all_paths(tower, "w", limit=0)


def test_a_node_reached_twice_through_one_parent_is_one_route():
    x = cc.Array(torch.ones(2), name="x")
    root = cc.Add(x, x, name="twice")
    assert str(get_all_paths(root, "x")) == "twice -> x"


# --------------------------------------------------------------------- errors


def test_errors_are_typed_and_say_what_is_wrong(tower):
    with pytest.raises(cc.errors.MatcherError, match="chain_many: give at least one chain"):
        IterativeMatcher("r").chain_many()
    with pytest.raises(cc.errors.MatcherError, match="cannot make a Matcher from int 3"):
        IterativeMatcher("r").then("w", term_early_at=3)
    with pytest.raises(cc.errors.MatcherError, match="cannot be used as a plain Matcher"):
        IterativeMatcher("r").then(IterativeMatcher("n2"))  # chain takes IterativeMatchers; then does not
    with pytest.raises(cc.errors.MatcherError, match="get_paths: the circuit"):
        cc.get_paths("r", "w")


# ------------------------------------------------------------------ deep chain


def test_deep_chain_without_recursion():
    leaf = cc.Array(torch.ones(1), name="deep.leaf")
    node = leaf
    for depth in range(20_000):
        node = cc.Add(node, name="mid" if depth == 10_000 else None)
    assert node.get(IterativeMatcher(cc.Array) | IterativeMatcher("nothing").then(True)) == {leaf}
    assert node.get(IterativeMatcher(cc.Array) & IterativeMatcher(True, min_depth=20_000)) == {leaf}
    assert node.get(IterativeMatcher(cc.Array, term_early_at="mid")) == set()
    assert len(cc.get_paths(node, "deep.leaf")[leaf]) == 20_001
    assert len(get_all_paths(node, "deep.leaf")[leaf][0]) == 20_001
    # restrict and chains of IterativeMatchers walk as iteratively
    assert node.get(cc.restrict(cc.Array, end_depth=20_000)) == set()
    assert node.get(IterativeMatcher("mid").chain(cc.restrict(cc.Array, start_depth=9_999))) == {leaf}
    assert node.get(cc.chain_excluding(True, "deep.leaf", "mid")) == set()


# ------------------------------------------- path patching on the torch model


@pytest.fixture(scope="module")
def setup():
    w = weights(0)
    toks = tokens(1)
    return w, toks, split_circuit(w, toks)


def value_path(head):
    """Head 0.1 as seen by head 1.``head``'s value input."""
    return IterativeMatcher(f"b1.a.head{head}").then("a.v").then("b0.a.head1")


def loss_from_heads(w, toks, heads):
    """Per-token loss when the final residual stream is the embedding plus ``heads``' outputs."""
    inputs, targets = toks[:, :-1], toks[:, 1:]
    resid = w["t.w.tok_embeds"][inputs] + sum(heads.values())
    logits = layer_norm(resid, w["final.ln.w.scale"], w["final.ln.w.bias"]) @ w["t.w.unembed"].T
    log_probs = torch.log_softmax(logits, dim=-1)
    return -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def test_union_path_patching_matches_torch(setup):
    """Head 0.1 from the source run, seen only by the value inputs of heads 1.0 and 1.2."""
    w, toks, split = setup
    source = tokens(12)
    _, _, source_heads = forward(w, source)
    patched = ex.patch(split, value_path(2) | value_path(0), {"toks_int_var": source})

    def patched_stream(resid, heads):
        return resid - heads[(0, 1)] + source_heads[(0, 1)]

    expected, _, _ = forward(w, toks, value_resid={(1, 2): patched_stream, (1, 0): patched_stream})
    torch.testing.assert_close(patched.evaluate(), expected, **TOL)
    one, _, _ = forward(w, toks, value_resid={(1, 2): patched_stream})
    assert not torch.allclose(expected, one)
    # & narrows a union back down: head 1.2's value path only
    narrowed = ex.patch(
        split,
        (value_path(2) | value_path(0)) & IterativeMatcher("b1.a.head2").then(True),
        {"toks_int_var": source},
    )
    torch.testing.assert_close(narrowed.evaluate(), one, **TOL)


def test_chain_excluding_patches_only_the_direct_route(setup):
    """Head 0.1 from the source run on its direct route to the logits, not through layer 1."""
    w, toks, split = setup
    source = tokens(12)
    _, _, source_heads = forward(w, source)
    direct = cc.chain_excluding("t.call", "b0.a.head1", Matcher.regex(r"^b1\.a$"))
    patched = ex.patch(split, direct, {"toks_int_var": source})
    _, _, clean_heads = forward(w, toks)
    expected = loss_from_heads(w, toks, {**clean_heads, (0, 1): source_heads[(0, 1)]})
    torch.testing.assert_close(patched.evaluate(), expected, **TOL)
    everywhere, _, _ = forward(w, toks, override={(0, 1): source_heads[(0, 1)]})
    assert not torch.allclose(expected, everywhere)
    # with the value route of head 1.2 as well: one patch, both routes
    both = ex.patch(split, direct | value_path(2), {"toks_int_var": source})

    def patched_stream(resid, heads):
        return resid - heads[(0, 1)] + source_heads[(0, 1)]

    _, _, value_heads = forward(w, toks, value_resid={(1, 2): patched_stream})
    expected_both = loss_from_heads(w, toks, {**value_heads, (0, 1): source_heads[(0, 1)]})
    torch.testing.assert_close(both.evaluate(), expected_both, **TOL)


def test_get_paths_on_the_model_lists_the_expected_routes(setup):
    _, _, split = setup
    residual = (
        "t.loss -> ll -> log_probs -> t.call -> final.call -> ln.y_scaled -> ln.y -> ln.mean_subbed -> b1"
    )
    assert str(cc.get_paths(split, value_path(2))) == (
        f"{residual} -> b1.a -> b1.a.head2 -> a.comb_v -> a.v -> a1.norm -> ln.y_scaled -> ln.y"
        " -> ln.mean_subbed -> b0 -> b0.a -> b0.a.head1"
    )
    direct = cc.chain_excluding("t.call", "b0.a.head1", Matcher.regex(r"^b1\.a$"))
    assert str(cc.get_paths(split, direct)) == f"{residual} -> b0 -> b0.a -> b0.a.head1"
    # every direct route ends in the residual stream's b1 -> b0 (the final norm reads b1 several ways)
    (routes,) = get_all_paths(split, direct).values()
    assert len(routes) == 7
    assert all(str(route).endswith("-> b1 -> b0 -> b0.a -> b0.a.head1") for route in routes)
    assert not any("b1.a" in str(route) for route in routes)
