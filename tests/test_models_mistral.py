"""Mistral (Llama with sliding-window attention) against Hugging Face's ``MistralForCausalLM``:
what only Mistral's window does.

Random-weight models from small configs (``factories.mistral``; nothing is downloaded), with
sequences longer than the window so that it matters.  The forward, the checkpoint round trip,
head splitting and the points, which every family shares, are in test_models_conformance.py.
"""

from __future__ import annotations

import functools

import dataclasses

import pytest
import torch
from factories import FAMILY_VOCAB as VOCAB
from factories import MISTRAL_WINDOW as WINDOW
from factories import mistral
from hf_reference import hf_logits, logits_of, random_tokens

import circuits as cc
import circuits.models as cm
from circuits.transformer import names
from circuits.errors import ModelError
from circuits.transformer.masks import causal_mask_array
from circuits.models.llama import sliding_window_mask_array

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

tokens_for = functools.partial(random_tokens, VOCAB)


def test_the_window_convention():
    """Query q sees keys q - window + 1 .. q (transformers: ``kv_idx > q_idx - sliding_window``)."""
    mask = sliding_window_mask_array(5, 2, torch.float64)
    expected = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    assert mask.name == names.CAUSAL_MASK and mask.value.tolist() == expected
    assert mask.value.dtype == torch.float64
    assert torch.equal(sliding_window_mask_array(5, 5).value, causal_mask_array(5).value)


def test_the_window_matters():
    """With the window ignored (a plain causal Llama build of the same weights) the logits differ."""
    model = mistral()
    tokens = tokens_for(True)
    config, weights = cm.hf_to_weights(model.config, model.state_dict())[1:]
    assert config.sliding_window == WINDOW
    windowless = cm.build_llama(dataclasses.replace(config, sliding_window=None), weights, tokens)
    want = hf_logits(model, tokens[..., :-1])
    assert (logits_of(windowless) - want).abs().max().item() > 1e-2
    assert (logits_of(cm.build_llama(config, weights, tokens)) - want).abs().max().item() < 1e-5
    # the first WINDOW positions see every earlier key either way
    assert (logits_of(windowless)[:, :WINDOW] - want[:, :WINDOW]).abs().max().item() < 1e-5


def test_no_window_is_plain_causal():
    model = mistral(window=None)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    assert torch.equal(circuit.get_unique(names.CAUSAL_MASK).value, causal_mask_array(12).value)
    assert (logits_of(circuit) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5


def test_broken_inputs_name_the_field():
    config = mistral().config.to_dict()
    with pytest.raises(ModelError, match="'sliding_window' is 0"):
        cm.from_hf_state_dict(dict(config, sliding_window=0), {})
    with pytest.raises(ModelError, match="sliding_window='4'"):
        cm.LlamaConfig(n_layers=1, n_heads=4, d_model=16, d_mlp=24, vocab_size=13, sliding_window="4")


def test_causal_mask_pass_with_the_window_keeps_the_value():
    """The pass given the window's mask keeps the value; given none it refuses to replace the
    window by the plain causal mask (that would change the model silently); given the causal mask
    on purpose it writes it."""
    model = mistral().to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    window = circuit.get_unique(names.CAUSAL_MASK).value
    remasked = cc.passes.causal_mask(circuit, mask=window)
    torch.testing.assert_close(remasked.evaluate(), circuit.evaluate(), rtol=1e-12, atol=1e-12)
    with pytest.raises(cc.errors.PassError, match="not the causal mask"):
        cc.passes.causal_mask(circuit)
    plain = cc.passes.causal_mask(circuit, mask=causal_mask_array(12).value)
    assert torch.equal(plain.get_unique(names.CAUSAL_MASK).value, causal_mask_array(12).value)
    assert (plain.evaluate() - circuit.evaluate()).abs().max().item() > 1e-3
