"""GPT-2: learned positions added to the residual stream, biases, a gelu_new MLP.

Named in the golden file's scheme.  Per layer ``L``::

    'b{L}' Add                         block output
      'b{L}.m' Add                     MLP output (with its bias)
        'm.proj_out' Einsum sM,dM->sd
          'm.act' GeneralFunction gelu_new
            'm.pre' Add
              'm.proj_in' Einsum sd,Md->sM
                'm{L}.norm' Add        layer norm of 'b{L}.resid_mid'
                'm{L}.w.proj_in' [d_mlp,d]
              'm{L}.w.in_bias' [d_mlp]
          'm{L}.w.proj_out' [d,d_mlp]
        'm{L}.w.out_bias' [d]
      'b{L}.resid_mid' Add
        'b{L}.a' Einsum hsV,hdV->sd    the heads' summed output, *without* the output bias
        'a{L}.w.o_bias' [d]
        previous residual ('b{L-1}', or 'embeds' for layer 0)

Attention is as in the attention-only model, with ``'a.q'`` etc. an Add of
``'a.q_nobias'`` and a ``[heads, 1, d_head]`` bias ``'a{L}.w.q_bias'``, and
causal by default (the golden file's masked form).  Keeping ``'b{L}.a'`` the
bare head-summing Einsum lets ``split_heads`` treat every family alike.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from circuits.errors import ModelError, shown
from circuits.models import common
from circuits.models.common import einsum, fn
from circuits.nodes import Add, Array, Circuit
from circuits.passes.attention import causal_mask_array

#: Activation names as Hugging Face spells them -> the GeneralFunction computing them.
ACTIVATIONS = {
    "gelu_new": "gelu_new",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "tanh": "tanh",
}


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
        shapes = {"t.w.tok_embeds": (v, d), "t.w.pos_embeds": (self.n_ctx, d)}
        for layer in range(self.n_layers):
            shapes[f"a{layer}.ln.w.scale"] = (d,)
            shapes[f"a{layer}.ln.w.bias"] = (d,)
            for which in "qkv":
                shapes[f"a{layer}.w.{which}"] = (h, c, d)
                shapes[f"a{layer}.w.{which}_bias"] = (h, 1, c)
            shapes[f"a{layer}.w.o"] = (h, d, c)
            shapes[f"a{layer}.w.o_bias"] = (d,)
            shapes[f"m{layer}.ln.w.scale"] = (d,)
            shapes[f"m{layer}.ln.w.bias"] = (d,)
            shapes[f"m{layer}.w.proj_in"] = (m, d)
            shapes[f"m{layer}.w.in_bias"] = (m,)
            shapes[f"m{layer}.w.proj_out"] = (d, m)
            shapes[f"m{layer}.w.out_bias"] = (d,)
        shapes["final.ln.w.scale"] = (d,)
        shapes["final.ln.w.bias"] = (d,)
        shapes["t.w.unembed"] = (v, d)
        shapes["t.w.unembed_bias"] = (v,)  # optional
        return shapes


def gpt2_random_weights(config: GPT2Config, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Random weights for ``config``; tied configs get no separate ``'t.w.unembed'``."""
    shapes = config.weight_shapes()
    del shapes["t.w.unembed_bias"]
    if config.tie_word_embeddings:
        del shapes["t.w.unembed"]
    scales = [n for n in shapes if n.endswith(".ln.w.scale")]
    return common.random_weights(shapes, seed=seed, dtype=dtype, ones=scales)


@common.checked_options()
def build_gpt2(
    config: GPT2Config,
    weights: Mapping[str, Any],
    tokens: Any = None,
    *,
    seq_len: int | None = None,
    batch_size: int | None = None,
    convention: str = "default",
    causal: bool = True,
    neg_inf: float = common.NEG_INF,
    attach: bool = False,
) -> Circuit:
    """GPT-2 as a circuit whose root is the per-token loss ``'t.loss'``.

    ``weights`` maps the names of ``config.weight_shapes()`` to tensors; with
    ``tie_word_embeddings`` ``'t.w.unembed'`` may be left out (the token
    embedding is used); ``'t.w.unembed_bias'`` is optional.  Tokens and
    options (``attach`` too) as in ``build_attn_only``.
    """
    if not isinstance(config, GPT2Config):
        raise ModelError(f"build_gpt2 needs a GPT2Config, got {type(config).__name__}")
    if not isinstance(config.act, str) or config.act not in ACTIVATIONS:
        raise ModelError(
            f"GPT-2: activation {shown(repr(config.act))} is not supported; supported: {sorted(ACTIVATIONS)}"
        )
    common.check_build_options(causal, neg_inf, attach)
    optional = ("t.w.unembed_bias",) + (("t.w.unembed",) if config.tie_word_embeddings else ())
    tensors = common.check_weights("GPT-2", weights, config.weight_shapes(), optional=optional, attach=attach)
    w = {name: Array(tensor, name=name) for name, tensor in tensors.items()}
    if "t.w.unembed" not in w:
        w["t.w.unembed"] = Array(tensors["t.w.tok_embeds"], name="t.w.unembed")
    toks = common.make_tokens(
        tokens,
        seq_len=seq_len,
        batch_size=batch_size,
        convention=convention,
        vocab_size=config.vocab_size,
        max_positions=config.n_ctx,
    )
    mask = causal_mask_array(toks.seq_len, common.weights_dtype(tensors)) if causal else None
    act = ACTIVATIONS[config.act]

    idxed = common.embed(w["t.w.tok_embeds"], toks)
    resid: Circuit = Add(idxed, common.positions(w["t.w.pos_embeds"], toks.seq_len), name="embeds")
    for layer in range(config.n_layers):
        a, m = f"a{layer}", f"m{layer}"
        norm = common.layer_norm(
            resid, w[f"{a}.ln.w.scale"], w[f"{a}.ln.w.bias"], config.ln_eps, name=f"{a}.norm"
        )
        q = Add(einsum("qd,hcd->hqc", norm, w[f"{a}.w.q"], name="a.q_nobias"), w[f"{a}.w.q_bias"], name="a.q")
        k = Add(einsum("kd,hcd->hkc", norm, w[f"{a}.w.k"], name="a.k_nobias"), w[f"{a}.w.k_bias"], name="a.k")
        v = Add(einsum("kd,hVd->hkV", norm, w[f"{a}.w.v"], name="a.v_nobias"), w[f"{a}.w.v_bias"], name="a.v")
        div = common.div_head_size(w[f"{a}.w.k"])
        out = common.attend(q, k, v, div, w[f"{a}.w.o"], layer, mask, neg_inf)
        resid_mid = Add(out, w[f"{a}.w.o_bias"], resid, name=f"b{layer}.resid_mid")

        m_norm = common.layer_norm(
            resid_mid, w[f"{m}.ln.w.scale"], w[f"{m}.ln.w.bias"], config.ln_eps, name=f"{m}.norm"
        )
        pre = Add(
            einsum("sd,Md->sM", m_norm, w[f"{m}.w.proj_in"], name="m.proj_in"),
            w[f"{m}.w.in_bias"],
            name="m.pre",
        )
        activated = fn(act, pre, name="m.act")
        mlp = Add(
            einsum("sM,dM->sd", activated, w[f"{m}.w.proj_out"], name="m.proj_out"),
            w[f"{m}.w.out_bias"],
            name=f"b{layer}.m",
        )
        resid = Add(mlp, resid_mid, name=f"b{layer}")
    final = common.layer_norm(
        resid, w["final.ln.w.scale"], w["final.ln.w.bias"], config.ln_eps, name="final.call"
    )
    return common.loss_head(final, w["t.w.unembed"], toks.targets, w.get("t.w.unembed_bias"))
