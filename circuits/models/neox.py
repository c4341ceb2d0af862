"""GPT-NeoX (Pythia): layer norms with biases, partial rotary positions, a GELU MLP, parallel residual.

Named in the golden file's scheme (``circuits.transformer.names``), as GPT-2 for the
norms, projections, biases and MLP and as Llama for the rotation: per layer
``L``, ``'b{L}'`` is ``Add('b{L}.m', 'b{L}.resid_mid')`` and
``'b{L}.resid_mid'`` adds the head-summing Einsum ``'b{L}.a'``, the output
bias ``'a{L}.w.o_bias'`` and the previous residual.  With
``parallel_residual`` (GPT-NeoX's default, every Pythia) the MLP's norm
``'m{L}.norm'`` reads the layer's input, not ``'b{L}.resid_mid'``, so that
``'b{L}'`` is ``x + attn(ln1(x)) + mlp(ln2(x))``; without it the layer is
GPT-2's.

Queries and keys: ``'a.q_unrot'`` is ``Add('a.q_nobias', 'a{L}.w.q_bias')``
and ``'a.q'`` is ``Add('a.q_cos', 'a.q_sin')`` over the rotary tables
``'t.a.c.rope_cos'``/``'t.a.c.rope_sin'`` ``[S, d_head]``, as in Llama.  Only
the first ``rotary_dims`` entries of each head are rotated (``rotary_pct``):
the tables hold cos 1 and sin 0 beyond them, and ``'a.q_rot_half'`` carries
those entries unchanged, so they pass through exactly (``x * 1 + x * 0``)
while every node keeps Llama's name and shape.  With ``attention_bias=False``
the projections are the bare Einsums, named as their biased Adds would be.
The layer written out as a tree: docs/models.md.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.errors import ModelError, shown
from circuits.transformer.masks import causal_mask_array
from circuits.models import common
from circuits.models.common import ACTIVATIONS, einsum
from circuits.models.options import DEFAULT, NOT_ROTARY_TABLES, ModelOptions, takes_model_options
from circuits.models.gpt2 import mlp
from circuits.models.text import token_ids
from circuits.core.nodes import Add, Array, Circuit


@dataclasses.dataclass(frozen=True)
class NeoXConfig:
    n_layers: int
    n_heads: int
    d_model: int
    d_mlp: int
    vocab_size: int
    max_positions: int | None = None  # no limit when None
    ln_eps: float = 1e-5
    rotary_pct: float = 0.25  # the fraction of each head's dims that is rotated
    rope_theta: float = 10000.0
    act: str = "gelu"
    parallel_residual: bool = True
    attention_bias: bool = True  # biases on the query, key, value and output projections
    tie_word_embeddings: bool = False

    def __post_init__(self):
        common.check_config(
            self,
            ("n_heads", "d_model", "d_mlp", "vocab_size", "max_positions"),
            epsilons=("ln_eps",),
            flags=("parallel_residual", "attention_bias", "tie_word_embeddings"),
        )
        pct, theta = self.rotary_pct, self.rope_theta
        if isinstance(pct, bool) or not isinstance(pct, (int, float)) or not 0 <= pct <= 1:
            raise ModelError(f"NeoXConfig: rotary_pct={shown(repr(pct))} is not a number in [0, 1]")
        if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < float("inf"):
            raise ModelError(f"NeoXConfig: rope_theta={shown(repr(theta))} is not a finite positive number")
        if self.d_model % self.n_heads == 0 and self.rotary_dims % 2:
            raise ModelError(
                f"NeoXConfig: rotary_pct={pct} of d_head {self.d_head} rotates {self.rotary_dims} dims, "
                "an odd number (the rotation pairs dims up)"
            )

    @property
    def d_head(self) -> int:
        if self.d_model % self.n_heads:
            raise ModelError(f"GPT-NeoX: d_model {self.d_model} is not divisible by n_heads {self.n_heads}")
        return self.d_model // self.n_heads

    @property
    def rotary_dims(self) -> int:
        """The rotated dims per head, ``int(d_head * rotary_pct)`` as transformers computes them."""
        return int(self.d_head * self.rotary_pct)

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the builder takes, by circuit name, with its shape (GPT-2's names)."""
        d, h, c, v, m = self.d_model, self.n_heads, self.d_head, self.vocab_size, self.d_mlp
        shapes = {names.TOK_EMBEDS_WEIGHT: (v, d)}
        for layer in range(self.n_layers):
            a, m_ = names.attn_prefix(layer), names.mlp_prefix(layer)
            shapes[names.norm_weight(a, "scale")] = (d,)
            shapes[names.norm_weight(a, "bias")] = (d,)
            for which in "qkv":
                shapes[names.attn_weight(layer, which)] = (h, c, d)
                if self.attention_bias:
                    shapes[names.attn_weight(layer, f"{which}_bias")] = (h, 1, c)
            shapes[names.attn_weight(layer, "o")] = (h, d, c)
            if self.attention_bias:
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
        return shapes


def neox_rope_cos_sin(
    config: NeoXConfig, seq_len: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotary tables ``[seq_len, d_head]``: cos and sin of the first ``rotary_dims``, then 1 and 0.

    The angles are computed in float32 and then cast, as transformers'
    ``GPTNeoXRotaryEmbedding`` does (also in float64 models), so the circuit
    reproduces its numbers; the 1s and 0s leave the unrotated dims exact.
    """
    dims = config.rotary_dims
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dims, 2, dtype=torch.float) / dims))
    freqs = torch.arange(seq_len, dtype=torch.float)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    rest = config.d_head - dims
    cos = torch.cat((emb.cos(), torch.ones(seq_len, rest)), dim=-1)
    sin = torch.cat((emb.sin(), torch.zeros(seq_len, rest)), dim=-1)
    return cos.to(dtype), sin.to(dtype)


@takes_model_options(NOT_ROTARY_TABLES)
def build_neox(
    config: NeoXConfig,
    weights: Mapping[str, Any],
    tokens: Any = None,
    options: ModelOptions = DEFAULT,
) -> Circuit:
    """GPT-NeoX as a circuit whose root is the per-token loss ``'t.loss'``.

    ``weights`` maps the names of ``config.weight_shapes()`` to tensors; with
    ``tie_word_embeddings`` ``'t.w.unembed'`` may be left out.  Tokens and
    options (``attach`` too) as in ``build_attn_only``.
    """
    tokens = token_ids(tokens, options.tokenizer)
    if not isinstance(config, NeoXConfig):
        raise ModelError(f"build_neox needs a NeoXConfig, got {type(config).__name__}")
    common.check_activation("GPT-NeoX", config.act)
    optional = (names.UNEMBED_WEIGHT,) if config.tie_word_embeddings else ()
    tensors = common.check_weights(
        "GPT-NeoX", weights, config.weight_shapes(), optional=optional, attach=options.attach
    )
    dtype = common.weights_dtype(tensors)
    w = common.weight_arrays(tensors)
    toks = common.make_tokens(
        tokens, options, vocab_size=config.vocab_size, max_positions=config.max_positions
    )
    cos, sin = neox_rope_cos_sin(config, toks.seq_len, dtype)
    rotary = (Array(cos, name=names.ROPE_COS), Array(sin, name=names.ROPE_SIN), config.rotary_dims)
    mask = causal_mask_array(toks.seq_len, dtype) if options.causal else None
    act = ACTIVATIONS[config.act]

    resid: Circuit = common.embed(w[names.TOK_EMBEDS_WEIGHT], toks)
    for layer in range(config.n_layers):
        resid_mid = _attention(w, resid, layer, config.ln_eps, rotary, mask, options.neg_inf)
        mlp_in = resid if config.parallel_residual else resid_mid
        resid = Add(mlp(w, mlp_in, layer, config.ln_eps, act), resid_mid, name=names.block(layer))
    final = common.layer_norm(
        resid, *common.norm_weights(w, names.FINAL), config.ln_eps, name=names.FINAL_NORM
    )
    return common.loss_head(final, w[names.UNEMBED_WEIGHT], toks.targets)


def _attention(
    w: Mapping[str, Circuit],
    resid: Circuit,
    layer: int,
    eps: float,
    rotary: tuple[Circuit, Circuit, int],
    mask: Circuit | None,
    neg_inf: float,
) -> Add:
    """``'b{L}.resid_mid'``: the residual plus layer ``L``'s attention and its output bias (if any)."""
    norm = common.layer_norm(
        resid, *common.norm_weights(w, names.attn_prefix(layer)), eps, name=names.attn_norm(layer)
    )

    def projected(spec: str, which: str, unbiased: str, biased: str) -> Circuit:
        """The projection named ``biased`` whether or not it has a bias (as Llama's ``_project``)."""
        bias = w.get(names.attn_weight(layer, f"{which}_bias"))
        if bias is None:
            return einsum(spec, norm, w[names.attn_weight(layer, which)], name=biased)
        product = einsum(spec, norm, w[names.attn_weight(layer, which)], name=unbiased)
        return Add(product, bias, name=biased)

    q = _rotate(projected("qd,hcd->hqc", "q", names.Q_NOBIAS, names.Q_UNROTATED), rotary, names.Q)
    k = _rotate(projected("kd,hcd->hkc", "k", names.K_NOBIAS, names.K_UNROTATED), rotary, names.K)
    v = projected("kd,hVd->hkV", "v", names.V_NOBIAS, names.V)
    div = common.div_head_size(w[names.attn_weight(layer, "q")])
    out = common.attend(q, k, v, div, w[names.attn_weight(layer, "o")], layer, mask, neg_inf)
    o_bias = w.get(names.attn_weight(layer, "o_bias"))
    added = (out, resid) if o_bias is None else (out, o_bias, resid)
    return Add(*added, name=names.resid_mid(layer))


def _rotate(x: Circuit, rotary: tuple[Circuit, Circuit, int], name: str) -> Add:
    """``x * cos + rotate_half(x) * sin`` on the first ``dims`` entries (transformers' partial
    ``apply_rotary_pos_emb``); the others meet cos 1 and sin 0."""
    cos, sin, dims = rotary
    with_cos = einsum("hqc,qc->hqc", x, cos, name=names.rope_part(name, "cos"))
    rotated = common.rotate_half(x, name=names.rope_part(name, "rot_half"), dims=dims)
    with_sin = einsum("hqc,qc->hqc", rotated, sin, name=names.rope_part(name, "sin"))
    return Add(with_cos, with_sin, name=name)
