"""``Point(kind, layer, head)`` is the one value that names a spot in a model (issue 29 item 2).

It goes wherever a matcher goes (``get``, the rewrites, ablations, patching, sweeps, the
matcher combinators) and wherever a key goes (``run_with_cache``, ``gradients``, their results).
Values are checked against the attention-only model written in plain torch
(tests/experiments_reference.py), not against another spelling of the same call.  The matcher
learns the form from the hints registry that the transformer layer fills: without that
registration a Point is no matcher form.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from experiments_reference import CONFIG, forward, resid_pres, split_circuit, tokens, weights

import circuits as cc
from circuits import experiments as ex
from circuits import models
from circuits.experiments import Point
from circuits.rewriting import hints
from circuits.rewriting.matching import restrict
from circuits.transformer.attention import causal_mask

TOL = dict(rtol=1e-10, atol=1e-10)
HEAD = Point("head_out", 1, 2)  # head 1.2's output: 'b1.a.head2' on a split circuit


@pytest.fixture(scope="module")
def setup():
    w = weights(0)
    toks = tokens(1)
    return w, toks, split_circuit(w, toks)


def mean_loss(w, toks, **changes) -> torch.Tensor:
    return forward(w, toks, **changes)[0].mean()


# ------------------------------------------------------------------ the value


def test_a_point_is_a_checked_named_tuple():
    p = Point("z", 1, 2)
    assert (p.kind, p.layer, p.head) == ("z", 1, 2)
    assert p == ("z", 1, 2) and hash(p) == hash(("z", 1, 2))  # a dict keyed by tuples finds it
    assert Point("logits") == ("logits", None, None)
    assert [repr(Point("logits")), repr(Point("attn_probs", 1)), repr(p)] == [
        "Point('logits')",
        "Point('attn_probs', 1)",
        "Point('z', 1, 2)",
    ]
    assert pickle.loads(pickle.dumps(p)) == p and type(pickle.loads(pickle.dumps(p))) is Point
    assert p._replace(head=0) == Point("z", 1, 0)
    with pytest.raises(cc.errors.ExperimentError, match="unknown activation kind 'pattern'"):
        Point("pattern", 1)
    with pytest.raises(cc.errors.ExperimentError, match="has no heads"):
        Point("resid_pre", 1, 0)
    with pytest.raises(cc.errors.ExperimentError, match="the head must be an int"):
        p._replace(head="0")  # a changed point is checked as a new one is
    with pytest.raises(cc.errors.ExperimentError, match="give head="):
        Point("head_out", 1)


# ------------------------------------------------------------------ as a matcher


def test_a_point_finds_its_node_in_get_and_the_rewrites(setup):
    w, toks, split = setup
    assert split.get_unique(HEAD).name == "b1.a.head2"
    assert {node.name for node in split.get(Point("attn_probs", 1))} == {"a.attn_probs"}
    assert len(split.get(Point("attn_probs", 1))) == CONFIG.n_heads  # one per head branch
    replaced = cc.update(split, HEAD, lambda node: cc.Scalar(0.0, node.shape, name=node.name))
    expected = forward(w, toks, override={(1, 2): torch.zeros(())})[0]
    torch.testing.assert_close(replaced.evaluate(), expected, **TOL)
    assert len(cc.get_paths(split, HEAD)) == 1


def test_a_point_combines_with_other_matcher_forms(setup):
    _, _, split = setup
    head0, head2 = split.get_unique("b1.a.head0"), split.get_unique("b1.a.head2")
    for either in (HEAD | cc.Matcher("b1.a.head0"), "b1.a.head0" | cc.Matcher(HEAD)):
        assert split.get(either) == {head0, head2}
    head_probs = Point("attn_probs", 1, 2)  # restricts paths: an IterativeMatcher
    assert len(split.get(cc.Matcher("b1.a.head0") | head_probs)) == 2
    assert split.get(cc.IterativeMatcher(head_probs)) == split.get(head_probs)
    assert split.get(cc.IterativeMatcher("b1.a").chain(head_probs)) == split.get(head_probs)
    assert split.get(restrict(HEAD, end_depth=1)) == set()  # the head is deeper than the root
    assert split.get(restrict(HEAD, start_depth=1)) == {head2}


def test_ablations_and_patching_take_a_point(setup):
    w, toks, split = setup
    zeroed = ex.zero_ablate(split, HEAD)
    torch.testing.assert_close(
        zeroed.evaluate(), forward(w, toks, override={(1, 2): torch.zeros(())})[0], **TOL
    )
    dataset = tokens(7, batch=5)
    mean = forward(w, dataset)[2][(1, 2)].mean(0)
    averaged = ex.mean_ablate(split, HEAD, {"toks_int_var": dataset})
    torch.testing.assert_close(averaged.evaluate(), forward(w, toks, override={(1, 2): mean})[0], **TOL)
    other = tokens(9)
    expected = forward(w, toks, override={(1, 2): forward(w, other)[2][(1, 2)]})[0]
    for rewrite in (ex.patch, ex.resample_ablate):
        patched = rewrite(split, HEAD, {"toks_int_var": other})
        torch.testing.assert_close(patched.evaluate(), expected, **TOL)


def test_patching_a_residual_point(setup):
    """``Point('resid_pre', 1)``: the stream entering layer 1, taken from the other run."""
    w, toks, split = setup
    other = tokens(9)
    patched = ex.patch(split, Point("resid_pre", 1), {"toks_int_var": other})
    expected = forward(w, toks, resid_pre={1: resid_pres(w, other)[1]})[0]
    torch.testing.assert_close(patched.evaluate(), expected, **TOL)


def test_a_sweep_takes_points_and_keys_its_table_by_them(setup):
    w, toks, split = setup
    unsplit = causal_mask(models.build_attn_only(CONFIG, w, toks))
    targets = [HEAD, Point("head_out", 0, 1)]
    for circuit in (split, unsplit):  # on an unsplit circuit a head point splits its layer, as a head name
        table = ex.sweep(circuit, targets, progress=False)
        assert list(table) == targets
        for point in targets:
            expected = mean_loss(w, toks, override={(point.layer, point.head): torch.zeros(())})
            assert table[point] == pytest.approx(expected.item(), rel=1e-9)
    assert ex.sweep_plan(unsplit, targets).circuits == 3


def test_a_single_point_is_not_a_list_of_targets(setup):
    _, _, split = setup
    with pytest.raises(
        cc.errors.ExperimentError,
        match=r"single Point Point\('head_out', 1, 2\); write \[Point\('head_out', 1, 2\)\]",
    ):
        ex.sweep(split, HEAD, progress=False)


# ------------------------------------------------------------------ as a key


def test_run_with_cache_takes_points_and_is_keyed_by_them(setup):
    w, toks, split = setup
    cache = ex.run_with_cache(split, [HEAD, Point("resid_pre", 1), "logits"])
    assert list(cache) == [HEAD, Point("resid_pre", 1), Point("logits")]
    assert all(type(key) is Point for key in cache)
    _, logits, heads = forward(w, toks)
    torch.testing.assert_close(cache[HEAD], heads[(1, 2)], **TOL)
    torch.testing.assert_close(cache[Point("resid_pre", 1)], resid_pres(w, toks)[1], **TOL)
    torch.testing.assert_close(cache[Point("logits")], logits, **TOL)
    assert cache["head_out", 1, 2] is cache[HEAD]  # the short spellings read the same entries
    with pytest.raises(cc.errors.MissingPointError, match=r"^Point\('z', 1, 2\): not in this cache"):
        cache[Point("z", 1, 2)]


def test_gradients_take_points_and_are_keyed_by_them(setup):
    w, toks, split = setup
    point = Point("resid_pre", 1)
    grads = ex.gradients(split, lambda logits: logits[:, -1, 3].sum(), [point])
    assert list(grads) == [point] and type(next(iter(grads))) is Point
    resid = resid_pres(w, toks)[1].clone().requires_grad_(True)
    (expected,) = torch.autograd.grad(forward(w, toks, resid_pre={1: resid})[1][:, -1, 3].sum(), resid)
    torch.testing.assert_close(grads[point], expected, **TOL)
    torch.testing.assert_close(grads.activations[point], resid.detach(), **TOL)


# ------------------------------------------------------------------ the registry


def test_the_transformer_layer_registers_point_as_a_matcher_form():
    assert hints.MATCHER_FORMS[Point] == Point.matcher
    hints.register(matcher_form=(Point, Point.matcher))
    assert list(hints.MATCHER_FORMS) == [Point]  # registered once, however often


def test_without_the_registration_a_point_is_no_matcher_form(setup, monkeypatch):
    _, _, split = setup
    monkeypatch.setattr(hints, "MATCHER_FORMS", {})
    with pytest.raises(cc.errors.MatcherError):
        split.get(HEAD)


def test_another_convention_registers_its_own_form(monkeypatch):
    class Stage(int):
        """A toy convention's spot: stage n is the node named 'stage{n}'."""

    monkeypatch.setattr(hints, "MATCHER_FORMS", dict(hints.MATCHER_FORMS))
    hints.register(matcher_form=(Stage, lambda stage: cc.Matcher(f"stage{int(stage)}")))
    leaf = cc.Array(torch.ones(2), name="stage7")
    circuit = cc.Add(leaf, cc.Array(torch.zeros(2), name="stage1"), name="root")
    assert circuit.get(Stage(7)) == {leaf}
    assert circuit.get(Stage(7) | cc.Matcher("root")) == {leaf, circuit}
