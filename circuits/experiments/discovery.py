"""Circuit discovery in one namespace (``ex.discovery``), as TransformerLens keeps its grids in ``patching``.

Every edge explicit (``edge_circuit``), edge attribution (``edge_attribution``: EAP, EAP-IG),
ACDC (``acdc``), the discovered circuit (``discovered_circuit``), MIB's faithfulness
(``faithfulness``: CPR, CMD) and ROC against a known circuit (``edge_roc``; ACDC's over a sweep
of thresholds, ``acdc_roc``), with their result types.  The most used are also in ``circuits.experiments``.  docs/discovery.md has the details.
"""

from circuits.experiments.acdc import ACDCResult, ACDCStep, acdc
from circuits.experiments.acdc_roc import ACDCROC, acdc_roc
from circuits.experiments.discovered import DiscoveredCircuit, discovered_circuit, kept_edges
from circuits.experiments.edge_attribution import EdgeScores, edge_attribution
from circuits.experiments.edge_roc import EdgeROC, edge_roc, edge_roc_auc
from circuits.experiments.edges import Edge, EdgeCircuit, Receiver, edge_circuit
from circuits.experiments.faithfulness import MIB_FRACTIONS, Faithfulness, area_under, faithfulness

__all__ = [
    "ACDCROC",
    "ACDCResult",
    "ACDCStep",
    "DiscoveredCircuit",
    "Edge",
    "EdgeCircuit",
    "EdgeROC",
    "EdgeScores",
    "Faithfulness",
    "MIB_FRACTIONS",
    "Receiver",
    "acdc",
    "acdc_roc",
    "area_under",
    "discovered_circuit",
    "edge_attribution",
    "edge_circuit",
    "edge_roc",
    "edge_roc_auc",
    "faithfulness",
    "kept_edges",
]
