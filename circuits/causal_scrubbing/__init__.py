"""Causal scrubbing (Redwood Research, 2022) with rust_circuit's names.

A hypothesis says which paths of a circuit matter and what about their
inputs matters; scrubbing replaces every input the hypothesis calls
irrelevant with one it calls equivalent and measures how much the output
moves.  The names and arguments are rust_circuit's
(``rust_circuit.causal_scrubbing``), so an experiment written for it runs
with its imports changed:

- ``Dataset`` (``dataset``): named input arrays, examples on axis 0, which
  become the circuit's batch axis;
- samplers (``samplers``): ``FuncSampler``, ``UncondSampler``,
  ``UncondTogetherSampler``, ``ExactSampler``, ``FixedOtherSampler``, and
  the pools (``PoolAnnotation``) that let several nodes reuse draws;
- hypotheses (``hypothesis``, ``correspondence``): ``InterpNode`` trees mapped
  onto branches of the circuit by a ``Correspondence``, with its checks;
- ``Experiment`` (``experiment``): samples every node's data, treeifies and
  replaces the inputs path by path (a circuit built on one example, as
  rust_circuit's, through ``DiscreteVar``s of a group; a batched one
  directly); ``ScrubbedExperiment.evaluate`` (``scrubbed``);
- ``scrub_losses`` (``report``): clean, scrubbed and scrambled losses and the
  fraction of loss recovered, over several seeds.
"""

from circuits.causal_scrubbing.correspondence import Correspondence
from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.experiment import Experiment
from circuits.causal_scrubbing.scrubbed import ExperimentEvalSettings, ScrubbedExperiment
from circuits.causal_scrubbing.report import ScrubReport, scrub_losses
from circuits.causal_scrubbing.hypothesis import InterpNode, SampledInputs, corr_root_matcher, to_inputs
from circuits.causal_scrubbing.samplers import (
    PNP,
    CondSampler,
    ExactSampler,
    FixedOtherSampler,
    FuncSampler,
    PoolAnnotation,
    PoolNotPresent,
    TooFewSamplesWarning,
    UncondSampler,
    UncondTogetherSampler,
)
from circuits.errors import CausalScrubbingError, IllegalCorrespondenceError

__all__ = [
    "PNP",
    "CausalScrubbingError",
    "CondSampler",
    "Correspondence",
    "Dataset",
    "ExactSampler",
    "Experiment",
    "ExperimentEvalSettings",
    "FixedOtherSampler",
    "FuncSampler",
    "IllegalCorrespondenceError",
    "InterpNode",
    "PoolAnnotation",
    "PoolNotPresent",
    "SampledInputs",
    "ScrubReport",
    "ScrubbedExperiment",
    "TooFewSamplesWarning",
    "UncondSampler",
    "UncondTogetherSampler",
    "corr_root_matcher",
    "scrub_losses",
    "to_inputs",
]
