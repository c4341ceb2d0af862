"""Gemma 2 (a Llama variant) against Hugging Face's ``Gemma2ForCausalLM``.

Random-weight models from small configs (nothing is downloaded) with every
Gemma 2 change switched on: sandwich norms (perturbed so that their
``(1 + w)`` scale matters), attention and final logit soft-caps small enough
to bend the values, and alternating windowed/full layers with sequences
longer than the window.  Hugging Face rounds the norms and the softmax
through float32, so the float64 reference runs with both round trips removed.
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
WINDOW = 4
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def gemma2(kv_heads: int = 2, tied: bool = True, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    fields = dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=36,
        head_dim=10,
        query_pre_attn_scalar=10,
        intermediate_size=51,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        sliding_window=WINDOW,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    config = transformers.Gemma2Config(**dict(fields, **overrides))
    model = transformers.Gemma2ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


def _no_float32_round_trips(monkeypatch):
    from transformers.models.gemma2 import modeling_gemma2

    def norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)

    original = modeling_gemma2.nn.functional.softmax

    def softmax(x, dim, dtype=None):  # Hugging Face upcasts the scores to float32
        return original(x, dim=dim)

    monkeypatch.setattr(modeling_gemma2.Gemma2RMSNorm, "forward", norm)
    monkeypatch.setattr(modeling_gemma2, "nn", _NnWith(softmax))


class _NnWith:
    """``torch.nn`` as ``modeling_gemma2`` sees it, with its own ``functional.softmax``."""

    def __init__(self, softmax):
        self.functional = type(
            "F", (), {"softmax": staticmethod(softmax), "dropout": torch.nn.functional.dropout}
        )

    def __getattr__(self, name):
        return getattr(torch.nn, name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("kv_heads,tied", [(4, True), (2, False), (1, True)], ids=["mha", "gqa", "mqa"])
def test_equals_hugging_face_forward(kv_heads, tied, batched, dtype, monkeypatch):
    if dtype == torch.float64:
        _no_float32_round_trips(monkeypatch)
    model = gemma2(kv_heads, tied=tied).to(dtype)
    tokens = tokens_for(batched)
    circuit = cm.from_hf(model, tokens)
    check_logits_and_loss(model, circuit, tokens, TOL[dtype])
    assert logits_of(circuit).dtype == dtype


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


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trip(tied, tmp_path):
    model = gemma2(2, tied=tied)
    tokens = tokens_for(True, seed=4)
    model.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    loaded = cm.load_hf_checkpoint(tmp_path, tokens)
    assert loaded == cm.from_hf(model, tokens)
    assert (logits_of(loaded) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5


def test_split_heads_and_points_and_a_zeroed_head(monkeypatch):
    """Head splitting keeps the value; zero-ablating head 1.3 equals the model with that head's
    slice of ``o_proj``'s input zeroed; every activation point finds its node."""
    _no_float32_round_trips(monkeypatch)
    model = gemma2(2).to(torch.float64)
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
    with pytest.raises(cc.PassError, match="already masked Add of 'a.attn_scores_raw'"):
        cc.causal_mask(circuit)


def test_unmasked_scores_are_capped_too():
    """With ``causal=False`` the scores are the capped Einsum itself: every one within the cap."""
    model = gemma2()
    circuit = cm.from_hf(model, tokens_for(True), causal=False)
    scores = circuit.get(names.SCORES)
    assert len(scores) == 3 and not circuit.get(names.CAUSAL_MASK)
    assert all(0 < node.evaluate().abs().max() < 2.0 for node in scores)
    assert max(node.evaluate().abs().max() for node in scores) > 1.0  # the cap bends them
