"""Text in and out with a tokenizer built here (nothing downloaded): to_tokens, to_str_tokens, tokenizer=."""

from __future__ import annotations

import factories
import pytest
import torch

import circuits as cc
from circuits import models
from circuits.models.gpt2 import GPT2Config, build_gpt2, gpt2_random_weights

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

WORDS = ["<bos>", "<unk>", "the", "cat", "sat", "on", "mat", "a", "dog", "ran"]


@pytest.fixture(scope="module")
def tokenizer():
    vocab = {word: i for i, word in enumerate(WORDS)}
    model = tokenizers.models.WordLevel(vocab=vocab, unk_token="<unk>")
    core = tokenizers.Tokenizer(model)
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<bos>", unk_token="<unk>")


def test_to_tokens_puts_bos_in_front_and_batches_equal_lengths(tokenizer):
    assert models.to_tokens(tokenizer, "the cat sat").tolist() == [0, 2, 3, 4]
    assert models.to_tokens(tokenizer, "the cat sat", prepend_bos=False).tolist() == [2, 3, 4]
    assert models.to_tokens(tokenizer, ["the cat", "a dog"]).tolist() == [[0, 2, 3], [0, 7, 8]]
    with pytest.raises(cc.errors.ModelError, match=r"\[3, 4\] tokens per row"):
        models.to_tokens(tokenizer, ["the cat", "a dog ran"])


def test_to_str_tokens_labels_each_token(tokenizer):
    assert models.to_str_tokens(tokenizer, torch.tensor([0, 2, 3])) == ["<bos>", "the", "cat"]
    assert models.to_str_tokens(tokenizer, "a dog") == ["<bos>", "a", "dog"]
    assert models.to_str_tokens(tokenizer, torch.tensor([[2, 3], [7, 8]])) == [["the", "cat"], ["a", "dog"]]


def test_builders_accept_text_with_a_tokenizer(tokenizer):
    config = GPT2Config(n_layers=1, n_heads=2, d_model=8, vocab_size=len(WORDS), n_ctx=8)
    weights = gpt2_random_weights(config, seed=1)
    from_text = build_gpt2(
        config, weights, "the cat sat on the mat", tokenizer=tokenizer, convention="prompt"
    )
    from_ids = build_gpt2(config, weights, torch.tensor([0, 2, 3, 4, 5, 2, 6]), convention="prompt")
    assert from_text == from_ids
    with pytest.raises(cc.errors.ModelError, match="needs a tokenizer"):
        build_gpt2(config, weights, "the cat")


def test_loaders_accept_text_with_a_tokenizer(tokenizer):
    model = factories.gpt2(n_layer=1, n_head=2, n_embd=8, vocab_size=len(WORDS), n_positions=8)
    circuit = models.from_hf(model, ["the cat sat", "a dog ran"], tokenizer=tokenizer, convention="prompt")
    with torch.no_grad():
        expected = model(models.to_tokens(tokenizer, ["the cat sat", "a dog ran"])).logits
    torch.testing.assert_close(circuit.evaluate(), expected, rtol=1e-5, atol=1e-5)
