"""The generic rewrite passes: plain functions from circuit to circuit, for any circuit.

``push_down_index`` moves Index nodes toward the leaves so that only the
selected work is done; ``distribute``, ``factor`` and the other algebraic
rewrites regroup sums and products into named path terms; the concat
passes split a node into position pieces and fuse them back; ``simplify``
and ``canonicalize`` bring a circuit to a simpler or a canonical form.
The attention passes, which read the transformer naming convention, are in
``circuits.transformer.attention``; ``circuits.passes`` gathers both.
"""

from circuits.rewriting.passes.algebra import (
    distribute,
    distribute_all,
    extract_add,
    factor,
    flatten_adds,
    flatten_einsums,
    nest_adds,
    nest_einsums,
    residual_rewrite,
)
from circuits.rewriting.passes.canonical import canonicalize
from circuits.rewriting.passes.concat import (
    concat_drop_size_zero,
    concat_elim_split,
    concat_fuse,
    split_to_concat,
)
from circuits.rewriting.passes.concat_pull import pull_concat, push_down_concat
from circuits.rewriting.passes.push_down import push_down_index, push_index
from circuits.rewriting.passes.simplify import (
    fold_scalars,
    remove_identity_index,
    remove_identity_rearrange,
    remove_single_operand,
    simplify,
)

__all__ = [
    "canonicalize",
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
    "split_to_concat",
]
