"""Gemma (a Llama variant) against Hugging Face's ``GemmaForCausalLM``.

Random-weight models from small odd-dimension configs (nothing is downloaded),
with ``head_dim`` unequal to ``hidden_size / heads`` and the norms' weights
perturbed away from zero so that their ``(1 + w)`` scale matters.
``GemmaRMSNorm`` computes in float32, so the float64 reference runs with that
round trip removed (as the Llama tests do).
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
from circuits.transformer.points import Point

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 97
tokens_for = functools.partial(random_tokens, VOCAB)
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def gemma(kv_heads: int = 2, tied: bool = True, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.GemmaConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=37,
        head_dim=10,
        intermediate_size=51,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        tie_word_embeddings=tied,
    )
    model = transformers.GemmaForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


def _no_rmsnorm_round_trip(monkeypatch):
    from transformers.models.gemma import modeling_gemma

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    monkeypatch.setattr(modeling_gemma.GemmaRMSNorm, "forward", forward)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("kv_heads,tied", [(4, True), (2, False), (1, True)], ids=["mha", "gqa", "mqa"])
def test_equals_hugging_face_forward(kv_heads, tied, batched, dtype, monkeypatch):
    if dtype == torch.float64:
        _no_rmsnorm_round_trip(monkeypatch)
    model = gemma(kv_heads, tied=tied).to(dtype)
    tokens = tokens_for(batched)
    circuit = cm.from_hf(model, tokens)
    check_logits_and_loss(model, circuit, tokens, TOL[dtype])
    assert logits_of(circuit).dtype == dtype


def test_the_config():
    model = gemma()
    config = cm.hf_to_weights(model.config, model.state_dict())[1]
    assert (config.act, config.d_head, config.kv_heads) == ("gelu_new", 10, 2)
    assert config.rms_unit_offset and config.embed_scale and config.tie_word_embeddings
    legacy = cm.hf_to_weights(dict(model.config.to_dict(), hidden_act="gelu"), model.state_dict())[1]
    assert legacy.act == "gelu_new"  # GemmaConfig's own reading of the legacy value


@pytest.mark.parametrize("flag", ["rms_unit_offset", "embed_scale"])
def test_each_gemma_change_matters(flag):
    """A build without the ``(1 + w)`` norms or without the embedding scale is off; with both it is not."""
    model = gemma()
    tokens = tokens_for(True)
    config, weights = cm.hf_to_weights(model.config, model.state_dict())[1:]
    want = hf_logits(model, tokens[..., :-1])
    without = cm.build_llama(dataclasses.replace(config, **{flag: False}), weights, tokens)
    assert (logits_of(without) - want).abs().max().item() > 1e-2
    assert (logits_of(cm.build_llama(config, weights, tokens)) - want).abs().max().item() < 1e-5


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trip(tied, tmp_path):
    model = gemma(2, tied=tied)
    tokens = tokens_for(True, seed=4)
    model.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    loaded = cm.load_hf_checkpoint(tmp_path, tokens)
    assert loaded == cm.from_hf(model, tokens)
    assert (logits_of(loaded) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5


def test_split_heads_and_points_and_a_zeroed_head(monkeypatch):
    """Head splitting keeps the value; zero-ablating head 1.3 equals the model with that head's
    slice of ``o_proj``'s input zeroed; every activation point finds its node."""
    _no_rmsnorm_round_trip(monkeypatch)
    model = gemma(2).to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    (embed,) = circuit.get(Point("embed"))  # the scaled embeddings: the residual before layer 0
    assert embed.name == names.TOKEN_EMBEDS and len(embed.children) == 2
    check_heads_and_points(
        model,
        circuit,
        tokens,
        model.model.layers[1].self_attn.o_proj,
        head=3,
        d_head=model.config.head_dim,
        kinds=("q", "k", "v", "attn_scores", "attn_probs", "z", "mlp_post", "resid_mid"),
    )


def test_causal_mask_pass_keeps_the_value():
    model = gemma().to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    torch.testing.assert_close(
        cc.passes.causal_mask(circuit).evaluate(), circuit.evaluate(), rtol=1e-12, atol=1e-12
    )


def test_unsupported_options_name_the_field():
    config = gemma().config.to_dict()
    with pytest.raises(ModelError, match="Gemma config options not supported: attention_bias=True"):
        cm.from_hf_state_dict(dict(config, attention_bias=True), {})
    with pytest.raises(ModelError, match="use_bidirectional_attention=True"):
        cm.from_hf_state_dict(dict(config, use_bidirectional_attention=True), {})
    with pytest.raises(ModelError, match="'hidden_act' is 3"):
        cm.from_hf_state_dict(dict(config, hidden_act=3), {})
    with pytest.raises(ModelError, match="rms_unit_offset=1"):
        cm.LlamaConfig(n_layers=1, n_heads=4, d_model=16, d_mlp=24, vocab_size=13, rms_unit_offset=1)


def test_random_weights_keep_the_scales_near_one():
    config = cm.LlamaConfig(n_layers=1, n_heads=2, d_model=6, d_mlp=8, vocab_size=11, rms_unit_offset=True)
    weights = cm.llama_random_weights(config)
    assert weights[names.norm_weight(names.FINAL, "scale", names.RMS)].abs().max() < 0.5
