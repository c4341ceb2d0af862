"""The rotary embedding of a Hugging Face Llama-style config: each layer kind's variant, checked, and the
tables of the scaled variants, which transformers computes (a model's own module, or one made from the
config).

The variants the builder reproduces (``SUPPORTED_ROPE_TYPES``) are ``default``, computed by the builder,
and ``linear``, ``dynamic``, ``yarn``, ``longrope`` and ``llama3``, whose tables (``attention_factor``
included: transformers multiplies cos and sin by it) come from the family's own rotary module for the
positions of the circuit.  ``dynamic`` and ``longrope`` pick their frequencies by the sequence length:
the module, given the circuit's positions, picks them as the model's forward on those tokens does (a
copy of a model's module is used, so that building a circuit never changes the model).  Any other
``rope_type`` (``proportional``, a misspelling) is refused with a ``ModelError`` naming the field.
Gemma 3 has one set of parameters per layer kind (``rope_parameters['full_attention']`` and
``['sliding_attention']``; in transformers 4.x ``rope_theta``, ``rope_scaling`` and
``rope_local_base_freq``).
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Mapping
from typing import Any

import torch

from circuits.errors import ModelError, shown
from circuits.models.reading import get_field, hf_rope_parameters, number_field, rope_kind
from circuits.models.rotary import FULL, SLIDING

#: The ``rope_type`` values whose tables the circuit reproduces exactly.
SUPPORTED_ROPE_TYPES = ("default", "linear", "dynamic", "yarn", "longrope", "llama3")

#: model_type -> (the module under ``transformers.models``, its rotary-embedding class)
ROTARY_CLASSES = {
    "llama": ("llama", "LlamaRotaryEmbedding"),
    "qwen2": ("qwen2", "Qwen2RotaryEmbedding"),
    "qwen3": ("qwen3", "Qwen3RotaryEmbedding"),
    "mistral": ("mistral", "MistralRotaryEmbedding"),
    "gemma": ("gemma", "GemmaRotaryEmbedding"),
    "gemma2": ("gemma2", "Gemma2RotaryEmbedding"),
    "gemma3_text": ("gemma3", "Gemma3RotaryEmbedding"),
    "phi3": ("phi3", "Phi3RotaryEmbedding"),
    "mixtral": ("mixtral", "MixtralRotaryEmbedding"),
}
PER_KIND = ("gemma3_text",)  #: the model_types whose rotary parameters are per layer kind
_GEMMA3_THETAS = {FULL: ("rope_theta", 1_000_000.0), SLIDING: ("rope_local_base_freq", 10_000.0)}


def rope_kinds(family: str, config: Any, model_type: str) -> dict[str, dict[str, Any]]:
    """Layer kind -> the rotary parameters its layers use, each with its ``rope_type`` and ``rope_theta``
    (one kind, ``FULL``, but for Gemma 3); a variant the builder does not reproduce is refused."""
    if model_type in PER_KIND:
        kinds = {
            kind: (f"rope_parameters[{kind!r}]", params) for kind, params in _gemma3(family, config).items()
        }
    else:
        key, params = hf_rope_parameters(family, config)
        theta = params if "rope_theta" in params else config
        params = dict(params, rope_theta=number_field(family, theta, "rope_theta", 10000.0, positive=True))
        kinds = {FULL: (repr(key), params)}
    out = {}
    for kind, (key, params) in kinds.items():
        variant = rope_kind(family, params)
        if model_type == "phi3" and variant in ("su", "yarn"):  # Phi3Config reads both as longrope
            variant = "longrope"
        if variant not in SUPPORTED_ROPE_TYPES:
            raise ModelError(
                f"{family} config: {key} asks for the rotary variant {shown(repr(variant))}, which circuits "
                f"does not reproduce; supported: {', '.join(SUPPORTED_ROPE_TYPES)}"
            )
        out[kind] = dict(params, rope_type=variant)
    return out


def _gemma3(family: str, config: Any) -> dict[str, dict[str, Any]]:
    """Gemma 3's two parameter sets, as ``Gemma3TextConfig.convert_rope_params_to_dict`` makes them from a
    ``config.json`` (a config object holds them made already)."""
    params = get_field(config, "rope_parameters", {})
    if not isinstance(params, Mapping) or any(key not in (FULL, SLIDING) for key in params):
        raise ModelError(
            f"{family} config: 'rope_parameters' is {shown(repr(params))}; expected a mapping from "
            f"{FULL!r} and {SLIDING!r} to each kind's rotary parameters"
        )
    scaling = get_field(config, "rope_scaling", {}) if isinstance(config, Mapping) else {}
    if not isinstance(scaling, Mapping):
        raise ModelError(f"{family} config: 'rope_scaling' is {shown(repr(scaling))}; expected a mapping")
    out = {}
    for kind, (legacy, default) in _GEMMA3_THETAS.items():
        own = params.get(kind) or {"rope_type": "default"}
        if not isinstance(own, Mapping):
            raise ModelError(
                f"{family} config: 'rope_parameters'[{kind!r}] is {shown(repr(own))}; expected a mapping"
            )
        merged = {**own, **scaling} if kind == FULL else dict(own)
        if "rope_theta" not in merged:
            merged["rope_theta"] = number_field(family, config, legacy, default, positive=True)
        merged["rope_theta"] = number_field(family, merged, "rope_theta", default, positive=True)
        out[kind] = merged
    return out


def scaled_kinds(kinds: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The kinds whose tables transformers must compute (a variant other than ``default``)."""
    return [kind for kind, params in kinds.items() if params["rope_type"] != "default"]


def module_tables(
    rotary_module: Any, seq_len: int, dtype: torch.dtype, layer_type: str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[S, d_head]`` (Phi-3's partial rotary: ``[S, rotary_dims]``) from a Hugging Face
    rotary-embedding module, for ``layer_type``'s layers where it has one table per kind (Gemma 3).

    A copy of the module computes them: ``dynamic`` and ``longrope`` modules update their
    frequencies in place as they run, and the model must be left as it was (the copy starts from
    the model's state, so the tables are those of the model's next forward on these positions).
    """
    module = copy.deepcopy(rotary_module)
    device = next((b.device for b in module.buffers()), torch.device("cpu"))
    probe = torch.zeros(1, dtype=dtype, device=device)
    positions = torch.arange(seq_len, device=device)[None, :]
    extra = () if layer_type is None else (layer_type,)
    with torch.no_grad():
        cos, sin = module(probe, positions, *extra)
    return cos[0].cpu(), sin[0].cpu()


def tables_from_transformers(
    family: str,
    config_dict: Mapping[str, Any],
    model_type: str,
    kinds: list[str],
    seq_len: int,
    dtype: torch.dtype,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """cos/sin of each of ``kinds`` (scaled variants), computed by transformers from the config.

    With the family's own config class and rotary module, so that the fields
    the config lacks (``max_position_embeddings``, which ``dynamic``, ``yarn``
    and ``llama3`` read; Gemma's ``head_dim``) take that family's defaults.
    """
    module_name, class_name = ROTARY_CLASSES[model_type]
    try:
        from transformers import AutoConfig

        module = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}")
    except ImportError as error:
        raise ModelError(
            f"this {family} checkpoint uses the {_variants(config_dict, kinds, family, model_type)} rotary variant, "
            f"which is computed with transformers; install it (pip install 'circuits-interp[hf]'): {error}"
        ) from error
    try:
        fields = {k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")}
        rotary = getattr(module, class_name)(AutoConfig.for_model(model_type, **fields))
        per_kind = model_type in PER_KIND
        return {kind: module_tables(rotary, seq_len, dtype, kind if per_kind else None) for kind in kinds}
    except Exception as error:  # transformers' own complaint about the rope parameters
        raise ModelError(
            f"{family}: transformers cannot compute the {_variants(config_dict, kinds, family, model_type)} rotary "
            f"tables from this config: {shown(str(error))}"
        ) from error


def _variants(config: Mapping[str, Any], kinds: list[str], family: str, model_type: str) -> str:
    """``'linear'`` (Gemma 3: ``'linear' (full_attention)``): the scaled variants of ``kinds``, for messages."""
    found = rope_kinds(family, config, model_type)
    per_kind = model_type in PER_KIND
    return ", ".join(repr(found[kind]["rope_type"]) + (f" ({kind})" if per_kind else "") for kind in kinds)
