"""Hugging Face Llama and its relatives: config, state dict and rotary tables in the builder's terms.

``LlamaForCausalLM`` (model_type ``llama``), ``Qwen2ForCausalLM`` (``qwen2``:
biases on the query, key and value projections) and ``MistralForCausalLM``
(``mistral``: sliding-window attention) and ``GemmaForCausalLM`` (``gemma``: ``(1 + w)``
RMSNorms, embeddings times ``sqrt(d_model)``, a GeGLU MLP, usually tied embeddings) and
``Gemma2ForCausalLM`` (``gemma2``: Gemma with sandwich norms, soft-capped scores and logits and
alternating windowed layers) and ``MixtralForCausalLM`` (``mixtral``: Mistral with a mixture of
experts in each MLP, ``hf_mixtral``) all become ``build_llama`` circuits.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError, shown
from circuits.models.hf_mixtral import moe_fields, moe_weights_from_hf
from circuits.models.llama import LlamaConfig, post_norm_weight
from circuits.models.reading import (
    Reader,
    get_field,
    hf_rope_parameters,
    int_field,
    number_field,
    optional_int,
    present_or_default,
    rope_kind,
    stored_unembedding,
    typed_field,
)


def rope_type(config: Any) -> str:
    """The rotary variant a Hugging Face Llama config asks for (``'default'`` when none)."""
    return rope_kind("Llama", hf_rope_parameters("Llama", config)[1])


def _rope_theta(config: Any) -> float:
    """The chosen parameters' ``rope_theta``, else the top-level one (transformers 4.x), else 10000."""
    params = hf_rope_parameters("Llama", config)[1]
    source = params if "rope_theta" in params else config
    return number_field("Llama", source, "rope_theta", 10000.0, positive=True)


#: model_type -> the family's name in messages
FAMILY_NAMES = {
    "llama": "Llama",
    "qwen2": "Qwen2",
    "mistral": "Mistral",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "mixtral": "Mixtral",
}

# Options of each family's Hugging Face model that change its forward and that the builder lacks.
_UNSUPPORTED_FLAGS = {
    "llama": ("attention_bias", "mlp_bias"),
    "qwen2": ("use_sliding_window",),  # per-layer windows (layers >= max_window_layers)
    "mistral": (),
    "gemma": ("attention_bias", "use_bidirectional_attention"),
    "gemma2": ("attention_bias", "use_bidirectional_attention"),
    "mixtral": (),  # its mixture-of-experts fields: hf_mixtral.moe_fields
}
GEMMAS = ("gemma", "gemma2")

#: What each family's config class (transformers 5) sets for a field a ``config.json`` lacks, where the
#: builder's own default would differ.  (``num_key_value_heads`` is ``num_attention_heads`` for Llama;
#: ``max_position_embeddings`` is left out: it only limits the tokens here, and the rotary tables of the
#: variants that read it are transformers' own, made with the family's config class.)
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {"num_key_value_heads": 32},
    "mistral": {"num_key_value_heads": 8, "sliding_window": 4096},
    "gemma": {
        "num_key_value_heads": 16,
        "head_dim": 256,
        "hidden_act": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
    },
    "gemma2": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0,
    },
    "mixtral": {
        "num_key_value_heads": 8,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1e6,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
}


def _check_supported(config: Any, model_type: str) -> None:
    """Refuse, naming them, the options whose model the builder would not reproduce."""
    family = FAMILY_NAMES[model_type]
    problems = [
        f"{option}=True"
        for option in _UNSUPPORTED_FLAGS[model_type]
        if typed_field(family, config, option, False, bool)
    ]
    if model_type == "qwen2":  # MistralForCausalLM ignores layer_types; Qwen2 windows its sliding layers
        layer_types = typed_field(family, config, "layer_types", [], list)
        if any(kind != "full_attention" for kind in layer_types):
            problems.append(f"layer_types={shown(repr(layer_types))} (sliding-window layers)")
    if model_type == "gemma2":  # the builder's scores scale is 1/sqrt(head_dim)
        scalar, head_dim = get_field(config, "query_pre_attn_scalar"), get_field(config, "head_dim")
        if scalar != head_dim:
            problems.append(f"query_pre_attn_scalar={shown(repr(scalar))} (not head_dim {head_dim})")
    if problems:
        raise ModelError(f"{family} config options not supported: {', '.join(problems)}")


def _activation(config: Any, model_type: str) -> str:
    """``hidden_act`` (Gemma 2: ``hidden_activation``).  A Gemma's ``'gelu_pytorch_tanh'`` is our
    ``'gelu_new'`` (torch's tanh approximation, the same kernel), and so is Gemma's legacy ``'gelu'``,
    as ``GemmaConfig`` rewrites it."""
    key = "hidden_activation" if model_type == "gemma2" else "hidden_act"
    act = typed_field(FAMILY_NAMES[model_type], config, key, "silu", str)
    tanh_names = ("gelu_pytorch_tanh", "gelu") if model_type == "gemma" else ("gelu_pytorch_tanh",)
    return "gelu_new" if model_type in GEMMAS and act in tanh_names else act


def _gemma2_fields(config: Any) -> dict[str, Any]:
    """Gemma 2's sandwich norms, soft-caps and windowed layers (``layer_types``; when absent,
    ``Gemma2Config``'s default: every even layer is windowed)."""
    family = FAMILY_NAMES["gemma2"]
    n_layers = int_field(family, config, "num_hidden_layers", low=0)
    default = ["sliding_attention" if layer % 2 == 0 else "full_attention" for layer in range(n_layers)]
    layer_types = typed_field(family, config, "layer_types", default, list)
    kinds = ("sliding_attention", "full_attention")
    if len(layer_types) != n_layers or any(kind not in kinds for kind in layer_types):
        raise ModelError(
            f"{family} config: 'layer_types' is {shown(repr(layer_types))}; expected {n_layers} of {kinds}"
        )
    caps = {}
    for ours, theirs in (
        ("attn_softcap", "attn_logit_softcapping"),
        ("final_softcap", "final_logit_softcapping"),
    ):
        cap = get_field(config, theirs)
        caps[ours] = None if cap is None else number_field(family, config, theirs, 1.0, positive=True)
    sliding = tuple(layer for layer, kind in enumerate(layer_types) if kind == "sliding_attention")
    return dict(sandwich_norms=True, sliding_layers=sliding, **caps)


def llama_config_from_hf(config: Any, model_type: str = "llama") -> LlamaConfig:
    """Our ``LlamaConfig`` from a Hugging Face one (object or ``config.json`` dict), each field checked.

    ``model_type`` is one of ``FAMILY_NAMES``: Qwen2 adds the QKV biases, Mistral its sliding window,
    Gemma its ``(1 + w)`` RMSNorms and ``sqrt(d_model)`` embedding scale, Gemma 2 more (``_gemma2_fields``).
    """
    family = FAMILY_NAMES[model_type]
    config = present_or_default(config, HF_DEFAULTS[model_type])
    _check_supported(config, model_type)
    hf_rope_parameters(family, config)
    heads = int_field(family, config, "num_attention_heads")
    ours = LlamaConfig(
        n_layers=int_field(family, config, "num_hidden_layers", low=0),
        n_heads=heads,
        n_kv_heads=int_field(family, config, "num_key_value_heads", heads),
        d_model=int_field(family, config, "hidden_size"),
        d_head=optional_int(family, config, "head_dim"),
        d_mlp=int_field(family, config, "intermediate_size"),
        vocab_size=int_field(family, config, "vocab_size"),
        max_positions=optional_int(family, config, "max_position_embeddings"),
        rms_eps=number_field(family, config, "rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(config),
        act=_activation(config, model_type),
        tie_word_embeddings=typed_field(family, config, "tie_word_embeddings", False, bool),
        qkv_bias=model_type == "qwen2",
        sliding_window=optional_int(family, config, "sliding_window")
        if model_type in ("mistral", "gemma2", "mixtral")
        else None,
        rms_unit_offset=model_type in GEMMAS,
        embed_scale=model_type in GEMMAS,
        **(_gemma2_fields(config) if model_type == "gemma2" else {}),
        **(moe_fields(config) if model_type == "mixtral" else {}),
    )
    if heads % ours.kv_heads:
        raise ModelError(
            f"{family} config: 'num_attention_heads' {heads} is not a multiple of 'num_key_value_heads' {ours.kv_heads}"
        )
    if ours.d_head is None and ours.d_model % heads:
        raise ModelError(
            f"{family} config: 'hidden_size' {ours.d_model} is not divisible by 'num_attention_heads' {heads}"
        )
    return ours


def llama_weights_from_hf(
    config: LlamaConfig, state_dict: Mapping[str, Any], attach: bool = False, family: str = "Llama"
) -> dict[str, torch.Tensor]:
    """Hugging Face Llama (``nn.Linear`` ``[out, in]`` weights) -> the builder's names and layouts (views).

    With ``config.qkv_bias`` (Qwen2) the projections' biases become ``[heads, 1, d_head]``.
    """
    d, h, g, c, v, m = (
        config.d_model,
        config.n_heads,
        config.kv_heads,
        config.head_size,
        config.vocab_size,
        config.d_mlp,
    )
    r = Reader(family, state_dict, attach)
    out: dict[str, Any] = {names.TOK_EMBEDS_WEIGHT: r.take("model.embed_tokens.weight", (v, d))}
    for layer in range(config.n_layers):
        p = f"model.layers.{layer}."
        attn_scale = names.norm_weight(names.attn_prefix(layer), "scale", names.RMS)
        out[attn_scale] = r.take(p + "input_layernorm.weight", (d,))
        for which, heads in (("q", h), ("k", g), ("v", g)):
            weight = r.take(p + f"self_attn.{which}_proj.weight", (heads * c, d))
            out[names.attn_weight(layer, which)] = None if weight is None else weight.reshape(heads, c, d)
            if config.qkv_bias:
                bias = r.take(p + f"self_attn.{which}_proj.bias", (heads * c,))
                out[names.attn_weight(layer, f"{which}_bias")] = (
                    None if bias is None else bias.reshape(heads, 1, c)
                )
        o = r.take(p + "self_attn.o_proj.weight", (d, h * c))
        out[names.attn_weight(layer, "o")] = None if o is None else o.reshape(d, h, c).permute(1, 0, 2)
        mlp_scale = names.norm_weight(names.mlp_prefix(layer), "scale", names.RMS)
        if config.sandwich_norms:  # Gemma 2: post_attention_layernorm is the attention output's norm
            out[post_norm_weight(names.attn_prefix(layer))] = r.take(
                p + "post_attention_layernorm.weight", (d,)
            )
            out[mlp_scale] = r.take(p + "pre_feedforward_layernorm.weight", (d,))
            out[post_norm_weight(names.mlp_prefix(layer))] = r.take(
                p + "post_feedforward_layernorm.weight", (d,)
            )
        else:
            out[mlp_scale] = r.take(p + "post_attention_layernorm.weight", (d,))
        if config.n_experts is not None:  # Mixtral
            out.update(moe_weights_from_hf(r, p, layer, config.n_experts, d, m))
            continue
        out[names.mlp_weight(layer, "gate")] = r.take(p + "mlp.gate_proj.weight", (m, d))
        out[names.mlp_weight(layer, "up")] = r.take(p + "mlp.up_proj.weight", (m, d))
        out[names.mlp_weight(layer, "down")] = r.take(p + "mlp.down_proj.weight", (d, m))
    out[names.norm_weight(names.FINAL, "scale", names.RMS)] = r.take("model.norm.weight", (d,))
    out[names.UNEMBED_WEIGHT] = stored_unembedding(
        r, "lm_head.weight", (v, d), out[names.TOK_EMBEDS_WEIGHT], config.tie_word_embeddings
    )
    r.finish(ignore=lambda k: k.endswith("rotary_emb.inv_freq"))
    return r.weights(out)


def hf_rope_tables(rotary_module: Any, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[S, d_head]`` from a Hugging Face rotary-embedding module (any rope variant)."""
    device = next((b.device for b in rotary_module.buffers()), torch.device("cpu"))
    probe = torch.zeros(1, dtype=dtype, device=device)
    positions = torch.arange(seq_len, device=device)[None, :]
    with torch.no_grad():
        cos, sin = rotary_module(probe, positions)
    return cos[0].cpu(), sin[0].cpu()


#: model_type -> its rotary-embedding class in ``transformers.models.<model_type>.modeling_<model_type>``
_ROTARY_CLASSES = {
    "llama": "LlamaRotaryEmbedding",
    "qwen2": "Qwen2RotaryEmbedding",
    "mistral": "MistralRotaryEmbedding",
    "gemma": "GemmaRotaryEmbedding",
    "gemma2": "Gemma2RotaryEmbedding",
    "mixtral": "MixtralRotaryEmbedding",
}


def rope_from_transformers(config_dict: Mapping[str, Any], seq_len: int, dtype: torch.dtype):
    """cos/sin ``[S, d_head]`` of a scaled rotary variant, computed by transformers from the config.

    With the family's own config class and rotary module, so that the fields
    the config lacks (``max_position_embeddings``, which ``dynamic``, ``yarn``
    and ``llama3`` read; Gemma's ``head_dim``) take that family's defaults.
    """
    model_type = config_dict.get("model_type", "llama")
    try:
        from transformers import AutoConfig

        module = importlib.import_module(f"transformers.models.{model_type}.modeling_{model_type}")
    except ImportError as error:
        raise ModelError(
            f"this {FAMILY_NAMES[model_type]} checkpoint uses the {rope_type(config_dict)!r} rotary variant, "
            f"which is computed with transformers; install it (pip install 'circuits-interp[hf]'): {error}"
        ) from error
    try:
        fields = {k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")}
        hf_config = AutoConfig.for_model(model_type, **fields)
        return hf_rope_tables(getattr(module, _ROTARY_CLASSES[model_type])(hf_config), seq_len, dtype)
    except Exception as error:  # transformers' own complaint about the rope parameters
        raise ModelError(
            f"{FAMILY_NAMES[model_type]}: transformers cannot compute the {rope_type(config_dict)!r} rotary "
            f"tables from this config: {shown(str(error))}"
        ) from error
