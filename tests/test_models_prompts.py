"""Prompts without targets: ``convention="prompt"`` gives the logits of the tokens as given.

References: the same model's logits from the default convention on the
prompt plus a dummy target token, and Hugging Face's own forward.
"""

from __future__ import annotations

import factories
import pytest
import torch

import circuits as cc
from circuits import models
from circuits.models.attn_only import AttnOnlyConfig, attn_only_random_weights, build_attn_only
from circuits.models.gpt2 import GPT2Config, build_gpt2, gpt2_random_weights
from circuits.models.llama import LlamaConfig, build_llama, llama_random_weights


def _prompt(batched: bool, vocab: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(3)
    return torch.randint(0, vocab, (2, 7) if batched else (7,), generator=g)


def _builders():
    gpt2 = GPT2Config(n_layers=2, n_heads=2, d_model=16, vocab_size=23, n_ctx=16)
    llama = LlamaConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_mlp=24, vocab_size=23)
    attn = AttnOnlyConfig(n_layers=2, n_heads=2, d_model=16, d_head=8, vocab_size=23, n_ctx=16)
    return [
        ("gpt2", build_gpt2, gpt2, gpt2_random_weights(gpt2, seed=0)),
        ("llama", build_llama, llama, llama_random_weights(llama, seed=0)),
        ("attn_only", build_attn_only, attn, attn_only_random_weights(attn, seed=0)),
    ]


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("family", ["gpt2", "llama", "attn_only"])
def test_prompt_logits_equal_the_default_conventions_logits(family, batched):
    _, build, config, weights = next(b for b in _builders() if b[0] == family)
    prompt = _prompt(batched, 23)
    circuit = build(config, weights, prompt, convention="prompt")
    assert circuit.name == "t.call"
    assert circuit.shape == (*prompt.shape, 23)
    assert not circuit.get("t.loss") and not circuit.get("true_toks_int")
    with_target = torch.cat([prompt, torch.zeros_like(prompt[..., :1])], dim=-1)
    reference = build(config, weights, with_target).get_unique("t.call").evaluate()
    torch.testing.assert_close(circuit.evaluate(), reference, rtol=0, atol=0)


def test_prompt_placeholder_and_errors():
    _, build, config, weights = _builders()[0]
    placeholder = build(config, weights, None, seq_len=5, batch_size=3, convention="prompt")
    assert placeholder.shape == (3, 5, 23)
    assert placeholder.get_unique("toks_int_var").shape == (3, 5)
    with pytest.raises(cc.errors.ModelError, match="'prompt' convention needs more than 0 tokens per row"):
        build(config, weights, torch.zeros(0, dtype=torch.int64), convention="prompt")


@pytest.mark.slow
def test_prompt_from_hf_equals_hugging_faces_logits():
    model = factories.gpt2(n_head=2, n_embd=16, vocab_size=31, n_positions=16)
    prompt = _prompt(True, 31)
    circuit = models.from_hf(model, prompt, convention="prompt")
    with torch.no_grad():
        expected = model(prompt).logits
    torch.testing.assert_close(circuit.evaluate(), expected, rtol=1e-5, atol=1e-5)
