"""Hugging Face GPT-2 (``GPT2LMHeadModel``): its config and state dict in the builder's terms."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError
from circuits.models.gpt2 import GPT2Config
from circuits.models.reading import (
    Reader,
    int_field,
    number_field,
    optional_int,
    stored_unembedding,
    strip_prefix,
    typed_field,
)


def gpt2_config_from_hf(config: Any) -> GPT2Config:
    """Our ``GPT2Config`` from a Hugging Face one (object or ``config.json`` dict), each field checked."""
    family = "GPT-2"
    problems = []
    if not typed_field(family, config, "scale_attn_weights", True, bool):
        problems.append("scale_attn_weights=False")
    for option in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if typed_field(family, config, option, False, bool):
            problems.append(f"{option}=True")
    if problems:
        raise ModelError(f"GPT-2 config options not supported: {', '.join(problems)}")
    ours = GPT2Config(
        n_layers=int_field(family, config, "n_layer", low=0),
        n_heads=int_field(family, config, "n_head"),
        d_model=int_field(family, config, "n_embd"),
        vocab_size=int_field(family, config, "vocab_size"),
        n_ctx=int_field(family, config, "n_positions"),
        d_mlp=optional_int(family, config, "n_inner"),
        ln_eps=number_field(family, config, "layer_norm_epsilon", 1e-5),
        act=typed_field(family, config, "activation_function", "gelu_new", str),
        tie_word_embeddings=typed_field(family, config, "tie_word_embeddings", True, bool),
    )
    if ours.d_model % ours.n_heads:
        raise ModelError(f"GPT-2 config: 'n_embd' {ours.d_model} is not divisible by 'n_head' {ours.n_heads}")
    return ours


def gpt2_weights_from_hf(
    config: GPT2Config, state_dict: Mapping[str, Any], attach: bool = False
) -> dict[str, torch.Tensor]:
    """Hugging Face GPT-2 (Conv1D ``[in, out]`` weights, fused ``c_attn``) -> the builder's names and layouts.

    Every conversion is a view (reshape of a contiguous tensor, permute,
    transpose), so that no weight is copied.
    """
    lm_head = state_dict.get("lm_head.weight")
    state = strip_prefix({k: v for k, v in state_dict.items() if k != "lm_head.weight"}, "transformer.")
    if lm_head is not None:
        state["lm_head.weight"] = lm_head
    d, h, c, v, m = config.d_model, config.n_heads, config.d_head, config.vocab_size, config.mlp_size
    r = Reader("GPT-2", state, attach)
    out: dict[str, Any] = {
        names.TOK_EMBEDS_WEIGHT: r.take("wte.weight", (v, d)),
        names.POS_EMBEDS_WEIGHT: r.take("wpe.weight", (config.n_ctx, d)),
    }
    for layer in range(config.n_layers):
        p = f"h.{layer}."
        a, m_ = names.attn_prefix(layer), names.mlp_prefix(layer)
        out[names.norm_weight(a, "scale")] = r.take(p + "ln_1.weight", (d,))
        out[names.norm_weight(a, "bias")] = r.take(p + "ln_1.bias", (d,))
        qkv = r.take(p + "attn.c_attn.weight", (d, 3 * d))
        qkv_bias = r.take(p + "attn.c_attn.bias", (3 * d,))
        if qkv is not None:
            # output column (which * d + head * c + j) -> [which][head, j, input]
            split = qkv.reshape(d, 3, h, c).permute(1, 2, 3, 0)
            for i, which in enumerate("qkv"):
                out[names.attn_weight(layer, which)] = split[i]
        if qkv_bias is not None:
            split_bias = qkv_bias.reshape(3, h, 1, c)
            for i, which in enumerate("qkv"):
                out[names.attn_weight(layer, f"{which}_bias")] = split_bias[i]
        proj = r.take(p + "attn.c_proj.weight", (d, d))
        if proj is not None:  # [head * c + j, out] -> [head, out, j]
            out[names.attn_weight(layer, "o")] = proj.reshape(h, c, d).permute(0, 2, 1)
        out[names.attn_weight(layer, "o_bias")] = r.take(p + "attn.c_proj.bias", (d,))
        out[names.norm_weight(m_, "scale")] = r.take(p + "ln_2.weight", (d,))
        out[names.norm_weight(m_, "bias")] = r.take(p + "ln_2.bias", (d,))
        fc = r.take(p + "mlp.c_fc.weight", (d, m))
        out[names.mlp_weight(layer, "proj_in")] = None if fc is None else fc.T
        out[names.mlp_weight(layer, "in_bias")] = r.take(p + "mlp.c_fc.bias", (m,))
        fc_out = r.take(p + "mlp.c_proj.weight", (m, d))
        out[names.mlp_weight(layer, "proj_out")] = None if fc_out is None else fc_out.T
        out[names.mlp_weight(layer, "out_bias")] = r.take(p + "mlp.c_proj.bias", (d,))
    out[names.norm_weight(names.FINAL, "scale")] = r.take("ln_f.weight", (d,))
    out[names.norm_weight(names.FINAL, "bias")] = r.take("ln_f.bias", (d,))
    out[names.UNEMBED_WEIGHT] = stored_unembedding(
        r, "lm_head.weight", (v, d), out[names.TOK_EMBEDS_WEIGHT], config.tie_word_embeddings
    )
    # attention-mask buffers that older transformers versions saved
    r.finish(ignore=lambda k: bool(re.fullmatch(r"h\.\d+\.attn\.(bias|masked_bias)", k)))
    return r.weights(out)
