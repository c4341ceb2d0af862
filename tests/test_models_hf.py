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

import json

import pytest
import torch
import torch.nn.functional as F

import circuits as cc
import circuits.models as cm

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = {torch.float32: 1e-4, torch.float64: 1e-9}
VOCAB = 97


def gpt2(tied: bool, seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=VOCAB,
        n_positions=40,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config).eval()
    _perturb(model)
    return model


def llama(kv_heads: int, seed: int = 0, tied: bool = False):
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=32,
        intermediate_size=48,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    _perturb(model)
    return model


def _perturb(model):
    """Norm weights and biases away from 1 and 0, and larger weights, so that wiring mistakes show."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "ln" in name or "norm" in name:
                param.add_(torch.randn_like(param) * 0.2)
            elif name.endswith("bias"):
                param.normal_(0, 0.1)
            else:
                param.mul_(4.0)


MODELS = {
    "gpt2-tied": lambda: gpt2(True),
    "gpt2-untied": lambda: gpt2(False),
    "llama-mha": lambda: llama(4),
    "llama-gqa": lambda: llama(2),
}


def tokens_for(batched: bool, length: int = 13, seed: int = 1):
    shape = (3, length) if batched else (length,)
    return torch.randint(0, VOCAB, shape, generator=torch.Generator().manual_seed(seed))


def hf_logits(model, inputs):
    with torch.no_grad():
        out = model(input_ids=inputs if inputs.ndim == 2 else inputs[None])
    return out.logits if inputs.ndim == 2 else out.logits[0]


def circuit_logits_and_loss(circuit):
    return cc.evaluate_many([circuit.get_unique("t.call"), circuit])


def _no_rmsnorm_round_trip(monkeypatch):
    from transformers.models.llama import modeling_llama

    def forward(self, hidden_states):
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))

    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", forward)


MEASURED: dict[str, tuple[float, float, float]] = {}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("batched", [False, True], ids=["unbatched", "batched"])
@pytest.mark.parametrize("which", list(MODELS))
def test_equals_hugging_face_forward(which, batched, dtype, monkeypatch):
    if which.startswith("llama") and dtype == torch.float64:
        _no_rmsnorm_round_trip(monkeypatch)
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
    _perturb(model)
    tokens = tokens_for(True)
    circuit = cm.from_hf(model, tokens)
    logits, _ = circuit_logits_and_loss(circuit)
    assert (logits - hf_logits(model, tokens[..., :-1])).abs().max().item() < 1e-4
    model.save_pretrained(tmp_path)
    loaded, _ = circuit_logits_and_loss(cm.load_hf_checkpoint(tmp_path, tokens))
    assert (loaded - logits).abs().max().item() < 1e-6


# -------------------------------------------------------- TransformerLens


def transformer_lens_state(model, detach: bool = True) -> dict:
    """A Hugging Face GPT-2's weights in TransformerLens's HookedTransformer layout
    (as TransformerLens's own convert_gpt2_weights writes them, unprocessed);
    ``detach=False`` keeps them differentiable views of the parameters."""
    cfg = model.config
    d, h = cfg.n_embd, cfg.n_head
    c = d // h
    t = model.transformer
    state = {"embed.W_E": t.wte.weight, "pos_embed.W_pos": t.wpe.weight}
    for layer, block in enumerate(t.h):
        p = f"blocks.{layer}."
        state[p + "ln1.w"], state[p + "ln1.b"] = block.ln_1.weight, block.ln_1.bias
        for i, which in enumerate("QKV"):
            flat = block.attn.c_attn.weight[:, i * d : (i + 1) * d]  # [d, (head c)]
            state[p + f"attn.W_{which}"] = flat.reshape(d, h, c).permute(1, 0, 2)  # [head, d, c]
            state[p + f"attn.b_{which}"] = block.attn.c_attn.bias[i * d : (i + 1) * d].reshape(h, c)
        state[p + "attn.W_O"] = block.attn.c_proj.weight.reshape(h, c, d)
        state[p + "attn.b_O"] = block.attn.c_proj.bias
        state[p + "ln2.w"], state[p + "ln2.b"] = block.ln_2.weight, block.ln_2.bias
        state[p + "mlp.W_in"], state[p + "mlp.b_in"] = block.mlp.c_fc.weight, block.mlp.c_fc.bias
        state[p + "mlp.W_out"], state[p + "mlp.b_out"] = block.mlp.c_proj.weight, block.mlp.c_proj.bias
        state[p + "attn.mask"] = torch.ones(cfg.n_positions, cfg.n_positions, dtype=torch.bool).tril()
        state[p + "attn.IGNORE"] = torch.tensor(-1e5)
    state["ln_final.w"], state["ln_final.b"] = t.ln_f.weight, t.ln_f.bias
    state["unembed.W_U"] = model.lm_head.weight.T
    state["unembed.b_U"] = torch.zeros(cfg.vocab_size)
    return {k: v.detach() for k, v in state.items()} if detach else state


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
