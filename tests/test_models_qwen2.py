"""Qwen2 (Llama with query/key/value biases) against Hugging Face's ``Qwen2ForCausalLM``: what
only Qwen2 has.

Random-weight models from small configs (``factories.qwen2``; nothing is downloaded), with large
weights and perturbed biases and norms so that every weight moves the logits.  The forward, the
checkpoint round trip, head splitting, the points and the causal mask pass, which every family
shares, are in test_models_conformance.py.
"""

from __future__ import annotations

import functools

import dataclasses

import pytest
import torch
from factories import FAMILY_VOCAB as VOCAB
from factories import qwen2
from hf_reference import hf_logits, logits_of, random_tokens

import circuits.models as cm
from circuits.transformer import names
from circuits.errors import ModelError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

tokens_for = functools.partial(random_tokens, VOCAB)


def test_the_biases_are_in_the_circuit_and_matter():
    model = qwen2()
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    for which in ("q", "k", "v"):
        bias = circuit.get_unique(names.attn_weight(1, f"{which}_bias"))
        assert tuple(bias.shape) == ((4 if which == "q" else 2), 1, 10)
    assert circuit.get(names.Q_NOBIAS) and circuit.get(names.V_NOBIAS)
    with torch.no_grad():
        model.model.layers[1].self_attn.k_proj.bias.zero_()
    assert (logits_of(circuit) - hf_logits(model, tokens[..., :-1])).abs().max().item() > 1e-3
    assert (logits_of(cm.from_hf(model, tokens)) - hf_logits(model, tokens[..., :-1])).abs().max() < 1e-5


def test_unsupported_and_broken_inputs_name_the_field():
    with pytest.raises(ModelError, match="use_sliding_window=True"):
        cm.from_hf(qwen2(use_sliding_window=True, sliding_window=4, max_window_layers=1), tokens_for(False))
    model = qwen2()
    config = model.config.to_dict()
    with pytest.raises(ModelError, match="layer_types"):
        cm.from_hf_state_dict(dict(config, layer_types=["full_attention", "sliding_attention"]), {})
    state = {k: v for k, v in model.state_dict().items() if k != "model.layers.0.self_attn.v_proj.bias"}
    with pytest.raises(ModelError) as info:
        cm.from_hf_state_dict(config, state, tokens_for(False))
    assert info.value.missing_keys == ["model.layers.0.self_attn.v_proj.bias"]
    llama_config = dict(config, model_type="llama")  # a Llama has no QKV biases: they are not understood
    with pytest.raises(ModelError) as info:
        cm.from_hf_state_dict(llama_config, model.state_dict(), tokens_for(False))
    assert info.value.unexpected_keys == sorted(k for k in model.state_dict() if k.endswith("_proj.bias"))


def test_the_builder_config_and_random_weights():
    config = cm.LlamaConfig(
        n_layers=1, n_heads=4, n_kv_heads=2, d_model=16, d_mlp=24, vocab_size=13, qkv_bias=True
    )
    shapes = config.weight_shapes()
    assert shapes[names.attn_weight(0, "q_bias")] == (4, 1, 4) and shapes[names.attn_weight(0, "v_bias")] == (
        2,
        1,
        4,
    )
    weights = cm.llama_random_weights(config, seed=2, dtype=torch.float64)
    tokens = torch.randint(0, 13, (2, 7), generator=torch.Generator().manual_seed(3))
    circuit = cm.build_llama(config, weights, tokens)
    unbiased = {name: w for name, w in weights.items() if not name.endswith("_bias")}
    plain = cm.build_llama(dataclasses.replace(config, qkv_bias=False), unbiased, tokens)
    assert circuit.get(names.K_NOBIAS) and not plain.get(names.K_NOBIAS)
    with pytest.raises(ModelError, match="k_bias"):
        cm.build_llama(
            config, {n: w for n, w in weights.items() if n != names.attn_weight(0, "k_bias")}, tokens
        )
    with pytest.raises(ModelError, match="qkv_bias"):
        cm.LlamaConfig(n_layers=1, n_heads=4, d_model=16, d_mlp=24, vocab_size=13, qkv_bias="yes")


def test_a_window_size_without_use_sliding_window_is_ignored_as_qwen2_does():
    """Hub configs (e.g. Qwen2-0.5B) carry ``sliding_window`` with ``use_sliding_window: false``:
    Qwen2's attention is then full, and so is ours."""
    model = qwen2()
    tokens = tokens_for(True, length=14)
    config = dict(model.config.to_dict(), sliding_window=3, use_sliding_window=False)
    circuit = cm.from_hf_state_dict(config, model.state_dict(), tokens)
    assert circuit == cm.from_hf(model, tokens)
    assert (logits_of(circuit) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5
