"""``acdc_roc``: the ROC of ACDC against a circuit's true edges, over a sweep of thresholds.

ACDC keeps a set of edges, not a score per edge, so each threshold gives one point of the ROC: its
kept edges' false positive rate (false edges kept over all false edges) and true positive rate
(true edges kept over all true edges), as Conmy et al. (2023) compute ACDC's ROC on tracr and IOI.
The curve runs from (0, 0) through the points, by false positive rate, to (1, 1); a point below
one at no larger false positive rate is dropped (kept sets of greedy ACDC need not be nested, so
its points need not rise together: the curve is their Pareto frontier), and the area is the
trapezoidal rule over what is left.

A threshold is run only where it can change something: greedy ACDC's decisions compare each
tested edge's delta with the threshold (``delta < threshold`` removes it), so a run at ``t``
decides alike, step by step, at any threshold above its largest removed delta and at most its
smallest kept one; a threshold in that range reuses the run (``runs`` counts the ACDC runs made).
A threshold that removes every edge (``NoCircuitError``) is the point (0, 0), and so is every
larger one: each of their tests sees the same circuit and removes its edge too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any

from circuits.core.nodes import Circuit
from circuits.errors import ExperimentError, NoCircuitError
from circuits.evaluation.cache import DEFAULT_CACHE_BYTES, Evaluator
from circuits.experiments.acdc import ACDCResult, acdc
from circuits.experiments.discovery_metric import check_threshold
from circuits.experiments.edge_ablation import ABLATIONS
from circuits.experiments.edges import EdgeCircuit, edge_circuit
from circuits.experiments.faithfulness import area_under

__all__ = ["ACDCROC", "acdc_roc"]


@dataclasses.dataclass(frozen=True)
class ACDCROC:
    """``auc``; per threshold (ascending): ``thresholds``, ``fpr``, ``tpr``, ``kept`` (edge names) and
    ``results`` (the ``ACDCResult``, None where every edge was removed; thresholds that decide alike
    share one); ``curve_fpr``/``curve_tpr``: the curve the area is taken under, (0, 0) to (1, 1);
    ``missed``: the true edges no threshold kept; ``n_true``, ``n_false``; ``runs``."""

    auc: float
    thresholds: tuple[float, ...]
    fpr: tuple[float, ...]
    tpr: tuple[float, ...]
    kept: tuple[tuple[str, ...], ...]
    results: tuple[ACDCResult | None, ...]
    curve_fpr: tuple[float, ...]
    curve_tpr: tuple[float, ...]
    missed: tuple[str, ...]
    n_true: int
    n_false: int
    runs: int

    def __repr__(self) -> str:
        return (
            f"ACDCROC(auc {self.auc:.4g}, {len(self.thresholds)} thresholds, {self.runs} runs, "
            f"{self.n_true} true and {self.n_false} false edges, missed {list(self.missed)})"
        )


def acdc_roc(
    circuit: Circuit | EdgeCircuit,
    corrupted_inputs: Mapping[Any, Any] | None,
    metric: Any = "kl",
    *,
    true_edges: Iterable[str],
    thresholds: Iterable[float],
    ablation: str = "resample",
    position: int | None = None,
    absolute: bool = False,
) -> ACDCROC:
    """``acdc(circuit, corrupted_inputs, metric, threshold=t, ...)`` at each of ``thresholds``, its
    kept edges against ``true_edges`` (edge names); see the module docstring.  The other arguments
    are ``acdc``'s.  No threshold, a true edge that is not an edge of the circuit, or no true or no
    false edge is an ``ExperimentError``.

    >>> roc = ex.discovery.acdc_roc(c, None, "kl", true_edges=true, thresholds=np.logspace(-6, 0, 13),
    ...                             ablation="zero")
    >>> roc.auc, roc.missed, list(zip(roc.thresholds, roc.fpr, roc.tpr))
    """
    what = "acdc_roc"
    sweep = sorted({check_threshold(t, what) for t in _listed(thresholds, what)})
    if not sweep:
        raise ExperimentError(f"{what}: thresholds is empty; give at least one")
    edges = _edges(circuit, corrupted_inputs, ablation, what)
    names = [edge.name for edge in edges.edges]
    truth = set(_listed(true_edges, what))
    missing = sorted(truth - set(names))
    if missing:
        raise ExperimentError(f"{what}: true_edges {missing[:4]} are not edges of the circuit")
    n_true, n_false = len(truth), len(names) - len(truth)
    if not n_true or not n_false:
        raise ExperimentError(f"{what}: {n_true} true and {n_false} false edges; the ROC needs one of each")
    settings = dict(ablation=ablation, position=position, absolute=absolute)
    evaluator = Evaluator(DEFAULT_CACHE_BYTES)
    results: list[ACDCResult | None] = []
    runs, last, up_to = 0, None, -math.inf  # the last run stands for thresholds <= up_to
    for threshold in sweep:
        if not (results and (last is None or threshold <= up_to)):
            runs += 1
            try:
                last = acdc(
                    edges, corrupted_inputs, metric, threshold=threshold, evaluator=evaluator, **settings
                )
            except NoCircuitError:
                last = None
            up_to = math.inf if last is None else _smallest_kept_delta(last)
        results.append(last)
    kept = [() if r is None else r.kept for r in results]
    fpr = [len(set(k) - truth) / n_false for k in kept]
    tpr = [len(set(k) & truth) / n_true for k in kept]
    curve_fpr, curve_tpr = _frontier(fpr, tpr)
    found = set().union(*map(set, kept))
    return ACDCROC(
        area_under(curve_fpr, curve_tpr),
        tuple(sweep),
        tuple(fpr),
        tuple(tpr),
        tuple(kept),
        tuple(results),
        curve_fpr,
        curve_tpr,
        tuple(name for name in names if name in truth and name not in found),
        n_true,
        n_false,
        runs,
    )


def _listed(values: Any, what: str) -> list:
    if isinstance(values, str):
        return [values]
    try:
        return list(values)
    except TypeError:
        raise ExperimentError(f"{what}: expected a list, got {type(values).__name__}") from None


def _edges(circuit: Any, corrupted_inputs: Any, ablation: str, what: str) -> EdgeCircuit:
    """The edge circuit every run searches, built once."""
    if ablation not in ABLATIONS:
        raise ExperimentError(f"{what}: ablation must be one of {ABLATIONS}, got {ablation!r}")
    if ablation != "zero" and corrupted_inputs is None:
        raise ExperimentError(f"{what}: ablation={ablation!r} needs corrupted_inputs (the run it reads)")
    if isinstance(circuit, EdgeCircuit):
        return circuit
    return edge_circuit(
        circuit, ablation=ablation, corrupted_inputs=None if ablation == "zero" else corrupted_inputs
    )


def _smallest_kept_delta(result: ACDCResult) -> float:
    """The largest threshold at which ``result``'s run decides every edge alike."""
    kept = [abs(s.delta) if result.absolute else s.delta for s in result.steps if s.tested and s.kept]
    return min(kept, default=math.inf)


def _frontier(fpr: list[float], tpr: list[float]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(0, 0), the points no other point beats (a higher TPR at no larger FPR) by FPR, (1, 1)."""
    curve = [(0.0, 0.0)]
    for x, y in sorted(zip(fpr, tpr), key=lambda point: (point[0], -point[1])):
        if y > curve[-1][1]:
            curve[-1:] = [(x, y)] if x == curve[-1][0] else [curve[-1], (x, y)]
    if curve[-1] != (1.0, 1.0):
        curve.append((1.0, 1.0))
    return tuple(x for x, _ in curve), tuple(y for _, y in curve)
