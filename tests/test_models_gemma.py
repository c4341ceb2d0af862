"""Gemma (a Llama variant) against Hugging Face's ``GemmaForCausalLM``: what only Gemma has.

Random-weight models from small odd-dimension configs (``factories.gemma``; nothing is
downloaded), with ``head_dim`` unequal to ``hidden_size / heads`` and the norms' weights
perturbed away from zero so that their ``(1 + w)`` scale matters.  The forward, the checkpoint
round trip, head splitting and the points, which every family shares, are in
test_models_conformance.py.
"""

from __future__ import annotations

import functools

import dataclasses

import pytest
import torch
from factories import FAMILY_VOCAB as VOCAB
from factories import gemma
from hf_reference import hf_logits, logits_of, random_tokens

import circuits.models as cm
from circuits.transformer import names
from circuits.errors import ModelError
from circuits.transformer.points import Point

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

tokens_for = functools.partial(random_tokens, VOCAB)


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


def test_the_embed_point_is_the_scaled_embeddings():
    """Gemma scales its token embeddings: the residual before layer 0 is that product."""
    circuit = cm.from_hf(gemma().to(torch.float64), tokens_for(True))
    (embed,) = circuit.get(Point("embed"))  # the scaled embeddings: the residual before layer 0
    assert embed.name == names.TOKEN_EMBEDS and len(embed.children) == 2


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
