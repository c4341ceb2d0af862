"""Experiments: ablate, patch, measure, sweep (``from circuits import experiments as ex``).

============================================  =============================================
``zero_ablate(c, matcher)``                   matched nodes -> zeros
``mean_ablate(c, matcher, dataset_inputs)``   matched nodes -> their mean over a dataset
``resample_ablate(c, matcher, other_inputs)`` matched nodes -> themselves on other inputs
``patch(c, matcher, source_inputs)``          activation patching; path patching with an
                                              IterativeMatcher
``mean_loss``, ``logit_diff``, ``kl_div``     metrics, as circuit builders (``Metric``)
``sweep(c, targets, ablation, metric)``       one ablation per target, through a cached
                                              ``Evaluator``; a table of results
``point(kind, layer, head)``                  a matcher for one layer's (head's) activation:
                                              ``'resid_pre'``, ``'attn_probs'``, ``'z'``, ...
                                              (``circuits.transformer.points``)
``head_names(c)``                             every ``'b{L}.a.head{h}'``, of split layers
                                              and unsplit ones (``sweep`` splits those
                                              one layer at a time)
``run_with_cache(c, points)``                 the value and the activations at points, one
                                              evaluation; ``cache["attn_probs", 1]``
``cache.accumulated_resid``, ``decompose_resid``, TransformerLens's cache analyses on an
``stack_head_results``, ``apply_ln_to_stack``, ``ActivationCache`` (docs/analyses.md)
``logit_attrs``
``direct_logit_attribution(c, answers, wrong)`` each head's, MLP's and embedding's direct share of
                                              a logit (difference); they sum to it
``logit_lens(c, pos)``                        each layer's residual through the final norm and
                                              the unembedding; top tokens per layer
``path_terms(c, pos)``                        the logits at pos as an Add of one node per
                                              direct path (frozen final-norm scale)
``gradients(c, metric, points)``              dmetric/dactivation at points: one forward, one
                                              backward, no weight gradients
``attribution_patching(c, corrupted, metric)`` the gradient estimate of patching every layer,
                                              head and position at once
``act_patch_resid_pre(c, corrupted, metric)`` TransformerLens's patching grids, one per
and every ``act_patch_*`` (``patch_grid``)    function of its ``patching`` module
                                              (docs/patching.md)
``detect_head(c, "induction_head")``          TransformerLens's head detector: each head's
                                              share of attention where a kind of head puts it
``overview(c)``                               the model circuit at a glance, one line per
                                              component (like torch's ``print(model)``)
``plot_attention``, ``plot_grid``             attention patterns per head; grids (sweep
                                              deltas by layer and head, patching results)
============================================  =============================================

Inputs are mappings ``{matcher form: tensor or node}``, usually
``{"toks_int_var": tokens}`` for the model builders' circuits (see
``circuits.experiments.inputs``).  Every function returns a new circuit and
evaluates nothing it does not need; ``circuits.Evaluator`` (``circuits.evaluation.cache``)
makes evaluating many rewrites of one circuit cost only what changed.
"""

from circuits.evaluation.cache import DEFAULT_CACHE_BYTES, Evaluator
from circuits.experiments.activations import ActivationCache, run_with_cache
from circuits.experiments.attribution import ATTRIBUTION_KINDS, AttributionResult, attribution_patching
from circuits.experiments.ablation import mean_ablate, resample_ablate, zero_ablate
from circuits.errors import ExperimentError, MissingPointError
from circuits.experiments.gradients import Gradients, gradients
from circuits.experiments.head_detector import HEAD_PATTERNS, detect_head, detection_pattern
from circuits.experiments.inputs import with_inputs
from circuits.experiments.logit_attribution import (
    LogitAttribution,
    LogitLens,
    direct_logit_attribution,
    logit_lens,
)
from circuits.experiments.metrics import Metric, kl_div, logit_diff, mean_loss
from circuits.experiments.overview import overview
from circuits.experiments.patching import patch
from circuits.experiments.path_terms import PathTerms, path_terms
from circuits.experiments.patching_grids import (
    EVERY,
    GRIDS,
    PatchGrid,
    act_patch_attn_head_all_pos_every,
    act_patch_attn_head_by_pos_every,
    act_patch_attn_head_k_all_pos,
    act_patch_attn_head_k_by_pos,
    act_patch_attn_head_out_all_pos,
    act_patch_attn_head_out_by_pos,
    act_patch_attn_head_pattern_all_pos,
    act_patch_attn_head_pattern_by_pos,
    act_patch_attn_head_q_all_pos,
    act_patch_attn_head_q_by_pos,
    act_patch_attn_head_v_all_pos,
    act_patch_attn_head_v_by_pos,
    act_patch_attn_out,
    act_patch_block_every,
    act_patch_mlp_out,
    act_patch_resid_mid,
    act_patch_resid_pre,
    patch_grid,
)
from circuits.experiments.plots import plot_attention, plot_grid
from circuits.transformer.points import HEAD_KINDS, POINT_KINDS, TRANSFORMER_LENS_HOOKS, point
from circuits.experiments.sweep import SweepPlan, SweepResult, head_names, sweep

__all__ = [
    "ATTRIBUTION_KINDS",
    "ActivationCache",
    "AttributionResult",
    "DEFAULT_CACHE_BYTES",
    "EVERY",
    "Evaluator",
    "ExperimentError",
    "GRIDS",
    "Gradients",
    "HEAD_KINDS",
    "HEAD_PATTERNS",
    "LogitAttribution",
    "LogitLens",
    "Metric",
    "MissingPointError",
    "POINT_KINDS",
    "PatchGrid",
    "PathTerms",
    "SweepPlan",
    "SweepResult",
    "TRANSFORMER_LENS_HOOKS",
    "act_patch_attn_head_all_pos_every",
    "act_patch_attn_head_by_pos_every",
    "act_patch_attn_head_k_all_pos",
    "act_patch_attn_head_k_by_pos",
    "act_patch_attn_head_out_all_pos",
    "act_patch_attn_head_out_by_pos",
    "act_patch_attn_head_pattern_all_pos",
    "act_patch_attn_head_pattern_by_pos",
    "act_patch_attn_head_q_all_pos",
    "act_patch_attn_head_q_by_pos",
    "act_patch_attn_head_v_all_pos",
    "act_patch_attn_head_v_by_pos",
    "act_patch_attn_out",
    "act_patch_block_every",
    "act_patch_mlp_out",
    "act_patch_resid_mid",
    "act_patch_resid_pre",
    "attribution_patching",
    "detect_head",
    "detection_pattern",
    "direct_logit_attribution",
    "gradients",
    "head_names",
    "kl_div",
    "logit_diff",
    "logit_lens",
    "mean_ablate",
    "mean_loss",
    "overview",
    "patch",
    "patch_grid",
    "path_terms",
    "plot_attention",
    "plot_grid",
    "point",
    "resample_ablate",
    "run_with_cache",
    "sweep",
    "with_inputs",
    "zero_ablate",
]
