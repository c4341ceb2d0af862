"""GPT-2: learned positions added to the residual stream, biases, a gelu_new MLP.

Named in the golden file's scheme (``circuits.transformer.names``): per layer ``L``,
``'b{L}'`` is ``Add('b{L}.m', 'b{L}.resid_mid')``, the MLP output ``'b{L}.m'``
carries its bias, and ``'b{L}.resid_mid'`` adds the bare head-summing Einsum
``'b{L}.a'``, the output bias ``'a{L}.w.o_bias'`` and the previous residual
(``'embeds'`` for layer 0), so that ``split_heads`` treats every family alike.
``'a.q'`` etc. are an Add of ``'a.q_nobias'`` and a ``[heads, 1, d_head]``
bias.  Causal by default (the golden file's masked form).  The layer written
out as a tree: docs/models.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError
from circuits.transformer.masks import causal_mask_array
from circuits.models import common
from circuits.models.text import token_ids
from circuits.models.common import ACTIVATIONS, einsum, fn
from circuits.models.options import DEFAULT, NOT_ROTARY, ModelOptions, takes_model_options
from circuits.core.nodes import Add, Circuit


@dataclasses.dataclass(frozen=True)
class GPT2Config:
    n_layers: int
    n_heads: int
    d_model: int
    vocab_size: int
    n_ctx: int
    d_mlp: int | None = None  # 4 * d_model when None
    ln_eps: float = 1e-5
    act: str = "gelu_new"
    tie_word_embeddings: bool = True

    def __post_init__(self):
        common.check_config(
            self,
            ("n_heads", "d_model", "vocab_size", "n_ctx", "d_mlp"),
            epsilons=("ln_eps",),
            flags=("tie_word_embeddings",),
        )

    @property
    def d_head(self) -> int:
        if self.d_model % self.n_heads:
            raise ModelError(f"GPT-2: d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        return self.d_model // self.n_heads

    @property
    def mlp_size(self) -> int:
        return 4 * self.d_model if self.d_mlp is None else self.d_mlp

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the builder takes, by circuit name, with its shape."""
        d, h, c, v, m = self.d_model, self.n_heads, self.d_head, self.vocab_size, self.mlp_size
        shapes = {names.TOK_EMBEDS_WEIGHT: (v, d), names.POS_EMBEDS_WEIGHT: (self.n_ctx, d)}
        for layer in range(self.n_layers):
            a, m_ = names.attn_prefix(layer), names.mlp_prefix(layer)
            shapes[names.norm_weight(a, "scale")] = (d,)
            shapes[names.norm_weight(a, "bias")] = (d,)
            for which in "qkv":
                shapes[names.attn_weight(layer, which)] = (h, c, d)
                shapes[names.attn_weight(layer, f"{which}_bias")] = (h, 1, c)
            shapes[names.attn_weight(layer, "o")] = (h, d, c)
            shapes[names.attn_weight(layer, "o_bias")] = (d,)
            shapes[names.norm_weight(m_, "scale")] = (d,)
            shapes[names.norm_weight(m_, "bias")] = (d,)
            shapes[names.mlp_weight(layer, "proj_in")] = (m, d)
            shapes[names.mlp_weight(layer, "in_bias")] = (m,)
            shapes[names.mlp_weight(layer, "proj_out")] = (d, m)
            shapes[names.mlp_weight(layer, "out_bias")] = (d,)
        shapes[names.norm_weight(names.FINAL, "scale")] = (d,)
        shapes[names.norm_weight(names.FINAL, "bias")] = (d,)
        shapes[names.UNEMBED_WEIGHT] = (v, d)
        shapes[names.UNEMBED_BIAS_WEIGHT] = (v,)  # optional
        return shapes


def gpt2_random_weights(config: GPT2Config, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Random weights for ``config``; tied configs get no separate ``'t.w.unembed'``."""
    shapes = config.weight_shapes()
    del shapes[names.UNEMBED_BIAS_WEIGHT]
    if config.tie_word_embeddings:
        del shapes[names.UNEMBED_WEIGHT]
    scales = [n for n in shapes if n.endswith(names.norm_weight("", "scale"))]
    return common.random_weights(shapes, seed=seed, dtype=dtype, ones=scales)


@takes_model_options(NOT_ROTARY)
def build_gpt2(
    config: GPT2Config,
    weights: Mapping[str, Any],
    tokens: Any = None,
    options: ModelOptions = DEFAULT,
) -> Circuit:
    """GPT-2 as a circuit whose root is the per-token loss ``'t.loss'``.

    ``weights`` maps the names of ``config.weight_shapes()`` to tensors; with
    ``tie_word_embeddings`` ``'t.w.unembed'`` may be left out (the token
    embedding is used); ``'t.w.unembed_bias'`` is optional.  Tokens and
    options (``attach`` too) as in ``build_attn_only``.
    """
    tokens = token_ids(tokens, options.tokenizer)
    if not isinstance(config, GPT2Config):
        raise ModelError(f"build_gpt2 needs a GPT2Config, got {type(config).__name__}")
    common.check_activation("GPT-2", config.act)
    optional = (names.UNEMBED_BIAS_WEIGHT,) + ((names.UNEMBED_WEIGHT,) if config.tie_word_embeddings else ())
    tensors = common.check_weights(
        "GPT-2", weights, config.weight_shapes(), optional=optional, attach=options.attach, copy=options.copy
    )
    w = common.weight_arrays(tensors)
    toks = common.make_tokens(tokens, options, vocab_size=config.vocab_size, max_positions=config.n_ctx)
    mask = causal_mask_array(toks.seq_len, common.weights_dtype(tensors)) if options.causal else None
    act = ACTIVATIONS[config.act]

    idxed = common.embed(w[names.TOK_EMBEDS_WEIGHT], toks)
    resid: Circuit = Add(idxed, common.positions(w[names.POS_EMBEDS_WEIGHT], toks.seq_len), name=names.EMBEDS)
    for layer in range(config.n_layers):
        resid_mid = _attention(w, resid, layer, config.ln_eps, mask, options.neg_inf)
        resid = Add(mlp(w, resid_mid, layer, config.ln_eps, act), resid_mid, name=names.block(layer))
    final = common.layer_norm(
        resid, *common.norm_weights(w, names.FINAL), config.ln_eps, name=names.FINAL_NORM
    )
    return common.loss_head(final, w[names.UNEMBED_WEIGHT], toks.targets, w.get(names.UNEMBED_BIAS_WEIGHT))


def _attention(
    w: Mapping[str, Circuit], resid: Circuit, layer: int, eps: float, mask: Circuit | None, neg_inf: float
) -> Add:
    """``'b{L}.resid_mid'``: the residual plus layer ``L``'s attention and its output bias."""
    norm = common.layer_norm(
        resid, *common.norm_weights(w, names.attn_prefix(layer)), eps, name=names.attn_norm(layer)
    )
    out = attention_heads(w, norm, layer, mask, neg_inf)
    return Add(out, w[names.attn_weight(layer, "o_bias")], resid, name=names.resid_mid(layer))


def attention_heads(w: Mapping[str, Circuit], norm: Circuit, layer: int, mask, neg_inf: float) -> Circuit:
    """``'b{L}.a'``: layer ``L``'s heads summed, reading ``norm`` (biased q, k and v, GPT-2's nodes)."""

    def projected(spec: str, which: str, unbiased: str, biased: str) -> Add:
        product = einsum(spec, norm, w[names.attn_weight(layer, which)], name=unbiased)
        return Add(product, w[names.attn_weight(layer, f"{which}_bias")], name=biased)

    q = projected("qd,hcd->hqc", "q", names.Q_NOBIAS, names.Q)
    k = projected("kd,hcd->hkc", "k", names.K_NOBIAS, names.K)
    v = projected("kd,hVd->hkV", "v", names.V_NOBIAS, names.V)
    div = common.div_head_size(w[names.attn_weight(layer, "k")])
    return common.attend(q, k, v, div, w[names.attn_weight(layer, "o")], layer, mask, neg_inf)


def mlp(w: Mapping[str, Circuit], mlp_in: Circuit, layer: int, eps: float, act: str) -> Add:
    """``'b{L}.m'``: layer ``L``'s MLP with its output bias, reading ``mlp_in`` (``'b{L}.resid_mid'``;
    GPT-NeoX's parallel residual gives it the layer's input)."""
    norm = common.layer_norm(
        mlp_in, *common.norm_weights(w, names.mlp_prefix(layer)), eps, name=names.mlp_norm(layer)
    )
    pre = Add(
        einsum("sd,Md->sM", norm, w[names.mlp_weight(layer, "proj_in")], name=names.MLP_PROJ_IN),
        w[names.mlp_weight(layer, "in_bias")],
        name=names.MLP_PRE,
    )
    activated = fn(act, pre, name=names.MLP_ACT)
    return Add(
        einsum("sM,dM->sd", activated, w[names.mlp_weight(layer, "proj_out")], name=names.MLP_PROJ_OUT),
        w[names.mlp_weight(layer, "out_bias")],
        name=names.mlp_out(layer),
    )
