"""``ex.detect_head`` against TransformerLens's head detector on the same weights, and its errors."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.models as cm
from circuits import experiments as ex
from circuits.errors import ExperimentError
from circuits.experiments import head_detector
from factories import tl_model


def tl_scores(model, tokens, kind, **options):
    """``detect_head``'s loop, with TransformerLens's own pattern and score functions, per row, averaged."""
    from transformer_lens import head_detector as hd

    rows = []
    for row in tokens:
        with torch.no_grad():
            _, cache = model.run_with_cache(row[None])
        detection = getattr(hd, f"get_{kind}_detection_pattern")(row[None])
        rows.append(
            torch.tensor(
                [
                    [
                        hd.compute_head_attention_similarity_score(
                            cache["pattern", layer][0, head], detection_pattern=detection, **options
                        )
                        for head in range(model.cfg.n_heads)
                    ]
                    for layer in range(model.cfg.n_layers)
                ]
            )
        )
    return torch.stack(rows).mean(0)


@pytest.mark.slow  # importing TransformerLens alone takes seconds
@pytest.mark.parametrize("kind", head_detector.HEAD_PATTERNS)
def test_detect_head_equals_transformer_lens(kind):
    model = tl_model("gpt2", d_vocab=7)  # TransformerLens 4's GPT-2 layout, every weight perturbed
    # a small vocabulary, so tokens repeat and every pattern has ones
    tokens = torch.randint(0, 7, (3, 11), generator=torch.Generator().manual_seed(1))
    circuit = cm.from_transformer_lens(model, tokens, convention="prompt")
    split = cc.passes.split_heads(circuit)
    for options in (
        dict(exclude_bos=False, exclude_current_token=False, error_measure="mul"),
        dict(exclude_bos=True, exclude_current_token=True, error_measure="mul"),
        dict(exclude_bos=True, exclude_current_token=False, error_measure="abs"),
        dict(exclude_bos=False, exclude_current_token=True, error_measure="abs"),
    ):
        expected = tl_scores(model, tokens, kind, **options)
        atol = 1e-3 if options["error_measure"] == "abs" else 1e-5  # TransformerLens rounds "abs" to 3 places
        for c in (circuit, split):
            torch.testing.assert_close(ex.detect_head(c, kind, **options), expected, rtol=0, atol=atol)


def test_detection_patterns_by_hand():
    tokens = torch.tensor([5, 6, 5, 6])
    previous = torch.zeros(4, 4)
    previous[[1, 2, 3], [0, 1, 2]] = 1
    duplicate = torch.zeros(4, 4)
    duplicate[[2, 3], [0, 1]] = 1
    induction = torch.zeros(4, 4)
    induction[[2, 3], [1, 2]] = 1  # the key after the earlier occurrence
    assert torch.equal(head_detector.detection_pattern("previous_token_head", tokens), previous)
    assert torch.equal(head_detector.detection_pattern("duplicate_token_head", tokens), duplicate)
    assert torch.equal(head_detector.detection_pattern("induction_head", tokens), induction)
    assert torch.equal(head_detector.detection_pattern("induction_head", tokens[None]), induction[None])


def test_perfect_induction_attention_scores_its_share():
    """Attention given by hand: every query of the repeat attends only to its induction key."""
    config = cm.AttnOnlyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, vocab_size=9, n_ctx=16)
    block = torch.tensor([1, 2, 3, 4])
    tokens = torch.cat([block, block])
    circuit = cm.build_attn_only(config, cm.attn_only_random_weights(config), tokens, convention="prompt")
    probs = torch.zeros(2, 8, 8)
    probs[:, torch.arange(8), torch.arange(8)] = 1.0  # attend to self ...
    probs[0, 4:, :] = 0
    probs[0, torch.arange(4, 8), torch.arange(1, 5)] = 1.0  # ... but head 0 attends by induction
    cache = ex.run_with_cache(circuit, [ex.Point("attn_probs", 0)])
    fixed = ex.ActivationCache(cache.value, {ex.Point("attn_probs", 0): probs}, circuit)
    scores = ex.detect_head(fixed, "induction_head")
    torch.testing.assert_close(scores, torch.tensor([[4 / 8, 0.0]]))


def test_bad_arguments_are_experiment_errors():
    config = cm.AttnOnlyConfig(n_layers=1, n_heads=2, d_model=8, d_head=4, vocab_size=9, n_ctx=16)
    circuit = cm.build_attn_only(config, cm.attn_only_random_weights(config), torch.arange(6) % 9)
    with pytest.raises(ExperimentError, match="the named ones are"):
        ex.detect_head(circuit, "induction")
    with pytest.raises(ExperimentError, match="error_measure"):
        ex.detect_head(circuit, "induction_head", error_measure="l2")
    with pytest.raises(ExperimentError, match="exclude_bos"):
        ex.detect_head(circuit, "induction_head", exclude_bos=1)
    with pytest.raises(ExperimentError, match="shape"):
        ex.detect_head(circuit, torch.zeros(3, 3))
