"""Attention-only transformers in the style of ../shared/golden/attn_only_2l.circ.

Token embedding by ``gen_index``, shortformer positions (added to the
query/key input only), layer norm written out, attention with heads as an
axis, a final layer norm, unembedding, log-softmax and the per-token loss.
The builder writes attention *unsplit* and, by default, *causal* (masked, as
every model is trained); built with ``causal=False`` (unmasked), ``cc.passes.causal_mask``
then ``cc.passes.split_heads`` turn the 2-layer build at the golden dimensions into the
golden file (all but the array hashes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from circuits.transformer import names
from circuits.transformer.masks import causal_mask_array
from circuits.models import common
from circuits.models.text import token_ids
from circuits.models.common import einsum
from circuits.models.options import DEFAULT, NOT_ROTARY, ModelOptions, takes_model_options
from circuits.core.nodes import Add, Array, Circuit


@dataclasses.dataclass(frozen=True)
class AttnOnlyConfig:
    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    vocab_size: int
    n_ctx: int
    ln_eps: float = 1e-5

    def __post_init__(self):
        common.check_config(
            self, ("n_heads", "d_model", "d_head", "vocab_size", "n_ctx"), epsilons=("ln_eps",)
        )

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the builder takes, by circuit name, with its shape."""
        d, h, c, v = self.d_model, self.n_heads, self.d_head, self.vocab_size
        shapes = {names.TOK_EMBEDS_WEIGHT: (v, d), names.POS_EMBEDS_WEIGHT: (self.n_ctx, d)}
        for layer in range(self.n_layers):
            shapes[names.norm_weight(names.attn_prefix(layer), "scale")] = (d,)
            shapes[names.norm_weight(names.attn_prefix(layer), "bias")] = (d,)
            for which in "qkv":
                shapes[names.attn_weight(layer, which)] = (h, c, d)
            shapes[names.attn_weight(layer, "o")] = (h, d, c)
        shapes[names.norm_weight(names.FINAL, "scale")] = (d,)
        shapes[names.norm_weight(names.FINAL, "bias")] = (d,)
        shapes[names.UNEMBED_WEIGHT] = (v, d)
        shapes[names.UNEMBED_BIAS_WEIGHT] = (v,)  # optional
        return shapes


_OPTIONAL = (names.UNEMBED_BIAS_WEIGHT,)


def attn_only_random_weights(config: AttnOnlyConfig, seed: int = 0, dtype: torch.dtype = torch.float32):
    """Random weights for ``config`` (norm scales near 1), without an unembedding bias."""
    shapes = {n: s for n, s in config.weight_shapes().items() if n not in _OPTIONAL}
    scales = [n for n in shapes if n.endswith(names.norm_weight("", "scale"))]
    return common.random_weights(shapes, seed=seed, dtype=dtype, ones=scales)


@takes_model_options(NOT_ROTARY)
def build_attn_only(
    config: AttnOnlyConfig,
    weights: Mapping[str, Any],
    tokens: Any = None,
    options: ModelOptions = DEFAULT,
) -> Circuit:
    """The model as a circuit whose root is the per-token loss ``'t.loss'``.

    ``weights`` maps the names of ``config.weight_shapes()`` to tensors
    (``'t.w.unembed_bias'`` is optional).  ``tokens`` is an int tensor
    ``[S+1]`` or ``[B,S+1]`` (``[S+2]``/``[B,S+2]`` with
    ``convention="golden"``; a prompt ``[S]``/``[B,S]`` with
    ``convention="prompt"``, which makes the logits ``'t.call'`` the root,
    with no targets and no loss), copied, or None with ``seq_len`` (and
    ``batch_size``) for a zero placeholder; or text (a string, or a list of
    strings of equal token length) with ``tokenizer=`` any Hugging Face
    tokenizer (``models.to_tokens``: a BOS token in front, as TransformerLens).  ``options``: a
    ``models.ModelOptions``, its fields also keywords that override it (``causal=False``
    leaves attention unmasked, as the golden file; the default writes the masked form that
    the ``causal_mask`` pass produces).  An unknown option is a ``ModelError`` listing the
    accepted ones.

    The arrays hold the given weight tensors, not copies.  ``attach=False``
    detaches them, so no gradient reaches them; ``attach=True`` keeps them in
    autograd, so ``cc.evaluate(c).mean().backward()`` fills their ``.grad``.
    Either way an in-place change to a weight (an optimizer step) makes the
    circuit stale: evaluating it raises ``StaleTensorError``, so rebuild it
    after each step.
    """
    tokens = token_ids(tokens, options.tokenizer)
    if not isinstance(config, AttnOnlyConfig):
        raise common.ModelError(f"build_attn_only needs an AttnOnlyConfig, got {type(config).__name__}")
    tensors = common.check_weights(
        "attention-only", weights, config.weight_shapes(), optional=_OPTIONAL, attach=options.attach
    )
    w = {name: Array(tensor, name=name) for name, tensor in tensors.items()}
    toks = common.make_tokens(tokens, options, vocab_size=config.vocab_size, max_positions=config.n_ctx)
    mask = causal_mask_array(toks.seq_len, common.weights_dtype(tensors)) if options.causal else None

    resid: Circuit = common.embed(w[names.TOK_EMBEDS_WEIGHT], toks)
    pos = common.positions(w[names.POS_EMBEDS_WEIGHT], toks.seq_len)
    for layer in range(config.n_layers):
        norm = common.layer_norm(
            resid,
            *common.norm_weights(w, names.attn_prefix(layer)),
            config.ln_eps,
            name=names.attn_norm(layer),
        )
        qk_input = Add(norm, pos, name=names.QK_INPUT)
        q = einsum("qd,hcd->hqc", qk_input, w[names.attn_weight(layer, "q")], name=names.Q)
        k = einsum("kd,hcd->hkc", qk_input, w[names.attn_weight(layer, "k")], name=names.K)
        v = einsum("kd,hVd->hkV", norm, w[names.attn_weight(layer, "v")], name=names.V)
        div = common.div_head_size(w[names.attn_weight(layer, "k")])
        out = common.attend(q, k, v, div, w[names.attn_weight(layer, "o")], layer, mask, options.neg_inf)
        resid = Add(out, resid, name=names.block(layer))
    final = common.layer_norm(
        resid, *common.norm_weights(w, names.FINAL), config.ln_eps, name=names.FINAL_NORM
    )
    return common.loss_head(final, w[names.UNEMBED_WEIGHT], toks.targets, w.get(names.UNEMBED_BIAS_WEIGHT))
