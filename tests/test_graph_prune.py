"""Attribution-graph pruning (issue 33 item 4): circuit-tracer's ``prune_graph`` on its own graph, and by hand.

The reference is circuit-tracer 0.5.0's output on its small random Gemma-2 test model
(tests/data/circuit_tracer, written by scripts/circuit_tracer_reference.py in circuit-tracer's
own venv; its README says what each file holds).  The small graphs below are worked out by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from circuits import experiments as ex
from circuits.errors import ExperimentError
from circuits.experiments.graph_prune import graph_scores, node_influence, prune_graph

DATA = Path(__file__).parent / "data" / "circuit_tracer"


@pytest.fixture(scope="module")
def reference():
    ref = load_file(str(DATA / "reference.safetensors"))
    meta = json.loads((DATA / "graph_meta.json").read_text())
    n_features = sum(1 for node in meta["nodes"] if node[0] == "feature")
    n_tokens = sum(1 for node in meta["nodes"] if node[0] == "embedding")
    return ref, meta, {"n_features": n_features, "n_tokens": n_tokens}


def test_equals_circuit_tracer_with_its_default_thresholds(reference):
    ref, _, counts = reference
    adjacency = ref["adjacency_matrix"].clone()
    pruned = prune_graph(adjacency, ref["logit_probabilities"], **counts)
    assert torch.equal(pruned.node_mask, ref["node_mask"])
    assert torch.equal(pruned.edge_mask, ref["edge_mask"])
    assert (pruned.cumulative_scores - ref["cumulative_scores"]).abs().max().item() < 1e-6
    assert int(pruned.node_mask.sum()) == 40 and int(pruned.edge_mask.sum()) == 385  # README's figures
    assert torch.equal(adjacency, ref["adjacency_matrix"])  # the input is left alone
    assert ex.tracing.prune_graph is prune_graph


def test_equals_circuit_tracer_with_other_thresholds_and_in_float64(reference):
    ref, meta, counts = reference
    node_threshold, edge_threshold = meta["other_thresholds"]
    for dtype in (torch.float32, torch.float64):
        pruned = prune_graph(
            ref["adjacency_matrix"].to(dtype),
            ref["logit_probabilities"],
            **counts,
            node_threshold=node_threshold,
            edge_threshold=edge_threshold,
        )
        assert torch.equal(pruned.node_mask, ref["other_node_mask"])
        assert torch.equal(pruned.edge_mask.nonzero().to(torch.int32), ref["other_edges"])


def test_influence_is_the_inverse_series_and_the_scores_are_circuit_tracers(reference):
    """``w @ ((I - N)^-1 - I)`` by a linear solve in float64 (not the series the code sums)."""
    ref, meta, counts = reference
    adjacency = ref["adjacency_matrix"].double()
    n = adjacency.shape[0]
    normalized = adjacency.abs() / adjacency.abs().sum(1, keepdim=True).clamp(min=1e-10)
    weights = torch.zeros(n, dtype=torch.float64)
    weights[-len(ref["logit_probabilities"]) :] = ref["logit_probabilities"].double()
    expected = torch.linalg.solve((torch.eye(n, dtype=torch.float64) - normalized).T, weights) - weights
    ours = node_influence(adjacency, ref["logit_probabilities"])
    assert (ours - expected).abs().max().item() < 1e-12
    pruned = prune_graph(ref["adjacency_matrix"], ref["logit_probabilities"], **counts)
    assert (pruned.influence.double() - expected).abs().max().item() < 1e-6
    replacement, completeness = graph_scores(ref["adjacency_matrix"], ref["logit_probabilities"], **counts)
    assert abs(replacement - meta["replacement_score"]) < 1e-6
    assert abs(completeness - meta["completeness_score"]) < 1e-6


def _graph(n: int, edges: dict[tuple[int, int], float]) -> torch.Tensor:
    """An adjacency ``[target, source]`` in float64 from ``{(target, source): weight}``."""
    adjacency = torch.zeros(n, n, dtype=torch.float64)
    for (target, source), weight in edges.items():
        adjacency[target, source] = weight
    return adjacency


def test_a_chain_keeps_everything_and_each_node_has_the_whole_influence():
    """token 2 -> feature 0 -> feature 1 -> logit 3 (weights 2, -3, 1): each row has one source, so
    each normalized edge is 1 and every node upstream of the logit carries all of its weight."""
    adjacency = _graph(4, {(0, 2): 2.0, (1, 0): -3.0, (3, 1): 1.0})
    pruned = prune_graph(adjacency, [1.0], n_features=2, n_tokens=1)
    assert pruned.influence.tolist() == [1.0, 1.0, 1.0, 0.0]
    assert pruned.node_mask.tolist() == [True] * 4
    assert sorted(map(tuple, pruned.edge_mask.nonzero().tolist())) == [(0, 2), (1, 0), (3, 1)]
    # ranked 1, 1, 1, 0 (ties in index order): shares 1/3, 2/3, 1, 1
    assert sorted(pruned.cumulative_scores.tolist()) == pytest.approx([1 / 3, 2 / 3, 1.0, 1.0])


def test_a_weak_branch_and_a_dead_end_are_pruned():
    """Nodes [f0, f1, f2, token, logit]: the logit reads f0 (9) and f1 (1); the token feeds all three
    features; f2 feeds nothing.  Influence: f0 0.9, f1 0.1, f2 0, token 1.0; total 2.0, so the
    ranked shares are 0.5 (token), 0.95 (f0), 1.0 ...: 0.8 is reached at f0 and f1 is dropped."""
    adjacency = _graph(5, {(4, 0): 9.0, (4, 1): 1.0, (0, 3): 1.0, (1, 3): 1.0, (2, 3): 1.0})
    pruned = prune_graph(adjacency, torch.tensor([1.0]), n_features=3, n_tokens=1)
    assert pruned.influence.tolist() == pytest.approx([0.9, 0.1, 0.0, 1.0, 0.0])
    assert pruned.node_mask.tolist() == [True, False, False, True, True]
    assert sorted(map(tuple, pruned.edge_mask.nonzero().tolist())) == [(0, 3), (4, 0)]
    assert pruned.cumulative_scores.tolist() == pytest.approx([0.95, 1.0, 1.0, 0.5, 1.0])


def test_nodes_stranded_by_edge_pruning_are_dropped_in_turn():
    """Nodes [f0, f1, error, token, logit]: logit <- f0 (99), logit <- f1 (1), f0 <- token, f1 <- error.
    A node threshold of 0.999 keeps every node (influence 0.99, 0.01, 0.01, 0.99); the edge scores are
    0.99, 0.99, 0.01, 0.01, so 0.98 keeps logit <- f0 and f0 <- token only.  Then f1 has no outgoing
    edge and goes; the error node is dropped for the same reason (it never has incoming edges)."""
    adjacency = _graph(5, {(4, 0): 99.0, (4, 1): 1.0, (0, 3): 1.0, (1, 2): 1.0})
    pruned = prune_graph(adjacency, [1.0], n_features=2, n_tokens=1, node_threshold=0.999)
    assert pruned.influence.tolist() == pytest.approx([0.99, 0.01, 0.01, 0.99, 0.0])
    assert sorted(map(tuple, pruned.edge_mask.nonzero().tolist())) == [(0, 3), (4, 0)]
    assert pruned.node_mask.tolist() == [True, False, False, True, True]
    kept_all = prune_graph(
        adjacency, [1.0], n_features=2, n_tokens=1, node_threshold=0.999, edge_threshold=1.0
    )
    assert kept_all.node_mask.tolist() == [True] * 5


def test_logits_are_weighted_by_their_probabilities():
    """Two logits, each fed by its own feature: the influences are the probabilities."""
    adjacency = _graph(5, {(3, 0): 1.0, (4, 1): 5.0, (0, 2): 1.0, (1, 2): 1.0})
    influence = node_influence(adjacency, np.array([0.7, 0.2]))
    assert influence.tolist() == pytest.approx([0.7, 0.2, 0.9, 0.0, 0.0])


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"adjacency": torch.zeros(4, 5)}, "adjacency"),
        ({"adjacency": torch.zeros(4)}, "adjacency"),
        ({"adjacency": "abc"}, "adjacency"),
        ({"node_threshold": 1.5}, "node_threshold"),
        ({"node_threshold": -0.1}, "node_threshold"),
        ({"node_threshold": float("nan")}, "node_threshold"),
        ({"edge_threshold": True}, "edge_threshold"),
        ({"edge_threshold": "0.9"}, "edge_threshold"),
        ({"logit_probabilities": [-0.5]}, "logit_probabilities"),
        ({"logit_probabilities": [[1.0]]}, "logit_probabilities"),
        ({"logit_probabilities": []}, "logit_probabilities"),
        ({"n_features": 3}, "n_features"),
        ({"n_tokens": -1}, "n_tokens"),
        ({"n_features": 1.0}, "n_features"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(change, argument):
    arguments = {
        "adjacency": _graph(4, {(0, 2): 2.0, (1, 0): 3.0, (3, 1): 1.0}),
        "logit_probabilities": [1.0],
        "n_features": 2,
        "n_tokens": 1,
    }
    arguments.update(change)
    with pytest.raises(ExperimentError) as info:
        prune_graph(**arguments)
    assert argument in str(info.value)


def test_a_nan_a_cycle_or_no_influence_is_refused():
    with pytest.raises(ExperimentError, match="NaN"):
        prune_graph(_graph(3, {(2, 0): float("nan")}), [1.0], n_features=1, n_tokens=1)
    cycle = _graph(4, {(0, 1): 1.0, (1, 0): 1.0, (3, 0): 1.0, (0, 2): 1.0})
    with pytest.raises(ExperimentError, match="cycle"):
        prune_graph(cycle, [1.0], n_features=2, n_tokens=1)
    with pytest.raises(ExperimentError, match="zero everywhere"):
        prune_graph(torch.zeros(3, 3), [1.0], n_features=1, n_tokens=1)
