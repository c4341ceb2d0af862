"""run_with_cache: every cached activation equals its node evaluated on its own; one evaluation."""

from __future__ import annotations

import factories
import pytest
import torch

import circuits as cc
from circuits.experiments.activations import run_with_cache
from circuits.models.gpt2 import GPT2Config, build_gpt2, gpt2_random_weights
from circuits.transformer.points import Point


@pytest.fixture(scope="module")
def gpt2():
    tokens = factories.token_ids(17, (2, 7), seed=1)
    return factories.gpt2_circuit(tokens, factories.gpt2_config(n_ctx=10), seed=2)


def test_every_default_point_equals_its_node_evaluated_alone(gpt2):
    cache = run_with_cache(gpt2)
    torch.testing.assert_close(cache.value, gpt2.evaluate(), rtol=0, atol=0)
    kinds = {key[0] for key in cache}
    assert {"resid_pre", "attn_probs", "z", "mlp_post", "resid_post", "logits", "loss"} <= kinds
    assert {key[1] for key in cache if key[0] == "attn_probs"} == {0, 1}
    for kind, layer, head in cache:
        alone = gpt2.get_unique(Point(kind, layer, head)).evaluate()
        torch.testing.assert_close(cache[kind, layer, head], alone, rtol=1e-6, atol=1e-6)
    assert cache["attn_probs", 1].shape == (2, 3, 6, 6)  # 7 tokens: 6 inputs
    assert cache["logits"].shape == (2, 6, 17)


def test_head_points_on_a_split_circuit(gpt2):
    split = cc.passes.split_heads(gpt2)
    cache = run_with_cache(split, [("z", 1, 2), ("head_out", 0, 1), "logits"])
    assert list(cache) == [("z", 1, 2), ("head_out", 0, 1), ("logits", None, None)]
    unsplit = run_with_cache(gpt2, [("z", 1)])
    torch.testing.assert_close(cache["z", 1, 2], unsplit["z", 1][:, 2], rtol=1e-5, atol=1e-6)
    with pytest.raises(cc.errors.ExperimentError, match="one per head branch: give a head"):
        run_with_cache(split, [("z", 1)])


def test_bad_points_and_keys():
    config = GPT2Config(n_layers=1, n_heads=2, d_model=8, vocab_size=11, n_ctx=8)
    c = build_gpt2(config, gpt2_random_weights(config), torch.randint(0, 11, (5,)))
    with pytest.raises(cc.errors.ExperimentError, match="unknown activation kind"):
        run_with_cache(c, ["nonsense"])
    with pytest.raises(cc.errors.ExperimentError, match="finds no node"):
        run_with_cache(c, [("resid_pre", 5)])
    cache = run_with_cache(c, ["logits"])
    with pytest.raises(
        cc.errors.MissingPointError, match=r"^'loss': not in this cache; it holds 'logits'$"
    ) as missing:
        cache["loss"]
    assert isinstance(missing.value, KeyError) and isinstance(missing.value, cc.CircuitError)
    with pytest.raises(cc.errors.MissingPointError, match=r"^\('nonsense', 0\): not in this cache"):
        cache["nonsense", 0]
    with pytest.raises(cc.errors.MissingPointError, match="a point is a kind"):
        cache[3]
    assert cache.get("loss") is None and "loss" not in cache  # a Mapping's missing key, as a dict's
