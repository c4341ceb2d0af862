"""A spliced SAE's nodes as Points: run_with_cache, gradients, attribution_patching and the feature
patching grids against a tiny Hugging Face GPT-2 with the SAE applied by hand (plain torch hooks
written here: the reference), with the library's Metrics and with metric functions."""

from __future__ import annotations

import pytest
import torch

import circuits.experiments as ex
import circuits.models as cm
from circuits.errors import ExperimentError
from circuits.experiments import patching_grids
from circuits.experiments.sae import splice_sae, splice_saes
from circuits.transformer.points import Point
from test_sae import M, edited_features, hooked_logits, random_sae, reference_decode, reference_encode
from factories import gpt2

TOKENS = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(13))
CORRUPTED = TOKENS.clone()
CORRUPTED[:, [1, 3]] = (TOKENS[:, [1, 3]] + 5) % 97
GOOD, BAD = torch.tensor([3, 8]), torch.tensor([5, 2])
ACTS = Point("resid_pre.sae_acts", 1)


@pytest.fixture(scope="module")
def model():
    return gpt2()


@pytest.fixture(scope="module")
def sae():
    return random_sae("standard", "blocks.1.hook_resid_pre", seed=11)


@pytest.fixture(scope="module")
def spliced(model, sae):
    return splice_sae(cm.from_hf(model, TOKENS), sae)


def resid_pre1(model, tokens) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=tokens[:, :-1], output_hidden_states=True).hidden_states[1]


def reference_logit_diff(logits: torch.Tensor) -> torch.Tensor:
    """ex.logit_diff(-1, GOOD, BAD)'s number, in torch: the mean over the batch."""
    rows = torch.arange(logits.shape[0])
    return (logits[rows, -1, GOOD] - logits[rows, -1, BAD]).mean()


def test_run_with_cache_reads_every_part_of_the_sae(model, sae, spliced):
    parts = ["acts", "pre", "recon", "error", "input"]
    cache = ex.run_with_cache(
        spliced, [Point(f"resid_pre.sae_{part}", 1) for part in parts] + [("sae_acts", 1)]
    )
    h = resid_pre1(model, TOKENS)
    centered = h - sae.b_dec
    pre = centered @ sae.W_enc + sae.b_enc
    acts = reference_encode(sae, h)
    assert (acts > 0).any() and (acts == 0).any()
    expected = {
        "acts": acts,
        "pre": pre,
        "recon": reference_decode(sae, acts),
        "error": h - reference_decode(sae, acts),
        "input": h,
    }
    for part, value in expected.items():
        torch.testing.assert_close(cache["resid_pre.sae_" + part, 1], value, atol=1e-5, rtol=1e-5)
    assert torch.equal(cache["sae_acts", 1], cache[ACTS])
    # the default points include the SAE's nodes, by their site
    default = ex.run_with_cache(spliced)
    assert {Point(f"resid_pre.sae_{part}", 1) for part in parts} <= set(default)
    torch.testing.assert_close(default[ACTS], acts, atol=1e-5, rtol=1e-5)


def test_gradients_at_the_features(model, sae, spliced):
    grads = ex.gradients(spliced, reference_logit_diff, [ACTS, ("resid_pre.sae_error", 1)])
    leaf = reference_encode(sae, resid_pre1(model, TOKENS)).requires_grad_(True)
    error = torch.zeros(2, 6, 32, requires_grad=True)

    def from_leaf(h):
        return (
            reference_decode(sae, leaf)
            + (h - reference_decode(sae, reference_encode(sae, h))).detach()
            + error
        )

    metric = reference_logit_diff(hooked_logits(model, TOKENS, from_leaf))
    d_acts, d_error = torch.autograd.grad(metric, [leaf, error])
    torch.testing.assert_close(grads[ACTS], d_acts, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(grads["resid_pre.sae_error", 1], d_error, atol=1e-5, rtol=1e-4)
    assert grads[ACTS].abs().max() > 1e-3


@pytest.mark.parametrize("use_metric", [True, False])
def test_attribution_patching_to_features(model, sae, spliced, use_metric):
    metric = ex.logit_diff(-1, GOOD, BAD, push_down=False) if use_metric else reference_logit_diff
    result = ex.attribution_patching(spliced, {"toks_int_var": CORRUPTED}, metric, ["sae_acts", ACTS.kind])
    clean = reference_encode(sae, resid_pre1(model, TOKENS))
    corrupted = reference_encode(sae, resid_pre1(model, CORRUPTED))
    leaf = corrupted.clone().requires_grad_(True)

    def from_leaf(h):
        return reference_decode(sae, leaf) + (h - reference_decode(sae, reference_encode(sae, h))).detach()

    (gradient,) = torch.autograd.grad(reference_logit_diff(hooked_logits(model, CORRUPTED, from_leaf)), leaf)
    expected = ((clean - corrupted) * gradient).sum(0)  # [pos, feature]
    for kind in ("sae_acts", ACTS.kind):
        grid = result[kind]
        assert grid.shape == (2, 6, M)
        assert torch.isnan(grid[0]).all()  # no SAE in layer 0
        torch.testing.assert_close(grid[1], expected, atol=1e-5, rtol=1e-4)
    assert expected.abs().max() > 1e-3
    records = [r for r in result.records if r["kind"] == "sae_acts"]
    assert len(records) == 6 * M and {r["layer"] for r in records} == {1}
    one = next(r for r in records if r["pos"] == 3 and r["feature"] == 5)
    assert one["attribution"] == pytest.approx(float(expected[3, 5]), abs=1e-5)


def clean_feature_hook(sae, clean_acts, k, pos=None):
    """resid_pre 1 of the corrupted run with feature k's clean activations (at pos, or everywhere)."""

    def put(acts):
        where = (Ellipsis, k) if pos is None else (slice(None), pos, k)
        acts[where] = clean_acts[where]
        return acts

    return edited_features(sae, put)


@pytest.fixture(scope="module")
def feature_reference(model, sae):
    """The hooked model's logit difference with each feature's clean value patched in: at every
    position ``[M]``, and at positions 1 and 5 ``{pos: [M]}``; and the corrupted run's own."""
    clean_acts = reference_encode(sae, resid_pre1(model, TOKENS))

    def patched(k, pos=None):
        return reference_logit_diff(
            hooked_logits(model, CORRUPTED, clean_feature_hook(sae, clean_acts, k, pos))
        )

    with torch.no_grad():
        every = torch.stack([patched(k) for k in range(M)])
        by_pos = {pos: torch.stack([patched(k, pos) for k in range(M)]) for pos in (1, 5)}
        unpatched = float(reference_logit_diff(hooked_logits(model, CORRUPTED)))
    return every, by_pos, unpatched


@pytest.mark.parametrize("use_metric", [True, False])
def test_feature_patching_grids(spliced, feature_reference, use_metric):
    metric = ex.logit_diff(-1, GOOD, BAD) if use_metric else reference_logit_diff
    corrupted = {"toks_int_var": CORRUPTED}
    expected, expected_by_pos, unpatched = feature_reference
    every_pos = patching_grids.act_patch_sae_features(spliced, corrupted, metric, patches_per_run=7)
    assert every_pos.values.shape == (1, M)
    torch.testing.assert_close(every_pos.values[0], expected, atol=1e-4, rtol=1e-5)
    assert (expected - unpatched).abs().max() > 1e-3  # the patches matter
    assert {r["feature"] for r in every_pos.records} == set(range(M)) and every_pos.records[0]["layer"] == 1

    by_pos = patching_grids.patch_grid(spliced, corrupted, metric, "sae_features_by_pos")
    assert by_pos.values.shape == (1, 6, M)
    for pos, row in expected_by_pos.items():
        torch.testing.assert_close(by_pos.values[0, pos], row, atol=1e-4, rtol=1e-5)
    # positions before the first corrupted token patch the numbers already there
    assert by_pos.values[0, 0].sub(unpatched).abs().max() < 1e-4
    assert (expected_by_pos[1] - unpatched).abs().max() > 1e-4


def test_patch_and_zero_ablate_take_the_feature_point(model, sae, spliced):
    logits = spliced.get_unique("t.call")
    patched = ex.patch(logits, ACTS, {"toks_int_var": CORRUPTED}).evaluate()
    corrupted_acts = reference_encode(sae, resid_pre1(model, CORRUPTED))
    expected = hooked_logits(model, TOKENS, edited_features(sae, lambda acts: corrupted_acts.clone()))
    torch.testing.assert_close(patched, expected, atol=1e-5, rtol=1e-5)
    ablated = ex.zero_ablate(logits, ACTS).evaluate()
    expected = hooked_logits(model, TOKENS, edited_features(sae, torch.zeros_like))
    torch.testing.assert_close(ablated, expected, atol=1e-5, rtol=1e-5)


def test_two_saes_in_one_layer_are_named(model, sae):
    other = random_sae("jumprelu", "blocks.1.hook_mlp_out", seed=12)
    both = splice_saes(cm.from_hf(model, TOKENS).get_unique("t.call"), [sae, other])
    with pytest.raises(ExperimentError) as caught:
        ex.run_with_cache(both, [("sae_acts", 1)])
    for named in ("Point('resid_pre.sae_acts', 1)", "Point('mlp_out.sae_acts', 1)"):
        assert named in str(caught.value)
    cache = ex.run_with_cache(both, [ACTS, ("mlp_out.sae_acts", 1)])
    assert cache[ACTS].shape == cache["mlp_out.sae_acts", 1].shape == (2, 6, M)
    with pytest.raises(ExperimentError, match="several points of layer 1"):
        patching_grids.act_patch_sae_features(both, {"toks_int_var": CORRUPTED}, reference_logit_diff)


def test_refusals(model, spliced):
    plain = cm.from_hf(model, TOKENS)
    with pytest.raises(ExperimentError, match="finds no node"):
        ex.run_with_cache(plain, [ACTS])
    with pytest.raises(ExperimentError, match="no SAE is spliced"):
        patching_grids.act_patch_sae_features(plain, {"toks_int_var": CORRUPTED}, reference_logit_diff)
    with pytest.raises(ExperimentError, match=r"layers \[0\] have no SAE"):
        patching_grids.act_patch_sae_features(
            spliced, {"toks_int_var": CORRUPTED}, reference_logit_diff, layers=[0]
        )
    with pytest.raises(ExperimentError, match="no SAE spliced"):
        ex.attribution_patching(plain, {"toks_int_var": CORRUPTED}, reference_logit_diff, ["sae_acts"])
    for bad in [("sae_acts",), ("sae_acts", 1, 0), ("resid_final.sae_acts", 1), ("nowhere.sae_acts", 1)]:
        with pytest.raises(ExperimentError):
            Point(*bad)
