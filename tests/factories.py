"""The small models the tests build, in one place: Hugging Face models of each family (random
weights, nothing downloaded), TransformerLens 4's natively booted model, and our builders' circuits
with random weights.

Each factory's defaults are the model its family's tests use; a test that needs another size, seed
or perturbation passes it (``gpt2(n_layer=1, n_embd=8, perturb=None)``), so its numbers stay its
own.  ``seed=None`` leaves torch's global generator as the test left it (for the tests whose
model was always drawn from it).  A ``perturb`` moves the weights after the init (in ``no_grad``):
zero biases and unit norm scales would hide a mis-wired one.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import circuits as cc
import circuits.models as cm

Perturbation = Callable[[torch.nn.Module], None]

FAMILY_VOCAB = 97  #: the vocabulary of the Hugging Face family tests' models
GEMMA2_WINDOW = 4  #: Gemma 2's sliding window, shorter than the tests' sequences
MISTRAL_WINDOW = 4  #: Mistral's sliding window, shorter than the tests' sequences


def token_ids(vocab: int, shape: tuple[int, ...], seed: int | None = None) -> torch.Tensor:
    """Token ids below ``vocab`` of ``shape``, from a generator seeded with ``seed`` (torch's global
    generator when None)."""
    generator = None if seed is None else torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=generator)


# ------------------------------------------------------------------ perturbations


def shifted(std: float, where: Callable[[str], bool] | None = None, seed: int | None = None) -> Perturbation:
    """Adds normal noise of ``std`` to each parameter whose name ``where`` accepts (every one when
    None), drawn from torch's global generator or, given ``seed``, from a generator of its own."""

    @torch.no_grad()
    def perturb(model: torch.nn.Module) -> None:
        generator = None if seed is None else torch.Generator().manual_seed(seed)
        for name, param in model.named_parameters():
            if where is None or where(name):
                param.add_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * std)

    return perturb


def sorted_shifted(std: float, seed: int) -> Perturbation:
    """Adds normal noise of ``std`` to every parameter, drawn from a generator seeded with ``seed`` in
    the order of the parameters' sorted names (the draw does not depend on how a model registers them)."""

    @torch.no_grad()
    def perturb(model: torch.nn.Module) -> None:
        generator = torch.Generator().manual_seed(seed)
        for _, param in sorted(model.named_parameters()):
            param.add_(std * torch.randn(param.shape, generator=generator, dtype=param.dtype))

    return perturb


def _is_norm(name: str) -> bool:
    return "norm" in name


def _is_bias_or_norm(name: str) -> bool:
    return name.endswith("bias") or "norm" in name


#: the norms' weights moved, so that Gemma's ``(1 + w)`` scale (or a plain RMSNorm's) matters
norms_shifted = shifted(0.3, where=_is_norm)
#: the norms' weights and every bias moved
biases_and_norms_shifted = shifted(0.3, where=_is_bias_or_norm)


@torch.no_grad()
def scaled_weights(model: torch.nn.Module) -> None:
    """Norm weights and biases away from 1 and 0, and larger weights, so that wiring mistakes show."""
    for name, param in model.named_parameters():
        if "ln" in name or "norm" in name:
            param.add_(torch.randn_like(param) * 0.2)
        elif name.endswith("bias"):
            param.normal_(0, 0.1)
        else:
            param.mul_(4.0)


@torch.no_grad()
def opt_shifted(model: torch.nn.Module) -> None:
    """Biases and norms moved, and OPT's position table redrawn: rows that differ enough that an
    offset shows."""
    for name, param in model.named_parameters():
        if _is_bias_or_norm(name):
            param.add_(torch.randn_like(param) * 0.3)
        if name.endswith("embed_positions.weight"):
            param.normal_(0, 0.5)


# ------------------------------------------------------------------ Hugging Face models


def hf_causal_lm(
    model_class: str,
    config_class: str,
    fields: dict,
    *,
    seed: int | None = 0,
    perturb: Perturbation | None = None,
    dtype: torch.dtype | None = None,
):
    """``transformers.<model_class>(<config_class>(**fields))`` in eval mode: random weights drawn
    after ``torch.manual_seed(seed)``, then ``perturb``-ed, then cast to ``dtype``."""
    transformers = pytest.importorskip("transformers")
    if seed is not None:
        torch.manual_seed(seed)
    config = getattr(transformers, config_class)(**fields)
    model = getattr(transformers, model_class)(config).eval()
    if perturb is not None:
        perturb(model)
    return model if dtype is None else model.to(dtype)


def gpt2(
    tied: bool = True,
    *,
    seed: int | None = 0,
    perturb: Perturbation | None = None,
    dtype: torch.dtype | None = None,
    **fields,
):
    """A ``GPT2LMHeadModel``: 2 layers of 4 heads, width 32 (``fields`` override the config)."""
    config = dict(
        n_layer=2, n_head=4, n_embd=32, vocab_size=FAMILY_VOCAB, n_positions=40, tie_word_embeddings=tied
    )
    return hf_causal_lm(
        "GPT2LMHeadModel", "GPT2Config", dict(config, **fields), seed=seed, perturb=perturb, dtype=dtype
    )


def llama(
    kv_heads: int = 2,
    *,
    tied: bool = False,
    seed: int | None = 0,
    perturb: Perturbation | None = None,
    dtype: torch.dtype | None = None,
    **fields,
):
    """A ``LlamaForCausalLM``: 2 layers of 4 query heads sharing ``kv_heads`` key/value heads,
    width 32 (``fields`` override the config)."""
    config = dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=32,
        intermediate_size=48,
        vocab_size=FAMILY_VOCAB,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    return hf_causal_lm(
        "LlamaForCausalLM", "LlamaConfig", dict(config, **fields), seed=seed, perturb=perturb, dtype=dtype
    )


#: the special tokens of the GPT-2 and Llama of the family tests: ids inside their vocabulary
_SPECIAL_TOKENS_0 = dict(bos_token_id=0, eos_token_id=0)


def perturbed_gpt2(tied: bool, seed: int = 0):
    """The GPT-2 of the Hugging Face family tests: ``gpt2`` with ``scaled_weights``."""
    return gpt2(tied, seed=seed, perturb=scaled_weights, **_SPECIAL_TOKENS_0)


def perturbed_llama(kv_heads: int, seed: int = 0, tied: bool = False):
    """The Llama of the Hugging Face family tests: ``llama`` with ``scaled_weights``."""
    return llama(
        kv_heads,
        tied=tied,
        seed=seed,
        perturb=scaled_weights,
        rms_norm_eps=1e-5,
        pad_token_id=0,
        **_SPECIAL_TOKENS_0,
    )


def gemma(kv_heads: int = 2, tied: bool = True, seed: int = 0):
    """A ``GemmaForCausalLM`` of odd width 37 with ``head_dim`` 10 (not 37 / 4), norms shifted."""
    config = dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=37,
        head_dim=10,
        intermediate_size=51,
        vocab_size=FAMILY_VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        tie_word_embeddings=tied,
    )
    return hf_causal_lm("GemmaForCausalLM", "GemmaConfig", config, seed=seed, perturb=norms_shifted)


def gemma2(kv_heads: int = 2, tied: bool = True, seed: int = 0, **overrides):
    """A ``Gemma2ForCausalLM`` with every Gemma 2 change on: sandwich norms (shifted), soft-caps
    small enough to bend the values, and alternating windowed/full layers (3 of them)."""
    config = dict(
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=36,
        head_dim=10,
        query_pre_attn_scalar=10,
        intermediate_size=51,
        vocab_size=FAMILY_VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        sliding_window=GEMMA2_WINDOW,
        attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0,
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    return hf_causal_lm(
        "Gemma2ForCausalLM", "Gemma2Config", dict(config, **overrides), seed=seed, perturb=norms_shifted
    )


def mistral(kv_heads: int = 2, window: int | None = MISTRAL_WINDOW, tied: bool = False, seed: int = 0):
    """A ``MistralForCausalLM`` whose sliding window is shorter than the tests' sequences, norms shifted."""
    config = dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=40,
        intermediate_size=51,
        vocab_size=FAMILY_VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        initializer_range=0.2,
        sliding_window=window,
        tie_word_embeddings=tied,
    )
    return hf_causal_lm("MistralForCausalLM", "MistralConfig", config, seed=seed, perturb=norms_shifted)


def qwen2(kv_heads: int = 2, tied: bool = False, seed: int = 0, **extra):
    """A ``Qwen2ForCausalLM`` (query/key/value biases), biases and norms shifted."""
    config = dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        hidden_size=40,
        intermediate_size=51,
        vocab_size=FAMILY_VOCAB,
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        rope_theta=1000.0,
        initializer_range=0.2,
        tie_word_embeddings=tied,
    )
    return hf_causal_lm(
        "Qwen2ForCausalLM", "Qwen2Config", dict(config, **extra), seed=seed, perturb=biases_and_norms_shifted
    )


def neox(parallel: bool = True, rotary_pct: float = 0.5, tied: bool = False, seed: int = 0, **extra):
    """A ``GPTNeoXForCausalLM`` (Pythia) with partial rotary (half of a head of 12 by default),
    biases and layer norms shifted."""
    config = dict(
        num_hidden_layers=2,
        num_attention_heads=4,
        hidden_size=48,
        intermediate_size=51,
        vocab_size=FAMILY_VOCAB,
        max_position_embeddings=64,
        rotary_pct=rotary_pct,
        rotary_emb_base=1000,
        initializer_range=0.2,
        use_parallel_residual=parallel,
        tie_word_embeddings=tied,
    )
    return hf_causal_lm(
        "GPTNeoXForCausalLM",
        "GPTNeoXConfig",
        dict(config, **extra),
        seed=seed,
        perturb=biases_and_norms_shifted,
    )


def opt(tied: bool = True, seed: int = 0, **extra):
    """An ``OPTForCausalLM`` of odd width 39 (3 heads), biases and norms shifted, positions redrawn."""
    config = dict(
        num_hidden_layers=2,
        num_attention_heads=3,
        hidden_size=39,
        ffn_dim=53,
        vocab_size=FAMILY_VOCAB,
        max_position_embeddings=40,
        init_std=0.2,
        tie_word_embeddings=tied,
        pad_token_id=1,
        word_embed_proj_dim=39,
    )
    return hf_causal_lm("OPTForCausalLM", "OPTConfig", dict(config, **extra), seed=seed, perturb=opt_shifted)


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


# ------------------------------------------------------------------ TransformerLens


def tl_model(
    family: str = "gpt2",
    masked: bool = True,
    seed: int = 0,
    n_layers: int = 2,
    *,
    compat: bool = False,
    dtype: torch.dtype = torch.float32,
    **fields,
):
    """TransformerLens 4's natively booted model (``boot_native``, a ``TransformerBridge``) in GPT-2's
    layout at odd dimensions (d_model 12, 3 heads of 4, d_mlp 20, vocab 17), every weight then moved
    by ``sorted_shifted(0.3, seed)`` (biases and norms too), so wiring mistakes show; ``masked``: its
    ``attention_dir`` causal or bidirectional; ``compat``: compatibility mode (HookedTransformer's
    weight processing); ``fields`` override the ``TransformerBridgeConfig``.  Its attention has no
    ``use_attn_result``: per-head results come from ``ActivationCache.compute_head_results``.

    Only ``family="gpt2"``: TransformerLens 3's attention-only model with shortformer positions has no
    TransformerLens 4 equivalent (its tests check the attention-only model against torch instead)."""
    if family != "gpt2":
        raise ValueError(f"TransformerLens 4 has no {family!r} model (shortformer positions)")
    sources = pytest.importorskip("transformer_lens.model_bridge.sources")  # here: it takes seconds
    from transformer_lens import TransformerBridgeConfig

    options = dict(
        n_layers=n_layers,
        d_model=12,
        n_heads=3,
        d_head=4,
        d_mlp=20,
        d_vocab=17,
        n_ctx=16,
        act_fn="gelu_new",
        normalization_type="LN",
        attention_dir="causal" if masked else "bidirectional",
        seed=seed,
        dtype=dtype,
        device="cpu",
    )
    model = sources.boot_native(TransformerBridgeConfig(**dict(options, **fields)), dtype=dtype)
    sorted_shifted(0.3, seed)(model.original_model)
    if compat:
        model.enable_compatibility_mode(disable_warnings=True)
    return model.eval()


# ------------------------------------------------------------------ our builders, random weights


def gpt2_config(**fields) -> cm.GPT2Config:
    """A ``GPT2Config`` of odd dimensions: 2 layers of 3 heads, width 12, vocabulary 17, context 16."""
    return cm.GPT2Config(**dict(dict(n_layers=2, n_heads=3, d_model=12, vocab_size=17, n_ctx=16), **fields))


def gpt2_circuit(
    tokens, config: cm.GPT2Config | None = None, *, seed: int = 0, **build_options
) -> cc.Circuit:
    """``build_gpt2`` of ``config`` (``gpt2_config()`` by default) with random weights from ``seed``."""
    config = gpt2_config() if config is None else config
    return cm.build_gpt2(config, cm.gpt2_random_weights(config, seed=seed), tokens, **build_options)


def llama_config(**fields) -> cm.LlamaConfig:
    """A ``LlamaConfig``: 2 layers of 4 query heads on 2 key/value heads of 4 dims, width 12."""
    small = dict(n_layers=2, n_heads=4, n_kv_heads=2, d_model=12, d_mlp=10, vocab_size=13, d_head=4)
    return cm.LlamaConfig(**dict(small, **fields))


def llama_circuit(
    tokens, config: cm.LlamaConfig | None = None, *, seed: int = 0, **build_options
) -> cc.Circuit:
    """``build_llama`` of ``config`` (``llama_config()`` by default) with random weights from ``seed``."""
    config = llama_config() if config is None else config
    return cm.build_llama(config, cm.llama_random_weights(config, seed=seed), tokens, **build_options)
