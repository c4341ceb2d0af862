"""Mistral (Llama with sliding-window attention) against Hugging Face's ``MistralForCausalLM``.

Random-weight models from small configs (nothing is downloaded), with
sequences longer than the window so that it matters.  ``MistralRMSNorm``
rounds activations through float32, so the float64 reference runs with that
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
from circuits.transformer.masks import causal_mask_array
from circuits.models.llama import sliding_window_mask_array

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

VOCAB = 97
tokens_for = functools.partial(random_tokens, VOCAB)
WINDOW = 4
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def mistral(kv_heads: int = 2, window: int | None = WINDOW, tied: bool = False, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.MistralConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=40,
        intermediate_size=51,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        sliding_window=window,
        tie_word_embeddings=tied,
    )
    model = transformers.MistralForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


def _no_rmsnorm_round_trip(monkeypatch):
    from transformers.models.mistral import modeling_mistral

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_mistral.MistralRMSNorm, "forward", forward)


def test_the_window_convention():
    """Query q sees keys q - window + 1 .. q (transformers: ``kv_idx > q_idx - sliding_window``)."""
    mask = sliding_window_mask_array(5, 2, torch.float64)
    expected = [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    assert mask.name == names.CAUSAL_MASK and mask.value.tolist() == expected
    assert mask.value.dtype == torch.float64
    assert torch.equal(sliding_window_mask_array(5, 5).value, causal_mask_array(5).value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("kv_heads,tied", [(4, False), (2, False), (1, True)], ids=["mha", "gqa", "mqa-tied"])
def test_equals_hugging_face_forward(kv_heads, tied, batched, dtype, monkeypatch):
    if dtype == torch.float64:
        _no_rmsnorm_round_trip(monkeypatch)
    model = mistral(kv_heads, tied=tied).to(dtype)
    tokens = tokens_for(batched)
    circuit = cm.from_hf(model, tokens)
    check_logits_and_loss(model, circuit, tokens, TOL[dtype])
    assert logits_of(circuit).dtype == dtype


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


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trip(tied, tmp_path):
    model = mistral(2, tied=tied)
    tokens = tokens_for(True, seed=4)
    model.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    loaded = cm.load_hf_checkpoint(tmp_path, tokens)
    assert loaded == cm.from_hf(model, tokens)  # same structure, names, weights and mask
    assert (logits_of(loaded) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5


def test_split_heads_and_points_and_a_zeroed_head(monkeypatch):
    """Head splitting keeps the value; zero-ablating head 1.3 equals the model with that head's
    slice of ``o_proj``'s input zeroed; every activation point finds its node."""
    _no_rmsnorm_round_trip(monkeypatch)
    model = mistral(2).to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    check_heads_and_points(
        model,
        circuit,
        tokens,
        model.model.layers[1].self_attn.o_proj,
        head=3,
        d_head=model.config.head_dim,
        kinds=("q", "k", "v", "attn_scores", "attn_probs", "z", "mlp_post", "resid_mid"),
    )


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
