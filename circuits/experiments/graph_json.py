"""An attribution graph as circuit-tracer's graph JSON, the file its viewer shows.

``graph_json`` builds what circuit-tracer 0.5.0's ``create_graph_files`` writes (its
``frontend.graph_models``: ``metadata``, ``qParams``, ``nodes``, ``links``), from plain inputs:
the nodes as ``(kind, layer, pos, feature)`` records in the adjacency's order, the adjacency
``[target, source]``, the masks and cumulative scores of ``graph_prune.prune_graph``, the token
strings and the logits' tokens and probabilities.  ``write_graph_files`` writes it as
``{slug}.json`` and lists it in the folder's ``graph-metadata.json``, as circuit-tracer does, so
its local server (``circuit_tracer.frontend.local_server``) serves the folder.

What circuit-tracer writes, kept as it is: the kept nodes in adjacency order, then only those on a
kept edge plus every embedding and logit node; links in row-major order of the edge mask, between
kept nodes, ``weight`` the adjacency's entry.  Node ids: feature ``'{layer}_{feature}_{pos}'``
(``feature`` the Cantor pairing of layer and feature, ``feature_type`` ``'cross layer
transcoder'`` for every transcoder), error ``'0_{layer}_{pos}'``, embedding ``'E_{token}_{pos}'``,
logit ``'{n_layers + 1}_{token}_{pos}'`` (``is_target_logit`` for the first logit node only);
``influence`` is the node's cumulative score (none for logits).  An error node's id can equal a
layer-0 feature's (error of layer 1 at pos 3 and feature 1 of layer 0 at pos 3 are both
``'0_1_3'``); circuit-tracer writes both, and so does this module, with a warning naming them.
tests/test_graph_json.py checks the output against the file circuit-tracer wrote.
"""

from __future__ import annotations

import json
import warnings
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from circuits.errors import ExperimentError

__all__ = ["GRAPH_NODE_KINDS", "GraphNode", "graph_json", "write_graph_files"]

#: The node kinds of an attribution graph, in circuit-tracer's order.
GRAPH_NODE_KINDS = ("feature", "error", "embedding", "logit")

_FEATURE_TYPES = {
    "feature": "cross layer transcoder",
    "error": "mlp reconstruction error",
    "embedding": "embedding",
    "logit": "logit",
}
_QPARAMS = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}


class GraphNode(NamedTuple):
    """One node of an attribution graph: ``kind`` one of ``GRAPH_NODE_KINDS``; ``layer`` (features and
    error nodes; None otherwise); ``pos``; ``feature``: the feature id, or the token id of an embedding
    or a logit (None for error nodes)."""

    kind: str
    layer: int | None
    pos: int
    feature: int | None


def graph_json(
    nodes: Sequence[Any],
    adjacency: Any,
    *,
    node_mask: Any,
    edge_mask: Any,
    cumulative_scores: Any,
    activations: Sequence[float],
    prompt_tokens: Sequence[str],
    logit_tokens: Sequence[str],
    logit_probabilities: Any,
    n_layers: int,
    slug: str,
    scan: str,
    prompt: str | None = None,
    node_threshold: float = 0.8,
    transcoder_list: Sequence[str] = (),
) -> dict[str, Any]:
    """circuit-tracer's graph JSON (a dict; ``json.dumps`` it or ``write_graph_files``) of a pruned graph.

    ``nodes``: ``GraphNode``s (or 4-tuples) in the adjacency's order; ``adjacency`` ``[n, n]``,
    ``[target, source]``; ``node_mask``, ``edge_mask``, ``cumulative_scores``: ``prune_graph``'s;
    ``activations``: one per feature node, in node order; ``prompt_tokens``: each position's token
    as text; ``logit_tokens``, ``logit_probabilities``: one per logit node, in node order;
    ``n_layers``: the model's (logit nodes are drawn at layer ``n_layers + 1``); ``prompt``: the
    prompt as text (default: the tokens joined); ``node_threshold``: recorded in the metadata;
    ``scan``: the transcoders' name (circuit-tracer's viewer uses it to find feature pages)."""
    records = _records(nodes, n_layers, len(prompt_tokens))
    n = len(records)
    matrix = _matrix("adjacency", adjacency, (n, n), floating=True)
    kept = _matrix("node_mask", node_mask, (n,), floating=False)
    edges = _matrix("edge_mask", edge_mask, (n, n), floating=False)
    scores = _matrix("cumulative_scores", cumulative_scores, (n,), floating=True)
    probabilities = [float(p) for p in torch.as_tensor(logit_probabilities).flatten().tolist()]
    _check_counts(records, activations, logit_tokens, probabilities)
    built = _nodes(records, kept, scores, activations, logit_tokens, probabilities, n_layers)
    used_nodes, links = _used(built, matrix, edges)
    metadata = {
        "slug": slug,
        "scan": scan,
        "transcoder_list": list(transcoder_list),
        "prompt_tokens": list(prompt_tokens),
        "prompt": "".join(prompt_tokens) if prompt is None else prompt,
        "node_threshold": float(node_threshold),
        "schema_version": 1,
    }
    return {
        "metadata": metadata,
        "qParams": json.loads(json.dumps(_QPARAMS)),
        "nodes": used_nodes,
        "links": links,
    }


def write_graph_files(folder: str | Path, graph: dict[str, Any]) -> Path:
    """Write ``graph`` (``graph_json``'s) as ``{folder}/{slug}.json`` and list its metadata in
    ``{folder}/graph-metadata.json`` (replacing an entry of the same slug), as circuit-tracer's
    ``create_graph_files`` does; the path of the graph's file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    metadata = graph["metadata"]
    path = folder / f"{metadata['slug']}.json"
    path.write_text(json.dumps(graph, indent=2))
    listing = folder / "graph-metadata.json"
    try:
        listed = json.loads(listing.read_text()) if listing.exists() else {"graphs": []}
        graphs = [g for g in listed["graphs"] if g["slug"] != metadata["slug"]]
    except (ValueError, KeyError, TypeError) as error:
        raise ExperimentError(f"write_graph_files: {listing} is not a graph listing: {error!r}") from None
    listing.write_text(json.dumps({**listed, "graphs": [*graphs, metadata]}, indent=2))
    return path


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def _node(record: GraphNode, n_layers: int, **values: Any) -> dict[str, Any]:
    """One node as circuit-tracer's ``Node`` model dumps it (its fields in its order)."""
    kind, layer, pos, feature = record
    if kind == "feature":
        ids = (f"{layer}_{feature}_{pos}", _cantor(layer, feature), str(layer), f"{layer}_{feature}-0")
    elif kind == "error":
        ids = (f"0_{layer}_{pos}", -1, str(layer), f"{layer}_{pos}-0")
    elif kind == "embedding":
        ids = (f"E_{feature}_{pos}", pos, "E", f"E_{feature}-{pos}")
    else:
        ids = (f"{n_layers + 1}_{feature}_{pos}", feature, str(n_layers + 1), f"L_{feature}-{pos}")
    node_id, number, layer_name, js_id = ids
    node = {"node_id": node_id, "feature": number, "layer": layer_name, "ctx_idx": pos}
    node |= {"feature_type": _FEATURE_TYPES[kind], "token_prob": 0.0, "is_target_logit": False}
    node |= {"run_idx": 0, "reverse_ctx_idx": 0, "jsNodeId": js_id, "clerp": ""}
    node |= {"influence": None, "activation": None}
    return node | values


def _nodes(records, kept, scores, activations, logit_tokens, probabilities, n_layers) -> dict[int, dict]:
    """The kept nodes by index (circuit-tracer's ``create_nodes``)."""
    feature_rank = _ranks(records, "feature")
    logit_rank = _ranks(records, "logit")
    built: dict[int, dict] = {}
    for index in torch.nonzero(kept).flatten().tolist():
        record = records[index]
        if record.kind == "logit":
            rank = logit_rank[index]
            prob = probabilities[rank]
            built[index] = _node(
                record,
                n_layers,
                token_prob=prob,
                is_target_logit=rank == 0,
                clerp=f'Output "{logit_tokens[rank]}" (p={prob:.3f})',
            )
            continue
        values = {"influence": float(scores[index])}
        if record.kind == "feature":
            values["activation"] = float(activations[feature_rank[index]])
        built[index] = _node(record, n_layers, **values)
    return built


def _used(built: dict[int, dict], matrix: torch.Tensor, edges: torch.Tensor) -> tuple[list, list]:
    """The links between kept nodes, and the nodes on one of them plus every embedding and logit
    (circuit-tracer's ``create_used_nodes_and_edges``)."""
    targets, sources = torch.nonzero(edges, as_tuple=True)
    weights = matrix[targets, sources].tolist()
    links = [
        {"source": built[s]["node_id"], "target": built[t]["node_id"], "weight": w}
        for t, s, w in zip(targets.tolist(), sources.tolist(), weights)
        if s in built and t in built
    ]
    connected = {link["source"] for link in links} | {link["target"] for link in links}
    used = [
        node
        for node in built.values()
        if node["node_id"] in connected or node["feature_type"] in ("embedding", "logit")
    ]
    shared = sorted(i for i, count in Counter(node["node_id"] for node in used).items() if count > 1)
    if shared:
        warnings.warn(
            f"graph_json: node ids {shared} each name two nodes (circuit-tracer's error id '0_{{layer}}_{{pos}}' "
            "equals a layer-0 feature's '0_{feature}_{pos}'); the viewer shows them as one",
            stacklevel=3,
        )
    return used, links


def _ranks(records: Sequence[GraphNode], kind: str) -> dict[int, int]:
    """Each node of ``kind``: its index among the nodes of that kind."""
    indices = [i for i, record in enumerate(records) if record.kind == kind]
    return {index: rank for rank, index in enumerate(indices)}


def _records(nodes: Sequence[Any], n_layers: Any, n_pos: int) -> list[GraphNode]:
    """The node records, each checked (kind, layer, position and feature of its kind)."""
    if isinstance(n_layers, bool) or not isinstance(n_layers, int) or n_layers < 1:
        raise ExperimentError(f"graph_json: n_layers must be an int >= 1, got {n_layers!r}")
    records = []
    for index, node in enumerate(nodes):
        try:
            record = GraphNode(*node)
        except TypeError:
            raise ExperimentError(
                f"graph_json: nodes[{index}] is {node!r}, not a (kind, layer, pos, feature) record"
            ) from None
        kind, layer, pos, feature = record
        needs_layer, needs_feature = kind in ("feature", "error"), kind != "error"
        problem = None
        if kind not in GRAPH_NODE_KINDS:
            problem = f"kind {kind!r} is not one of {GRAPH_NODE_KINDS}"
        elif needs_layer and not (_is_int(layer) and 0 <= layer < n_layers):
            problem = f"layer {layer!r} is not an int in [0, n_layers={n_layers})"
        elif not (_is_int(pos) and 0 <= pos < n_pos):
            problem = f"pos {pos!r} is not an int in [0, {n_pos}) (the prompt_tokens' positions)"
        elif needs_feature and not (_is_int(feature) and feature >= 0):
            problem = f"feature {feature!r} is not an int >= 0 (a {kind}'s {'feature' if kind == 'feature' else 'token'} id)"
        if problem:
            raise ExperimentError(f"graph_json: nodes[{index}] ({kind}): {problem}")
        records.append(record)
    return records


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _matrix(name: str, value: Any, shape: tuple[int, ...], *, floating: bool) -> torch.Tensor:
    """``value`` as a tensor of ``shape`` (a mask: bool), or refused naming ``name``."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ExperimentError(f"graph_json: {name} is not a tensor: {error}") from None
    if tuple(tensor.shape) != shape:
        raise ExperimentError(f"graph_json: {name} is {list(tensor.shape)}, not {list(shape)} (one per node)")
    if not floating and tensor.dtype != torch.bool:
        raise ExperimentError(f"graph_json: {name} must be a bool mask, got {tensor.dtype}")
    if floating and not (tensor.is_floating_point() and bool(torch.isfinite(tensor).all())):
        raise ExperimentError(f"graph_json: {name} must hold finite floats")
    return tensor.cpu()


def _check_counts(records, activations, logit_tokens, probabilities) -> None:
    counts = Counter(record.kind for record in records)
    for name, have, kind in (
        ("activations", len(activations), "feature"),
        ("logit_tokens", len(logit_tokens), "logit"),
        ("logit_probabilities", len(probabilities), "logit"),
    ):
        if have != counts[kind]:
            raise ExperimentError(f"graph_json: {name} has {have} entries for {counts[kind]} {kind} nodes")
