"""Gemma 2 (a Llama variant) against Hugging Face's ``Gemma2ForCausalLM``: what only Gemma 2 has.

Random-weight models from small configs (``factories.gemma2``; nothing is downloaded) with every
Gemma 2 change switched on: sandwich norms (perturbed so that their ``(1 + w)`` scale matters),
attention and final logit soft-caps small enough to bend the values, and alternating
windowed/full layers with sequences longer than the window.  The forward, the checkpoint round
trip, head splitting and the points, which every family shares, are in
test_models_conformance.py.
"""

from __future__ import annotations

import functools

import dataclasses

import pytest
import torch
from factories import FAMILY_VOCAB as VOCAB
from factories import GEMMA2_WINDOW as WINDOW
from factories import gemma2
from hf_reference import hf_logits, logits_of, random_tokens

import circuits as cc
import circuits.models as cm
from circuits.transformer import names
from circuits.errors import ModelError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

tokens_for = functools.partial(random_tokens, VOCAB)


def test_the_config():
    model = gemma2()
    config = cm.hf_to_weights(model.config, model.state_dict())[1]
    assert (config.act, config.sliding_window, config.sliding_layers) == ("gelu_new", WINDOW, (0, 2))
    assert (config.attn_softcap, config.final_softcap) == (2.0, 3.0)
    assert config.sandwich_norms and config.rms_unit_offset and config.embed_scale


@pytest.mark.parametrize(
    "change",
    [
        {"sandwich_norms": False},
        {"attn_softcap": None},
        {"final_softcap": None},
        {"sliding_layers": ()},
        {"sliding_layers": None},
    ],
    ids=["no-sandwich", "no-attn-cap", "no-final-cap", "no-window", "every-layer-windowed"],
)
def test_each_gemma2_change_matters(change):
    """A build without any one of Gemma 2's changes is off; with all of them it is not."""
    model = gemma2()
    tokens = tokens_for(True)
    config, weights = cm.hf_to_weights(model.config, model.state_dict())[1:]
    kept = {k: v for k, v in weights.items() if ".post." not in k} if "sandwich_norms" in change else weights
    want = hf_logits(model, tokens[..., :-1])
    changed = cm.build_llama(dataclasses.replace(config, **change), kept, tokens)
    assert (logits_of(changed) - want).abs().max().item() > 1e-3
    assert (logits_of(cm.build_llama(config, weights, tokens)) - want).abs().max().item() < 1e-5


def test_unsupported_options_name_the_field():
    # (query_pre_attn_scalar other than head_dim is supported: tests/test_models_families_2026.py)
    config = gemma2().config.to_dict()
    with pytest.raises(ModelError, match="attention_bias=True"):
        cm.from_hf_state_dict(dict(config, attention_bias=True), {})
    with pytest.raises(ModelError, match="'layer_types' is"):
        cm.from_hf_state_dict(dict(config, layer_types=["full_attention"]), {})
    with pytest.raises(ModelError, match="'attn_logit_softcapping' is -1"):
        cm.from_hf_state_dict(dict(config, attn_logit_softcapping=-1), {})
    with pytest.raises(ModelError, match="final_softcap=0"):
        cm.LlamaConfig(n_layers=1, n_heads=4, d_model=16, d_mlp=24, vocab_size=13, final_softcap=0)
    with pytest.raises(ModelError, match="sliding_layers=\\(3,\\)"):
        cm.LlamaConfig(n_layers=1, n_heads=4, d_model=16, d_mlp=24, vocab_size=13, sliding_layers=(3,))


def test_the_layers_masks_and_the_causal_mask_pass():
    """Windowed layers get the window's mask, the others the causal one.  The ``causal_mask`` pass
    does not know soft-capped scores (a tanh between the masked Einsum and the bias): it refuses."""
    model = gemma2().to(torch.float64)
    circuit = cm.from_hf(model, tokens_for(True))
    masks = {m.value.sum().item() for m in circuit.get(names.CAUSAL_MASK)}
    assert masks == {12 * 13 / 2, 12 * 13 / 2 - 8 * 9 / 2}  # causal; keys 4 or more back hidden
    with pytest.raises(cc.errors.PassError, match="already masked Add of 'a.attn_scores_raw'"):
        cc.passes.causal_mask(circuit)


def test_unmasked_scores_are_capped_too():
    """With ``causal=False`` the scores are the capped Einsum itself: every one within the cap."""
    model = gemma2()
    circuit = cm.from_hf(model, tokens_for(True), causal=False)
    scores = circuit.get(names.SCORES)
    assert len(scores) == 3 and not circuit.get(names.CAUSAL_MASK)
    assert all(0 < node.evaluate().abs().max() < 2.0 for node in scores)
    assert max(node.evaluate().abs().max() for node in scores) > 1.0  # the cap bends them
