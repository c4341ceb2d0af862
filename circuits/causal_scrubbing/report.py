"""The usual causal scrubbing report: each hypothesis's loss against the clean and scrambled ones.

``scrub_losses(circuit, dataset, hypotheses, num_examples, metric=..., seeds=...)`` scrubs the
circuit under every hypothesis with each seed (one seed: one reference sample, shared by every
hypothesis, and one draw of every node's data), and measures the clean model on the same
reference data.  The *fraction of loss recovered* by a hypothesis is
``(scrambled - scrubbed) / (scrambled - clean)``, with ``scrambled`` the loss under the hypothesis
the caller names as the baseline ("nothing but the labels matters"): 1 when the hypothesis
explains all of the behaviour, 0 when it explains none.  Spreads are the standard deviation over
seeds (``n - 1`` in the denominator).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import statistics
from collections.abc import Iterable
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from circuits.causal_scrubbing.correspondence import Correspondence
from circuits.causal_scrubbing.dataset import Dataset
from circuits.causal_scrubbing.experiment import Experiment, checked_seed
from circuits.causal_scrubbing.hypothesis import InterpNode, corr_root_matcher
from circuits.causal_scrubbing.samplers import ExactSampler
from circuits.errors import CausalScrubbingError, shown
from circuits.core.nodes import Circuit

__all__ = ["ScrubReport", "scrub_losses"]


def _spread(values: Sequence[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


@dataclasses.dataclass(frozen=True)
class ScrubReport:
    """Per seed: ``clean[i]``, ``losses[label][i]``; ``scrambled`` names the baseline hypothesis."""

    seeds: tuple[int, ...]
    clean: list[float]
    losses: dict[str, list[float]]
    scrambled: str

    def recovered(self, label: str) -> list[float]:
        """Per seed, the fraction of the loss ``label`` recovers (see the module)."""
        if label not in self.losses:
            raise CausalScrubbingError(f"no hypothesis {label!r} in this report; have {sorted(self.losses)}")
        out = []
        for clean, base, loss in zip(self.clean, self.losses[self.scrambled], self.losses[label]):
            if base == clean:
                raise CausalScrubbingError(
                    f"the scrambled loss equals the clean loss ({clean}): no loss to recover; "
                    f"{self.scrambled!r} is not a baseline for this metric"
                )
            out.append((base - loss) / (base - clean))
        return out

    def rows(self) -> list[tuple[str, float, float, float, float]]:
        """``(label, mean loss, its spread, mean fraction recovered, its spread)``, clean first."""
        rows = [("clean", statistics.fmean(self.clean), _spread(self.clean), 1.0, 0.0)]
        for label, losses in self.losses.items():
            recovered = self.recovered(label)
            rows.append(
                (
                    label,
                    statistics.fmean(losses),
                    _spread(losses),
                    statistics.fmean(recovered),
                    _spread(recovered),
                )
            )
        return rows

    def __str__(self) -> str:
        width = max(len(label) for label, *_ in self.rows())
        lines = [
            f"{'hypothesis':{width}s}  loss (mean ± sd)     recovered (mean ± sd), {len(self.seeds)} seeds"
        ]
        for label, loss, loss_sd, kept, kept_sd in self.rows():
            lines.append(f"{label:{width}s}  {loss:8.4f} ± {loss_sd:<8.4f}  {kept:7.3f} ± {kept_sd:.3f}")
        return "\n".join(lines)


def _clean_hypothesis() -> Correspondence:
    """Everything runs on the reference data: the clean model."""
    corr = Correspondence()
    corr.add(InterpNode(ExactSampler(), "clean"), corr_root_matcher)
    return corr


def scrub_losses(
    circuit: Circuit,
    dataset: Dataset,
    hypotheses: Mapping[str, Correspondence],
    num_examples: int,
    *,
    metric: Callable[[torch.Tensor], float],
    scrambled: str = "scrambled",
    seeds: Sequence[int] = (0, 1, 2, 3, 4),
    check: bool = True,
) -> ScrubReport:
    """Every hypothesis scrubbed with every seed, ``metric`` of each result (and of the clean
    model on each seed's reference data); ``hypotheses[scrambled]`` is the baseline."""
    if scrambled not in hypotheses:
        raise CausalScrubbingError(
            f"scrub_losses: the baseline {scrambled!r} is not among the hypotheses {sorted(hypotheses)}; "
            "give the scrambled hypothesis (e.g. only the labels exact) under that name"
        )
    seeds = _checked_seeds(seeds)
    if not callable(metric):
        raise CausalScrubbingError(f"scrub_losses: metric must be callable, got {type(metric).__name__}")
    clean, losses = [], {label: [] for label in hypotheses}
    for seed in seeds:
        # Each experiment draws its reference data first, so one seed gives every one the same.
        clean_run = Experiment(circuit, dataset, _clean_hypothesis(), random_seed=seed, check=check).scrub(
            num_examples
        )
        clean.append(_one_number(metric, clean_run.evaluate(), "the clean model"))
        for label, corr in hypotheses.items():
            scrubbed = Experiment(circuit, dataset, corr, random_seed=seed, check=check).scrub(num_examples)
            losses[label].append(_one_number(metric, scrubbed.evaluate(), repr(label)))
    return ScrubReport(seeds, clean, losses, scrambled)


def _checked_seeds(seeds: Any) -> tuple[int, ...]:
    """``seeds`` as a non-empty tuple of seeds, or an error naming ``seeds``."""
    if isinstance(seeds, (str, bytes)) or not isinstance(seeds, Iterable):
        raise CausalScrubbingError(
            f"scrub_losses: seeds must be a sequence of ints (one experiment each), got {shown(repr(seeds))}"
        )
    checked = tuple(checked_seed(seed, f"scrub_losses: seeds[{i}]") for i, seed in enumerate(seeds))
    if not checked:
        raise CausalScrubbingError("scrub_losses: give at least one seed")
    return checked


def _one_number(metric: Callable[[torch.Tensor], Any], value: torch.Tensor, which: str) -> float:
    """``metric(value)`` as a float: a Python number or a one-element tensor, else an error naming
    ``metric`` (a loss per example, say, that the metric forgot to average)."""
    result = metric(value)
    if isinstance(result, (torch.Tensor, np.ndarray)) and math.prod(result.shape) == 1:
        result = result.item()
    if isinstance(result, bool) or not isinstance(result, numbers.Real):
        raise CausalScrubbingError(
            f"scrub_losses: metric {shown(repr(metric))} must return one number; on {which} it returned "
            f"{shown(repr(result), 80)}"
        )
    return float(result)
