"""A TransformerLens ``HookedTransformerConfig`` read for ``from_transformer_lens``: the family, and refusals.

The state dict holds the weights; the cfg holds what a forward pass also needs
(epsilon, activation, rotary base and width, windows, soft-caps, parallel
layers).  Every cfg option that changes TransformerLens's forward and that the
family's builder does not reproduce is refused here, naming the field, so a
circuit is never silently unlike the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from circuits.errors import ModelError, shown
from circuits.models.common import ACTIVATIONS

#: ``from_transformer_lens`` families -> the Hugging Face architecture TransformerLens records in
#: ``cfg.original_architecture`` (None: no architecture, as TransformerLens's attention-only models).
TL_FAMILIES: dict[str, str | None] = {
    "gpt2": "GPT2LMHeadModel",
    "attn_only": None,
    "opt": "OPTForCausalLM",
    "neox": "GPTNeoXForCausalLM",
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "mistral": "MistralForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
}
#: The families built by ``build_llama`` (RMSNorm, rotary, gated MLP, grouped keys and values).
LLAMA_LIKE = ("llama", "qwen2", "mistral", "gemma", "gemma2")
#: The families whose state dict alone builds them (the cfg is optional).
STATE_ONLY = ("gpt2", "attn_only")

# TransformerLens's activation names that are ours under another name: torch's tanh gelu is our gelu_new.
_ACT_NAMES = {"gelu_pytorch_tanh": "gelu_new"}

# cfg fields that change the forward pass in ways no builder reproduces, with the value that is safe.
_REFUSED_UNLESS = {
    "use_qk_norm": False,
    "clip_qkv": None,
    "use_logn_attn": False,
    "use_dynamic_ntk_rope": False,
    "rotary_adjacent_pairs": False,
    "scale_attn_by_inverse_layer_idx": False,
    "post_embedding_ln": False,
    "num_experts": None,
    "use_attention_sinks": False,
    "load_in_4bit": False,
}
#: Scaled rotary variants: the Llama-like circuit takes TransformerLens's own tables (its state dict's
#: ``rotary_cos``/``rotary_sin``) for them; without those tables they are refused.
SCALED_ROPE = {"use_NTK_by_parts_rope": False, "use_yarn_rope": False, "rotary_scaling_factor": 1.0}


def raw(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg.key`` (a ``HookedTransformerConfig``) or ``cfg[key]`` (its ``to_dict()``), None kept."""
    return cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)


def family_of(family: Any, cfg: Any) -> str:
    """The family asked for, checked against the cfg's ``original_architecture``; read off it when None."""
    arch = None if cfg is None else raw(cfg, "original_architecture")
    by_arch = {a: f for f, a in TL_FAMILIES.items() if a is not None}
    if family is None:
        if cfg is None:
            raise ModelError(
                f"from_transformer_lens: give family= (one of {', '.join(map(repr, TL_FAMILIES))}) or the "
                "HookedTransformer (or cfg=) to read it from"
            )
        if arch in by_arch:
            return by_arch[arch]
        if raw(cfg, "attn_only", False) and raw(cfg, "positional_embedding_type") == "shortformer":
            return "attn_only"
        raise ModelError(
            f"from_transformer_lens: cfg.original_architecture {shown(repr(arch))} is not a supported "
            f"family; supported: {', '.join(f'{f!r} ({a})' for f, a in TL_FAMILIES.items() if a)}"
        )
    if not isinstance(family, str) or family not in TL_FAMILIES:
        raise ModelError(
            f"from_transformer_lens: family {shown(repr(family))} is not one of "
            f"{', '.join(map(repr, TL_FAMILIES))}"
        )
    if arch in by_arch and by_arch[arch] != family:
        raise ModelError(
            f"from_transformer_lens: family={family!r} but cfg.original_architecture is {arch!r} "
            f"(family {by_arch[arch]!r})"
        )
    return family


def tl_act(cfg: Any) -> str:
    """The cfg's ``act_fn`` as our activation name, refused if we have none like it."""
    act = raw(cfg, "act_fn")
    ours = _ACT_NAMES.get(act, act)
    if not isinstance(ours, str) or ours not in ACTIVATIONS:
        raise ModelError(
            f"TransformerLens cfg: act_fn {shown(repr(act))} is not supported; supported: "
            f"{sorted(set(ACTIVATIONS) | set(_ACT_NAMES))}"
        )
    return ours


def _expected(family: str) -> dict[str, Any]:
    """The cfg values the family's builder assumes."""
    rotary = family == "neox" or family in LLAMA_LIKE
    positions = "rotary" if rotary else ("shortformer" if family == "attn_only" else "standard")
    expected = {
        "normalization_type": "RMS" if family in LLAMA_LIKE else "LN",
        "positional_embedding_type": positions,
        "attn_only": family == "attn_only",
        "gated_mlp": family in LLAMA_LIKE,
        "use_attn_scale": True,
    }
    if family not in LLAMA_LIKE:
        expected.update(final_rms=False, use_local_attn=False, use_normalization_before_and_after=False)
    if family != "neox":
        expected["parallel_attn_mlp"] = False
    return expected


def check_cfg(family: str, cfg: Any, own_tables: bool = False) -> None:
    """Refuse, naming every field at fault, a cfg whose forward the family's builder would not reproduce.

    ``own_tables``: the circuit takes TransformerLens's rotary tables, so a scaled variant is fine."""
    problems = []
    norm = raw(cfg, "normalization_type")
    if norm in ("LNPre", "RMSPre"):
        problems.append(
            f"normalization_type={norm!r} (folded layer norms: load with fold_ln=False, e.g. "
            "from_pretrained_no_processing)"
        )
    refused = {**_REFUSED_UNLESS, **({} if own_tables else SCALED_ROPE), **_expected(family)}
    for key, value in refused.items():
        have = raw(cfg, key, value)
        if have != value and not (key == "normalization_type" and norm in ("LNPre", "RMSPre")):
            problems.append(f"{key}={shown(repr(have))} (expected {value!r} for family {family!r})")
    if raw(cfg, "rotary_base_local") not in (None, raw(cfg, "rotary_base")):
        problems.append(f"rotary_base_local={shown(repr(raw(cfg, 'rotary_base_local')))} (per-layer bases)")
    scale, d_head = raw(cfg, "attn_scale"), raw(cfg, "d_head")
    if isinstance(d_head, int) and d_head > 0 and scale is not None and float(scale) != math.sqrt(d_head):
        problems.append(
            f"attn_scale={scale!r} (the builders divide the scores by sqrt(d_head) = {d_head**0.5})"
        )
    if family not in LLAMA_LIKE:  # only the Llama builder soft-caps
        for key in ("attn_scores_soft_cap", "output_logits_soft_cap"):
            if softcap(cfg, key) is not None:
                problems.append(f"{key}={shown(repr(raw(cfg, key)))} (no soft-caps in family {family!r})")
    if raw(cfg, "attention_dir", "causal") not in ("causal", "bidirectional"):
        problems.append(f"attention_dir={shown(repr(raw(cfg, 'attention_dir')))}")
    if problems:
        raise ModelError(f"TransformerLens {family} cfg options not supported: {'; '.join(problems)}")


def cfg_int(cfg: Any, key: str, low: int = 1) -> int:
    """An int field of the cfg ``>= low``."""
    value = raw(cfg, key)
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ModelError(f"TransformerLens cfg: {key!r} is {shown(repr(value))}; expected an int >= {low}")
    return value


def cfg_number(cfg: Any, key: str) -> float:
    """A finite positive number field of the cfg (an epsilon, a rotary base)."""
    value = raw(cfg, key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ModelError(
            f"TransformerLens cfg: {key!r} is {shown(repr(value))}; expected a finite number > 0"
        )
    return float(value)


def softcap(cfg: Any, key: str) -> float | None:
    """A soft-cap field: None when disabled (TransformerLens: not > 0), else the cap."""
    value = raw(cfg, key)
    if value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and value <= 0):
        return None
    return cfg_number(cfg, key)
