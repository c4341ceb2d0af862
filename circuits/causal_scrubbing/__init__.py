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
  the pools (``PoolAnnotation``) that let several nodes reuse draws.
"""

from circuits.causal_scrubbing.dataset import Dataset
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
from circuits.errors import CausalScrubbingError

__all__ = [
    "PNP",
    "CausalScrubbingError",
    "CondSampler",
    "Dataset",
    "ExactSampler",
    "FixedOtherSampler",
    "FuncSampler",
    "PoolAnnotation",
    "PoolNotPresent",
    "TooFewSamplesWarning",
    "UncondSampler",
    "UncondTogetherSampler",
]
