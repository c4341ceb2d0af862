"""GPT-2 and Llama circuits against the Hugging Face models' own forward.

Random-weight models from small configs (nothing is downloaded).  Logits
``'t.call'`` must agree within 1e-4 (float32) / 1e-9 (float64) max abs diff,
and the mean of the per-token loss ``'t.loss'`` must equal the mean
cross-entropy of Hugging Face's logits.  Two Hugging Face details matter in
float64: its loss function upcasts logits to float32 (so ``labels=`` loss is
float32-accurate only), and ``LlamaRMSNorm`` rounds activations through
float32 (so the float64 Llama reference runs with that round trip removed;
``test_llama_float64_rmsnorm_round_trip`` measures what it costs).
"""

from __future__ import annotations

import functools
import json

import pytest
import torch
import torch.nn.functional as F

import circuits as cc
import circuits.models as cm
from factories import FAMILY_VOCAB as VOCAB
from factories import perturbed_gpt2 as gpt2
from factories import perturbed_llama as llama
from factories import scaled_weights, transformer_lens_state
from hf_reference import hf_logits, random_tokens, without_float32_round_trips

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = {torch.float32: 1e-4, torch.float64: 1e-9}
tokens_for = functools.partial(random_tokens, VOCAB)
MODELS = {
    "gpt2-tied": lambda: gpt2(True),
    "gpt2-untied": lambda: gpt2(False),
    "llama-mha": lambda: llama(4),
    "llama-gqa": lambda: llama(2),
}


def circuit_logits_and_loss(circuit):
    return cc.evaluate_many([circuit.get_unique("t.call"), circuit])


MEASURED: dict[str, tuple[float, float, float]] = {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("which", list(MODELS))
def test_equals_hugging_face_forward(which, batched, dtype, monkeypatch):
    if which.startswith("llama") and dtype == torch.float64:
        without_float32_round_trips(monkeypatch, "llama")
    model = MODELS[which]().to(dtype)
    tokens = tokens_for(batched)
    circuit = cm.from_hf(model, tokens)
    logits, loss = circuit_logits_and_loss(circuit)
    want = hf_logits(model, tokens[..., :-1])
    assert logits.dtype == want.dtype == dtype
    assert logits.shape == want.shape == tokens[..., :-1].shape + (VOCAB,)
    logit_diff = (logits - want).abs().max().item()
    assert logit_diff < TOL[dtype]

    targets = tokens[..., 1:]
    want_loss = F.cross_entropy(want.reshape(-1, VOCAB), targets.reshape(-1), reduction="none").reshape(
        targets.shape
    )
    assert loss.shape == targets.shape
    loss_diff = (loss - want_loss).abs().max().item()
    mean_diff = abs(loss.mean().item() - want_loss.mean().item())
    assert loss_diff < TOL[dtype] and mean_diff < TOL[dtype]
    # Hugging Face's own loss (labels=...): computed from float32-upcast logits
    with torch.no_grad():
        full = tokens if batched else tokens[None]
        hf_loss = model(input_ids=full, labels=full).loss.item()
    assert abs(loss.mean().item() - hf_loss) < 1e-5
    MEASURED[f"{which}-{'batched' if batched else 'unbatched'}-{dtype}"] = (
        logit_diff,
        mean_diff,
        abs(loss.mean().item() - hf_loss),
    )


def test_llama_float64_rmsnorm_round_trip():
    """Unpatched, HF's float64 Llama rounds through float32 in RMSNorm: agreement is float32-sized."""
    model = llama(2).to(torch.float64)
    tokens = tokens_for(True)
    logits, _ = circuit_logits_and_loss(cm.from_hf(model, tokens))
    diff = (logits - hf_logits(model, tokens[..., :-1])).abs().max().item()
    assert 1e-12 < diff < 1e-5


@pytest.mark.parametrize("which", list(MODELS))
def test_save_pretrained_round_trip(which, tmp_path):
    model = MODELS[which]()
    tokens = tokens_for(True, seed=4)
    model.save_pretrained(tmp_path)
    loaded = cm.load_hf_checkpoint(tmp_path, tokens)
    assert loaded == cm.from_hf(model, tokens)  # same structure, names and weights (array hashes)
    logits, loss = circuit_logits_and_loss(loaded)
    want = hf_logits(model, tokens[..., :-1])
    assert (logits - want).abs().max().item() < 1e-4
    want_loss = F.cross_entropy(want.reshape(-1, VOCAB), tokens[..., 1:].reshape(-1))
    assert abs(loss.mean().item() - want_loss.item()) < 1e-5
    # and the reloaded Hugging Face model agrees with the same circuit
    again = type(model).from_pretrained(tmp_path).eval()
    assert (hf_logits(again, tokens[..., :-1]) - logits).abs().max().item() < 1e-4


def test_sharded_checkpoint(tmp_path):
    model = llama(2)
    model.save_pretrained(tmp_path, max_shard_size="40KB")
    assert (tmp_path / "model.safetensors.index.json").exists()
    tokens = tokens_for(False)
    assert cm.load_hf_checkpoint(tmp_path, tokens) == cm.from_hf(model, tokens)


def test_tied_llama(tmp_path):
    model = llama(4, tied=True)
    tokens = tokens_for(False)
    circuit = cm.from_hf(model, tokens)
    logits, _ = circuit_logits_and_loss(circuit)
    assert (logits - hf_logits(model, tokens[:-1])).abs().max().item() < 1e-4
    model.save_pretrained(tmp_path)
    assert cm.load_hf_checkpoint(tmp_path, tokens) == circuit


def test_golden_convention_and_placeholder():
    model = gpt2(False)
    tokens = tokens_for(False, length=14)
    circuit = cm.from_hf(model, tokens, convention="golden")
    text = circuit.repr()
    assert "'input_toks_int' [12] Index [:-2]" in text and "'true_toks_int' [12] Index [1:-1]" in text
    logits, loss = circuit_logits_and_loss(circuit)
    want = hf_logits(model, tokens[:-2])
    assert (logits - want).abs().max().item() < 1e-4
    torch.testing.assert_close(loss, F.cross_entropy(want, tokens[1:-1], reduction="none"), rtol=0, atol=1e-4)
    placeholder = cm.from_hf(model, seq_len=5, batch_size=2)
    assert placeholder.shape == (2, 5) and placeholder.get_unique("toks_int_var").shape == (2, 6)


def test_causal_form_matches_the_golden_masking():
    for model in (gpt2(True), llama(2)):
        text = cm.from_hf(model, tokens_for(False)).repr()
        for line in (
            "'a.attn_scores' Add",
            "'a.attn_scores_raw' Einsum hqc,hkc,h,qk->hqk",
            "'t.a.c.causal_mask' [12,12] Array",
            "'a.score_neg_inf_bias' Einsum qk,->qk",
            "'not_mask.neg_mask' Einsum ab,->ab",
            "'a.neg_inf' [] Scalar -10000",
            "'b1.a' Einsum hsV,hdV->sd",
            "'t.call' Einsum sh,vh->sv",
            "'t.loss' Einsum a,->a",
        ):
            assert line in text, (type(model).__name__, line)
        assert cc.parse(text) == cm.from_hf(model, tokens_for(False))
    # without the mask, the model attends to later tokens and the logits change
    model = gpt2(True)
    unmasked, _ = circuit_logits_and_loss(cm.from_hf(model, tokens_for(False), causal=False))
    assert (unmasked - hf_logits(model, tokens_for(False)[:-1])).abs().max().item() > 1e-3


def test_llama_gqa_layout():
    text = cm.from_hf(llama(2), tokens_for(True)).repr()
    assert "'a.k' [3,4,12,8] Index [:,[0,0,1,1],:,:]" in text
    assert "'a0.w.k' [2,8,32] Array" in text and "'a0.w.q' [4,8,32] Array" in text
    assert "'a.q_rot_half' Concat 3" in text
    assert "'t.a.c.rope_cos' [12,8] Array" in text


# ------------------------------------------------------------------ errors


def test_unknown_architecture(tmp_path):
    bloom = transformers.BloomForCausalLM(
        transformers.BloomConfig(vocab_size=50, hidden_size=16, n_layer=1, n_head=2)
    )
    with pytest.raises(cm.ModelError, match=r"unsupported architecture: model_type 'bloom'.*'gpt2'.*'llama'"):
        cm.from_hf(bloom, tokens_for(False))
    with pytest.raises(cm.ModelError, match="expected GPT2LMHeadModel"):
        cm.from_hf(gpt2(True).transformer, tokens_for(False))
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]})
    )
    with pytest.raises(cm.ModelError, match=r"'t5' \(T5ForConditionalGeneration\)"):
        cm.load_hf_checkpoint(tmp_path, tokens_for(False))
    with pytest.raises(cm.ModelError, match="no config.json"):
        cm.load_hf_checkpoint(tmp_path / "nowhere")


def test_missing_and_misshapen_weights():
    model = llama(2)
    state = dict(model.state_dict())
    del state["model.layers.1.mlp.up_proj.weight"]
    state["model.layers.0.self_attn.k_proj.weight"] = torch.zeros(32, 32)
    state["model.layers.0.self_attn.extra.weight"] = torch.zeros(1)
    with pytest.raises(cm.ModelError) as info:
        cm.from_hf_state_dict(model.config, state, tokens_for(False))
    message = str(info.value)
    assert "'model.layers.1.mlp.up_proj.weight' [48, 32]" in message
    assert "'model.layers.0.self_attn.k_proj.weight' has shape [32, 32], expected [16, 32]" in message
    assert "'model.layers.0.self_attn.extra.weight'" in message


def test_checkpoint_missing_weight(tmp_path):
    from safetensors.torch import load_file, save_file

    model = gpt2(False)
    model.save_pretrained(tmp_path)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["transformer.h.0.attn.c_attn.weight"]
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    # the message gives the shape expected
    with pytest.raises(cc.errors.ModelError, match=r"'h.0.attn.c_attn.weight' \[32, 96\]") as info:
        cm.load_hf_checkpoint(tmp_path, tokens_for(False))
    assert info.value.missing_keys == ["h.0.attn.c_attn.weight"]
    assert info.value.unexpected_keys == info.value.mismatched_keys == []
    state["transformer.h.0.attn.c_proj.weight"] = torch.zeros(3)
    state["transformer.h.0.extra"] = torch.zeros(1)
    save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(cc.errors.ModelError) as info:  # every problem at once
        cm.load_hf_checkpoint(tmp_path, tokens_for(False))
    assert info.value.missing_keys == ["h.0.attn.c_attn.weight"]
    assert info.value.mismatched_keys == ["h.0.attn.c_proj.weight"]
    assert info.value.unexpected_keys == ["h.0.extra"]
    for path in tmp_path.glob("*.safetensors"):
        path.unlink()
    with pytest.raises(cm.ModelError, match="has no weights"):
        cm.load_hf_checkpoint(tmp_path, tokens_for(False))


def test_unsupported_options():
    config = transformers.GPT2Config(
        n_layer=1, n_head=2, n_embd=8, vocab_size=VOCAB, n_positions=16, scale_attn_by_inverse_layer_idx=True
    )
    with pytest.raises(cm.ModelError, match="scale_attn_by_inverse_layer_idx"):
        cm.from_hf(transformers.GPT2LMHeadModel(config), tokens_for(False))
    config = transformers.LlamaConfig(
        num_hidden_layers=1,
        num_attention_heads=2,
        hidden_size=8,
        intermediate_size=8,
        vocab_size=VOCAB,
        attention_bias=True,
    )
    with pytest.raises(cm.ModelError, match="attention_bias"):
        cm.from_hf(transformers.LlamaForCausalLM(config), tokens_for(False))


def test_scaled_rope_variant_uses_the_models_own_tables(tmp_path):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        hidden_size=16,
        intermediate_size=24,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rope_parameters={"rope_type": "linear", "factor": 4.0, "rope_theta": 500.0},
    )
    model = transformers.LlamaForCausalLM(config).eval()
    scaled_weights(model)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    logits, _ = circuit_logits_and_loss(circuit)
    assert (logits - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-4
    model.save_pretrained(tmp_path)
    loaded, _ = circuit_logits_and_loss(cm.load_hf_checkpoint(tmp_path, tokens))
    assert (loaded - logits).abs().max().item() < 1e-6


# -------------------------------------------------------- TransformerLens


@pytest.mark.parametrize("tied", [True, False])
def test_transformer_lens_gpt2(tied):
    model = gpt2(tied)
    tokens = tokens_for(True)
    circuit = cm.from_transformer_lens(transformer_lens_state(model), tokens, family="gpt2")
    logits, _ = circuit_logits_and_loss(circuit)
    assert (logits - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-4
    state = {k: v for k, v in transformer_lens_state(model).items() if ".mlp." not in k}
    with pytest.raises(cc.errors.ModelError, match="family='attn_only'") as info:  # the hint
        cm.from_transformer_lens(state, tokens, family="gpt2")
    assert info.value.missing_keys == ["blocks.0.mlp.W_in"]


def test_report_measured_diffs():
    """Not a check: prints the largest logit diffs measured above (pytest -s to see them)."""
    for key, (logits, loss, hf_loss) in sorted(MEASURED.items()):
        print(
            f"{key}: max |logits - HF| = {logits:.3g}, |mean loss - CE(HF logits)| = {loss:.3g}, "
            f"|mean loss - HF labels= loss| = {hf_loss:.3g}"
        )


def test_transformers_v4_style_llama_config(tmp_path):
    """config.json written by transformers 4.x: top-level rope_theta and rope_scaling, no rope_parameters."""
    model = llama(2)
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    theta = config.pop("rope_parameters", {}).get("rope_theta", 10000.0)
    config.update(rope_theta=theta, rope_scaling=None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    tokens = tokens_for(False)
    assert cm.load_hf_checkpoint(tmp_path, tokens) == cm.from_hf(model, tokens)
