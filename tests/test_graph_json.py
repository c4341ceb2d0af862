"""circuit-tracer's graph JSON (issue 33 item 4): ours equals the file circuit-tracer 0.5.0 wrote.

tests/data/circuit_tracer holds circuit-tracer's adjacency, prune masks and ``create_graph_files``
output for its small random Gemma-2 model (scripts/circuit_tracer_reference.py; README there).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from circuits import experiments as ex
from circuits.errors import ExperimentError
from circuits.experiments.graph_json import GraphNode, graph_json, write_graph_files
from circuits.experiments.graph_prune import prune_graph

DATA = Path(__file__).parent / "data" / "circuit_tracer"


@pytest.fixture(scope="module")
def inputs():
    """``graph_json``'s arguments for circuit-tracer's graph, from its saved adjacency and masks."""
    ref = load_file(str(DATA / "reference.safetensors"))
    meta = json.loads((DATA / "graph_meta.json").read_text())
    config = json.loads((DATA / "tl_config.json").read_text())
    nodes = [GraphNode(*node) for node in meta["nodes"]]
    return dict(
        nodes=nodes,
        adjacency=ref["adjacency_matrix"],
        node_mask=ref["node_mask"],
        edge_mask=ref["edge_mask"],
        cumulative_scores=ref["cumulative_scores"],
        activations=ref["activation_values"][ref["selected_features"]].tolist(),
        prompt_tokens=meta["token_strings"],
        logit_tokens=meta["logit_token_strings"],
        logit_probabilities=ref["logit_probabilities"],
        n_layers=config["n_layers"],
        slug=meta["slug"],
        scan=meta["scan"],
        prompt=meta["input_string"],
        node_threshold=meta["node_threshold"],
    )


def _same(ours, theirs, path="graph", tolerance=1e-6):
    """Equal JSON values, floats to ``tolerance`` (the float formatting may differ); the first
    difference's path."""
    if isinstance(theirs, float) or isinstance(ours, float):
        assert isinstance(ours, (int, float)) and isinstance(theirs, (int, float)), path
        assert math.isclose(ours, theirs, rel_tol=tolerance, abs_tol=tolerance), (path, ours, theirs)
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), (path, ours, theirs)
        for key in theirs:
            _same(ours[key], theirs[key], f"{path}.{key}", tolerance)
    elif isinstance(theirs, list):
        assert isinstance(ours, list) and len(ours) == len(theirs), (path, len(ours), len(theirs))
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{path}[{i}]", tolerance)
    else:
        assert type(ours) is type(theirs) and ours == theirs, (path, ours, theirs)


def test_equals_the_json_circuit_tracer_wrote(inputs, tmp_path):
    theirs = json.loads((DATA / "graph.json").read_text())
    ours = graph_json(**inputs)
    _same(ours, theirs)
    assert len(ours["nodes"]) == 40 and len(ours["links"]) == 385
    path = write_graph_files(tmp_path, ours)
    _same(json.loads(path.read_text()), theirs)  # and the file loads with json
    listing = json.loads((tmp_path / "graph-metadata.json").read_text())
    assert listing == {"graphs": [ours["metadata"]]}
    assert ex.tracing.graph_json is graph_json


def test_our_pruning_then_our_json_equals_circuit_tracers(inputs):
    """From the adjacency alone: ``prune_graph``'s masks and scores into ``graph_json``."""
    ref = load_file(str(DATA / "reference.safetensors"))
    counts = {kind: sum(1 for n in inputs["nodes"] if n.kind == kind) for kind in ("feature", "embedding")}
    pruned = prune_graph(
        inputs["adjacency"],
        inputs["logit_probabilities"],
        n_features=counts["feature"],
        n_tokens=counts["embedding"],
    )
    masks = {"node_mask": pruned.node_mask, "edge_mask": pruned.edge_mask}
    ours = graph_json(**{**inputs, **masks, "cumulative_scores": pruned.cumulative_scores})
    _same(ours, json.loads((DATA / "graph.json").read_text()))
    assert torch.equal(pruned.node_mask, ref["node_mask"])


def test_a_small_graph_by_hand(tmp_path):
    """token 'a' (pos 0) -> feature 3 of layer 0 (pos 0) -> the logit of token 7 (at pos 1); the error
    node's edge is not kept, so it is left out; the embedding of 'c' (pos 1) has no edge but stays."""
    nodes = [
        ("feature", 0, 0, 3),
        ("error", 0, 0, None),
        ("embedding", None, 0, 5),
        ("embedding", None, 1, 6),
        ("logit", None, 1, 7),
    ]
    adjacency = torch.zeros(5, 5)
    adjacency[0, 2], adjacency[4, 0], adjacency[4, 1] = 0.5, -2.0, 0.25
    edge_mask = torch.zeros(5, 5, dtype=torch.bool)
    edge_mask[0, 2] = edge_mask[4, 0] = True
    graph = graph_json(
        nodes,
        adjacency,
        node_mask=torch.ones(5, dtype=torch.bool),
        edge_mask=edge_mask,
        cumulative_scores=torch.tensor([0.5, 0.75, 1.0, 1.0, 1.0]),
        activations=[1.5],
        prompt_tokens=["a", " c"],
        logit_tokens=["b"],
        logit_probabilities=[0.625],
        n_layers=2,
        slug="tiny",
        scan="s",
    )
    assert [n["node_id"] for n in graph["nodes"]] == ["0_3_0", "E_5_0", "E_6_1", "3_7_1"]
    feature, embedding, _, logit = graph["nodes"]
    assert feature["feature"] == 9 and feature["jsNodeId"] == "0_3-0"  # Cantor pairing (0, 3): 3 * 4 // 2 + 3
    assert feature["influence"] == 0.5 and feature["activation"] == 1.5
    assert feature["feature_type"] == "cross layer transcoder"
    assert embedding["layer"] == "E" and embedding["feature"] == 0 and embedding["jsNodeId"] == "E_5-0"
    assert embedding["influence"] == 1.0 and embedding["activation"] is None
    assert logit["layer"] == "3" and logit["ctx_idx"] == 1 and logit["jsNodeId"] == "L_7-1"
    assert logit["is_target_logit"] and logit["token_prob"] == 0.625
    assert logit["clerp"] == 'Output "b" (p=0.625)' and logit["influence"] is None
    assert graph["links"] == [
        {"source": "E_5_0", "target": "0_3_0", "weight": 0.5},
        {"source": "0_3_0", "target": "3_7_1", "weight": -2.0},
    ]
    assert graph["metadata"]["prompt"] == "a c" and graph["metadata"]["prompt_tokens"] == ["a", " c"]
    write_graph_files(tmp_path, graph)
    write_graph_files(tmp_path, graph)  # the same slug again: listed once
    assert len(json.loads((tmp_path / "graph-metadata.json").read_text())["graphs"]) == 1


def test_colliding_ids_are_written_as_circuit_tracer_writes_them_with_a_warning():
    """The error node of layer 1 at pos 0 and feature 1 of layer 0 at pos 0 are both '0_1_0'."""
    nodes = [("feature", 0, 0, 1), ("error", 1, 0, None), ("embedding", None, 0, 0), ("logit", None, 0, 2)]
    adjacency = torch.zeros(4, 4)
    adjacency[0, 2] = adjacency[3, 0] = adjacency[3, 1] = 1.0
    with pytest.warns(UserWarning, match="0_1_0"):
        graph = graph_json(
            nodes,
            adjacency,
            node_mask=torch.ones(4, dtype=torch.bool),
            edge_mask=adjacency != 0,
            cumulative_scores=torch.ones(4),
            activations=[1.0],
            prompt_tokens=["x"],
            logit_tokens=["y"],
            logit_probabilities=[1.0],
            n_layers=2,
            slug="c",
            scan="s",
        )
    assert [n["node_id"] for n in graph["nodes"]] == ["0_1_0", "0_1_0", "E_0_0", "3_2_0"]


@pytest.mark.parametrize(
    ("change", "argument"),
    [
        ({"nodes": [("neuron", 0, 0, 1)]}, "kind"),
        ({"nodes": [("feature", 2, 0, 1)]}, "layer"),
        ({"nodes": [("feature", 0, 5, 1)]}, "pos"),
        ({"nodes": [("feature", 0, 0, None)]}, "feature"),
        ({"nodes": [("feature", 0)]}, "nodes[0]"),
        ({"adjacency": torch.zeros(2, 2)}, "adjacency"),
        ({"node_mask": torch.ones(1)}, "node_mask"),
        ({"edge_mask": torch.ones(1, 2, dtype=torch.bool)}, "edge_mask"),
        ({"cumulative_scores": torch.tensor([float("nan")])}, "cumulative_scores"),
        ({"activations": []}, "activations"),
        ({"logit_tokens": ["z"]}, "logit_tokens"),
        ({"n_layers": 0}, "n_layers"),
    ],
)
def test_bad_input_is_refused_naming_the_argument(change, argument):
    arguments = dict(
        nodes=[("feature", 0, 0, 1)],
        adjacency=torch.zeros(1, 1),
        node_mask=torch.ones(1, dtype=torch.bool),
        edge_mask=torch.zeros(1, 1, dtype=torch.bool),
        cumulative_scores=torch.ones(1),
        activations=[1.0],
        prompt_tokens=["x"],
        logit_tokens=[],
        logit_probabilities=[],
        n_layers=2,
        slug="s",
        scan="s",
    )
    arguments.update(change)
    with pytest.raises(ExperimentError) as info:
        graph_json(**arguments)
    assert argument in str(info.value)


def test_our_graph_pruned_and_written_equals_circuit_tracers_json():
    """End to end: our attribution graph of circuit-tracer's test model (tests/data/circuit_tracer),
    pruned and written by ``to_json``, against the graph.json circuit-tracer wrote (the adjacency
    agrees within 2.4e-6, so the floats within 1e-5)."""
    import circuits.models as cm
    from circuits.models.sae import load_sae
    from circuits.transformer import names

    ref = load_file(str(DATA / "reference.safetensors"))
    meta = json.loads((DATA / "graph_meta.json").read_text())
    config = json.loads((DATA / "tl_config.json").read_text())
    state = load_file(str(DATA / "model.safetensors"))
    circuit = cm.from_transformer_lens(state, ref["tokens"][None], cfg=config, convention="prompt")
    transcoders = [
        (load_sae(DATA / "transcoders" / f"layer_{layer}"), ("ln2", layer), names.mlp_out(layer))
        for layer in range(config["n_layers"])
    ]
    graph = ex.tracing.attribution_graph(circuit, transcoders)
    ours = graph.to_json(
        slug=meta["slug"],
        scan=meta["scan"],
        prompt_tokens=meta["token_strings"],
        logit_tokens=meta["logit_token_strings"],
        prompt=meta["input_string"],
        node_threshold=meta["node_threshold"],
    )
    _same(ours, json.loads((DATA / "graph.json").read_text()), tolerance=1e-5)
