"""Attention-mask nodes, written as in ../shared/golden/attn_only_2l.circ.

The model builders write them (``causal=True``) and the ``causal_mask`` pass rewrites scores into
them, so they live below both: models never import passes.  In the masked form the scores are
``Add('a.attn_scores_raw', 'a.score_neg_inf_bias')``: the raw scores take the 0/1 mask as one more
Einsum operand (masked pairs score 0), and the bias adds ``neg_inf`` where the mask is 0.
"""

from __future__ import annotations

import torch

from circuits.transformer import names
from circuits.core.nodes import Add, Array, Circuit, Einsum, Scalar

# The score bias where the mask is 0, as in the golden file.  After softmax a
# masked score of -10000 weighs exp(-10000 - max) == 0 exactly in float16/32/64
# whenever the row's largest unmasked score is above about -9000, which is
# what Hugging Face's ``finfo.min`` bias gives too.
NEG_INF = -10000.0


def causal_mask_array(seq_len: int, dtype: torch.dtype | None = None) -> Array:
    """``'t.a.c.causal_mask'``: 1 where a query may attend (keys at or before it)."""
    return Array(torch.tril(torch.ones(seq_len, seq_len, dtype=dtype)), name=names.CAUSAL_MASK)


def neg_inf_bias(mask: Circuit, neg_inf: float = NEG_INF) -> Circuit:
    """``(1 - mask) * neg_inf``, written as in the golden file (``'a.score_neg_inf_bias'``)."""
    letters = "hqk" if mask.rank == 3 else "qk"
    plain = "abc"[: mask.rank]  # the golden file's letters for the flip
    flipped = Einsum.from_einsum_string(
        f"{plain},->{plain}", mask, Scalar(-1.0, name=names.NEG_ONE), name=names.NEG_MASK
    )
    not_mask = Add(Scalar(1.0, name=names.ONE), flipped, name=names.NOT_MASK)
    return Einsum.from_einsum_string(
        f"{letters},->{letters}", not_mask, Scalar(neg_inf, name=names.NEG_INF_SCALAR), name=names.SCORE_BIAS
    )
