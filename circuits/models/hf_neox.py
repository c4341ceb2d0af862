"""Hugging Face GPT-NeoX (``GPTNeoXForCausalLM``, every Pythia): config and state dict in the builder's terms."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError, shown
from circuits.models.neox import NeoXConfig
from circuits.models.reading import (
    Reader,
    hf_rope_parameters,
    int_field,
    number_field,
    optional_int,
    rope_kind,
    stored_unembedding,
    typed_field,
)

FAMILY = "GPT-NeoX"

# Buffers older transformers versions saved with the weights: the causal mask and rotary frequencies.
_BUFFERS = re.compile(
    r"gpt_neox\.(layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)|rotary_emb\.inv_freq)"
)


def _rope(config: Any) -> tuple[float, float]:
    """``(rotary_pct, rope_theta)``, refusing a scaled rotary variant, which the builder lacks.

    transformers 5 keeps them in ``rope_parameters`` (``partial_rotary_factor``,
    ``rope_theta``), or reads ``rope_scaling`` in its place when that is set
    (``hf_rope_parameters``); 4.x and the Pythia hub configs spell them
    ``rotary_pct`` and ``rotary_emb_base``, which count where the parameters
    lack them.  Defaults as transformers'.
    """
    key, params = hf_rope_parameters(FAMILY, config)
    kind = rope_kind(FAMILY, params)
    if kind != "default":
        raise ModelError(
            f"{FAMILY} config: {key!r} asks for the rotary variant {shown(repr(kind))}; only 'default' "
            "is supported"
        )
    pct = number_field(FAMILY, config, "rotary_pct", 0.25)
    theta = number_field(FAMILY, config, "rotary_emb_base", 10000.0, positive=True)
    if "partial_rotary_factor" in params:
        pct = number_field(FAMILY, params, "partial_rotary_factor", pct)
    if "rope_theta" in params:
        theta = number_field(FAMILY, params, "rope_theta", theta, positive=True)
    return pct, theta


def neox_config_from_hf(config: Any) -> NeoXConfig:
    """Our ``NeoXConfig`` from a Hugging Face one (object or ``config.json`` dict), each field checked."""
    pct, theta = _rope(config)
    ours = NeoXConfig(
        n_layers=int_field(FAMILY, config, "num_hidden_layers", low=0),
        n_heads=int_field(FAMILY, config, "num_attention_heads"),
        d_model=int_field(FAMILY, config, "hidden_size"),
        d_mlp=int_field(FAMILY, config, "intermediate_size"),
        vocab_size=int_field(FAMILY, config, "vocab_size"),
        max_positions=optional_int(FAMILY, config, "max_position_embeddings"),
        ln_eps=number_field(FAMILY, config, "layer_norm_eps", 1e-5),
        rotary_pct=pct,
        rope_theta=theta,
        act=typed_field(FAMILY, config, "hidden_act", "gelu", str),
        parallel_residual=typed_field(FAMILY, config, "use_parallel_residual", True, bool),
        attention_bias=typed_field(FAMILY, config, "attention_bias", True, bool),
        tie_word_embeddings=typed_field(FAMILY, config, "tie_word_embeddings", False, bool),
    )
    if ours.d_model % ours.n_heads:
        raise ModelError(
            f"{FAMILY} config: 'hidden_size' {ours.d_model} is not divisible by "
            f"'num_attention_heads' {ours.n_heads}"
        )
    head_dim = optional_int(FAMILY, config, "head_dim")
    if head_dim not in (None, ours.d_head):  # transformers' attention ignores it, its rotary does not
        raise ModelError(
            f"{FAMILY} config: 'head_dim' {head_dim} is not 'hidden_size' / 'num_attention_heads' {ours.d_head}"
        )
    return ours


def neox_weights_from_hf(
    config: NeoXConfig, state_dict: Mapping[str, Any], attach: bool = False
) -> dict[str, torch.Tensor]:
    """Hugging Face GPT-NeoX (``nn.Linear`` ``[out, in]``, fused ``query_key_value``) -> the builder's
    names and layouts, every one a view (so that no weight is copied).

    The fused projection's outputs are laid out per head as ``[q, k, v]`` blocks of
    ``d_head`` (transformers views them ``[heads, 3 * d_head]`` and chunks), so its
    weight is ``[heads, 3, d_head, d_model]``.  The unembedding is ``lm_head``
    (transformers 5) or ``embed_out`` (4.x and the Pythia checkpoints).
    """
    d, h, c, v, m = config.d_model, config.n_heads, config.d_head, config.vocab_size, config.d_mlp
    r = Reader(FAMILY, state_dict, attach)
    out: dict[str, Any] = {names.TOK_EMBEDS_WEIGHT: r.take("gpt_neox.embed_in.weight", (v, d))}
    for layer in range(config.n_layers):
        p = f"gpt_neox.layers.{layer}."
        a, m_ = names.attn_prefix(layer), names.mlp_prefix(layer)
        out[names.norm_weight(a, "scale")] = r.take(p + "input_layernorm.weight", (d,))
        out[names.norm_weight(a, "bias")] = r.take(p + "input_layernorm.bias", (d,))
        qkv = r.take(p + "attention.query_key_value.weight", (3 * d, d))
        biased = config.attention_bias
        qkv_bias = r.take(p + "attention.query_key_value.bias", (3 * d,)) if biased else None
        for i, which in enumerate("qkv"):
            if qkv is not None:
                out[names.attn_weight(layer, which)] = qkv.reshape(h, 3, c, d)[:, i]
            if qkv_bias is not None:
                out[names.attn_weight(layer, f"{which}_bias")] = qkv_bias.reshape(h, 3, 1, c)[:, i]
        dense = r.take(p + "attention.dense.weight", (d, d))
        if dense is not None:  # [out, head * c + j] -> [head, out, j]
            out[names.attn_weight(layer, "o")] = dense.reshape(d, h, c).permute(1, 0, 2)
        if biased:
            out[names.attn_weight(layer, "o_bias")] = r.take(p + "attention.dense.bias", (d,))
        out[names.norm_weight(m_, "scale")] = r.take(p + "post_attention_layernorm.weight", (d,))
        out[names.norm_weight(m_, "bias")] = r.take(p + "post_attention_layernorm.bias", (d,))
        out[names.mlp_weight(layer, "proj_in")] = r.take(p + "mlp.dense_h_to_4h.weight", (m, d))
        out[names.mlp_weight(layer, "in_bias")] = r.take(p + "mlp.dense_h_to_4h.bias", (m,))
        out[names.mlp_weight(layer, "proj_out")] = r.take(p + "mlp.dense_4h_to_h.weight", (d, m))
        out[names.mlp_weight(layer, "out_bias")] = r.take(p + "mlp.dense_4h_to_h.bias", (d,))
    out[names.norm_weight(names.FINAL, "scale")] = r.take("gpt_neox.final_layer_norm.weight", (d,))
    out[names.norm_weight(names.FINAL, "bias")] = r.take("gpt_neox.final_layer_norm.bias", (d,))
    head_key = "embed_out.weight" if "embed_out.weight" in state_dict else "lm_head.weight"
    out[names.UNEMBED_WEIGHT] = stored_unembedding(
        r, head_key, (v, d), out[names.TOK_EMBEDS_WEIGHT], config.tie_word_embeddings
    )
    r.finish(ignore=lambda k: bool(_BUFFERS.fullmatch(k)))
    return r.weights(out)
