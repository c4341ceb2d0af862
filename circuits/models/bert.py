"""BERT encoders: bidirectional attention, token-type and learned position embeddings, a norm after
each sublayer, a gelu MLP, and position-wise pooling into one vector (sentence embeddings).

Named in the golden file's scheme where the meaning carries over (``circuits.transformer.names``):
``'embeds'`` is the layer norm of ``'embeds.pre_norm'``, the sum of the token, token-type and
position embeddings.  Per layer ``L`` (post-norm, as TransformerLens's BERT block names its hooks):
``'b{L}.resid_mid'`` is the Add of the head-summing ``'b{L}.a'``, the output bias
``'a{L}.w.o_bias'`` and the layer's input; ``'a{L}.norm'`` its layer norm (the point ``ln1``), which
the MLP ``'b{L}.m'`` reads; ``'b{L}.pre_norm'`` the Add of ``'b{L}.m'`` and ``'a{L}.norm'``; and
``'b{L}'``, the stream the next layer reads, its layer norm.  ``'a.q'`` etc. are an Add of
``'a.q_nobias'`` and a ``[heads, 1, d_head]`` bias, as in GPT-2.

The inputs are Arrays to swap with ``update`` or ``ex.patch``: the tokens ``'toks_int_var'``
(the ``"prompt"`` convention: every token is an input, none a target), ``'token_type_ids'`` and
``'attention_mask'`` (1 for a token, 0 for padding: a padded key gets ``neg_inf`` added to its
scores, ``'a.key_bias'``, and is left out of mean pooling).  The root is the last hidden state
``'b{n-1}'``, or with ``pooling`` one vector per row, ``'pooled'``: ``"cls"`` the first token's,
``"pooler"`` BERT's pooler (``tanh`` of a dense layer on it), ``"mean"`` the mean over the tokens
the mask keeps (sentence-transformers' ``Pooling``); ``normalize=True`` scales it to unit length,
``'sentence_embedding'`` (its ``Normalize``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from circuits.core.nodes import Add, Array, Circuit, Index, Scalar
from circuits.errors import ModelError, shown
from circuits.models import common
from circuits.models.common import ACTIVATIONS, einsum, fn
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.models.text import token_ids
from circuits.transformer import names

#: What ``build_bert``'s ``pooling`` takes (None: no pooling, the root is the last hidden state).
POOLINGS = (None, "cls", "pooler", "mean")
#: The ``ModelOptions`` fields a BERT entry point does not take, and why (``takes_model_options``).
NOT_ENCODER_OPTIONS = {
    "convention": "every token of an encoder is an input (the 'prompt' convention), none a target",
    "causal": "an encoder attends both ways (padding is masked with attention_mask=)",
    "rope": "its positions are learned embeddings, not rotary",
}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    n_layers: int
    n_heads: int
    d_model: int
    d_mlp: int
    vocab_size: int
    n_positions: int
    type_vocab_size: int = 2
    ln_eps: float = 1e-12
    act: str = "gelu"

    def __post_init__(self):
        common.check_config(
            self,
            ("n_heads", "d_model", "d_mlp", "vocab_size", "n_positions", "type_vocab_size"),
            epsilons=("ln_eps",),
        )

    @property
    def d_head(self) -> int:
        if self.d_model % self.n_heads:
            raise ModelError(f"BERT: d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        return self.d_model // self.n_heads

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the builder takes, by circuit name, with its shape (the pooler's are optional)."""
        d, h, c, m = self.d_model, self.n_heads, self.d_head, self.d_mlp
        shapes = {
            names.TOK_EMBEDS_WEIGHT: (self.vocab_size, d),
            names.POS_EMBEDS_WEIGHT: (self.n_positions, d),
            names.TOKEN_TYPE_EMBEDS_WEIGHT: (self.type_vocab_size, d),
            names.norm_weight(names.EMBEDS, "scale"): (d,),
            names.norm_weight(names.EMBEDS, "bias"): (d,),
        }
        for layer in range(self.n_layers):
            a, m_ = names.attn_prefix(layer), names.mlp_prefix(layer)
            for which in "qkv":
                shapes[names.attn_weight(layer, which)] = (h, c, d)
                shapes[names.attn_weight(layer, f"{which}_bias")] = (h, 1, c)
            shapes[names.attn_weight(layer, "o")] = (h, d, c)
            shapes[names.attn_weight(layer, "o_bias")] = (d,)
            shapes[names.norm_weight(a, "scale")] = (d,)
            shapes[names.norm_weight(a, "bias")] = (d,)
            shapes[names.mlp_weight(layer, "proj_in")] = (m, d)
            shapes[names.mlp_weight(layer, "in_bias")] = (m,)
            shapes[names.mlp_weight(layer, "proj_out")] = (d, m)
            shapes[names.mlp_weight(layer, "out_bias")] = (d,)
            shapes[names.norm_weight(m_, "scale")] = (d,)
            shapes[names.norm_weight(m_, "bias")] = (d,)
        shapes[names.POOLER_WEIGHT] = (d, d)
        shapes[names.POOLER_BIAS_WEIGHT] = (d,)
        return shapes


_POOLER = (names.POOLER_WEIGHT, names.POOLER_BIAS_WEIGHT)


def bert_random_weights(config: BertConfig, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Random weights for ``config``, the pooler's included."""
    shapes = config.weight_shapes()
    scales = [n for n in shapes if n.endswith(names.norm_weight("", "scale"))]
    return common.random_weights(shapes, seed=seed, dtype=dtype, ones=scales)


@takes_model_options(NOT_ENCODER_OPTIONS)
def build_bert(
    config: BertConfig,
    weights: Mapping[str, Any],
    tokens: Any = None,
    options: ModelOptions = DEFAULT,
    *,
    token_type_ids: Any = None,
    attention_mask: Any = None,
    pooling: str | None = None,
    normalize: bool = False,
) -> Circuit:
    """A BERT encoder as a circuit (see the module docstring for its nodes and root).

    ``tokens``: token ids ``[S]`` or ``[B,S]`` (every one an input), or None with ``seq_len=``
    (and ``batch_size=``) for a placeholder, or text with ``tokenizer=``.  ``options``: a
    ``models.ModelOptions`` (its fields also keywords), but for ``NOT_ENCODER_OPTIONS``.  ``token_type_ids`` and
    ``attention_mask``: tensors of the tokens' shape (zeros and ones when None), copied.
    ``pooling``: one of ``POOLINGS``; ``normalize``: the pooled vector scaled to unit length
    (needs ``pooling``).  ``weights`` as ``config.weight_shapes()`` names them; the pooler's two
    are needed only by ``pooling="pooler"``.
    """
    tokens = token_ids(tokens, options.tokenizer)
    if not isinstance(config, BertConfig):
        raise ModelError(f"build_bert needs a BertConfig, got {type(config).__name__}")
    common.check_activation("BERT", config.act)
    _check_pooling(pooling, normalize)
    optional = () if pooling == "pooler" else _POOLER
    tensors = common.check_weights(
        "BERT", weights, config.weight_shapes(), optional=optional, attach=options.attach
    )
    dtype = common.weights_dtype(tensors)
    w = common.weight_arrays(tensors)
    toks = common.make_tokens(
        tokens,
        options.evolve(convention="prompt"),
        vocab_size=config.vocab_size,
        max_positions=config.n_positions,
    )
    types = _input_ids(token_type_ids, toks, config.type_vocab_size)
    mask = _mask(attention_mask, toks, dtype)
    key_bias = _key_bias(mask, config.n_heads, toks.seq_len, options.neg_inf)
    act = ACTIVATIONS[config.act]

    resid = _embed(w, toks, types, config.ln_eps)
    for layer in range(config.n_layers):
        normed_mid = _attention(w, resid, layer, key_bias, config.ln_eps)
        out = Add(_mlp(w, normed_mid, layer, act), normed_mid, name=names.pre_norm(layer))
        resid = _layer_norm(w, out, names.mlp_prefix(layer), config.ln_eps, names.block(layer))
    if pooling is None:
        return resid
    return _pooled(w, resid, mask, pooling, normalize)


def _check_pooling(pooling: Any, normalize: Any) -> None:
    if not isinstance(pooling, (str, type(None))) or pooling not in POOLINGS:
        raise ModelError(f"pooling={shown(repr(pooling))} is not one of {POOLINGS}")
    if not isinstance(normalize, bool):
        raise ModelError(f"normalize={shown(repr(normalize))} is not a bool (True or False)")
    if normalize and pooling is None:
        raise ModelError(
            "normalize=True scales the pooled vector: give pooling= too ('mean', 'cls', 'pooler')"
        )


def _input_ids(values: Any, toks: common.Tokens, vocab: int) -> Array:
    """``'token_type_ids'``: a private int64 copy of ``values`` (zeros when None), the tokens' shape."""
    shape = tuple(toks.var.shape)
    if values is None:
        return Array(torch.zeros(shape, dtype=torch.int64), name=names.TOKEN_TYPES)
    ids = _tensor(values, "token_type_ids", shape)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise ModelError(f"token_type_ids have dtype {ids.dtype}; expected integer ids")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise ModelError(
            f"token_type_ids range over [{int(ids.min())}, {int(ids.max())}] but the model has {vocab} types"
        )
    return Array(ids.to(torch.int64, copy=True), name=names.TOKEN_TYPES)


def _mask(values: Any, toks: common.Tokens, dtype: torch.dtype) -> Array:
    """``'attention_mask'``: 1 where a token counts, 0 for padding (ones when None), in the weights' dtype."""
    shape = tuple(toks.var.shape)
    if values is None:
        return Array(torch.ones(shape, dtype=dtype), name=names.ATTENTION_MASK)
    mask = _tensor(values, "attention_mask", shape)
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ModelError("attention_mask holds values other than 0 and 1")
    if not bool(mask.reshape(-1, shape[-1]).any(-1).all()):
        raise ModelError("attention_mask has a row of zeros: a sequence with no token to attend to or pool")
    return Array(mask.to(dtype, copy=True), name=names.ATTENTION_MASK)


def _tensor(values: Any, what: str, shape: tuple[int, ...]) -> torch.Tensor:
    try:
        tensor = torch.as_tensor(values).detach()
    except Exception as error:
        raise ModelError(f"{what} of type {type(values).__name__} are not a tensor ({error})") from error
    if tuple(tensor.shape) != shape or tensor.is_meta:
        raise ModelError(f"{what} have shape {list(tensor.shape)}; expected the tokens' shape {list(shape)}")
    return tensor


def _key_bias(mask: Array, heads: int, seq: int, neg_inf: float) -> Circuit:
    """``(1 - mask) * neg_inf`` per key, ``'a.key_bias'``, spread over heads and queries into the
    scores' shape ``[h, q, k]`` (``'a.score_neg_inf_bias'``), as Hugging Face's additive mask is."""
    flipped = einsum("k,->k", mask, Scalar(-1.0, name=names.NEG_ONE), name=names.NEG_MASK)
    not_mask = Add(Scalar(1.0, name=names.ONE), flipped, name=names.NOT_MASK)
    bias = einsum("k,->k", not_mask, Scalar(neg_inf, name=names.NEG_INF_SCALAR), name=names.KEY_BIAS)
    every_head, every_query = Scalar(1.0, shape=(heads,)), Scalar(1.0, shape=(seq,))
    return einsum("k,h,q->hqk", bias, every_head, every_query, name=names.SCORE_BIAS)


def _layer_norm(w: Mapping[str, Circuit], x: Circuit, prefix: str, eps: float, name: str) -> Add:
    return common.layer_norm(x, *common.norm_weights(w, prefix), eps, name=name)


def _embed(w: Mapping[str, Circuit], toks: common.Tokens, types: Array, eps: float) -> Add:
    """``'embeds'``: the layer norm of the token, token-type and position embeddings' sum (in
    Hugging Face's order of addition)."""
    token = common.embed(w[names.TOK_EMBEDS_WEIGHT], toks)
    typed = fn("gen_index_at_0_c", w[names.TOKEN_TYPE_EMBEDS_WEIGHT], types, name=names.TOKEN_TYPE_EMBEDS)
    position = common.positions(w[names.POS_EMBEDS_WEIGHT], toks.seq_len)
    total = Add(Add(token, typed), position, name=names.EMBEDS_PRE_NORM)
    return _layer_norm(w, total, names.EMBEDS, eps, names.EMBEDS)


def _attention(w: Mapping[str, Circuit], resid: Circuit, layer: int, key_bias: Circuit, eps: float) -> Add:
    """``'a{L}.norm'``: the layer norm of ``'b{L}.resid_mid'``, the input plus the attention and its bias."""

    def projected(spec: str, which: str, unbiased: str, biased: str) -> Add:
        product = einsum(spec, resid, w[names.attn_weight(layer, which)], name=unbiased)
        return Add(product, w[names.attn_weight(layer, f"{which}_bias")], name=biased)

    q = projected("qd,hcd->hqc", "q", names.Q_NOBIAS, names.Q)
    k = projected("kd,hcd->hkc", "k", names.K_NOBIAS, names.K)
    v = projected("kd,hVd->hkV", "v", names.V_NOBIAS, names.V)
    div = common.div_head_size(w[names.attn_weight(layer, "q")])
    raw = einsum("hqc,hkc,h->hqk", q, k, div, name=names.RAW_SCORES)
    probs = fn("softmax", Add(raw, key_bias, name=names.SCORES), name=names.PROBS)
    comb_v = einsum("hqk,hkV->hqV", probs, v, name=names.COMB_V)
    out = einsum("hsV,hdV->sd", comb_v, w[names.attn_weight(layer, "o")], name=names.attn_out(layer))
    mid = Add(out, w[names.attn_weight(layer, "o_bias")], resid, name=names.resid_mid(layer))
    return _layer_norm(w, mid, names.attn_prefix(layer), eps, names.attn_norm(layer))


def _mlp(w: Mapping[str, Circuit], x: Circuit, layer: int, act: str) -> Add:
    """``'b{L}.m'``: the MLP with its output bias, reading ``'a{L}.norm'``."""
    pre = Add(
        einsum("sd,Md->sM", x, w[names.mlp_weight(layer, "proj_in")], name=names.MLP_PROJ_IN),
        w[names.mlp_weight(layer, "in_bias")],
        name=names.MLP_PRE,
    )
    activated = fn(act, pre, name=names.MLP_ACT)
    return Add(
        einsum("sM,dM->sd", activated, w[names.mlp_weight(layer, "proj_out")], name=names.MLP_PROJ_OUT),
        w[names.mlp_weight(layer, "out_bias")],
        name=names.mlp_out(layer),
    )


def _pooled(w: Mapping[str, Circuit], hidden: Circuit, mask: Array, pooling: str, normalize: bool) -> Circuit:
    """``'pooled'`` ``[d]`` (or ``[B, d]``), and with ``normalize`` ``'sentence_embedding'``."""
    if pooling == "mean":  # sentence-transformers: sum(h * mask) / sum(mask)
        total = einsum("sd,s->d", hidden, mask, name=names.pool("sum"))
        count = einsum("s->", mask, name=names.pool("count"))
        recip = fn("reciprocal", count, name=names.pool("recip_count"))
        pooled: Circuit = einsum("d,->d", total, recip, name=names.POOLED)
    else:
        first = Index(hidden, common.batch_prefix(hidden.rank == 3) + (0,), name=names.pool("cls"))
        pooled = first.rename(names.POOLED) if pooling == "cls" else _pooler(w, first)
    if not normalize:
        return pooled
    squared = einsum("d,d->", pooled, pooled, name=names.pool("sq_norm"))
    scale = fn("rsqrt", squared, name=names.pool("rsqrt_norm"))
    return einsum("d,->d", pooled, scale, name=names.SENTENCE_EMBEDDING)


def _pooler(w: Mapping[str, Circuit], first: Circuit) -> Circuit:
    """BERT's pooler: ``tanh(W first + b)``."""
    dense = Add(
        einsum("d,ed->e", first, w[names.POOLER_WEIGHT]),
        w[names.POOLER_BIAS_WEIGHT],
        name=names.pool("dense"),
    )
    return fn("tanh", dense, name=names.POOLED)
