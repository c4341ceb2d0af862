"""TransformerLens models as circuits: ``from_transformer_lens(model_or_state_dict, tokens, family=...)``.

TransformerLens 4's ``TransformerBridge`` (compatibility mode or not) is read by ``tl_bridge`` into
the layout and cfg below, TransformerLens 3's ``HookedTransformer`` and state dicts directly.
Families (``tl_config.TL_FAMILIES``): ``"gpt2"`` and ``"attn_only"`` from a
state dict alone (keys: ``TRANSFORMER_LENS_KEYS``), ``"opt"`` (GPT-2's layout,
ReLU), and, with the model's cfg, the rotary ones: ``"llama"``, ``"qwen2"``,
``"mistral"``, ``"gemma"``, ``"gemma2"`` and ``"neox"`` (``tl_families``).
Weights are copied, or views of the state dict's tensors with ``attach=True``
(see ``circuits.models.hf``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError, shown
from circuits.models.attn_only import AttnOnlyConfig, build_attn_only
from circuits.models.common import CONVENTIONS
from circuits.models.gpt2 import GPT2Config, build_gpt2
from circuits.models.llama import build_llama
from circuits.models.neox import build_neox
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.models.reading import Reader
from circuits.models.tl_bridge import (
    BridgeReading,
    is_bridge,
    read_bridge,
    refuse_bridge_state_dict,
    state_dict_cfg,
)
from circuits.models.tl_config import (
    LLAMA_LIKE,
    STATE_ONLY,
    TL_FAMILIES,
    cfg_number,
    check_cfg,
    family_of,
    raw,
    tl_act,
)
from circuits.models.tl_families import (
    llama_config_from_tl,
    rope_table_keys,
    tl_rope_tables,
    llama_weights_from_tl,
    neox_config_from_tl,
    neox_weights_from_tl,
)
from circuits.models.text import token_ids
from circuits.core.nodes import Circuit

#: The TransformerLens ``HookedTransformer`` state-dict keys accepted for the GPT-2 layout
#: (``"gpt2"``, ``"opt"``, ``"attn_only"``; the rotary families': ``tl_families``), with
#: their shapes (H heads, d d_model, c d_head, M d_mlp, V vocab, P positions).
#: ``mlp.*`` keys are not for ``family="attn_only"``; ``b_Q``/``b_K``/``b_V``/``b_O``
#: must be all zero for ``family="attn_only"`` (its builder has no attention
#: biases); ``unembed.b_U`` is optional.  Buffers (``attn.mask``,
#: ``attn.IGNORE``, ``attn.rotary_sin``/``rotary_cos``, ``hook_*``) are ignored.  Folded layer norms
#: (``fold_ln=True``, TransformerLens's default in ``from_pretrained``) have no
#: ``ln*.w``/``ln*.b`` keys and are refused: load with
#: ``from_pretrained_no_processing`` or ``fold_ln=False``.
TRANSFORMER_LENS_KEYS = {
    "embed.W_E": "[V,d]",
    "pos_embed.W_pos": "[P,d]",
    "blocks.{L}.ln1.w": "[d]",
    "blocks.{L}.ln1.b": "[d]",
    "blocks.{L}.attn.W_Q": "[H,d,c]",
    "blocks.{L}.attn.W_K": "[H,d,c]",
    "blocks.{L}.attn.W_V": "[H,d,c]",
    "blocks.{L}.attn.W_O": "[H,c,d]",
    "blocks.{L}.attn.b_Q": "[H,c]",
    "blocks.{L}.attn.b_K": "[H,c]",
    "blocks.{L}.attn.b_V": "[H,c]",
    "blocks.{L}.attn.b_O": "[d]",
    "blocks.{L}.ln2.w": "[d]",
    "blocks.{L}.ln2.b": "[d]",
    "blocks.{L}.mlp.W_in": "[d,M]",
    "blocks.{L}.mlp.b_in": "[M]",
    "blocks.{L}.mlp.W_out": "[M,d]",
    "blocks.{L}.mlp.b_out": "[d]",
    "ln_final.w": "[d]",
    "ln_final.b": "[d]",
    "unembed.W_U": "[d,V]",
    "unembed.b_U": "[V]",
}

_TL_IGNORED = re.compile(r"(.*\.)?(hook_[\w.]*|mask|IGNORE|rotary_sin|rotary_cos)$")


def _ignored(key: str) -> bool:
    """Buffers of a ``HookedTransformer``'s state dict that are no weights (masks, rotary tables)."""
    return bool(_TL_IGNORED.match(key))


def _tl_dims(state: Mapping[str, Any], family: str) -> dict[str, int]:
    """The dimensions read off the tensors (``V d P H c L``, and ``M`` for GPT-2)."""
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise ModelError(
            f"from_transformer_lens needs a state dict (str keys to tensors), got {type(state).__name__}"
        )
    ranks = {"embed.W_E": 2, "pos_embed.W_pos": 2, "blocks.0.attn.W_Q": 3}
    if family != "attn_only":
        ranks["blocks.0.mlp.W_in"] = 2
    missing = [k for k in ranks if k not in state]
    if missing:
        hint = "; an attention-only model? use family='attn_only'" if missing == ["blocks.0.mlp.W_in"] else ""
        raise ModelError(
            f"TransformerLens {family}: missing {', '.join(repr(k) for k in missing)}, needed to read the "
            f"model's dimensions{hint}; accepted keys: "
            f"{', '.join(f'{k} {s}' for k, s in TRANSFORMER_LENS_KEYS.items())}",
            missing_keys=missing,
        )
    for key, rank in ranks.items():
        if not isinstance(state[key], torch.Tensor) or state[key].ndim != rank:
            shape = (
                list(state[key].shape) if isinstance(state[key], torch.Tensor) else type(state[key]).__name__
            )
            raise ModelError(
                f"TransformerLens {family}: {key!r} is {shape}, expected {TRANSFORMER_LENS_KEYS[key]}"
            )
    dims = dict(zip("Vd", state["embed.W_E"].shape))
    dims["P"] = state["pos_embed.W_pos"].shape[0]
    dims["H"], _, dims["c"] = state["blocks.0.attn.W_Q"].shape
    dims["L"] = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
    dims["M"] = state["blocks.0.mlp.W_in"].shape[-1] if family != "attn_only" else 0
    return dims


def _tl_layer(r: Reader, out: dict[str, Any], family: str, layer: int, dims: Mapping[str, int]) -> list[str]:
    """One block's weights into ``out`` (builder names); returns the attention biases that are not zero
    (the attention-only builder has none)."""
    d, H, c, M = dims["d"], dims["H"], dims["c"], dims["M"]
    p = f"blocks.{layer}."
    nonzero = []
    out[names.norm_weight(names.attn_prefix(layer), "scale")] = r.take(p + "ln1.w", (d,))
    out[names.norm_weight(names.attn_prefix(layer), "bias")] = r.take(p + "ln1.b", (d,))
    for which in "qkv":
        weight = r.take(p + f"attn.W_{which.upper()}", (H, d, c))
        out[names.attn_weight(layer, which)] = None if weight is None else weight.transpose(1, 2)
        bias = r.take(p + f"attn.b_{which.upper()}", (H, c), optional=family == "attn_only")
        if family != "attn_only":
            out[names.attn_weight(layer, f"{which}_bias")] = None if bias is None else bias.reshape(H, 1, c)
        elif bias is not None and bool(bias.any()):
            nonzero.append(p + f"attn.b_{which.upper()}")
    w_o = r.take(p + "attn.W_O", (H, c, d))
    out[names.attn_weight(layer, "o")] = None if w_o is None else w_o.transpose(1, 2)
    b_o = r.take(p + "attn.b_O", (d,), optional=family == "attn_only")
    if family == "attn_only":
        return nonzero + ([p + "attn.b_O"] if b_o is not None and bool(b_o.any()) else [])
    out[names.attn_weight(layer, "o_bias")] = b_o
    out[names.norm_weight(names.mlp_prefix(layer), "scale")] = r.take(p + "ln2.w", (d,))
    out[names.norm_weight(names.mlp_prefix(layer), "bias")] = r.take(p + "ln2.b", (d,))
    w_in = r.take(p + "mlp.W_in", (d, M))
    out[names.mlp_weight(layer, "proj_in")] = None if w_in is None else w_in.T
    out[names.mlp_weight(layer, "in_bias")] = r.take(p + "mlp.b_in", (M,))
    w_out = r.take(p + "mlp.W_out", (M, d))
    out[names.mlp_weight(layer, "proj_out")] = None if w_out is None else w_out.T
    out[names.mlp_weight(layer, "out_bias")] = r.take(p + "mlp.b_out", (d,))
    return nonzero


def _state_and_cfg(source: Any, cfg: Any, attach: bool) -> tuple[Mapping[str, Any], Any]:
    """The state dict and cfg of a ``HookedTransformer`` (``source.cfg``), or ``source`` and ``cfg`` (a
    TransformerLens 4 cfg read as ``tl_bridge.state_dict_cfg``)."""
    if isinstance(source, Mapping) or not (hasattr(source, "cfg") and hasattr(source, "state_dict")):
        if isinstance(source, Mapping):
            refuse_bridge_state_dict(source)
        if (
            cfg is not None
            and raw(cfg, "architecture") is not None
            and raw(cfg, "original_architecture") is None
        ):
            cfg = state_dict_cfg(cfg)
        return source, cfg
    if cfg is not None:
        raise ModelError(
            "from_transformer_lens: cfg= is given with a HookedTransformer, which has its own cfg"
        )
    return source.state_dict(keep_vars=attach), source.cfg


def _positions(tokens: Any, seq_len: Any, convention: Any) -> int | None:
    """The positions the circuit will have (for the rotary tables); None to let the builder refuse the call."""
    if not isinstance(convention, str) or convention not in CONVENTIONS:
        return None
    if tokens is None:
        count = seq_len
    else:
        try:
            shape = tuple(getattr(tokens, "shape", None) or torch.as_tensor(tokens).shape)
        except (TypeError, ValueError, RuntimeError):
            return None
        count = int(shape[-1]) - CONVENTIONS[convention][0] if shape else None
    return count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else None


def _check_direction(cfg: Any, causal: bool) -> None:
    """A bidirectional cfg built causal would be a different model: refused (``causal=True`` is
    the default, so a bidirectional model must ask for ``causal=False``)."""
    if causal and raw(cfg, "attention_dir", "causal") == "bidirectional":
        raise ModelError(
            "from_transformer_lens: the cfg's attention_dir is 'bidirectional' but causal=True (the default, "
            "as for every model); pass causal=False to build it unmasked",
            "causal",
        )


def _own_or_cfg(name: str, given: Any, cfg: Any, key: str, default: Any) -> Any:
    """An option the cfg also sets (``ln_eps`` as ``eps``, ``act`` as ``act_fn``): the cfg's when not given,
    refused when given unlike it."""
    if cfg is None:
        return default if given is None else given
    ours = tl_act(cfg) if key == "act_fn" else cfg_number(cfg, key)
    if given is not None and given != ours:
        raise ModelError(
            f"from_transformer_lens: {name}={shown(repr(given))} but the cfg's {key} is {ours!r}"
        )
    return ours


@takes_model_options({"rope": "computed from the cfg's rotary_base"})
def from_transformer_lens(
    state_dict: Any,
    tokens: Any = None,
    options: ModelOptions = DEFAULT,
    *,
    family: str | None = None,
    cfg: Any = None,
    ln_eps: float | None = None,
    act: str | None = None,
) -> Circuit:
    """A circuit from a TransformerLens 4 ``TransformerBridge``, a TransformerLens 3 ``HookedTransformer``,
    or a state dict in its layout (and ``cfg=``).

    A bridge (around a Hugging Face model of a family below, or ``boot_native``'s GPT-2 layout; in
    compatibility mode or not) brings its own cfg: the family is its ``cfg.architecture``'s
    (``tl_bridge.BRIDGE_FAMILIES``), a wrapped model's config and rotary tables are its own, and
    a native bridge's ``tl_parameters()`` is read with ``cfg=bridge.cfg``.

    Otherwise ``family`` is one of ``tl_config.TL_FAMILIES``; None reads it off the cfg's
    ``original_architecture``.  ``"gpt2"``, ``"attn_only"`` (shortformer
    positions, as the golden file) and ``"opt"`` build from a state dict alone
    (accepted keys: ``TRANSFORMER_LENS_KEYS``), their dimensions read off the
    tensors, ``ln_eps`` and ``act`` defaulting to 1e-5 and ``"gelu_new"``
    (OPT: ``"relu"``); the rotary families need the cfg (rotary base and width,
    windows, soft-caps are not in a state dict).  With a cfg, its ``eps`` and
    ``act_fn`` are used (``ln_eps``/``act`` must agree if given) and an option
    the builder cannot reproduce (folded layer norms among them) is refused.
    ``options``: a ``models.ModelOptions``, its fields also keywords that override it (the
    builders' options).  ``causal`` is True by default, as everywhere; a cfg whose
    ``attention_dir`` is ``"bidirectional"`` needs ``causal=False`` (a ModelError says so,
    rather than masking a model that was not).  With ``attach=True`` the
    arrays are views of the model's tensors (for gradients pass the model, or
    ``model.state_dict(keep_vars=True)``).
    """
    tokens = token_ids(tokens, options.tokenizer)
    options = options.evolve(tokenizer=None)  # the tokens are ids from here on
    if is_bridge(state_dict):
        if cfg is not None:
            raise ModelError(
                "from_transformer_lens: cfg= is given with a TransformerBridge, which has its own cfg"
            )
        reading = read_bridge(state_dict, _positions(tokens, options.seq_len, options.convention))
        return _from_bridge(reading, tokens, family, ln_eps, act, options)
    state, cfg = _state_and_cfg(state_dict, cfg, options.attach)
    family = family_of(family, cfg)
    if cfg is None and family not in (*STATE_ONLY, "opt"):
        raise ModelError(
            f"TransformerLens {family}: the state dict alone does not say the rotary base, epsilon or activation; "
            "pass the HookedTransformer, or its cfg as cfg="
        )
    if cfg is not None:
        own_tables = family in LLAMA_LIKE and isinstance(state, Mapping)
        check_cfg(family, cfg, own_tables and all(k in state for k in rope_table_keys(cfg)))
        _check_direction(cfg, options.causal)
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise ModelError(
            f"from_transformer_lens needs a HookedTransformer or a state dict (str keys to tensors), "
            f"got {type(state).__name__}"
        )
    ln_eps = _own_or_cfg("ln_eps", ln_eps, cfg, "eps", 1e-5)  # the rotary families' come from the cfg
    act = _own_or_cfg("act", act, cfg, "act_fn", "relu" if family == "opt" else "gelu_new")
    if family in LLAMA_LIKE:
        config = llama_config_from_tl(family, cfg)
        weights = llama_weights_from_tl(family, config, state, options.attach, _ignored)
        rope = tl_rope_tables(family, cfg, state, _positions(tokens, options.seq_len, options.convention))
        return build_llama(config, weights, tokens, options, rope=rope)
    if family == "neox":
        config = neox_config_from_tl(cfg)
        weights = neox_weights_from_tl(config, state, options.attach, _ignored)
        return build_neox(config, weights, tokens, options)
    return _gpt2_like(family, state, tokens, ln_eps, act, options)


def _from_bridge(
    reading: BridgeReading, tokens: Any, family: Any, ln_eps: Any, act: Any, options: ModelOptions
) -> Circuit:
    """A ``TransformerBridge`` (``tl_bridge.read_bridge``): a wrapped Hugging Face model's builder config is
    its own; the weights are the bridge's, read as a ``HookedTransformer``'s."""
    cfg = reading.cfg
    if isinstance(family, str) and family in TL_FAMILIES and family != reading.family:
        raise ModelError(
            f"from_transformer_lens: family={family!r} but the bridge's cfg.architecture is "
            f"{cfg['architecture']!r} (family {reading.family!r})"
        )
    family = family_of(family, cfg)
    check_cfg(family, cfg, own_tables=True)
    _check_direction(cfg, options.causal)
    ln_eps = _own_or_cfg("ln_eps", ln_eps, cfg, "eps", None)
    act = _own_or_cfg("act", act, cfg, "act_fn", None)
    if family in LLAMA_LIKE:
        weights = llama_weights_from_tl(family, reading.config, reading.state, options.attach, _ignored)
        return build_llama(reading.config, weights, tokens, options, rope=reading.rope)
    if family == "neox":
        weights = neox_weights_from_tl(reading.config, reading.state, options.attach, _ignored)
        return build_neox(reading.config, weights, tokens, options)
    return _gpt2_like(family, reading.state, tokens, ln_eps, act, options)


def _gpt2_like(
    family: str, state: Mapping[str, Any], tokens: Any, ln_eps: float, act: str, options: ModelOptions
) -> Circuit:
    """GPT-2 and OPT (``build_gpt2``) or the attention-only model (``build_attn_only``) from a state dict."""
    dims = _tl_dims(state, family)
    V, d, P, H, c, L = (dims[k] for k in "VdPHcL")
    r = Reader(f"TransformerLens {family}", state, options.attach)
    out: dict[str, Any] = {
        names.TOK_EMBEDS_WEIGHT: r.take("embed.W_E", (V, d)),
        names.POS_EMBEDS_WEIGHT: r.take("pos_embed.W_pos", (P, d)),
    }
    nonzero_biases = [key for layer in range(L) for key in _tl_layer(r, out, family, layer, dims)]
    out[names.norm_weight(names.FINAL, "scale")] = r.take("ln_final.w", (d,))
    out[names.norm_weight(names.FINAL, "bias")] = r.take("ln_final.b", (d,))
    w_u = r.take("unembed.W_U", (d, V))
    out[names.UNEMBED_WEIGHT] = None if w_u is None else w_u.T
    b_u = r.take("unembed.b_U", (V,), optional=True)
    if b_u is not None and bool(b_u.any()):
        out[names.UNEMBED_BIAS_WEIGHT] = b_u
    if r.missing and any(".ln1.w" in m or "ln_final.w" in m for m in r.missing):
        r.missing.append(
            "(no layer-norm weights: a state dict with folded layer norms is not supported; "
            "load with fold_ln=False / from_pretrained_no_processing)"
        )
    r.finish(ignore=_ignored)
    if nonzero_biases:
        raise ModelError(
            "TransformerLens attn_only: the attention-only builder has no attention biases, but "
            f"{', '.join(repr(k) for k in nonzero_biases)} are not all zero"
        )
    weights = r.weights(out)
    if family == "attn_only":
        config = AttnOnlyConfig(
            n_layers=L, n_heads=H, d_model=d, d_head=c, vocab_size=V, n_ctx=P, ln_eps=ln_eps
        )
        return build_attn_only(config, weights, tokens, options)
    if H * c != d:
        raise ModelError(f"TransformerLens {family}: {H} heads x d_head {c} != d_model {d}")
    config = GPT2Config(
        n_layers=L,
        n_heads=H,
        d_model=d,
        vocab_size=V,
        n_ctx=P,
        d_mlp=dims["M"],
        ln_eps=ln_eps,
        act=act,
        tie_word_embeddings=False,
    )
    return build_gpt2(config, weights, tokens, options)
