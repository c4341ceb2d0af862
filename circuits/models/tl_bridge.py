"""TransformerLens 4's ``TransformerBridge`` read for ``from_transformer_lens``.

TransformerLens 4 removed ``HookedTransformer``: a model is a ``TransformerBridge``
around a Hugging Face model (``boot_transformers``, or any module wrapped by
``build_bridge_from_module``) or around TransformerLens's own small model
(``boot_native``), optionally in compatibility mode (``enable_compatibility_mode``:
folded norms, centred writing weights and unembedding, value biases folded into
``b_O``).  This module turns a bridge into what ``from_transformer_lens`` already
reads: a state dict in ``HookedTransformer``'s layout (the bridge components'
``W_Q``, ``b_O``, ``W_in``, ``ln1.w``, ... properties, which are the weights the
bridge computes with, processed or not) and a cfg with TransformerLens 3's
meanings.  Grouped keys and values stay grouped (``_W_K``), the rotary tables
are the wrapped model's own (any scaled variant), and the cfg's TransformerLens 4
sentinels become values (``attn_scale=-1`` is ``sqrt(d_head)``).

Only architectures whose bridge this reading reproduces are accepted
(``BRIDGE_FAMILIES``, each checked hook by hook in tests/test_models_tl_bridge.py);
any other, and any option the family's builder lacks, is a ``ModelError`` naming
``cfg.architecture`` or the field.  A Hugging Face model's own config is checked too
(``hf.config_for``: the options TransformerLens's cfg does not record).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch

from circuits.errors import ModelError, shown
from circuits.models.hf import config_for
from circuits.models.hf_rope import module_tables
from circuits.models.hf_opt import POSITION_OFFSET
from circuits.models.tl_config import LLAMA_LIKE, TL_FAMILIES, cfg_number, raw, tl_act

#: ``cfg.architecture`` of the bridges read -> the ``from_transformer_lens`` family.
#: ``TransformerLensNative`` (``boot_native``) is GPT-2's layout when its cfg says so.
BRIDGE_FAMILIES: dict[str, str] = {
    "GPT2LMHeadModel": "gpt2",
    "OPTForCausalLM": "opt",
    "GPTNeoXForCausalLM": "neox",
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "MistralForCausalLM": "mistral",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "TransformerLensNative": "gpt2",
}
#: The Hugging Face ``model_type`` each wrapped architecture must have.
_HF_MODEL_TYPES = {"neox": "gpt_neox"}

# TransformerLens 4 cfg fields (none of them TransformerLens 3's) that change the forward pass when set
# (true, not empty): no builder reproduces them.
_REFUSED_WHEN_SET = (
    "rotary_interleaved_cos_sin",
    "qk_norm_after_rope",
    "scale_embedding",
    "per_layer_head_dim",
    "per_layer_num_key_value_heads",
)

#: The keys of a bridge's own ``state_dict()`` (``'blocks.0.attn.q.weight'``): its layout depends on
#: the wrapped model (a Hugging Face GPT-2's are ``[in, out]``, a native model's ``[out, in]``).
_BRIDGE_STATE_KEY = re.compile(
    r"(embed|pos_embed|unembed|ln_final|blocks\.\d+\.(attn\.[qkvo]|mlp\.(in|out|gate)|ln[12]))\.(weight|bias)"
)


def is_bridge(source: Any) -> bool:
    """Whether ``source`` is a TransformerLens 4 ``TransformerBridge`` (without importing TransformerLens)."""
    return any(
        c.__name__ == "TransformerBridge" and c.__module__.startswith("transformer_lens.")
        for c in type(source).__mro__
    )


def refuse_bridge_state_dict(state: Mapping[str, Any]) -> None:
    """A bridge's ``state_dict()`` is refused, saying what to pass instead."""
    key = next((k for k in state if isinstance(k, str) and _BRIDGE_STATE_KEY.fullmatch(k)), None)
    if key is not None:
        raise ModelError(
            f"from_transformer_lens: {key!r} is a TransformerBridge state-dict key (TransformerLens 4), whose "
            "layout depends on the wrapped model; pass the bridge itself, or bridge.tl_parameters() with "
            "cfg=bridge.cfg"
        )


def _family(cfg: Any) -> str:
    architecture = raw(cfg, "architecture")
    if architecture not in BRIDGE_FAMILIES:
        raise ModelError(
            f"from_transformer_lens: a TransformerBridge with cfg.architecture {shown(repr(architecture))} is "
            f"not supported; supported: {', '.join(map(repr, BRIDGE_FAMILIES))}"
        )
    return BRIDGE_FAMILIES[architecture]


def _native_problems(cfg: Any) -> list[str]:
    """``boot_native`` options the GPT-2 builder lacks (the others are the family's cfg checks)."""
    problems = []
    if raw(cfg, "positional_embedding_type", "standard") == "rotary":
        problems.append(
            "positional_embedding_type='rotary' (TransformerLensNative rotates adjacent pairs, GPT-J style, "
            "which no builder here does)"
        )
    if raw(cfg, "n_key_value_heads") not in (None, raw(cfg, "n_heads")):
        problems.append(
            f"n_key_value_heads={raw(cfg, 'n_key_value_heads')!r} (the GPT-2 builder has no groups)"
        )
    return problems


def _effective_scale(cfg: Any, native: bool) -> float:
    """What the scores are divided by.  A native model divides by ``attn_scale`` when it is set (> 0) and
    ``use_attn_scale``, else by ``sqrt(d_head)``; a wrapped model's scale is its Hugging Face config's,
    which ``config_for`` has checked is ``sqrt(d_head)``."""
    d_head = raw(cfg, "d_head")
    root = math.sqrt(d_head) if isinstance(d_head, int) and d_head > 0 else None
    scale = raw(cfg, "attn_scale", -1.0)
    if native and raw(cfg, "use_attn_scale", True) and isinstance(scale, (int, float)) and scale > 0:
        return float(scale)
    return root


def tl3_cfg(cfg: Any, native: bool) -> dict[str, Any]:
    """A TransformerLens 4 cfg (``TransformerBridgeConfig`` or its dict) with TransformerLens 3's meanings,
    for ``tl_config.check_cfg`` and the family readers; those of ``_REFUSED_WHEN_SET`` refused here."""
    family = _family(cfg)
    fields = dict(cfg) if isinstance(cfg, Mapping) else dict(vars(cfg))
    problems = [f"{key}={shown(repr(raw(cfg, key)))}" for key in _REFUSED_WHEN_SET if raw(cfg, key)]
    if native:
        problems += _native_problems(cfg)
    if problems:
        raise ModelError(
            f"TransformerLens {family} cfg (cfg.architecture {raw(cfg, 'architecture')!r}) options not "
            f"supported: {'; '.join(problems)}"
        )
    fields["original_architecture"] = TL_FAMILIES[family]
    fields["attn_scale"] = _effective_scale(cfg, native)
    fields["use_attn_scale"] = True
    if native:  # NativeMLP: no act_fn is exact GELU, and the name is case-blind
        act = raw(cfg, "act_fn")
        fields["act_fn"] = "gelu" if act is None else act.lower() if isinstance(act, str) else act
    if fields.get("positional_embedding_type") == "rotary" and fields.get("rotary_dim") is None:
        fields["rotary_dim"] = fields.get("d_head")  # TransformerLens 4: None is the whole head
    norm = fields.get("normalization_type")
    if norm in ("LNPre", "RMSPre"):  # parameter-free norms: ours with unit weights (bridge_state fills them)
        fields["normalization_type"] = norm[:-3]
    return fields


def state_dict_cfg(cfg: Any) -> dict[str, Any]:
    """A TransformerLens 4 cfg given with a state dict (``bridge.tl_parameters()``): a native model's only,
    which its cfg describes whole.  A wrapped Hugging Face model's forward also depends on its own
    config (options TransformerLens 4's cfg does not record: GPT-2's ``scale_attn_weights``, the rotary
    tables), so the bridge itself is asked for."""
    fields = tl3_cfg(cfg, raw(cfg, "architecture") == "TransformerLensNative")
    if fields["architecture"] != "TransformerLensNative":
        raise ModelError(
            f"from_transformer_lens: a state dict with the TransformerLens 4 cfg of a wrapped Hugging Face "
            f"model (cfg.architecture {fields['architecture']!r}) is not read: pass the TransformerBridge, "
            "whose wrapped model's config holds what the cfg does not (attention scaling, rotary tables)"
        )
    return fields


def _tensor(component: Any, name: str) -> torch.Tensor | None:
    """``component.name`` if it is a tensor; None when absent (a bias the layer lacks)."""
    try:
        value = getattr(component, name)
    except (AttributeError, NotImplementedError, TypeError):
        return None
    return value if isinstance(value, torch.Tensor) else None


def _put(out: dict[str, Any], key: str, component: Any, name: str) -> None:
    value = _tensor(component, name)
    if value is not None:
        out[key] = value


def _norm(out: dict[str, Any], key: str, component: Any, cfg: Mapping[str, Any], pre: bool) -> None:
    """A norm's ``w`` (and ``b``); a parameter-free norm's unit weights."""
    _put(out, key + ".w", component, "w")
    _put(out, key + ".b", component, "b")
    if pre and key + ".w" not in out:
        d = cfg["d_model"]
        out[key + ".w"] = torch.ones(d, dtype=cfg.get("dtype") or torch.float32)
        if cfg.get("normalization_type") == "LN":
            out[key + ".b"] = torch.zeros(d, dtype=out[key + ".w"].dtype)


def _block(out: dict[str, Any], layer: int, block: Any, cfg: Mapping[str, Any], pre: bool) -> None:
    p = f"blocks.{layer}."
    attn = getattr(block, "attn", None)
    for name in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
        value = _tensor(attn, name)
        if value is None:
            continue
        grouped = name[-1] in "KV" and value.shape[0] != cfg["n_heads"]
        out[p + "attn." + ("_" if grouped else "") + name] = value  # HookedTransformer's GQA keys
    mlp = getattr(block, "mlp", None)
    for name in ("W_in", "W_out", "b_in", "b_out", "W_gate"):
        _put(out, p + "mlp." + name, mlp, name)
    for name in ("ln1", "ln2", "ln1_post", "ln2_post"):  # the post norms: Gemma 2's sandwich
        if hasattr(block, name):
            _norm(out, p + name, getattr(block, name), cfg, pre)


def _weights(bridge: Any, cfg: Mapping[str, Any], pre: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    _put(out, "embed.W_E", getattr(bridge, "embed", None), "W_E")
    if hasattr(bridge, "pos_embed"):
        _put(out, "pos_embed.W_pos", bridge.pos_embed, "W_pos")
    for layer, block in enumerate(getattr(bridge, "blocks", ())):
        _block(out, layer, block, cfg, pre)
    _norm(out, "ln_final", getattr(bridge, "ln_final", None), cfg, pre)
    _put(out, "unembed.W_U", getattr(bridge, "unembed", None), "W_U")
    _put(out, "unembed.b_U", getattr(bridge, "unembed", None), "b_U")
    return out


def _rope_tables(bridge: Any, cfg: Mapping[str, Any], positions: int | None, dtype: torch.dtype):
    """The wrapped model's own rotary tables ``[positions, d_head]`` (any scaled variant is the model's)."""
    rotary = getattr(getattr(bridge, "rotary_emb", None), "original_component", None)
    if rotary is None:
        raise ModelError(
            f"from_transformer_lens: the {cfg['architecture']} TransformerBridge has no rotary_emb component "
            "to take the rotary tables from"
        )
    if positions is None:
        raise ModelError(
            "from_transformer_lens: a rotary TransformerBridge's tables need the number of positions: pass "
            "tokens (an int tensor [S+1] or [B,S+1]) or seq_len= (a positive int), and a known convention"
        )
    return module_tables(rotary, positions, dtype)


def _check_agreement(fields: Mapping[str, Any], config: Any) -> None:
    """The bridge's cfg and its wrapped model's config must agree on what both hold (the epsilon, the
    activation): the bridge's norms compute with the cfg's epsilon, the circuit with the config's."""
    eps = getattr(config, "rms_eps", getattr(config, "ln_eps", None))
    problems = []
    if cfg_number(fields, "eps") != eps:
        problems.append(f"cfg.eps {fields['eps']!r} but the model's epsilon {eps!r}")
    if tl_act(fields) != config.act:
        problems.append(f"cfg.act_fn {fields['act_fn']!r} but the model's activation {config.act!r}")
    if problems:
        raise ModelError(
            f"from_transformer_lens: the TransformerBridge's cfg and its Hugging Face model's config "
            f"disagree: {'; '.join(problems)}"
        )


class BridgeReading(NamedTuple):
    """A ``TransformerBridge`` as ``from_transformer_lens`` builds it."""

    family: str
    state: dict[str, Any]  #: ``HookedTransformer``'s keys, the bridge's tensors
    cfg: dict[str, Any]  #: TransformerLens 3's meanings (``tl3_cfg``)
    config: Any  #: the builder config of the wrapped Hugging Face model (``hf.config_for``); None if native
    rope: tuple[torch.Tensor, torch.Tensor] | None  #: the wrapped model's rotary tables


def read_bridge(bridge: Any, positions: int | None) -> BridgeReading:
    """Read a ``TransformerBridge``; the tensors are the bridge's (views of its parameters where they can be).

    A wrapped Hugging Face model's builder config is its own config's (TransformerLens 4's cfg leaves some
    fields at defaults the model does not use: GPT-NeoX's rotary width and base), checked by
    ``hf.config_for``; the weights are the bridge's, so compatibility mode's processing is in them."""
    cfg = getattr(bridge, "cfg", None)
    if cfg is None:
        raise ModelError("from_transformer_lens: the TransformerBridge has no cfg attribute")
    native = raw(cfg, "architecture") == "TransformerLensNative"
    fields = tl3_cfg(cfg, native)
    family = BRIDGE_FAMILIES[fields["architecture"]]
    pre = raw(cfg, "normalization_type") in ("LNPre", "RMSPre")
    state = _weights(bridge, fields, pre)
    if native:
        return BridgeReading(family, state, fields, None, None)
    hf_config = getattr(getattr(bridge, "original_model", None), "config", None)
    model_type, config = config_for(hf_config)
    if model_type != _HF_MODEL_TYPES.get(family, family):
        raise ModelError(
            f"from_transformer_lens: the bridge's cfg.architecture is {fields['architecture']!r} but its "
            f"Hugging Face model's model_type is {model_type!r}"
        )
    _check_agreement(fields, config)
    if family == "opt" and "pos_embed.W_pos" in state:  # OPT looks positions up at position + 2
        state["pos_embed.W_pos"] = state["pos_embed.W_pos"][POSITION_OFFSET:]
    rope = None
    if family in LLAMA_LIKE:
        dtype = state["embed.W_E"].dtype if "embed.W_E" in state else torch.float32
        rope = _rope_tables(bridge, fields, positions, dtype)
    return BridgeReading(family, state, fields, config, rope)
