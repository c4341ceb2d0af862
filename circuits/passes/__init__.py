"""Rewrite passes: plain functions from circuit to circuit, all in one place.

The public home of the passes.  The generic ones live in the rewriting
layer (``circuits.rewriting.passes``: ``push_down_index``, the algebraic and
concat rewrites, ``simplify``, ``canonicalize``); the attention passes,
which read the transformer naming convention, in the transformer layer
(``circuits.transformer.attention``: ``causal_mask`` and ``split_heads``
rewrite attention, ``layer_of`` tells an attention node's layer).  This
package only gathers them, one layer above both, so that neither layer
imports the other's passes and a user finds every pass here.
"""

from circuits.rewriting.passes import (
    canonicalize,
    concat_drop_size_zero,
    concat_elim_split,
    concat_fuse,
    distribute,
    distribute_all,
    extract_add,
    factor,
    flatten_adds,
    flatten_einsums,
    fold_scalars,
    nest_adds,
    nest_einsums,
    pull_concat,
    push_down_concat,
    push_down_index,
    push_index,
    remove_identity_index,
    remove_identity_rearrange,
    remove_single_operand,
    residual_rewrite,
    simplify,
    split_to_concat,
)
from circuits.transformer.attention import causal_mask, layer_of, split_heads, unsplit_head_counts

__all__ = [
    "canonicalize",
    "causal_mask",
    "concat_drop_size_zero",
    "concat_elim_split",
    "concat_fuse",
    "distribute",
    "distribute_all",
    "extract_add",
    "factor",
    "flatten_adds",
    "flatten_einsums",
    "fold_scalars",
    "layer_of",
    "nest_adds",
    "nest_einsums",
    "pull_concat",
    "push_down_concat",
    "push_down_index",
    "push_index",
    "remove_identity_index",
    "remove_identity_rearrange",
    "remove_single_operand",
    "residual_rewrite",
    "simplify",
    "split_heads",
    "split_to_concat",
    "unsplit_head_counts",
]
