"""Experiments: ablate, patch, measure, sweep (``from circuits import experiments as ex``).

============================================  =============================================
``Point(kind, layer, head)``                  one spot in a model (``'resid_pre'``,
                                              ``'attn_probs'``, ``'z'``, ...): a matcher
                                              wherever one goes, and the key of caches
                                              and gradients (``circuits.transformer.points``)
``zero_ablate(c, matcher)``                   matched nodes -> zeros
``mean_ablate(c, matcher, dataset_inputs)``   matched nodes -> their mean over a dataset
``patch(c, matcher, source_inputs)``          matched nodes -> themselves on other inputs:
                                              activation patching; path patching with an
                                              IterativeMatcher
``resample_ablate``                           another name of ``patch`` (the same function)
``mean_loss``, ``logit_diff``, ``kl_div``     metrics, as circuit builders (``Metric``)
``sweep(c, targets, ablation, metric)``       one ablation per target, through a cached
                                              ``Evaluator``; a table of results
``sweep_plan(c, targets, ablation, metric)``  what that sweep will cost (FLOPs, peak
                                              memory), before it runs
``head_names(c)``                             every ``'b{L}.a.head{h}'``, of split layers
                                              and unsplit ones (``sweep`` splits those
                                              one layer at a time)
``run_with_cache(c, points)``                 the value and the activations at points, one
                                              evaluation; ``cache[Point("attn_probs", 1)]``
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
``edge_circuit(c)``                           every edge explicit: each receiver (head q/k/v
                                              input, MLP input, logits) reads a masked sum
                                              of its senders
``edge_attribution(c, corrupted, metric)``    EAP and EAP-IG scores of every edge
``acdc(c, corrupted, "kl", threshold=)``      ACDC's greedy pruning from the logits down, zero,
                                              mean or resample ablation
``discovered_circuit(edges, kept)``           kept edges (names, top-n or a threshold of
                                              scores, ACDC's) as a circuit whose other edges
                                              are ablated, with its metric; it saves
``discovery``                                 every name of circuit discovery: the above,
                                              ``faithfulness`` (MIB's curve, CPR, CMD),
                                              ``edge_roc`` (against a known circuit) and the
                                              result types (docs/discovery.md)
``sae.splice_sae(c, sae)``                    a sparse autoencoder or transcoder spliced in at
                                              its point, with named feature, reconstruction
                                              and error nodes (``sae``; docs/features.md)
``tracing.attribution_graph(c, transcoders)``  circuit-tracer's attribution graph: direct
                                              effects between features, errors, tokens and
                                              logits in the frozen replacement model
                                              (``tracing``; docs/features.md)
``patch_grid(c, corrupted, metric, grid)``    TransformerLens's patching grids; one function
``patching_grids.act_patch_resid_pre`` and    per grid in ``patching_grids``, as
every ``act_patch_*``                         TransformerLens's ``patching`` (docs/patching.md)
``detect_head(c, "induction_head")``          TransformerLens's head detector: each head's
                                              share of attention where a kind of head puts it
                                              (``head_detector.detection_pattern``)
``overview(c)``                               the model circuit at a glance, one line per
                                              component (like torch's ``print(model)``)
``plot_attention``, ``plot_grid``             attention patterns per head; grids (sweep
                                              deltas by layer and head, patching results)
============================================  =============================================

Inputs are mappings ``{matcher form: tensor or node}``, usually
``{"toks_int_var": tokens}`` for the model builders' circuits (see
``circuits.experiments.inputs``).  Every function returns a new circuit and
evaluates nothing it does not need; ``cc.Evaluator`` (``circuits.evaluation.cache``)
makes evaluating many rewrites of one circuit cost only what changed.  The
errors are ``circuits.errors.ExperimentError`` and ``MissingPointError``.
"""

from circuits.experiments import discovery, patching_grids, sae, tracing  # noqa: F401 (tracing: a namespace)
from circuits.experiments.acdc import acdc
from circuits.experiments.ablation import mean_ablate, zero_ablate
from circuits.experiments.activations import ActivationCache, run_with_cache
from circuits.experiments.attribution import AttributionResult, attribution_patching
from circuits.experiments.discovered import discovered_circuit
from circuits.experiments.edge_attribution import edge_attribution
from circuits.experiments.edges import edge_circuit
from circuits.experiments.gradients import Gradients, gradients
from circuits.experiments.head_detector import detect_head
from circuits.experiments.inputs import with_inputs
from circuits.experiments.logit_attribution import (
    LogitAttribution,
    LogitLens,
    direct_logit_attribution,
    logit_lens,
)
from circuits.experiments.metrics import Metric, kl_div, logit_diff, mean_loss
from circuits.experiments.overview import overview
from circuits.experiments.patching import patch, resample_ablate
from circuits.experiments.patching_grids import PatchGrid, patch_grid
from circuits.experiments.path_terms import PathTerms, path_terms
from circuits.experiments.plots import plot_attention, plot_grid
from circuits.experiments.sweep import SweepPlan, SweepResult, head_names, sweep, sweep_plan
from circuits.transformer.points import Point

__all__ = [
    # A spot in a model
    "Point",
    # Rewrites: ablation and patching (resample_ablate is patch)
    "mean_ablate",
    "patch",
    "resample_ablate",
    "with_inputs",
    "zero_ablate",
    # Metrics
    "Metric",
    "kl_div",
    "logit_diff",
    "mean_loss",
    # Sweeps
    "SweepPlan",
    "SweepResult",
    "head_names",
    "sweep",
    "sweep_plan",
    # Activations, gradients, attribution
    "ActivationCache",
    "AttributionResult",
    "Gradients",
    "LogitAttribution",
    "LogitLens",
    "PathTerms",
    "attribution_patching",
    "detect_head",
    "direct_logit_attribution",
    "gradients",
    "logit_lens",
    "path_terms",
    "run_with_cache",
    # Features: sparse autoencoders and transcoders (every name in sae)
    "sae",
    # Circuit discovery (every name in discovery)
    "acdc",
    "discovered_circuit",
    "discovery",
    "edge_attribution",
    "edge_circuit",
    # Patching grids (every act_patch_* is in patching_grids)
    "PatchGrid",
    "patch_grid",
    "patching_grids",
    # Reading and plotting
    "overview",
    "plot_attention",
    "plot_grid",
]
