"""Qwen2 (Llama with query/key/value biases) against Hugging Face's ``Qwen2ForCausalLM``.

Random-weight models from small configs (nothing is downloaded), with large
weights and perturbed biases and norms so that every weight moves the logits.
``Qwen2RMSNorm`` rounds activations through float32, so the float64
reference runs with that round trip removed (as the Llama tests do).
"""

from __future__ import annotations

import functools

import dataclasses

import pytest
import torch
from hf_reference import hf_logits, logits_of, random_tokens, check_heads_and_points, check_logits_and_loss

import circuits as cc
import circuits.models as cm
from circuits.transformer import names
from circuits.errors import ModelError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 97
tokens_for = functools.partial(random_tokens, VOCAB)
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def qwen2(kv_heads: int = 2, tied: bool = False, seed: int = 0, **extra):
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=40,
        intermediate_size=51,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=1000.0,
        initializer_range=0.2,
        tie_word_embeddings=tied,
        **extra,
    )
    model = transformers.Qwen2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


def _no_rmsnorm_round_trip(monkeypatch):
    from transformers.models.qwen2 import modeling_qwen2

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_qwen2.Qwen2RMSNorm, "forward", forward)


MEASURED: dict[str, float] = {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("kv_heads,tied", [(4, False), (2, False), (1, True)], ids=["mha", "gqa", "mqa-tied"])
def test_equals_hugging_face_forward(kv_heads, tied, batched, dtype, monkeypatch):
    if dtype == torch.float64:
        _no_rmsnorm_round_trip(monkeypatch)
    model = qwen2(kv_heads, tied).to(dtype)
    tokens = tokens_for(batched)
    circuit = cm.from_hf(model, tokens)
    MEASURED[f"{kv_heads}-{tied}-{batched}-{dtype}"] = check_logits_and_loss(
        model, circuit, tokens, TOL[dtype]
    )
    assert logits_of(circuit).dtype == dtype


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


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trip(tied, tmp_path):
    model = qwen2(2, tied)
    tokens = tokens_for(True, seed=4)
    model.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    loaded = cm.load_hf_checkpoint(tmp_path, tokens)
    assert loaded == cm.from_hf(model, tokens)  # same structure, names and weights (array hashes)
    assert (logits_of(loaded) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5


def test_split_heads_and_points_and_a_zeroed_head(monkeypatch):
    """Head splitting keeps the value; zero-ablating head 1.2 equals the model with that head's
    slice of ``o_proj``'s input zeroed; every activation point finds its node."""
    _no_rmsnorm_round_trip(monkeypatch)
    model = qwen2(2).to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    torch.testing.assert_close(cc.causal_mask(circuit).evaluate(), circuit.evaluate(), rtol=1e-12, atol=1e-12)
    check_heads_and_points(
        model,
        circuit,
        tokens,
        model.model.layers[1].self_attn.o_proj,
        head=2,
        d_head=model.config.hidden_size // model.config.num_attention_heads,
        kinds=("q", "k", "v", "attn_probs", "z", "mlp_post", "resid_mid"),
    )


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
