"""Llama-style decoders: RMSNorm, rotary positions, SwiGLU MLP, grouped-query attention.

Named in the golden file's scheme (``circuits.transformer.names``): per layer ``L``,
``'b{L}'`` is ``Add('b{L}.m', 'b{L}.resid_mid')``, with the SwiGLU output
``'b{L}.m'`` and ``'b{L}.resid_mid' = Add('b{L}.a', previous residual)``.
Norms are RMSNorms (``'rms.*'`` names).  Queries and keys are rotated
(``'a.q'`` is ``Add('a.q_cos', 'a.q_sin')`` over ``'a.q_unrot'`` and the
``'t.a.c.rope_cos'``/``'t.a.c.rope_sin'`` tables ``[S, d_head]``).  With fewer
key/value heads than query heads, ``'a.k'``/``'a.v'`` are an Index along the
head axis over ``'a.k_kv'``/``'a.v_kv'``, so every attention Einsum keeps one
head axis.  The ``1/sqrt(d_head)`` scale is read off ``'a{L}.w.q'``.  Causal by
default, in the golden file's masked form.  The layer written out as a tree:
docs/models.md.

Four relatives are the same builder with a few config fields: Qwen2 (``qkv_bias``:
``'a.q_unrot'``, ``'a.k_unrot'`` and ``'a.v'`` (or ``'a.v_kv'``) are Adds of
``'a.q_nobias'`` etc. and the ``[heads, 1, d_head]`` biases ``'a{L}.w.q_bias'``
etc., as in GPT-2), Mistral (``sliding_window``: the mask ``'t.a.c.causal_mask'``
also hides keys ``sliding_window`` or more positions back), Gemma
(``rms_unit_offset``: every RMSNorm scales by ``'rms.scale' = 1 + w``;
``embed_scale``: ``'idxed_embeds'`` is the gathered rows times ``sqrt(d_model)``;
a gelu gate, GeGLU) and Gemma 2 (also ``sandwich_norms``: ``'b{L}.a.post_norm'`` and
``'b{L}.m.post_norm'`` join the residual; ``attn_softcap`` and ``final_softcap``:
``cap * tanh(x / cap)`` of the masked raw scores and of the logits; ``sliding_layers``:
which layers the window masks, the others plain causal; ``query_pre_attn_scalar``: the
scores' scale ``'a.c.div_query_scalar'`` is ``1/sqrt`` of it).  Three more: Qwen3
(``qk_norm``: ``'a.q_norm'``/``'a.k_norm'`` are RMSNorms of each head's unrotated queries and
keys over ``d_head``, with the weights ``'a{L}.w.q_norm'``/``'a{L}.w.k_norm'``), Gemma 3 (Gemma 2
with ``qk_norm`` and ``rope_local_theta``: the ``sliding_layers`` rotate with the tables
``'t.a.c.rope_cos_local'``/``'t.a.c.rope_sin_local'`` of that base, see ``rotary``) and Phi-3
(``rotary_dims``: only each head's first ``rotary_dims`` entries are rotated).  Mixtral is Mistral
with ``n_experts``: each MLP a mixture of experts, ``experts_per_token`` chosen per token
(``circuits.models.moe``: ``'b{L}.m'`` the Add of the experts' ``'b{L}.m.expert{e}'``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError, shown
from circuits.transformer.masks import causal_mask_array
from circuits.models import common, moe
from circuits.models.rotary import layer_kinds, rope_arrays, rotated_dims
from circuits.models.text import token_ids
from circuits.models.common import ACTIVATIONS, einsum, fn
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.core.nodes import Add, Array, Circuit, Index, Scalar


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    n_layers: int
    n_heads: int
    d_model: int
    d_mlp: int
    vocab_size: int
    n_kv_heads: int | None = None  # n_heads when None (no grouped-query attention)
    d_head: int | None = None  # d_model // n_heads when None
    max_positions: int | None = None  # no limit when None
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    act: str = "silu"
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2: biases on the query, key and value projections
    sliding_window: int | None = None  # Mistral: each query sees its last sliding_window keys
    rms_unit_offset: bool = False  # Gemma: RMSNorms scale by (1 + w), their weights stored as offsets
    embed_scale: bool = False  # Gemma: token embeddings times sqrt(d_model)
    sandwich_norms: bool = False  # Gemma 2: RMSNorms on the attention's and the MLP's outputs too
    attn_softcap: float | None = None  # Gemma 2: scores become cap * tanh(scores / cap)
    final_softcap: float | None = None  # Gemma 2: logits become cap * tanh(logits / cap)
    sliding_layers: tuple[int, ...] | None = None  # Gemma 2: the layers windowed (None: all, as Mistral)
    qk_norm: bool = False  # Qwen3, Gemma 3: RMSNorms of each head's queries and keys (over d_head)
    query_pre_attn_scalar: float | None = None  # Gemma 2/3: scores scale by its 1/sqrt (None: d_head's)
    rope_local_theta: float | None = None  # Gemma 3: the sliding_layers' rotary base (None: rope_theta)
    rotary_dims: int | None = None  # Phi-3: only each head's first rotary_dims are rotated (None: all)
    n_experts: int | None = None  # Mixtral: each MLP a mixture of n_experts experts of d_mlp (None: one MLP)
    experts_per_token: int = 2  # Mixtral: the experts each token is routed to (top-k)

    def __post_init__(self):
        common.check_config(
            self,
            (
                "n_heads",
                "d_model",
                "d_mlp",
                "vocab_size",
                "n_kv_heads",
                "d_head",
                "max_positions",
                "sliding_window",
                "rotary_dims",
                "n_experts",
                "experts_per_token",
            ),
            epsilons=("rms_eps",),
            flags=(
                "tie_word_embeddings",
                "qkv_bias",
                "rms_unit_offset",
                "embed_scale",
                "sandwich_norms",
                "qk_norm",
            ),
        )
        for field in ("attn_softcap", "final_softcap", "query_pre_attn_scalar", "rope_local_theta"):
            cap = getattr(self, field)
            if cap is not None and (
                isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap < float("inf")
            ):
                raise ModelError(
                    f"LlamaConfig: {field}={shown(repr(cap))} is not None or a finite positive number"
                )
        layers = self.sliding_layers
        if layers is not None and (
            not isinstance(layers, tuple)
            or not all(type(i) is int and 0 <= i < self.n_layers for i in layers)
        ):
            raise ModelError(
                f"LlamaConfig: sliding_layers={shown(repr(layers))} is not None or a tuple of layer indices"
            )
        if self.n_experts is not None and self.experts_per_token > self.n_experts:
            raise ModelError(
                f"LlamaConfig: experts_per_token={self.experts_per_token} is more than n_experts={self.n_experts}"
            )
        theta = self.rope_theta
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
            raise ModelError(f"LlamaConfig: rope_theta={shown(repr(theta))} is not a finite positive number")

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_size(self) -> int:
        if self.d_head is not None:
            return self.d_head
        if self.d_model % self.n_heads:
            raise ModelError(
                f"Llama: d_model {self.d_model} is not divisible by n_heads {self.n_heads}; give d_head"
            )
        return self.d_model // self.n_heads

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the builder takes, by circuit name, with its shape."""
        d, h, g, c, v, m = (
            self.d_model,
            self.n_heads,
            self.kv_heads,
            self.head_size,
            self.vocab_size,
            self.d_mlp,
        )
        shapes = {names.TOK_EMBEDS_WEIGHT: (v, d)}
        for layer in range(self.n_layers):
            shapes[names.norm_weight(names.attn_prefix(layer), "scale", names.RMS)] = (d,)
            shapes[names.attn_weight(layer, "q")] = (h, c, d)
            shapes[names.attn_weight(layer, "k")] = (g, c, d)
            shapes[names.attn_weight(layer, "v")] = (g, c, d)
            shapes[names.attn_weight(layer, "o")] = (h, d, c)
            if self.qkv_bias:
                for which, count in (("q", h), ("k", g), ("v", g)):
                    shapes[names.attn_weight(layer, f"{which}_bias")] = (count, 1, c)
            if self.qk_norm:
                shapes[names.attn_weight(layer, "q_norm")] = (c,)
                shapes[names.attn_weight(layer, "k_norm")] = (c,)
            shapes[names.norm_weight(names.mlp_prefix(layer), "scale", names.RMS)] = (d,)
            if self.n_experts is not None:
                shapes.update(moe.moe_weight_shapes(layer, self.n_experts, d, m))
            else:
                shapes[names.mlp_weight(layer, "gate")] = (m, d)
                shapes[names.mlp_weight(layer, "up")] = (m, d)
                shapes[names.mlp_weight(layer, "down")] = (d, m)
            if self.sandwich_norms:
                shapes[post_norm_weight(names.attn_prefix(layer))] = (d,)
                shapes[post_norm_weight(names.mlp_prefix(layer))] = (d,)
        shapes[names.norm_weight(names.FINAL, "scale", names.RMS)] = (d,)
        shapes[names.UNEMBED_WEIGHT] = (v, d)
        if self.embed_scale:  # optional: the model's own factor (see ``_embed``)
            shapes[EMBED_SCALE] = ()
        return shapes


def post_norm_weight(prefix: str) -> str:
    """``'a3.post.rms.w.scale'``: the scale of Gemma 2's norm on layer 3's attention (or ``'m3'``: MLP) output."""
    return names.norm_weight(f"{prefix}.post", "scale", names.RMS)


def llama_random_weights(config: LlamaConfig, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Random weights for ``config``; tied configs get no separate ``'t.w.unembed'``."""
    shapes = config.weight_shapes()
    shapes.pop(EMBED_SCALE, None)
    if config.tie_word_embeddings:
        del shapes[names.UNEMBED_WEIGHT]
    qk_norms = {
        names.attn_weight(layer, f"{which}_norm") for layer in range(config.n_layers) for which in "qk"
    }
    scales = [n for n in shapes if n.endswith(names.norm_weight("", "scale", names.RMS)) or n in qk_norms]
    weights = common.random_weights(shapes, seed=seed, dtype=dtype, ones=scales)
    if config.rms_unit_offset:  # the weights are offsets from one: keep the effective scales near one
        for name in scales:
            weights[name] -= 1
    return weights


def sliding_window_mask_array(seq_len: int, window: int, dtype: torch.dtype | None = None) -> Array:
    """The causal mask that also hides keys ``window`` or more positions back (Mistral).

    Query ``q`` sees keys ``k`` with ``0 <= q - k < window``, as transformers'
    ``sliding_window_overlay`` (``kv_idx > q_idx - sliding_window``).  Named
    ``'t.a.c.causal_mask'`` like the plain one (and like any mask the
    ``causal_mask`` pass is given): it is the model's attention mask, and a
    window at least ``seq_len`` long gives exactly the plain causal mask.
    """
    offsets = torch.arange(seq_len)[:, None] - torch.arange(seq_len)[None, :]
    allowed = (offsets >= 0) & (offsets < window)
    return Array(allowed.to(torch.get_default_dtype() if dtype is None else dtype), name=names.CAUSAL_MASK)


def _masks(config: LlamaConfig, seq_len: int, dtype: torch.dtype) -> list[Array]:
    """Each layer's mask: the window's in the ``sliding_layers`` (every layer when None), else causal."""
    causal = causal_mask_array(seq_len, dtype)
    if config.sliding_window is None:
        return [causal] * config.n_layers
    window = sliding_window_mask_array(seq_len, config.sliding_window, dtype)
    windowed = range(config.n_layers) if config.sliding_layers is None else config.sliding_layers
    return [window if layer in windowed else causal for layer in range(config.n_layers)]


def _rotate(x: Circuit, cos: Circuit, sin: Circuit, name: str, dims: int | None = None) -> Add:
    """``x * cos + rotate_half(x) * sin`` (Hugging Face's ``apply_rotary_pos_emb``); with ``dims``
    (Phi-3's partial rotary) only the first ``dims`` entries are rotated, the others meet cos 1 and sin 0."""
    with_cos = einsum("hqc,qc->hqc", x, cos, name=names.rope_part(name, "cos"))
    rotated = common.rotate_half(x, name=names.rope_part(name, "rot_half"), dims=dims)
    with_sin = einsum("hqc,qc->hqc", rotated, sin, name=names.rope_part(name, "sin"))
    return Add(with_cos, with_sin, name=name)


@takes_model_options()
def build_llama(
    config: LlamaConfig,
    weights: Mapping[str, Any],
    tokens: Any = None,
    options: ModelOptions = DEFAULT,
) -> Circuit:
    """A Llama-style decoder as a circuit whose root is the per-token loss ``'t.loss'``.

    ``weights`` maps the names of ``config.weight_shapes()`` to tensors (with
    ``tie_word_embeddings`` ``'t.w.unembed'`` may be left out, and so may Gemma's
    ``'t.c.embed_scale'``).  ``rope`` gives the ``(cos, sin)`` tables ``[S, d_head]``
    for a scaled rotary variant (copied, never attached), or a mapping from the
    layer kinds ``'full_attention'`` and ``'sliding_attention'`` (Gemma 3's local
    layers) to such pairs; by default they are ``rope_cos_sin(config, S)`` (with
    ``rope_local_theta`` for the local layers).  Tokens and options (``attach``
    too) as in ``build_attn_only``.
    """
    tokens = token_ids(tokens, options.tokenizer)
    if not isinstance(config, LlamaConfig):
        raise ModelError(f"build_llama needs a LlamaConfig, got {type(config).__name__}")
    common.check_activation("Llama", config.act)
    heads, kv_heads = config.n_heads, config.kv_heads
    if heads % kv_heads:
        raise ModelError(f"Llama: {heads} query heads are not a multiple of {kv_heads} key/value heads")
    if config.head_size % 2:
        raise ModelError(f"Llama: rotary embedding needs an even head size, got d_head {config.head_size}")
    rotated_dims(config)
    optional = (names.UNEMBED_WEIGHT, EMBED_SCALE) if config.tie_word_embeddings else (EMBED_SCALE,)
    tensors = common.check_weights(
        "Llama", weights, config.weight_shapes(), optional=optional, attach=options.attach, copy=options.copy
    )
    dtype = common.weights_dtype(tensors)
    w = common.weight_arrays(tensors)
    toks = common.make_tokens(
        tokens, options, vocab_size=config.vocab_size, max_positions=config.max_positions
    )
    seq = toks.seq_len
    tables = rope_arrays(config, options.rope, seq, dtype)
    masks = _masks(config, seq, dtype) if options.causal else [None] * config.n_layers
    act = ACTIVATIONS[config.act]
    group = heads // kv_heads
    repeat = torch.arange(kv_heads).repeat_interleave(group) if group > 1 else None
    head_pick = None if repeat is None else common.batch_prefix(toks.batched) + (repeat,)

    resid = _embed(config, w, toks, dtype)
    for layer, kind in enumerate(layer_kinds(config)):
        resid_mid = _attention(
            w, resid, layer, config, tables[kind], head_pick, masks[layer], options.neg_inf
        )
        mlp = _post_norm(config, _mlp(w, resid_mid, layer, config, act), w, names.mlp_prefix(layer))
        resid = Add(mlp, resid_mid, name=names.block(layer))
    final = _rms_norm(config, resid, w, names.FINAL, names.FINAL_NORM)
    cap = config.final_softcap
    return common.loss_head(final, w[names.UNEMBED_WEIGHT], toks.targets, softcap=cap)


# Gemma's extra nodes (shared by every layer, like the norms' parts)
EMBED_UNSCALED = "idxed_embeds_unscaled"  #: the gathered embeddings before the sqrt(d_model) factor
EMBED_SCALE = "t.c.embed_scale"
RMS_ONE = "rms.c.one"
RMS_SCALE = "rms.scale"  #: ``1 + w``, the scale of a Gemma RMSNorm
RMS_UPCAST_WEIGHT = "rms.upcast_weight"  #: a bfloat16 or float16 Gemma norm's ``w`` in float32, for ``1 + w``


def _embed(config: LlamaConfig, w: Mapping[str, Circuit], toks: common.Tokens, dtype: torch.dtype) -> Circuit:
    """``'idxed_embeds'``, the residual before layer 0; with ``embed_scale`` (Gemma) the gathered rows
    times ``'t.c.embed_scale'``: the weights' own (``from_hf`` reads the model's buffer, which holds
    ``sqrt(d_model)`` rounded to the dtype the model was made in: float32 for a model made in float32
    and converted), else ``sqrt(d_model)`` rounded to the weights' dtype, as ``from_pretrained`` makes it."""
    if not config.embed_scale:
        return common.embed(w[names.TOK_EMBEDS_WEIGHT], toks)
    gathered = fn("gen_index_at_0_c", w[names.TOK_EMBEDS_WEIGHT], toks.inputs, name=EMBED_UNSCALED)
    factor = w.get(EMBED_SCALE)
    if factor is None:
        factor = Array(torch.tensor(config.d_model**0.5, dtype=dtype), name=EMBED_SCALE)
    return einsum("sd,->sd", gathered, factor, name=names.TOKEN_EMBEDS)


def _rms_norm(config: LlamaConfig, x: Circuit, w: Mapping[str, Circuit], prefix: str, name: str) -> Circuit:
    """The RMSNorm whose weight is ``prefix``'s (see ``_scaled_rms_norm``)."""
    return _scaled_rms_norm(config, x, w[names.norm_weight(prefix, "scale", names.RMS)], name)


def _scaled_rms_norm(config: LlamaConfig, x: Circuit, weight: Circuit, name: str, lead: str = "i") -> Circuit:
    """The RMSNorm of ``x``'s last axis (``lead``: the letters of the others, unbatched) with ``weight``;
    with ``rms_unit_offset`` (Gemma) it scales by ``'rms.scale' = 1 + w`` (Hugging Face's
    ``GemmaRMSNorm``: its weights start at zero).  A bfloat16 or float16 norm computes in float32
    (``common.rms_norm``); Gemma's ``1 + w`` too (``'rms.upcast_weight'``: ``1 + w`` in bfloat16 would
    round the offsets to multiples of 1/128)."""
    reduced = common.reduced_precision(weight)
    if config.rms_unit_offset:
        offset = common.upcast(weight, RMS_UPCAST_WEIGHT) if reduced else weight
        scale = Add(Scalar(1.0, name=RMS_ONE), offset, name=RMS_SCALE)
    else:
        scale = weight
    return common.rms_norm(
        x, scale, config.rms_eps, name, lead, reduced=reduced, scale_in_float32=config.rms_unit_offset
    )


def _post_norm(config: LlamaConfig, out: Circuit, w: Mapping[str, Circuit], prefix: str) -> Circuit:
    """Gemma 2's sandwich norm of an attention or MLP output ``'b{L}.a'``/``'b{L}.m'`` before it joins
    the residual, named ``'b{L}.a.post_norm'``/``'b{L}.m.post_norm'``; ``out`` itself otherwise."""
    if not config.sandwich_norms:
        return out
    return _rms_norm(config, out, w, f"{prefix}.post", f"{out.name}.post_norm")


def _attention(
    w: Mapping[str, Circuit],
    resid: Circuit,
    layer: int,
    config: LlamaConfig,
    rotary: tuple[Circuit, Circuit],
    head_pick: tuple | None,
    mask: Circuit | None,
    neg_inf: float,
) -> Add:
    """``'b{L}.resid_mid'``: the residual plus layer ``L``'s attention.

    ``head_pick`` indexes the key/value heads into one per query head (grouped-query
    attention), or is None when there are as many key/value heads as query heads.
    """
    norm = _rms_norm(config, resid, w, names.attn_prefix(layer), names.attn_norm(layer))

    def rotated(which: str, unrotated: str, name: str) -> Circuit:
        projected = _qk_normed(config, w, _project(w, norm, layer, which, unrotated), layer, which)
        return _rotate(projected, *rotary, name, config.rotary_dims)

    q = rotated("q", names.Q_UNROTATED, names.Q)
    if head_pick is None:
        k = rotated("k", names.K_UNROTATED, names.K)
        v = _project(w, norm, layer, "v", names.V)
    else:
        k = Index(rotated("k", names.K_UNROTATED, names.K_KV), head_pick, name=names.K)
        v = Index(_project(w, norm, layer, "v", names.V_KV), head_pick, name=names.V)
    div = _scores_scale(config, w, layer)
    out = common.attend(
        q, k, v, div, w[names.attn_weight(layer, "o")], layer, mask, neg_inf, softcap=config.attn_softcap
    )
    return Add(_post_norm(config, out, w, names.attn_prefix(layer)), resid, name=names.resid_mid(layer))


def _qk_normed(config: LlamaConfig, w: Mapping[str, Circuit], x: Circuit, layer: int, which: str) -> Circuit:
    """With ``qk_norm`` (Qwen3, Gemma 3), ``'a.q_norm'``/``'a.k_norm'``: the RMSNorm of each head's
    unrotated queries or keys ``x`` over ``d_head``, with the weight ``'a{L}.w.q_norm'``/``'a{L}.w.k_norm'``
    shared by the heads; ``x`` itself otherwise."""
    if not config.qk_norm:
        return x
    name = names.Q_NORM if which == "q" else names.K_NORM
    return _scaled_rms_norm(config, x, w[names.attn_weight(layer, f"{which}_norm")], name, lead="hq")


def _scores_scale(config: LlamaConfig, w: Mapping[str, Circuit], layer: int) -> Circuit:
    """The scores' per-head factor: ``'a.c.div_head_size'``, ``1/sqrt(d_head)`` read off ``'a{L}.w.q'``;
    with a ``query_pre_attn_scalar`` other than ``d_head`` (Gemma 2 and 3) that times
    ``'a.c.query_scale_factor'`` ``sqrt(d_head / query_pre_attn_scalar)``, named ``'a.c.div_query_scalar'``."""
    div = common.div_head_size(w[names.attn_weight(layer, "q")])
    scalar = config.query_pre_attn_scalar
    if scalar is None or scalar == config.head_size:
        return div
    factor = Scalar(math.sqrt(config.head_size / scalar), name=names.QUERY_SCALE_FACTOR)
    return einsum("h,->h", div, factor, name=names.QUERY_SCALE)


# The Einsum of each projection (the Llama builder's letters) and its name before a bias.
_PROJECTIONS = {
    "q": ("qd,hcd->hqc", names.Q_NOBIAS),
    "k": ("kd,hcd->hkc", names.K_NOBIAS),
    "v": ("kd,hVd->hkV", names.V_NOBIAS),
}


def _project(w: Mapping[str, Circuit], norm: Circuit, layer: int, which: str, name: str) -> Circuit:
    """The ``which`` projection ``[h, s, c]`` named ``name``: the Einsum, or (with QKV biases, Qwen2)
    an Add of the Einsum ``'a.{which}_nobias'`` and the ``[h, 1, c]`` bias, as GPT-2 writes it, so
    that ``name`` is the same activation whether or not the family has biases."""
    spec, unbiased = _PROJECTIONS[which]
    weight = w[names.attn_weight(layer, which)]
    bias = w.get(names.attn_weight(layer, f"{which}_bias"))
    if bias is None:
        return einsum(spec, norm, weight, name=name)
    return Add(einsum(spec, norm, weight, name=unbiased), bias, name=name)


def _mlp(w: Mapping[str, Circuit], resid_mid: Circuit, layer: int, config: LlamaConfig, act: str) -> Circuit:
    """``'b{L}.m'``: layer ``L``'s gated MLP (SwiGLU, or GeGLU with a gelu ``act``: Gemma), or with
    ``n_experts`` its mixture of experts (Mixtral: ``moe.moe_mlp``)."""
    norm = _rms_norm(config, resid_mid, w, names.mlp_prefix(layer), names.mlp_norm(layer))
    if config.n_experts is not None:
        return moe.moe_mlp(w, norm, layer, config.n_experts, config.experts_per_token, act)
    gate_in = einsum("sd,Md->sM", norm, w[names.mlp_weight(layer, "gate")], name=names.MLP_GATE)
    gate = fn(act, gate_in, name=names.MLP_ACT)
    up = einsum("sd,Md->sM", norm, w[names.mlp_weight(layer, "up")], name=names.MLP_UP)
    gated = einsum("sM,sM->sM", gate, up, name=names.MLP_GATED)
    return einsum("sM,dM->sd", gated, w[names.mlp_weight(layer, "down")], name=names.mlp_out(layer))
