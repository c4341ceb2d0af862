"""``faithfulness``: MIB's faithfulness curve of an edge ranking, with CPR and CMD.

For each fraction ``k`` of the edges (MIB's ``0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100 %``), the
circuit of the top ``int(k * n_edges)`` edges by absolute score (``absolute=False``: by signed
score, largest first) is evaluated with every other edge ablated, and::

    faithfulness(k) = (m(circuit_k) - m(corrupted)) / (m(full) - m(corrupted))

where ``m(full)`` is the metric with every edge kept and ``m(corrupted)`` with none (every edge
ablated: under resample ablation, the corrupted run).  As hannamw/MIB-circuit-track's
``evaluate_area_under_curve`` computes them (its ``log_scale`` does not change the sums), with the
trapezoidal rule over the fractions on a linear axis:

    CPR = sum_i (k_{i+1} - k_i) * (f_i + f_{i+1}) / 2                 (area under the curve)
    CMD = sum_i (k_{i+1} - k_i) * (|1 - f_i| + |1 - f_{i+1}|) / 2     (area between it and 1)

MIB's circuits are pruned (``Graph.prune``) before evaluation; here the top-n edges are evaluated
as they are (an edge out of a component no kept edge reads changes nothing, so that pruning does
not change the value).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence

import torch

from circuits.errors import ExperimentError
from circuits.evaluation.cache import DEFAULT_CACHE_BYTES, Evaluator
from circuits.experiments.discovered import masked_edges
from circuits.experiments.discovery_metric import DiscoveryMetric
from circuits.experiments.edge_attribution import EdgeScores
from circuits.experiments.edges import EdgeCircuit
from circuits.experiments.tables import records_frame

__all__ = ["MIB_FRACTIONS", "Faithfulness", "area_under", "faithfulness"]

#: The fractions of edges MIB evaluates circuits at (``evaluate_area_under_curve``'s percentages).
MIB_FRACTIONS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def area_under(fractions: Sequence[float], values: Sequence[float]) -> float:
    """The trapezoidal rule over ``fractions`` (a linear axis), as MIB sums it."""
    return sum(
        (fractions[i + 1] - fractions[i]) * (values[i] + values[i + 1]) / 2 for i in range(len(values) - 1)
    )


@dataclasses.dataclass(frozen=True)
class Faithfulness:
    """The curve: ``fractions``, ``n_kept`` (edges kept at each), ``values`` (the metric of each
    circuit), ``faithfulness``; ``full`` and ``corrupted`` (the metric with every edge kept, with
    none); ``cpr``, ``cmd`` (module docstring); ``metric_name``, ``n_edges``."""

    fractions: tuple[float, ...]
    n_kept: tuple[int, ...]
    values: tuple[float, ...]
    faithfulness: tuple[float, ...]
    full: float
    corrupted: float
    cpr: float
    cmd: float
    metric_name: str
    n_edges: int

    def __repr__(self) -> str:
        return (
            f"Faithfulness({self.metric_name}, {self.n_edges} edges: CPR {self.cpr:.4f}, CMD {self.cmd:.4f})"
        )

    @property
    def records(self) -> list[dict]:
        """One dict per fraction: ``fraction``, ``n_kept``, ``metric``, ``faithfulness``."""
        return [
            {"fraction": k, "n_kept": n, "metric": m, "faithfulness": f}
            for k, n, m, f in zip(self.fractions, self.n_kept, self.values, self.faithfulness)
        ]

    def to_pandas(self):
        """``records`` as a pandas DataFrame (pandas is not a dependency)."""
        return records_frame(self.records, "Faithfulness")

    def plot(self, ax=None, label: str | None = None):
        """Faithfulness against the percentage of edges (log axis), CPR and CMD in the legend; the
        matplotlib Figure (matplotlib is optional: the ``notebooks`` extra)."""
        try:
            import matplotlib.pyplot as plt
        except ImportError:
            raise ExperimentError(
                "Faithfulness.plot needs matplotlib: pip install 'circuits-interp[notebooks]' (or matplotlib)"
            ) from None
        if ax is None:
            figure, ax = plt.subplots(figsize=(5, 3.5))
        else:
            figure = ax.figure
        percent = [100 * k for k in self.fractions]
        shown = f"{label or self.metric_name} (CPR {self.cpr:.3f}, CMD {self.cmd:.3f})"
        ax.plot(percent, self.faithfulness, marker="o", label=shown)
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlabel("edges kept (%)")
        ax.set_ylabel("faithfulness")
        ax.legend(loc="best", fontsize="small")
        return figure


def faithfulness(
    edges: EdgeCircuit,
    scores: EdgeScores | Mapping[str, float],
    metric: Any,
    *,
    position: int | None = None,
    fractions: Sequence[float] = MIB_FRACTIONS,
    absolute: bool = True,
    evaluator: Evaluator | None = None,
) -> Faithfulness:
    """MIB's faithfulness of the ranking ``scores`` (``EdgeScores`` or ``{edge name: score}``) on
    ``edges`` (an ``EdgeCircuit`` whose ``ablation`` the dropped edges read) at each of ``fractions``,
    with CPR and CMD (module docstring).  ``metric``: ``"kl"`` (with ``position``), a ``Metric`` or a
    function of the logits.  ``m(full) == m(corrupted)`` is an ``ExperimentError`` (nothing to
    normalise by)."""
    what = "faithfulness"
    if not isinstance(edges, EdgeCircuit):
        raise ExperimentError(f"{what}: edges must be an EdgeCircuit, got {type(edges).__name__}")
    fractions = _checked_fractions(fractions, what)
    ranking = _ranking(edges, scores, absolute, what)
    full = masked_edges(edges, [e.name for e in edges.edges])
    spec = DiscoveryMetric(metric, full, position=position, what=what)
    evaluator = Evaluator(DEFAULT_CACHE_BYTES) if evaluator is None else evaluator

    def measured(kept: list[str]) -> float:
        with torch.no_grad():
            return spec.value(evaluator.evaluate(spec.root(masked_edges(edges, kept).circuit)))

    m_full, m_corrupted = measured(ranking), measured([])
    if m_full == m_corrupted:
        raise ExperimentError(
            f"{what}: metric {spec.name!r} is {m_full:.6g} with every edge and with none: nothing to normalise "
            "by (does it depend on the edges? do the corrupted inputs change it?)"
        )
    n_kept = tuple(int(k * len(ranking)) for k in fractions)
    values = tuple(measured(ranking[:n]) for n in n_kept)
    faith = tuple((v - m_corrupted) / (m_full - m_corrupted) for v in values)
    cpr = area_under(fractions, faith)
    cmd = area_under(fractions, [abs(1.0 - f) for f in faith])
    return Faithfulness(
        fractions, n_kept, values, faith, m_full, m_corrupted, cpr, cmd, spec.name, len(ranking)
    )


def _checked_fractions(fractions: Any, what: str) -> tuple[float, ...]:
    try:
        values = tuple(float(k) for k in fractions)
    except (TypeError, ValueError):
        raise ExperimentError(f"{what}: fractions must be numbers in (0, 1], got {fractions!r}") from None
    if not values or any(not 0 < k <= 1 for k in values) or list(values) != sorted(set(values)):
        raise ExperimentError(f"{what}: fractions must be increasing numbers in (0, 1], got {fractions!r}")
    return values


def _ranking(edges: EdgeCircuit, scores: Any, absolute: bool, what: str) -> list[str]:
    """Every edge name, best first (ties in ``edges.edges`` order)."""
    if isinstance(scores, EdgeScores):
        by_name = dict(
            zip((e.name for e in scores.edges), scores.scores.reshape(len(scores), -1).sum(-1).tolist())
        )
    elif isinstance(scores, Mapping):
        by_name = {str(k): float(v) for k, v in scores.items()}
    else:
        raise ExperimentError(
            f"{what}: scores must be EdgeScores or {{edge name: score}}, got {type(scores).__name__}"
        )
    names = [e.name for e in edges.edges]
    unknown = sorted(set(by_name) - set(names))
    missing = [n for n in names if n not in by_name]
    if unknown or missing:
        raise ExperimentError(
            f"{what}: scores must score every edge of the edge circuit by name: unknown {unknown[:4]}, "
            f"missing {missing[:4]}"
        )
    key = (lambda n: -abs(by_name[n])) if absolute else (lambda n: -by_name[n])
    return sorted(names, key=key)
