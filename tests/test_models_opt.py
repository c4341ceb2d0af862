"""OPT (a GPT-2 circuit with its positions offset by 2) against Hugging Face's ``OPTForCausalLM``:
what only OPT has.

Random-weight models from small odd-dimension configs (``factories.opt``; nothing is
downloaded), with large weights and perturbed biases and layer norms so that every weight moves
the logits.  The forward, the checkpoint round trip, head splitting, the points and the causal
mask pass, which every family shares, are in test_models_conformance.py.
"""

from __future__ import annotations

import functools

import pytest
import torch
from factories import FAMILY_VOCAB as VOCAB
from factories import opt
from hf_reference import hf_logits, logits_of, random_tokens

import circuits as cc
import circuits.models as cm
from circuits.transformer import names
from circuits.errors import ModelError

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

tokens_for = functools.partial(random_tokens, VOCAB)


def test_positions_start_at_two():
    """The position table is ``embed_positions.weight[2:]``: read from row 0 the logits are wrong."""
    model = opt().to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    table = model.model.decoder.embed_positions.weight.detach()
    torch.testing.assert_close(circuit.get_unique(names.POS_EMBEDS).evaluate(), table[2:14])
    _, config, weights = cm.hf_to_weights(model.config, model.state_dict())
    weights[names.POS_EMBEDS_WEIGHT] = table[:-2].clone()  # positions from 0, as GPT-2's
    unshifted = cm.build_gpt2(config, weights, tokens)
    want = hf_logits(model, tokens[..., :-1])
    assert (logits_of(circuit) - want).abs().max().item() < 1e-10
    assert (logits_of(unshifted) - want).abs().max().item() > 1e-2


def test_attached_gradients_equal_hugging_face_backward():
    """With ``attach=True`` the position slice and the per-head views pass the gradient back
    to the model's parameters, equal to its own backward; except the padding token's embedding
    row, which ``nn.Embedding(padding_idx=...)`` never trains and the circuit does."""
    model = opt(tied=True).to(torch.float64)
    tokens = tokens_for(True)
    assert (tokens == model.config.pad_token_id).any()
    logits = model(input_ids=tokens[..., :-1]).logits  # transformers' own loss rounds through float32
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[..., 1:].reshape(-1))
    params = [p for _, p in model.named_parameters()]
    want = torch.autograd.grad(loss, params)
    circuit = cm.from_hf(model, tokens, attach=True)
    got = torch.autograd.grad(cc.evaluate(circuit).mean(), params)
    for (name, _), g, w in zip(model.named_parameters(), got, want):
        if name.endswith("embed_tokens.weight"):
            pad = model.config.pad_token_id
            assert (g[pad] - w[pad]).abs().max() > 1e-3
            g, w = torch.cat([g[:pad], g[pad + 1 :]]), torch.cat([w[:pad], w[pad + 1 :]])
        torch.testing.assert_close(g, w, rtol=1e-8, atol=1e-12, msg=name)


@pytest.mark.parametrize(
    "change,match",
    [
        ({"do_layer_norm_before": False}, "do_layer_norm_before=False"),
        ({"word_embed_proj_dim": 20}, "word_embed_proj_dim=20"),
        ({"enable_bias": False}, "enable_bias=False"),
        ({"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine=False"),
        ({"_remove_final_layer_norm": True}, "_remove_final_layer_norm=True"),
        ({"activation_function": "gelu_pytorch_tanh"}, "activation_function"),
        ({"num_attention_heads": 4}, "num_attention_heads"),
        ({"do_layer_norm_before": "yes"}, "do_layer_norm_before"),
    ],
)
def test_unsupported_configs_name_the_field(change, match):
    model = opt()
    config = dict(model.config.to_dict(), **change)
    with pytest.raises(ModelError, match=match):
        cm.from_hf_state_dict(config, model.state_dict(), tokens_for(False))


def test_post_layer_norm_model_is_refused_from_memory():
    """OPT-350m's layout (post-LayerNorm, 512-wide embeddings projected in and out) is refused by name."""
    model = opt(do_layer_norm_before=False, word_embed_proj_dim=20)
    with pytest.raises(ModelError, match=r"do_layer_norm_before=False.*word_embed_proj_dim=20"):
        cm.from_hf(model, tokens_for(False))


def test_broken_state_dicts_name_the_key():
    model = opt()
    config = model.config.to_dict()
    state = {
        k: v for k, v in model.state_dict().items() if k != "model.decoder.layers.0.self_attn.v_proj.bias"
    }
    with pytest.raises(ModelError) as info:
        cm.from_hf_state_dict(config, state, tokens_for(False))
    assert info.value.missing_keys == ["layers.0.self_attn.v_proj.bias"]
    short = dict(model.state_dict())
    short["model.decoder.embed_positions.weight"] = short["model.decoder.embed_positions.weight"][2:]
    with pytest.raises(ModelError, match=r"has shape \[40, 39\], expected \[42, 39\]") as info:  # both shapes
        cm.from_hf_state_dict(config, short, tokens_for(False))
    assert info.value.mismatched_keys == ["embed_positions.weight"]


def test_a_state_dict_without_the_model_prefix():
    """A bare ``OPTModel``'s keys (``decoder.layers.0...``, as some hub checkpoints have them) read alike."""
    model = opt()
    tokens = tokens_for(True)
    state = {k.removeprefix("model."): v for k, v in model.state_dict().items()}
    assert "decoder.embed_tokens.weight" in state
    assert cm.from_hf_state_dict(model.config, state, tokens) == cm.from_hf(model, tokens)
