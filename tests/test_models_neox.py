"""GPT-NeoX (Pythia) against Hugging Face's ``GPTNeoXForCausalLM``.

Random-weight models from small configs (nothing is downloaded), with large
weights and perturbed biases and layer norms so that every weight moves the
logits, partial rotary (``rotary_pct`` 0.5 of a head of 12: 6 dims rotated, 6
passed through) and both residual layouts (parallel, Pythia's, and sequential).
"""

from __future__ import annotations

import functools

import dataclasses
import json

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


def neox(parallel: bool = True, rotary_pct: float = 0.5, tied: bool = False, seed: int = 0, **extra):
    torch.manual_seed(seed)
    config = transformers.GPTNeoXConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_size=48,
        intermediate_size=51,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rotary_pct=rotary_pct,
        rotary_emb_base=1000,
        initializer_range=0.2,
        use_parallel_residual=parallel,
        tie_word_embeddings=tied,
        **extra,
    )
    model = transformers.GPTNeoXForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "layernorm" in name or "layer_norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("parallel", [True, False], ids=["parallel", "sequential"])
def test_equals_hugging_face_forward(parallel, batched, dtype):
    model = neox(parallel).to(dtype)
    tokens = tokens_for(batched)
    circuit = cm.from_hf(model, tokens)
    check_logits_and_loss(model, circuit, tokens, TOL[dtype])
    assert logits_of(circuit).dtype == dtype


@pytest.mark.parametrize("rotary_pct", [0.0, 1.0], ids=["no-rotary", "full-rotary"])
def test_rotary_extremes_tied_embeddings_and_no_attention_bias(rotary_pct):
    model = neox(rotary_pct=rotary_pct, tied=True, attention_bias=False).to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    assert not circuit.get(names.Q_NOBIAS) and not circuit.get(names.attn_weight(1, "o_bias"))
    assert circuit.get(names.Q_UNROTATED) and circuit.get(names.V)
    assert (logits_of(circuit) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-10


def test_a_wrong_rotary_fraction_or_residual_layout_differs():
    """The partial rotary fraction and the residual layout both matter: the test can fail."""
    model = neox()
    tokens = tokens_for(True)
    config, weights = cm.hf_to_weights(model.config, model.state_dict())[1:]
    assert config.rotary_pct == 0.5 and config.rotary_dims == 6 and config.parallel_residual
    want = hf_logits(model, tokens[..., :-1])
    assert (logits_of(cm.build_neox(config, weights, tokens)) - want).abs().max().item() < 1e-5
    for wrong in (dict(rotary_pct=1.0), dict(rotary_pct=1 / 3), dict(parallel_residual=False)):
        built = cm.build_neox(dataclasses.replace(config, **wrong), weights, tokens)
        assert (logits_of(built) - want).abs().max().item() > 1e-2, wrong


@pytest.mark.parametrize("tied", [False, True])
def test_save_pretrained_round_trip(tied, tmp_path):
    model = neox(tied=tied)
    tokens = tokens_for(True, seed=4)
    model.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    loaded = cm.load_hf_checkpoint(tmp_path, tokens)
    assert loaded == cm.from_hf(model, tokens)  # same structure, names, weights and tables
    assert (logits_of(loaded) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5


def test_pythia_style_checkpoint(tmp_path):
    """A Pythia hub checkpoint spells the rotary fields ``rotary_pct``/``rotary_emb_base`` and
    the unembedding ``embed_out``: the same circuit."""
    from safetensors.torch import save_file

    model = neox()
    tokens = tokens_for(True)
    config = model.config.to_dict()
    del config["rope_parameters"]
    config.update(rotary_pct=0.5, rotary_emb_base=1000)
    (tmp_path / "config.json").write_text(json.dumps(config))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state["embed_out.weight"] = state.pop("lm_head.weight")
    save_file(state, str(tmp_path / "model.safetensors"))
    assert cm.load_hf_checkpoint(tmp_path, tokens) == cm.from_hf(model, tokens)


def test_split_heads_causal_mask_and_a_zeroed_head():
    """Head splitting and the causal mask pass keep the value; zero-ablating head 1.3 equals the
    model with that head's slice of ``dense``'s input zeroed; every activation point finds its node."""
    model = neox().to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    remasked = cc.passes.causal_mask(circuit)
    torch.testing.assert_close(remasked.evaluate(), circuit.evaluate(), rtol=1e-12, atol=1e-12)
    check_heads_and_points(
        model,
        circuit,
        tokens,
        model.gpt_neox.layers[1].attention.dense,
        head=3,
        d_head=model.config.hidden_size // model.config.num_attention_heads,
        kinds=("q", "k", "v", "attn_scores", "attn_probs", "z", "mlp_post", "resid_mid"),
    )


@pytest.mark.parametrize(
    "change,match",
    [
        (
            dict(rope_parameters={"rope_type": "linear", "factor": 2.0}),
            "'rope_parameters' asks for the rotary variant 'linear'",
        ),
        (dict(rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.25}), "rotary_pct=0.25"),
        (dict(hidden_act="gelu_fast"), "activation 'gelu_fast'"),
        (dict(rope_parameters=None, rope_scaling={"type": "dynamic"}), "'rope_scaling' asks for .*'dynamic'"),
        (dict(use_parallel_residual="yes"), "'use_parallel_residual' is 'yes'"),
        (dict(head_dim=8), "'head_dim' 8 is not"),
    ],
)
def test_unsupported_configs_name_the_field(change, match):
    """Refused, naming the field: a scaled rotary variant, an odd number
    of rotated dims (0.25 of 12 is 3), an activation the builders lack, a flag of the wrong kind,
    a ``head_dim`` other than the head size (transformers' rotary would read it, its attention not)."""
    model = neox()
    config = dict(model.config.to_dict(), **change)
    with pytest.raises(ModelError, match=match):
        cm.from_hf_state_dict(config, model.state_dict(), tokens_for(False))


def test_attached_gradients_equal_hugging_face_backward():
    """With ``attach=True`` the fused ``query_key_value`` and ``dense`` views pass the gradient
    back to the model's parameters, equal to its own backward."""
    model = neox(parallel=False).to(torch.float64)
    tokens = tokens_for(True)
    logits = model(input_ids=tokens[:, :-1]).logits  # (its own loss is computed in float32)
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    want = torch.autograd.grad(loss, list(model.parameters()))
    circuit = cm.from_hf(model, tokens, attach=True)
    got = torch.autograd.grad(cc.evaluate(circuit).mean(), list(model.parameters()))
    for (name, _), g, w in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-10, msg=name)
