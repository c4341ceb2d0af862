"""OPT (a GPT-2 circuit with its positions offset by 2) against Hugging Face's ``OPTForCausalLM``.

Random-weight models from small odd-dimension configs (nothing is
downloaded), with large weights and perturbed biases and layer norms so that
every weight moves the logits.
"""

from __future__ import annotations

import functools

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


def opt(tied: bool = True, seed: int = 0, **extra):
    torch.manual_seed(seed)
    extra = {"word_embed_proj_dim": 39, **extra}
    config = transformers.OPTConfig(
        num_hidden_layers=2,
        num_attention_heads=3,
        hidden_size=39,
        ffn_dim=53,
        vocab_size=VOCAB,
        max_position_embeddings=40,
        init_std=0.2,
        tie_word_embeddings=tied,
        pad_token_id=1,
        **extra,
    )
    model = transformers.OPTForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
            if name.endswith("embed_positions.weight"):
                param.normal_(0, 0.5)  # positions differ enough that an offset shows
    return model


MEASURED: dict[str, float] = {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_equals_hugging_face_forward(tied, batched, dtype):
    model = opt(tied).to(dtype)
    tokens = tokens_for(batched)
    circuit = cm.from_hf(model, tokens)
    MEASURED[f"{tied}-{batched}-{dtype}"] = check_logits_and_loss(model, circuit, tokens, TOL[dtype])
    assert logits_of(circuit).dtype == dtype


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


@pytest.mark.parametrize("tied", [True, False])
def test_save_pretrained_round_trip(tied, tmp_path):
    model = opt(tied)
    tokens = tokens_for(True, seed=4)
    model.save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    loaded = cm.load_hf_checkpoint(tmp_path, tokens)
    assert loaded == cm.from_hf(model, tokens)  # same structure, names and weights (array hashes)
    assert (logits_of(loaded) - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-5


def test_split_heads_and_points_and_a_zeroed_head():
    """Head splitting keeps the value; zero-ablating head 1.2 equals the model with that head's
    slice of ``out_proj``'s input zeroed; every activation point finds its node."""
    model = opt().to(torch.float64)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    torch.testing.assert_close(cc.causal_mask(circuit).evaluate(), circuit.evaluate(), rtol=1e-12, atol=1e-12)
    check_heads_and_points(
        model,
        circuit,
        tokens,
        model.model.decoder.layers[1].self_attn.out_proj,
        head=2,
        d_head=model.config.hidden_size // model.config.num_attention_heads,
        kinds=("q", "k", "v", "attn_probs", "z", "mlp_post", "resid_mid"),
    )


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
