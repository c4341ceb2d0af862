"""Hugging Face models in memory and state dicts: ``from_hf``, ``from_hf_state_dict``, ``hf_to_weights``.

- ``from_hf(model, tokens)``: an in-memory ``GPT2LMHeadModel``,
  ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``MistralForCausalLM``,
  ``GemmaForCausalLM``, ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``, ``Phi3ForCausalLM``,
  ``MixtralForCausalLM`` (these nine are ``build_llama`` circuits), ``GPTNeoXForCausalLM`` (Pythia,
  ``build_neox``) or ``OPTForCausalLM`` (a ``build_gpt2`` circuit: ``hf_opt``); the config is read
  from the model.
- ``from_hf_state_dict(config, state_dict, tokens)``: the same from a config
  (object or ``config.json`` dict) and a state dict.

The per-family conversions are in ``hf_gpt2``, ``hf_llama`` (Qwen2, Qwen3, Mistral, the Gemmas,
Phi-3 and Mixtral too; their rotary variants: ``hf_rope``; Mixtral's experts: ``hf_mixtral``),
``hf_neox`` and ``hf_opt``; a checkpoint directory is read by ``checkpoint.load_hf_checkpoint``.  Weights are copied
(so later changes to the model do not make the circuit's array hashes stale)
and converted to the builders' layouts.  With ``attach=True`` they are not
copied: every weight array holds a view of the model's parameter (a transpose,
reshape or slice of it), so ``cc.evaluate(c).mean().backward()`` fills the
parameters' ``.grad`` as the model's own backward would (a tied embedding gets
both uses' gradients).  The caveat: an in-place update of a parameter (an
optimizer step) changes the arrays' tensors, so evaluating the circuit raises
``StaleTensorError``; rebuild it after each step.

Every mistake (an unknown option, a config field of the wrong kind, weights
that do not fit) is a ``ModelError`` naming the option, field or key at fault;
so is what the builders cannot reproduce (an unknown architecture or rotary
variant, a ``quantization_config``, a quantised tensor), never a circuit that
computes something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from circuits.errors import ModelError, shown
from circuits.models.common import CONVENTIONS
from circuits.models.gpt2 import build_gpt2
from circuits.models.hf_gpt2 import gpt2_config_from_hf, gpt2_weights_from_hf
from circuits.models.hf_llama import FAMILY_NAMES, FUSED, llama_config_from_hf, llama_weights_from_hf
from circuits.models.hf_rope import (
    PER_KIND,
    module_tables,
    rope_kinds,
    scaled_kinds,
    tables_from_transformers,
)
from circuits.models.hf_neox import neox_config_from_hf, neox_weights_from_hf
from circuits.models.hf_opt import opt_config_from_hf, opt_weights_from_hf
from circuits.models.llama import build_llama
from circuits.models.neox import build_neox
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.models.reading import get_field
from circuits.models.text import token_ids
from circuits.core.nodes import Circuit

SUPPORTED_HF = {
    "gpt2": "GPT2LMHeadModel",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "opt": "OPTForCausalLM",
}

#: model_types built by ``build_gpt2`` (OPT is GPT-2 with its positions offset: ``hf_opt``).
GPT2_LIKE = ("gpt2", "opt")


def _positions(tokens: Any, seq_len: int | None, convention: str) -> int | None:
    """Positions the tokens give (for the rotary tables); None to let the builder say what is wrong."""
    if not isinstance(convention, str) or convention not in CONVENTIONS:
        return None
    if tokens is None:
        positions = seq_len
    else:
        shape = getattr(tokens, "shape", None)
        if shape is None:
            try:
                shape = torch.as_tensor(tokens).shape
            except (TypeError, ValueError, RuntimeError):
                return None
        positions = int(shape[-1]) - CONVENTIONS[convention][0] if len(shape) else None
    return (
        positions
        if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0
        else None
    )


def _model_type(config: Any) -> str:
    model_type = get_field(config, "model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_HF:
        archs = get_field(config, "architectures")
        listed = ", ".join(map(str, archs)) if isinstance(archs, list) else archs
        raise ModelError(
            f"unsupported architecture: model_type {shown(repr(model_type))}"
            + (f" ({shown(str(listed))})" if listed else "")
            + f"; supported: {', '.join(f'{t!r} ({c})' for t, c in SUPPORTED_HF.items())}"
            + (
                "; a BERT encoder: models.from_hf_bert or models.load_sentence_transformer"
                if model_type == "bert"
                else ""
            )
        )
    return model_type


def _refuse_quantized(config: Any) -> None:
    """A quantised checkpoint or model (``quantization_config``: GPTQ, AWQ, bitsandbytes, fp8, ...) holds
    packed or scaled tensors the builders cannot read as weights: refused, naming the field and method."""
    quantization = get_field(config, "quantization_config")
    if quantization is None:
        return
    method = get_field(quantization, "quant_method")  # a dict's key, or a QuantizationConfig's attribute
    method = getattr(method, "value", method)  # transformers' QuantizationMethod enum
    raise ModelError(
        f"quantised models are not supported: the config's 'quantization_config' has quant_method "
        f"{shown(repr(method))}; load the unquantised weights (or dequantise them) and build from those"
    )


def config_for(config: Any) -> tuple[str, Any]:
    """``(model_type, builder config)`` from a Hugging Face config, every field checked.

    ``'gpt2'`` and ``'opt'`` have a ``GPT2Config``, ``'gpt_neox'`` a ``NeoXConfig``, every other model_type a
    ``LlamaConfig`` (Qwen2, Qwen3, Mistral, the Gemmas and Phi-3 are Llama variants).  A
    ``quantization_config`` is refused, naming it.
    """
    model_type = _model_type(config)
    _refuse_quantized(config)
    if model_type == "gpt2":
        return model_type, gpt2_config_from_hf(config)
    if model_type == "opt":
        return model_type, opt_config_from_hf(config)
    if model_type == "gpt_neox":
        return model_type, neox_config_from_hf(config)
    return model_type, llama_config_from_hf(config, model_type)


def hf_to_weights(
    config: Any, state_dict: Mapping[str, Any], attach: bool = False
) -> tuple[str, Any, dict[str, torch.Tensor]]:
    """``(model_type, builder config, weights)`` from a Hugging Face config (object or dict) and state dict.

    The weights are copies, or views of the state dict's tensors with ``attach``.
    """
    family, ours = config_for(config)
    if not isinstance(state_dict, Mapping) or not all(isinstance(k, str) for k in state_dict):
        raise ModelError(f"a state dict must map str keys to tensors, got {type(state_dict).__name__}")
    if family == "gpt2":
        return family, ours, gpt2_weights_from_hf(ours, state_dict, attach)
    if family == "opt":
        return family, ours, opt_weights_from_hf(ours, state_dict, attach)
    if family == "gpt_neox":
        return family, ours, neox_weights_from_hf(ours, state_dict, attach)
    weights = llama_weights_from_hf(ours, state_dict, attach, FAMILY_NAMES[family], fused=family in FUSED)
    return family, ours, weights


def _scaled_tables(
    config: Any,
    model_type: str,
    tokens: Any,
    seq_len: int | None,
    convention: str,
    dtype: torch.dtype,
) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """The tables of the layer kinds with a scaled rotary variant, computed by transformers (None: none
    has one, and the builder computes every table)."""
    family = FAMILY_NAMES[model_type]
    kinds = rope_kinds(family, config, model_type)
    scaled = scaled_kinds(kinds)
    if not scaled:
        return None
    seq = _positions(tokens, seq_len, convention)
    if seq is None:
        variants = ", ".join(repr(kinds[kind]["rope_type"]) for kind in scaled)
        raise ModelError(
            f"this {family} model's {variants} rotary tables need the number of positions: pass tokens "
            "(an int tensor [S+1] or [B,S+1]) or seq_len= (a positive int), and a known convention"
        )
    config_dict = config if isinstance(config, Mapping) else config.to_dict()
    return tables_from_transformers(family, config_dict, model_type, scaled, seq, dtype)


def _own_tables(
    model: Any, model_type: str, seq: int | None
) -> dict[str, tuple[torch.Tensor, torch.Tensor]] | None:
    """A Llama-style model's own rotary tables for ``seq`` positions, per layer kind; None where the
    positions are unknown (the builder then says what is wrong) or the model has no rotary module."""
    rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
    if seq is None or rotary is None:
        return None
    dtype = model.get_input_embeddings().weight.dtype
    kinds = rope_kinds(FAMILY_NAMES[model_type], model.config, model_type)
    per_kind = model_type in PER_KIND
    return {kind: module_tables(rotary, seq, dtype, kind if per_kind else None) for kind in kinds}


@takes_model_options()
def from_hf_state_dict(
    config: Any, state_dict: Mapping[str, Any], tokens: Any = None, options: ModelOptions = DEFAULT
) -> Circuit:
    """A circuit from a Hugging Face config (object or ``config.json`` dict) and a state dict.

    The options are the builder's (``build_gpt2``, ``build_llama`` or ``build_neox``), as in
    ``from_hf``; with ``attach`` the arrays are views of the state dict's tensors (see the
    module docstring).  ``rope`` (Llama-style only): the rotary ``(cos, sin)`` tables, or a
    mapping from layer kinds to them (as ``build_llama`` takes it); by default the builder
    computes them, or, for a scaled rotary variant, ``transformers`` does (``hf_rope``).
    """
    tokens = token_ids(tokens, options.tokenizer)
    options = options.evolve(tokenizer=None)  # the tokens are ids from here on
    family, ours, weights = hf_to_weights(config, state_dict, options.attach)
    if family in (*GPT2_LIKE, "gpt_neox"):
        if options.rope is not None:
            raise ModelError(f"rope= applies to Llama-style models ({', '.join(FAMILY_NAMES)}) only", "rope")
        build = build_gpt2 if family in GPT2_LIKE else build_neox
        return build(ours, weights, tokens, options)
    if options.rope is None:
        dtype = next(iter(weights.values())).dtype
        scaled = _scaled_tables(config, family, tokens, options.seq_len, options.convention, dtype)
        options = options.evolve(rope=scaled)
    return build_llama(ours, weights, tokens, options)


@takes_model_options({"rope": "the model's own rotary tables are used"})
def from_hf(model: Any, tokens: Any = None, options: ModelOptions = DEFAULT) -> Circuit:
    """A circuit equal to an in-memory model of ``SUPPORTED_HF`` (``GPT2LMHeadModel``,
    ``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``Qwen3ForCausalLM``, ``MistralForCausalLM``,
    ``GemmaForCausalLM``, ``Gemma2ForCausalLM``, ``Gemma3ForCausalLM``, ``Phi3ForCausalLM``,
    ``MixtralForCausalLM``, ``GPTNeoXForCausalLM`` or ``OPTForCausalLM``).

    ``tokens``: an int tensor ``[S+1]`` or ``[B,S+1]`` (inputs all but the
    last, targets all but the first; copied), or None with ``seq_len=`` (and
    ``batch_size=``) for a placeholder, or text with ``tokenizer=``.  ``options``: a
    ``models.ModelOptions``, its fields also keywords that override it (the builders'
    options): ``convention="golden"`` for ``[S+2]`` tokens, ``causal`` (the masked form, as
    the model computes it; the default), ``neg_inf`` (the masked scores' value), and
    ``attach=True`` to make every weight array a view of the model's parameter, so that a
    backward pass through the circuit fills ``model.parameters()``'s ``.grad`` (rebuild the
    circuit after an optimizer step: see the module docstring).  A Llama-style model's rotary
    tables are its own (a copy of its module computes them, so the model is left as it was),
    and so is a Gemma's embedding scale.  The root is the per-token loss ``'t.loss'``; the
    logits are ``'t.call'``.
    """
    tokens = token_ids(tokens, options.tokenizer)
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "state_dict"):
        raise ModelError(f"from_hf needs a Hugging Face model with a .config, got {type(model).__name__}")
    model_type = _model_type(config)
    expected = SUPPORTED_HF[model_type]
    if type(model).__name__ != expected:
        raise ModelError(
            f"from_hf: got a {type(model).__name__} ({model_type}); expected {expected} (a model with its LM head)"
        )
    state = model.state_dict(keep_vars=options.attach)
    if model_type not in (*GPT2_LIKE, "gpt_neox"):
        seq = _positions(tokens, options.seq_len, options.convention)
        options = options.evolve(rope=_own_tables(model, model_type, seq))
        embed_scale = getattr(model.get_input_embeddings(), "embed_scale", None)  # Gemmas: a buffer
        if isinstance(embed_scale, torch.Tensor):
            state = {**state, "model.embed_tokens.embed_scale": embed_scale}
    return from_hf_state_dict(config, state, tokens, options.evolve(tokenizer=None))
