"""Rewrite passes: plain functions from circuit to circuit.

``causal_mask`` and ``split_heads`` rewrite attention; ``push_down_index``
moves Index nodes toward the leaves so that only the selected work is done;
``distribute``, ``factor`` and the other algebraic rewrites regroup sums and
products into named path terms.
"""

from circuits.errors import PassError
from circuits.passes.algebra import (
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
from circuits.passes.canonical import canonicalize
from circuits.passes.attention import causal_mask, layer_of, split_heads, unsplit_head_counts
from circuits.passes.concat import concat_drop_size_zero, concat_elim_split, concat_fuse, split_to_concat
from circuits.passes.concat_pull import pull_concat, push_down_concat
from circuits.passes.push_down import push_index
from circuits.passes.simplify import (
    fold_scalars,
    remove_identity_index,
    remove_identity_rearrange,
    remove_single_operand,
    simplify,
)
from circuits.rewriting.matching import Matcher
from circuits.core.nodes import Circuit, Index


def push_down_index(circuit: Circuit, matcher=True) -> Circuit:
    """Every Index that ``matcher`` finds moved down as far as it goes (same value)."""
    return circuit.update(Matcher.types(Index) & Matcher(matcher), push_index, assert_any_found=False)


__all__ = [
    "PassError",
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
