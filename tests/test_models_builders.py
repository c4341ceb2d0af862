"""GPT-2 and Llama builders without Hugging Face: swapping tokens, batching, config errors."""

from __future__ import annotations

import pytest
import torch

import circuits as cc
import circuits.models as cm

GPT2 = cm.GPT2Config(n_layers=2, n_heads=2, d_model=8, vocab_size=13, n_ctx=16)
LLAMA = cm.LlamaConfig(n_layers=2, n_heads=4, n_kv_heads=2, d_model=16, d_mlp=8, vocab_size=13)
FAMILIES = {
    "gpt2": (GPT2, cm.gpt2_random_weights, cm.build_gpt2),
    "llama": (LLAMA, cm.llama_random_weights, cm.build_llama),
    "attn_only": (
        cm.AttnOnlyConfig(n_layers=2, n_heads=2, d_model=8, d_head=4, vocab_size=13, n_ctx=16),
        cm.attn_only_random_weights,
        cm.build_attn_only,
    ),
}


@pytest.mark.parametrize("family", list(FAMILIES))
def test_tokens_swap_by_update_and_expand(family):
    config, random_weights, build = FAMILIES[family]
    weights = random_weights(config, dtype=torch.float64)
    tokens = torch.randint(0, 13, (3, 7), generator=torch.Generator().manual_seed(0))
    placeholder = build(config, weights, seq_len=6)
    swapped = placeholder.update("toks_int_var", lambda n: cc.Array(tokens[1], name="toks_int_var"))
    torch.testing.assert_close(
        swapped.evaluate(), build(config, weights, tokens[1]).evaluate(), rtol=0, atol=0
    )
    batched = cc.expand(placeholder, {"toks_int_var": cc.Array(tokens, name="toks_int_var")})
    assert batched.shape == (3, 6)
    torch.testing.assert_close(
        batched.evaluate(), build(config, weights, tokens).evaluate(), rtol=1e-12, atol=1e-12
    )


@pytest.mark.parametrize("family", list(FAMILIES))
def test_fixed_names_and_round_trip(family):
    config, random_weights, build = FAMILIES[family]
    circuit = build(config, random_weights(config), torch.randint(0, 13, (2, 5)))
    for name in (
        "toks_int_var",
        "input_toks_int",
        "true_toks_int",
        "idxed_embeds",
        "t.call",
        "log_probs",
        "ll",
    ):
        circuit.get_unique(name)
    assert circuit.name == "t.loss" and circuit.shape == (2, 4)
    assert circuit.get_unique("t.call").shape == (2, 4, 13)
    assert cc.parse(circuit.repr()) == circuit


def test_weight_shapes_name_every_array():
    for family, (config, random_weights, build) in FAMILIES.items():
        circuit = build(config, random_weights(config), seq_len=3)
        arrays = {n.name for n in cc.unique_nodes([circuit]) if isinstance(n, cc.Array)}
        expected = set(config.weight_shapes()) - {"t.w.unembed_bias"}
        assert expected <= arrays, (family, expected - arrays)


def test_config_errors():
    with pytest.raises(cm.ModelError, match="not divisible by n_heads"):
        cm.GPT2Config(n_layers=1, n_heads=3, d_model=8, vocab_size=5, n_ctx=4).weight_shapes()
    bad = cm.LlamaConfig(n_layers=1, n_heads=3, n_kv_heads=2, d_model=12, d_mlp=4, vocab_size=5)
    with pytest.raises(cm.ModelError, match="not a multiple of 2 key/value heads"):
        cm.build_llama(bad, cm.llama_random_weights(bad), seq_len=3)
    odd = cm.LlamaConfig(n_layers=1, n_heads=2, d_model=6, d_mlp=4, vocab_size=5)
    with pytest.raises(cm.ModelError, match="even head size"):
        cm.build_llama(odd, cm.llama_random_weights(odd), seq_len=3)
    with pytest.raises(cm.ModelError, match="activation 'quick_gelu'"):
        config = cm.GPT2Config(n_layers=1, n_heads=2, d_model=8, vocab_size=5, n_ctx=4, act="quick_gelu")
        cm.build_gpt2(config, cm.gpt2_random_weights(config), seq_len=3)
    with pytest.raises(cm.ModelError, match="rope tables"):
        cm.build_llama(
            LLAMA, cm.llama_random_weights(LLAMA), seq_len=3, rope=(torch.ones(3, 5), torch.ones(3, 5))
        )
    with pytest.raises(cm.ModelError, match="needs a GPT2Config"):
        cm.build_gpt2(LLAMA, {}, seq_len=3)
    weights = cm.gpt2_random_weights(GPT2)
    weights["a0.w.q_bias"] = weights["a0.w.q_bias"].reshape(2, 4)
    # the message gives the shape found and the one expected
    with pytest.raises(cc.errors.ModelError, match=r"has shape \[2, 4\], expected \[2, 1, 4\]") as info:
        cm.build_gpt2(GPT2, weights, seq_len=3)
    assert info.value.mismatched_keys == ["a0.w.q_bias"]
    assert info.value.missing_keys == info.value.unexpected_keys == []
    weights = cm.gpt2_random_weights(GPT2)
    weights["nonsense"], weights["a0.w.o"] = weights.pop("a0.w.q_bias"), "not a tensor"
    with pytest.raises(cc.errors.ModelError) as info:  # every problem at once
        cm.build_gpt2(GPT2, weights, seq_len=3)
    assert info.value.missing_keys == ["a0.w.q_bias"] and info.value.unexpected_keys == ["nonsense"]
    assert info.value.mismatched_keys == ["a0.w.o"]
    weights = cm.gpt2_random_weights(GPT2)
    weights["a0.w.o"] = weights["a0.w.o"].double()
    with pytest.raises(cm.ModelError, match="mix dtypes"):
        cm.build_gpt2(GPT2, weights, seq_len=3)


def test_rope_tables_match_the_formula():
    cos, sin = cm.rope_cos_sin(LLAMA, 5)
    d = LLAMA.head_size
    inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = torch.arange(5, dtype=torch.float64)[:, None] * inv
    torch.testing.assert_close(cos.double(), torch.cat([angles.cos()] * 2, -1), rtol=0, atol=1e-6)
    torch.testing.assert_close(sin.double(), torch.cat([angles.sin()] * 2, -1), rtol=0, atol=1e-6)
