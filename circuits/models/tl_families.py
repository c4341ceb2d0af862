"""TransformerLens state dicts of the rotary families: Llama, Qwen2, Mistral, Gemma, Gemma 2 and GPT-NeoX.

TransformerLens writes every family in one layout (``W_Q [heads, d_model,
d_head]``, ``W_in [d_model, d_mlp]``, ...; TransformerLens's
``pretrained/weight_conversions``), so one reader per builder suffices:

- Llama-like (``build_llama``): grouped keys and values are ``_W_K``/``_W_V``
  (``[kv_heads, d_model, d_head]``) when the cfg has ``n_key_value_heads``,
  else ``W_K``/``W_V``.  Gemma's ``(1 + w)`` norm scales and ``sqrt(d_model)``
  embedding factor are already folded into TransformerLens's ``ln*.w`` and
  ``W_E`` (its unembedding is a separate ``W_U``), so the circuit is a plain
  Llama with those weights: no ``'rms.scale'`` or ``'t.c.embed_scale'`` nodes.
  Gemma 2's sandwich norms are ``ln1_post.w``/``ln2_post.w``; its soft-caps
  and windowed layers come from the cfg.  Qwen2 keeps ``b_Q``/``b_K``/``b_V``.
- GPT-NeoX (``build_neox``): the biases, layer norms and MLP are GPT-2's; the
  rotated width is the cfg's ``rotary_dim``; ``parallel_attn_mlp`` is the
  parallel residual.

Biases the builder lacks (``b_O``, ``b_in``, ``b_out``, ``b_U``; the Llama-like
``b_Q``/``b_K``/``b_V`` but Qwen2's) come as zeros from TransformerLens's
conversions and must stay zero: a nonzero one (``fold_value_biases=True`` moves
``b_V`` into ``b_O``) is refused, naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError
from circuits.models.llama import LlamaConfig, post_norm_weight
from circuits.models.neox import NeoXConfig
from circuits.models.reading import Reader
from circuits.models.tl_config import SCALED_ROPE, cfg_int, cfg_number, raw, softcap, tl_act


def _dims(cfg: Any) -> dict[str, int]:
    """``L H G d c M V P`` off the cfg (G: key/value heads)."""
    heads = cfg_int(cfg, "n_heads")
    kv = raw(cfg, "n_key_value_heads")
    return {
        "L": cfg_int(cfg, "n_layers", low=0),
        "H": heads,
        "G": heads if kv is None else cfg_int(cfg, "n_key_value_heads"),
        "d": cfg_int(cfg, "d_model"),
        "c": cfg_int(cfg, "d_head"),
        "M": cfg_int(cfg, "d_mlp"),
        "V": cfg_int(cfg, "d_vocab"),
        "P": cfg_int(cfg, "n_ctx"),
    }


class _Zeros:
    """The keys whose tensors must be zero (biases the builder has no node for) and those that are not."""

    def __init__(self, r: Reader):
        self.r = r
        self.nonzero: list[str] = []

    def take(self, key: str, shape: tuple[int, ...]) -> None:
        tensor = self.r.take(key, shape, optional=True)
        if tensor is not None and bool(tensor.detach().any()):
            self.nonzero.append(key)

    def check(self, family: str) -> None:
        if self.nonzero:
            raise ModelError(
                f"TransformerLens {family}: the builder has no node for {', '.join(map(repr, self.nonzero))}, "
                "which are not all zero (weight processing put them there: fold_value_biases moves b_V into b_O, "
                "fold_ln the final norm's bias into b_U; load with those off, or in TransformerLens 4 "
                "enable_compatibility_mode(fold_value_biases=False, fold_ln=False))"
            )


def _per_head_in(t: torch.Tensor | None) -> torch.Tensor | None:
    """``[heads, d_model, d_head]`` -> the builders' ``[heads, d_head, d_model]`` (a view)."""
    return None if t is None else t.transpose(1, 2)


def _llama_layer(
    r: Reader, zeros: _Zeros, out: dict[str, Any], layer: int, dims, config: LlamaConfig
) -> None:
    H, G, d, c, M = (dims[k] for k in "HGdcM")
    p = f"blocks.{layer}."
    a, m = names.attn_prefix(layer), names.mlp_prefix(layer)
    out[names.norm_weight(a, "scale", names.RMS)] = r.take(p + "ln1.w", (d,))
    grouped = "_" if p + "attn._W_K" in r.state else ""
    for which, heads, under in (("q", H, ""), ("k", G, grouped), ("v", G, grouped)):
        letter = which.upper()
        out[names.attn_weight(layer, which)] = _per_head_in(
            r.take(p + f"attn.{under}W_{letter}", (heads, d, c))
        )
        if config.qkv_bias:
            bias = r.take(p + f"attn.{under}b_{letter}", (heads, c))
            out[names.attn_weight(layer, f"{which}_bias")] = (
                None if bias is None else bias.reshape(heads, 1, c)
            )
        else:
            zeros.take(p + f"attn.{under}b_{letter}", (heads, c))
    out[names.attn_weight(layer, "o")] = _per_head_in(r.take(p + "attn.W_O", (H, c, d)))
    zeros.take(p + "attn.b_O", (d,))
    out[names.norm_weight(m, "scale", names.RMS)] = r.take(p + "ln2.w", (d,))
    if config.sandwich_norms:
        out[post_norm_weight(a)] = r.take(p + "ln1_post.w", (d,))
        out[post_norm_weight(m)] = r.take(p + "ln2_post.w", (d,))
    for ours, theirs in (("gate", "W_gate"), ("up", "W_in")):
        weight = r.take(p + f"mlp.{theirs}", (d, M))
        out[names.mlp_weight(layer, ours)] = None if weight is None else weight.T
    down = r.take(p + "mlp.W_out", (M, d))
    out[names.mlp_weight(layer, "down")] = None if down is None else down.T
    zeros.take(p + "mlp.b_in", (M,))
    zeros.take(p + "mlp.b_out", (d,))


def rope_table_keys(cfg: Any) -> list[str]:
    """The state-dict keys of TransformerLens's rotary tables, every layer's cos and sin."""
    return [
        f"blocks.{layer}.attn.rotary_{w}"
        for layer in range(cfg_int(cfg, "n_layers", low=0))
        for w in ("cos", "sin")
    ]


def tl_rope_tables(family: str, cfg: Any, state: Mapping[str, Any], positions: int | None):
    """TransformerLens's own ``(cos, sin)`` ``[positions, d_head]`` (its state dict's buffers, which hold
    any scaled variant and its float64 angles), or None when absent or too short for a plain rotary
    (then the builder computes the same tables); refused when layers differ or a scaled variant's are short."""
    keys = rope_table_keys(cfg)
    if not keys or not all(isinstance(state.get(k), torch.Tensor) for k in keys):
        return None  # without them check_cfg has refused a scaled variant
    scaled = any(raw(cfg, key, plain) != plain for key, plain in SCALED_ROPE.items())
    if positions is None:
        if scaled:
            raise ModelError(
                f"TransformerLens {family}: its scaled rotary tables need the number of positions: pass tokens "
                "(an int tensor [S+1] or [B,S+1]) or seq_len= (a positive int), and a known convention"
            )
        return None
    cos, sin = state[keys[0]].detach(), state[keys[1]].detach()
    if any(not torch.equal(state[k].detach(), state[keys[i % 2]].detach()) for i, k in enumerate(keys)):
        raise ModelError(
            f"TransformerLens {family}: the layers' rotary tables differ (per-layer bases or scaling)"
        )
    if positions <= cos.shape[0]:
        return cos[:positions], sin[:positions]
    if scaled:
        raise ModelError(
            f"TransformerLens {family}: its scaled rotary tables hold {cos.shape[0]} positions, fewer than "
            f"the {positions} asked for"
        )
    return None


def llama_config_from_tl(family: str, cfg: Any) -> LlamaConfig:
    """The ``LlamaConfig`` of a Llama-like TransformerLens cfg (Gemma's scales are in its weights)."""
    dims = _dims(cfg)
    if raw(cfg, "rotary_dim") != dims["c"]:
        raise ModelError(
            f"TransformerLens {family} cfg: rotary_dim {raw(cfg, 'rotary_dim')!r} is not d_head {dims['c']} "
            "(the Llama builder rotates whole heads)"
        )
    window = None
    sliding: tuple[int, ...] | None = None
    if raw(cfg, "use_local_attn", False):
        window = cfg_int(cfg, "window_size")
        kinds = raw(cfg, "attn_types")
        if not isinstance(kinds, (list, tuple)) or len(kinds) != dims["L"]:
            raise ModelError(f"TransformerLens {family} cfg: attn_types {kinds!r} is not one kind per layer")
        sliding = tuple(layer for layer, kind in enumerate(kinds) if kind == "local")
    return LlamaConfig(
        n_layers=dims["L"],
        n_heads=dims["H"],
        n_kv_heads=dims["G"],
        d_model=dims["d"],
        d_head=dims["c"],
        d_mlp=dims["M"],
        vocab_size=dims["V"],
        max_positions=dims["P"],
        rms_eps=cfg_number(cfg, "eps"),
        rope_theta=cfg_number(cfg, "rotary_base"),
        act=tl_act(cfg),
        qkv_bias=family == "qwen2",
        sliding_window=window,
        sliding_layers=sliding,
        sandwich_norms=bool(raw(cfg, "use_normalization_before_and_after", False)),
        attn_softcap=softcap(cfg, "attn_scores_soft_cap"),
        final_softcap=softcap(cfg, "output_logits_soft_cap"),
    )


def llama_weights_from_tl(
    family: str, config: LlamaConfig, state: Mapping[str, Any], attach: bool, ignore
) -> dict[str, torch.Tensor]:
    """The builder's weights from a Llama-like TransformerLens state dict (views until copied)."""
    dims = {"H": config.n_heads, "G": config.kv_heads, "d": config.d_model, "c": config.head_size}
    dims.update(M=config.d_mlp, V=config.vocab_size)
    r = Reader(f"TransformerLens {family}", state, attach)
    zeros = _Zeros(r)
    out: dict[str, Any] = {names.TOK_EMBEDS_WEIGHT: r.take("embed.W_E", (dims["V"], dims["d"]))}
    for layer in range(config.n_layers):
        _llama_layer(r, zeros, out, layer, dims, config)
    out[names.norm_weight(names.FINAL, "scale", names.RMS)] = r.take("ln_final.w", (dims["d"],))
    _unembed(r, zeros, out, dims)
    r.finish(ignore=ignore)
    zeros.check(family)
    return r.weights(out)


def _unembed(r: Reader, zeros: _Zeros, out: dict[str, Any], dims: Mapping[str, int]) -> None:
    w_u = r.take("unembed.W_U", (dims["d"], dims["V"]))
    out[names.UNEMBED_WEIGHT] = None if w_u is None else w_u.T
    zeros.take("unembed.b_U", (dims["V"],))


def neox_config_from_tl(cfg: Any) -> NeoXConfig:
    """The ``NeoXConfig`` of a GPT-NeoX TransformerLens cfg; ``rotary_dim`` becomes ``rotary_pct``."""
    dims = _dims(cfg)
    rotary = raw(cfg, "rotary_dim")
    if isinstance(rotary, bool) or not isinstance(rotary, int) or not 0 <= rotary <= dims["c"] or rotary % 2:
        raise ModelError(
            f"TransformerLens neox cfg: rotary_dim {rotary!r} is not an even int in [0, d_head {dims['c']}]"
        )
    if dims["H"] * dims["c"] != dims["d"] or dims["G"] != dims["H"]:
        raise ModelError(
            f"TransformerLens neox cfg: {dims['H']} heads x d_head {dims['c']} (and {dims['G']} key/value "
            f"heads) do not make d_model {dims['d']}"
        )
    config = NeoXConfig(
        n_layers=dims["L"],
        n_heads=dims["H"],
        d_model=dims["d"],
        d_mlp=dims["M"],
        vocab_size=dims["V"],
        max_positions=dims["P"],
        ln_eps=cfg_number(cfg, "eps"),
        rotary_pct=rotary / dims["c"],
        rope_theta=cfg_number(cfg, "rotary_base"),
        act=tl_act(cfg),
        parallel_residual=bool(raw(cfg, "parallel_attn_mlp", False)),
    )
    if config.rotary_dims != rotary:
        raise ModelError(f"TransformerLens neox cfg: rotary_dim {rotary} is not a whole fraction of d_head")
    return config


def neox_weights_from_tl(
    config: NeoXConfig, state: Mapping[str, Any], attach: bool, ignore
) -> dict[str, torch.Tensor]:
    """The builder's weights (GPT-2's names) from a GPT-NeoX TransformerLens state dict."""
    d, H, c, M, V = config.d_model, config.n_heads, config.d_head, config.d_mlp, config.vocab_size
    r = Reader("TransformerLens neox", state, attach)
    zeros = _Zeros(r)
    out: dict[str, Any] = {names.TOK_EMBEDS_WEIGHT: r.take("embed.W_E", (V, d))}
    for layer in range(config.n_layers):
        p = f"blocks.{layer}."
        for n, prefix in ((1, names.attn_prefix(layer)), (2, names.mlp_prefix(layer))):
            out[names.norm_weight(prefix, "scale")] = r.take(p + f"ln{n}.w", (d,))
            out[names.norm_weight(prefix, "bias")] = r.take(p + f"ln{n}.b", (d,))
        for which in "qkv":
            out[names.attn_weight(layer, which)] = _per_head_in(
                r.take(p + f"attn.W_{which.upper()}", (H, d, c))
            )
            bias = r.take(p + f"attn.b_{which.upper()}", (H, c))
            out[names.attn_weight(layer, f"{which}_bias")] = None if bias is None else bias.reshape(H, 1, c)
        out[names.attn_weight(layer, "o")] = _per_head_in(r.take(p + "attn.W_O", (H, c, d)))
        out[names.attn_weight(layer, "o_bias")] = r.take(p + "attn.b_O", (d,))
        w_in, w_out = r.take(p + "mlp.W_in", (d, M)), r.take(p + "mlp.W_out", (M, d))
        out[names.mlp_weight(layer, "proj_in")] = None if w_in is None else w_in.T
        out[names.mlp_weight(layer, "in_bias")] = r.take(p + "mlp.b_in", (M,))
        out[names.mlp_weight(layer, "proj_out")] = None if w_out is None else w_out.T
        out[names.mlp_weight(layer, "out_bias")] = r.take(p + "mlp.b_out", (d,))
    out[names.norm_weight(names.FINAL, "scale")] = r.take("ln_final.w", (d,))
    out[names.norm_weight(names.FINAL, "bias")] = r.take("ln_final.b", (d,))
    _unembed(r, zeros, out, {"d": d, "V": V})
    r.finish(ignore=ignore)
    zeros.check("neox")
    return r.weights(out)
