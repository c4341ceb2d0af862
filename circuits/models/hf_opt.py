"""Hugging Face OPT (``OPTForCausalLM``) as a GPT-2 circuit: its config and state dict in ``build_gpt2``'s terms.

A pre-LayerNorm OPT layer is GPT-2's: layer norms with biases, separate
q/k/v/out projections with biases, a two-matrix MLP (ReLU), a final layer
norm and a tied unembedding.  Two differences disappear in the conversion:

- OPT's learned positions are looked up at ``position + 2`` (a fairseq
  padding convention), so the builder's position table is
  ``embed_positions.weight[2:]`` (a view: ``attach`` still reaches it).
- OPT multiplies the queries by ``head_dim ** -0.5`` before the scores; the
  circuit divides the scores by ``sqrt(d_head)``, the same product.

What has no GPT-2 form is refused, naming the config field: post-LayerNorm
layers (``do_layer_norm_before=False``, OPT-350m), ``word_embed_proj_dim``
unlike ``hidden_size`` (OPT-350m's ``project_in``/``project_out``),
``enable_bias=False``, ``layer_norm_elementwise_affine=False`` and
``_remove_final_layer_norm=True``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError, shown
from circuits.models.common import ACTIVATIONS
from circuits.models.gpt2 import GPT2Config
from circuits.models.reading import Reader, int_field, stored_unembedding, strip_prefix, typed_field

#: Positions 0, 1 of OPT's table are never looked up (``OPTLearnedPositionalEmbedding.offset``).
POSITION_OFFSET = 2
#: ``nn.LayerNorm``'s default: OPT's config has no epsilon field.
LN_EPS = 1e-5


def opt_config_from_hf(config: Any) -> GPT2Config:
    """Our ``GPT2Config`` from a Hugging Face OPT config (object or ``config.json`` dict), each field checked."""
    family = "OPT"
    problems = []
    for option, default, supported in (
        ("do_layer_norm_before", True, True),
        ("enable_bias", True, True),
        ("layer_norm_elementwise_affine", True, True),
        ("_remove_final_layer_norm", False, False),
    ):
        value = typed_field(family, config, option, default, bool)
        if value != supported:
            problems.append(f"{option}={value}")
    d_model = int_field(family, config, "hidden_size")
    proj_dim = int_field(family, config, "word_embed_proj_dim", d_model)
    if proj_dim != d_model:
        problems.append(f"word_embed_proj_dim={proj_dim} != hidden_size={d_model} (project_in/project_out)")
    if problems:
        raise ModelError(f"OPT config options not supported: {', '.join(problems)}")
    ours = GPT2Config(
        n_layers=int_field(family, config, "num_hidden_layers", low=0),
        n_heads=int_field(family, config, "num_attention_heads"),
        d_model=d_model,
        vocab_size=int_field(family, config, "vocab_size"),
        n_ctx=int_field(family, config, "max_position_embeddings"),
        d_mlp=int_field(family, config, "ffn_dim"),
        ln_eps=LN_EPS,
        act=typed_field(family, config, "activation_function", "relu", str),
        tie_word_embeddings=typed_field(family, config, "tie_word_embeddings", True, bool),
    )
    if ours.d_model % ours.n_heads:
        raise ModelError(
            f"OPT config: 'hidden_size' {ours.d_model} is not divisible by 'num_attention_heads' {ours.n_heads}"
        )
    if ours.act not in ACTIVATIONS:
        raise ModelError(
            f"OPT config: 'activation_function' {shown(repr(ours.act))} is not supported; "
            f"supported: {sorted(ACTIVATIONS)}"
        )
    return ours


def opt_weights_from_hf(
    config: GPT2Config, state_dict: Mapping[str, Any], attach: bool = False
) -> dict[str, torch.Tensor]:
    """Hugging Face OPT (``nn.Linear`` ``[out, in]`` weights) -> ``build_gpt2``'s names and layouts.

    Every conversion is a view (reshape, permute, slice), so that no
    weight is copied.
    """
    lm_head = state_dict.get("lm_head.weight")
    # OPTForCausalLM keys start 'model.decoder.', a bare OPTModel's (some hub checkpoints) 'decoder.'
    rest = strip_prefix({k: v for k, v in state_dict.items() if k != "lm_head.weight"}, "model.")
    state = strip_prefix(rest, "decoder.")
    if lm_head is not None:
        state["lm_head.weight"] = lm_head
    d, h, c, v, m = config.d_model, config.n_heads, config.d_head, config.vocab_size, config.mlp_size
    r = Reader("OPT", state, attach)
    positions = r.take("embed_positions.weight", (config.n_ctx + POSITION_OFFSET, d))
    out: dict[str, Any] = {
        names.TOK_EMBEDS_WEIGHT: r.take("embed_tokens.weight", (v, d)),
        names.POS_EMBEDS_WEIGHT: None if positions is None else positions[POSITION_OFFSET:],
    }
    for layer in range(config.n_layers):
        _layer_weights(r, out, layer, d, h, c, m)
    out[names.norm_weight(names.FINAL, "scale")] = r.take("final_layer_norm.weight", (d,))
    out[names.norm_weight(names.FINAL, "bias")] = r.take("final_layer_norm.bias", (d,))
    out[names.UNEMBED_WEIGHT] = stored_unembedding(
        r, "lm_head.weight", (v, d), out[names.TOK_EMBEDS_WEIGHT], config.tie_word_embeddings
    )
    r.finish()
    return r.weights(out)


def _layer_weights(r: Reader, out: dict[str, Any], layer: int, d: int, h: int, c: int, m: int) -> None:
    """Layer ``layer``'s weights into ``out``: per-head ``[h, c, d]`` q/k/v, ``[h, d, c]`` out_proj."""
    p = f"layers.{layer}."
    a, m_ = names.attn_prefix(layer), names.mlp_prefix(layer)
    out[names.norm_weight(a, "scale")] = r.take(p + "self_attn_layer_norm.weight", (d,))
    out[names.norm_weight(a, "bias")] = r.take(p + "self_attn_layer_norm.bias", (d,))
    for which in "qkv":
        weight = r.take(p + f"self_attn.{which}_proj.weight", (d, d))
        bias = r.take(p + f"self_attn.{which}_proj.bias", (d,))
        # output row (head * c + j) -> [head, j, input]
        out[names.attn_weight(layer, which)] = None if weight is None else weight.reshape(h, c, d)
        out[names.attn_weight(layer, f"{which}_bias")] = None if bias is None else bias.reshape(h, 1, c)
    proj = r.take(p + "self_attn.out_proj.weight", (d, d))
    if proj is not None:  # [out, head * c + j] -> [head, out, j]
        out[names.attn_weight(layer, "o")] = proj.reshape(d, h, c).permute(1, 0, 2)
    out[names.attn_weight(layer, "o_bias")] = r.take(p + "self_attn.out_proj.bias", (d,))
    out[names.norm_weight(m_, "scale")] = r.take(p + "final_layer_norm.weight", (d,))
    out[names.norm_weight(m_, "bias")] = r.take(p + "final_layer_norm.bias", (d,))
    out[names.mlp_weight(layer, "proj_in")] = r.take(p + "fc1.weight", (m, d))
    out[names.mlp_weight(layer, "in_bias")] = r.take(p + "fc1.bias", (m,))
    out[names.mlp_weight(layer, "proj_out")] = r.take(p + "fc2.weight", (d, m))
    out[names.mlp_weight(layer, "out_bias")] = r.take(p + "fc2.bias", (d,))
