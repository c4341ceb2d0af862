"""Hugging Face Llama and its relatives: config and state dict in the builder's terms.

``LlamaForCausalLM`` (model_type ``llama``), ``Qwen2ForCausalLM`` (``qwen2``: biases on the query, key
and value projections), ``Qwen3ForCausalLM`` (``qwen3``: RMSNorms of each head's queries and keys, no
biases, windowed layers by ``layer_types``), ``MistralForCausalLM`` (``mistral``: sliding-window
attention), ``GemmaForCausalLM`` (``gemma``: ``(1 + w)`` RMSNorms, embeddings times ``sqrt(d_model)``,
a GeGLU MLP, usually tied embeddings), ``Gemma2ForCausalLM`` (``gemma2``: Gemma with sandwich norms,
soft-capped scores and logits, alternating windowed layers and the scores' scale
``1/sqrt(query_pre_attn_scalar)``), ``Gemma3ForCausalLM`` (``gemma3_text``: Gemma 2 with query/key
norms, no soft-caps by default, and local layers rotating with their own base),
``Phi3ForCausalLM`` (``phi3``: fused ``qkv_proj`` and ``gate_up_proj``, an optional partial rotary
embedding and window) and ``MixtralForCausalLM`` (``mixtral``: Mistral with a mixture of experts in
each MLP, ``hf_mixtral``) all become ``build_llama`` circuits.  The rotary parameters are read by
``hf_rope``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError, shown
from circuits.models.hf_mixtral import moe_fields, moe_weights_from_hf
from circuits.models.hf_rope import rope_kinds
from circuits.models.llama import EMBED_SCALE, LlamaConfig, post_norm_weight
from circuits.models.reading import (
    Reader,
    get_field,
    int_field,
    number_field,
    optional_int,
    present_or_default,
    stored_unembedding,
    typed_field,
)
from circuits.models.rotary import FULL, SLIDING

#: model_type -> the family's name in messages
FAMILY_NAMES = {
    "llama": "Llama",
    "qwen2": "Qwen2",
    "qwen3": "Qwen3",
    "mistral": "Mistral",
    "gemma": "Gemma",
    "gemma2": "Gemma 2",
    "gemma3_text": "Gemma 3",
    "phi3": "Phi-3",
    "mixtral": "Mixtral",
}

# Options of each family's Hugging Face model that change its forward and that the builder lacks.
_UNSUPPORTED_FLAGS = {
    "llama": ("attention_bias", "mlp_bias"),
    "qwen2": ("use_sliding_window",),  # per-layer windows (layers >= max_window_layers)
    "qwen3": ("attention_bias",),  # biases on q, k, v and o
    "mistral": (),
    "gemma": ("attention_bias", "use_bidirectional_attention"),
    "gemma2": ("attention_bias", "use_bidirectional_attention"),
    "gemma3_text": ("attention_bias", "use_bidirectional_attention"),
    "phi3": (),
    "mixtral": (),  # its mixture-of-experts fields: hf_mixtral.moe_fields
}
GEMMAS = ("gemma", "gemma2", "gemma3_text")
SANDWICHED = ("gemma2", "gemma3_text")  #: Gemma 2 and 3: sandwich norms, soft-caps, windowed layer kinds

#: What each family's config class (transformers 5) sets for a field a ``config.json`` lacks, where the
#: builder's own default would differ.  (``num_key_value_heads`` is ``num_attention_heads`` for Llama and
#: Phi-3; ``max_position_embeddings`` is left out: it only limits the tokens here, and the rotary tables
#: of the variants that read it are transformers' own, made with the family's config class.)
HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {"num_key_value_heads": 32},
    "qwen3": {"num_key_value_heads": 32, "head_dim": 128, "sliding_window": 4096},
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
    "gemma3_text": {
        "num_key_value_heads": 4,
        "head_dim": 256,
        "hidden_activation": "gelu_pytorch_tanh",
        "tie_word_embeddings": True,
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
    },
    "phi3": {"rms_norm_eps": 1e-5},
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
    if problems:
        raise ModelError(f"{family} config options not supported: {', '.join(problems)}")


def _activation(config: Any, model_type: str) -> str:
    """``hidden_act`` (Gemma 2 and 3: ``hidden_activation``).  A Gemma's ``'gelu_pytorch_tanh'`` is our
    ``'gelu_new'`` (torch's tanh approximation, the same kernel), and so is Gemma's legacy ``'gelu'``,
    as ``GemmaConfig`` rewrites it."""
    key = "hidden_activation" if model_type in SANDWICHED else "hidden_act"
    act = typed_field(FAMILY_NAMES[model_type], config, key, "silu", str)
    tanh_names = ("gelu_pytorch_tanh", "gelu") if model_type == "gemma" else ("gelu_pytorch_tanh",)
    return "gelu_new" if model_type in GEMMAS and act in tanh_names else act


#: model_type -> ``layer_types`` when the config has none, from the config (as its class makes it)
_DEFAULT_LAYER_TYPES: dict[str, Callable[[Any, int], list[str]]] = {
    "gemma2": lambda config, n: [SLIDING if layer % 2 == 0 else FULL for layer in range(n)],
    "gemma3_text": lambda config, n: [
        SLIDING if (layer + 1) % _window_pattern(config) else FULL for layer in range(n)
    ],
    "qwen3": lambda config, n: [
        SLIDING if _qwen3_window(config) is not None and layer >= _max_window_layers(config) else FULL
        for layer in range(n)
    ],
}


def _window_pattern(config: Any) -> int:
    return int_field("Gemma 3", config, "sliding_window_pattern", 6)


def _max_window_layers(config: Any) -> int:
    return int_field("Qwen3", config, "max_window_layers", 28, low=0)


def _qwen3_window(config: Any) -> int | None:
    """Qwen3's window: ``sliding_window`` with ``use_sliding_window``, else none (as ``Qwen3Config``)."""
    used = typed_field("Qwen3", config, "use_sliding_window", False, bool)
    return optional_int("Qwen3", config, "sliding_window") if used else None


def _sliding_layers(config: Any, model_type: str, window: int | None) -> tuple[int, ...]:
    """The windowed layers of ``layer_types`` (when absent, the config class's default)."""
    family = FAMILY_NAMES[model_type]
    n_layers = int_field(family, config, "num_hidden_layers", low=0)
    default = _DEFAULT_LAYER_TYPES[model_type](config, n_layers)
    layer_types = typed_field(family, config, "layer_types", default, list)
    kinds = (SLIDING, FULL)
    if len(layer_types) != n_layers or any(kind not in kinds for kind in layer_types):
        raise ModelError(
            f"{family} config: 'layer_types' is {shown(repr(layer_types))}; expected {n_layers} of {kinds}"
        )
    sliding = tuple(layer for layer, kind in enumerate(layer_types) if kind == SLIDING)
    if sliding and window is None and model_type in ("qwen3", "gemma3_text"):  # transformers has no mask
        raise ModelError(
            f"{family} config: 'layer_types' has sliding-window layers {list(sliding)} but no window "
            "('sliding_window' is null or 'use_sliding_window' is false)"
        )
    return sliding


def _softcaps(config: Any, family: str) -> dict[str, float | None]:
    caps = {}
    for ours, theirs in (
        ("attn_softcap", "attn_logit_softcapping"),
        ("final_softcap", "final_logit_softcapping"),
    ):
        cap = get_field(config, theirs)
        caps[ours] = None if cap is None else number_field(family, config, theirs, 1.0, positive=True)
    return caps


def _family_fields(config: Any, model_type: str, rope: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The ``LlamaConfig`` fields one family sets beyond Llama's."""
    family = FAMILY_NAMES[model_type]
    if model_type == "qwen2":
        return dict(qkv_bias=True)
    if model_type == "mistral":
        return dict(sliding_window=optional_int(family, config, "sliding_window"))
    if model_type == "mixtral":
        return dict(sliding_window=optional_int(family, config, "sliding_window"), **moe_fields(config))
    if model_type == "qwen3":
        window = _qwen3_window(config)
        return dict(
            qk_norm=True, sliding_window=window, sliding_layers=_sliding_layers(config, model_type, window)
        )
    if model_type == "phi3":
        return dict(
            sliding_window=optional_int(family, config, "sliding_window"),
            rotary_dims=_rotary_dims(config, rope),
        )
    if model_type not in GEMMAS:
        return {}
    fields: dict[str, Any] = dict(rms_unit_offset=True, embed_scale=True)
    if model_type in SANDWICHED:
        window = optional_int(family, config, "sliding_window")
        fields.update(
            sandwich_norms=True,
            sliding_window=window,
            sliding_layers=_sliding_layers(config, model_type, window),
            query_pre_attn_scalar=number_field(family, config, "query_pre_attn_scalar", 256, positive=True),
            **_softcaps(config, family),
        )
    if model_type == "gemma3_text":  # Gemma3Attention keeps attn_logit_softcapping but never applies it
        fields.update(qk_norm=True, rope_local_theta=rope[SLIDING]["rope_theta"], attn_softcap=None)
    return fields


def _rotary_dims(config: Any, rope: Mapping[str, Mapping[str, Any]]) -> int | None:
    """Phi-3's rotated dims per head, ``int(head_dim * partial_rotary_factor)`` as transformers computes
    them (the factor from the rotary parameters, else the top level); None when all are."""
    family = FAMILY_NAMES["phi3"]
    source = rope[FULL] if "partial_rotary_factor" in rope[FULL] else config
    factor = number_field(family, source, "partial_rotary_factor", 1.0, positive=True)
    if factor > 1:
        raise ModelError(f"{family} config: 'partial_rotary_factor' is {factor}; expected a number in (0, 1]")
    heads = int_field(family, config, "num_attention_heads")
    head_dim = optional_int(family, config, "head_dim") or int_field(family, config, "hidden_size") // heads
    dims = int(head_dim * factor)
    return None if dims == head_dim else dims


def _max_positions(config: Any, family: str, rope: Mapping[str, Mapping[str, Any]]) -> int | None:
    """The positions a circuit may have: ``max_position_embeddings``, except with the ``dynamic`` rotary
    variant, which exists to go beyond it (transformers recomputes its frequencies for longer inputs)."""
    if any(params["rope_type"] == "dynamic" for params in rope.values()):
        return None
    return optional_int(family, config, "max_position_embeddings")


def llama_config_from_hf(config: Any, model_type: str = "llama") -> LlamaConfig:
    """Our ``LlamaConfig`` from a Hugging Face one (object or ``config.json`` dict), each field checked.

    ``model_type`` is one of ``FAMILY_NAMES``; ``_family_fields`` sets what each family adds to Llama.
    """
    family = FAMILY_NAMES[model_type]
    config = present_or_default(config, HF_DEFAULTS[model_type])
    _check_supported(config, model_type)
    rope = rope_kinds(family, config, model_type)
    heads = int_field(family, config, "num_attention_heads")
    ours = LlamaConfig(
        n_layers=int_field(family, config, "num_hidden_layers", low=0),
        n_heads=heads,
        n_kv_heads=int_field(family, config, "num_key_value_heads", heads),
        d_model=int_field(family, config, "hidden_size"),
        d_head=optional_int(family, config, "head_dim"),
        d_mlp=int_field(family, config, "intermediate_size"),
        vocab_size=int_field(family, config, "vocab_size"),
        max_positions=_max_positions(config, family, rope),
        rms_eps=number_field(family, config, "rms_norm_eps", 1e-6),
        rope_theta=rope[FULL]["rope_theta"],
        act=_activation(config, model_type),
        tie_word_embeddings=typed_field(family, config, "tie_word_embeddings", False, bool),
        **_family_fields(config, model_type, rope),
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


FUSED = ("phi3",)  #: model_types whose projections are fused: ``qkv_proj`` and ``gate_up_proj`` (Phi-3)


def llama_weights_from_hf(
    config: LlamaConfig,
    state_dict: Mapping[str, Any],
    attach: bool = False,
    family: str = "Llama",
    fused: bool = False,
) -> dict[str, torch.Tensor]:
    """Hugging Face Llama (``nn.Linear`` ``[out, in]`` weights) -> the builder's names and layouts (views).

    With ``config.qkv_bias`` (Qwen2) the projections' biases become ``[heads, 1, d_head]``; with
    ``fused`` (Phi-3) the query, key and value weights are row slices of ``qkv_proj`` and the gate and
    up weights the halves of ``gate_up_proj`` (views of them with ``attach``, so their gradients reach
    the fused parameters).  A Gemma's ``model.embed_tokens.embed_scale`` (a buffer, which ``from_hf``
    adds to the state dict) becomes ``'t.c.embed_scale'``.
    """
    d, v = config.d_model, config.vocab_size
    r = Reader(family, state_dict, attach)
    out: dict[str, Any] = {names.TOK_EMBEDS_WEIGHT: r.take("model.embed_tokens.weight", (v, d))}
    for layer in range(config.n_layers):
        p = f"model.layers.{layer}."
        attn_scale = names.norm_weight(names.attn_prefix(layer), "scale", names.RMS)
        out[attn_scale] = r.take(p + "input_layernorm.weight", (d,))
        out.update(_attention_weights(config, r, layer, fused))
        out.update(_mlp_weights(config, r, layer, fused))
    out[names.norm_weight(names.FINAL, "scale", names.RMS)] = r.take("model.norm.weight", (d,))
    out[names.UNEMBED_WEIGHT] = stored_unembedding(
        r, "lm_head.weight", (v, d), out[names.TOK_EMBEDS_WEIGHT], config.tie_word_embeddings
    )
    if config.embed_scale:
        scale = r.take("model.embed_tokens.embed_scale", (), optional=True)
        embedding = out[names.TOK_EMBEDS_WEIGHT]
        out[EMBED_SCALE] = scale if scale is None or embedding is None else scale.to(embedding.dtype)
    r.finish(ignore=lambda k: k.endswith("rotary_emb.inv_freq"))
    return r.weights(out)


def _attention_weights(config: LlamaConfig, r: Reader, layer: int, fused: bool) -> dict[str, Any]:
    """Layer ``layer``'s query, key, value and output weights (biases, q/k norms) in the builder's layouts."""
    d, h, g, c = config.d_model, config.n_heads, config.kv_heads, config.head_size
    p = f"model.layers.{layer}.self_attn."
    rows = {"q": h * c, "k": g * c, "v": g * c}
    if fused:
        qkv = r.take(p + "qkv_proj.weight", ((h + 2 * g) * c, d))
        parts = dict(zip(rows, (None,) * 3 if qkv is None else qkv.split(list(rows.values()))))
    else:
        parts = {which: r.take(p + f"{which}_proj.weight", (count, d)) for which, count in rows.items()}
    out: dict[str, Any] = {}
    for which, weight in parts.items():
        out[names.attn_weight(layer, which)] = None if weight is None else weight.reshape(-1, c, d)
        if config.qkv_bias:
            bias = r.take(p + f"{which}_proj.bias", (rows[which],))
            out[names.attn_weight(layer, f"{which}_bias")] = None if bias is None else bias.reshape(-1, 1, c)
    if config.qk_norm:
        out[names.attn_weight(layer, "q_norm")] = r.take(p + "q_norm.weight", (c,))
        out[names.attn_weight(layer, "k_norm")] = r.take(p + "k_norm.weight", (c,))
    o = r.take(p + "o_proj.weight", (d, h * c))
    out[names.attn_weight(layer, "o")] = None if o is None else o.reshape(d, h, c).permute(1, 0, 2)
    return out


def _mlp_weights(config: LlamaConfig, r: Reader, layer: int, fused: bool) -> dict[str, Any]:
    """Layer ``layer``'s norms after the attention (Gemma 2 and 3: three of them) and MLP weights (Mixtral:
    its router and experts)."""
    d, m = config.d_model, config.d_mlp
    p = f"model.layers.{layer}."
    out: dict[str, Any] = {}
    mlp_scale = names.norm_weight(names.mlp_prefix(layer), "scale", names.RMS)
    if config.sandwich_norms:  # Gemma 2 and 3: post_attention_layernorm is the attention output's norm
        out[post_norm_weight(names.attn_prefix(layer))] = r.take(p + "post_attention_layernorm.weight", (d,))
        out[mlp_scale] = r.take(p + "pre_feedforward_layernorm.weight", (d,))
        out[post_norm_weight(names.mlp_prefix(layer))] = r.take(p + "post_feedforward_layernorm.weight", (d,))
    else:
        out[mlp_scale] = r.take(p + "post_attention_layernorm.weight", (d,))
    if config.n_experts is not None:  # Mixtral
        out.update(moe_weights_from_hf(r, p, layer, config.n_experts, d, m))
        return out
    if fused:  # Phi3MLP: gate, up = gate_up_proj(x).chunk(2)
        gate_up = r.take(p + "mlp.gate_up_proj.weight", (2 * m, d))
        gate, up = (None, None) if gate_up is None else gate_up.split(m)
    else:
        gate, up = r.take(p + "mlp.gate_proj.weight", (m, d)), r.take(p + "mlp.up_proj.weight", (m, d))
    out[names.mlp_weight(layer, "gate")], out[names.mlp_weight(layer, "up")] = gate, up
    out[names.mlp_weight(layer, "down")] = r.take(p + "mlp.down_proj.weight", (d, m))
    return out
