"""bench/attribution_graph.py's comparison of our attribution graph with circuit-tracer's.

Both sides save (``ours.safetensors``, ``adjacency.safetensors`` and ``theirs_features.safetensors``
in the bench's folder) the adjacency, the active features ``(layer, pos, feature)``, their
activations, the logit tokens and the transcoders' inputs (``[layers, pos, d_model]``: our ``ln2``
outputs, circuit-tracer's ``mlp.hook_in``).  When the feature sets differ, a reader must be able
to tell a threshold-edge feature (a pre-activation within float32 rounding of the JumpReLU
threshold, which two correct float32 forwards may put on either side) from a computation that
differs: so the report gives, in float64 from each side's own inputs, every mismatched feature's
pre-activations on both sides against its threshold and against how far the two sides'
pre-activations differ at that layer, the shared features' activations, the inputs' difference
per layer, and the adjacency restricted to the nodes both graphs have.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file


def load_sides(folder: Path) -> tuple[dict, dict] | None:
    """Our saved graph and circuit-tracer's (adjacency joined in), or ``None`` if either is missing."""
    paths = [
        folder / name for name in ("ours.safetensors", "theirs_features.safetensors", "adjacency.safetensors")
    ]
    if not all(path.exists() for path in paths):
        return None
    ours, theirs = load_file(str(paths[0])), load_file(str(paths[1]))
    theirs |= load_file(str(paths[2]))
    return ours, theirs


def encoders(folder: Path, layers: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``W_enc [layers, d, features]``, ``b_enc`` and ``threshold [layers, features]``, float64."""
    weights = [
        load_file(str(folder / "transcoders" / f"layer_{L}" / "sae_weights.safetensors"))
        for L in range(layers)
    ]
    return tuple(torch.stack([w[key] for w in weights]).double() for key in ("W_enc", "b_enc", "threshold"))


def pre_activations(inputs: torch.Tensor, w_enc, b_enc) -> torch.Tensor:
    """``[layers, pos, features]``: each layer's transcoder pre-activations in float64."""
    return torch.einsum("lpd,ldf->lpf", inputs.double(), w_enc) + b_enc[:, None]


def feature_set(side: dict) -> set[tuple[int, int, int]]:
    return {tuple(row) for row in side["active_features"].tolist()}


def input_report(ours: dict, theirs: dict) -> list[str]:
    """Per layer: the largest difference of the transcoders' inputs, relative to their largest entry."""
    diff = (ours["inputs"].double() - theirs["inputs"].double()).abs().amax(dim=(1, 2))
    scale = theirs["inputs"].double().abs().amax(dim=(1, 2))
    relative = (diff / scale).tolist()
    return [
        "transcoder inputs (our ln2 output, circuit-tracer's mlp.hook_in), per layer max |ours - theirs| "
        f"/ max |theirs|: {', '.join(f'{value:.1e}' for value in relative)}"
    ]


def mismatch_report(folder: Path, ours: dict, theirs: dict) -> list[str]:
    """Each feature active on one side only: its pre-activation on both sides against the threshold;
    the verdict compares its gap to the threshold with how far the sides' pre-activations differ."""
    layers = ours["inputs"].shape[0]
    w_enc, b_enc, threshold = encoders(folder, layers)
    pre_ours = pre_activations(ours["inputs"], w_enc, b_enc)
    pre_theirs = pre_activations(theirs["inputs"], w_enc, b_enc)
    spread = (pre_ours - pre_theirs).abs()[:, 1:].amax(dim=(1, 2))  # position 0 has no features
    mine, other = feature_set(ours), feature_set(theirs)
    lines, worst, worst_ratio = [], 0.0, 0.0
    for where, only in (("ours only", mine - other), ("circuit-tracer's only", other - mine)):
        for layer, pos, feature in sorted(only):
            t = float(threshold[layer, feature])
            o, c = float(pre_ours[layer, pos, feature]), float(pre_theirs[layer, pos, feature])
            gap = max(abs(o - t), abs(c - t))
            worst, worst_ratio = max(worst, gap / abs(t)), max(worst_ratio, gap / float(spread[layer]))
            lines.append(
                f"  {where} (layer {layer}, pos {pos}, feature {feature}): threshold {t:.9g}, pre-activation "
                f"ours {o:.9g}, circuit-tracer's {c:.9g}: |pre - threshold| / threshold {gap / abs(t):.1e}"
            )
    counts = f"features: ours {len(mine)}, circuit-tracer's {len(other)}, shared {len(mine & other)}"
    if not lines:
        return [counts + ": the same"]
    verdict = (
        "every mismatched feature lies within the two sides' float32 rounding of its threshold"
        if worst_ratio <= 1
        else "a mismatched feature lies farther from its threshold than the sides' rounding: "
        "something is computed differently"
    )
    head = [
        f"{counts}; {len(mine ^ other)} on one side only: largest |pre - threshold| / threshold of those "
        f"{worst:.1e}, at most {worst_ratio:.2f} x the largest |pre ours - pre theirs| of their layer",
        "  per layer max |pre ours - pre theirs| / threshold: "
        + ", ".join(f"{float(s / threshold[L].abs().max()):.1e}" for L, s in enumerate(spread)),
        f"  {verdict}",
    ]
    return head + lines + nearest_report(pre_theirs, threshold)


def nearest_report(pre: torch.Tensor, threshold: torch.Tensor) -> list[str]:
    """Per layer, the pre-activation nearest its threshold (positions 1 on), relative: how close the
    calibration (a quantile, which interpolates between two pre-activations) put one to it."""
    gaps = ((pre[:, 1:] - threshold[:, None]).abs() / threshold[:, None].abs()).amin(dim=(1, 2))
    return [
        "  per layer min |pre - threshold| / threshold over all positions and features (circuit-tracer's "
        f"inputs): {', '.join(f'{float(g):.1e}' for g in gaps)}"
    ]


def activation_report(ours: dict, theirs: dict) -> list[str]:
    """The shared features' activations: the largest relative difference."""
    index_ours = {row: i for i, row in enumerate(map(tuple, ours["active_features"].tolist()))}
    pairs = [
        (index_ours[row], j)
        for j, row in enumerate(map(tuple, theirs["active_features"].tolist()))
        if row in index_ours
    ]
    mine, other = (torch.tensor(side) for side in zip(*pairs))
    a, b = ours["activation_values"][mine].double(), theirs["activation_values"][other].double()
    relative = float(((a - b).abs() / b.abs()).max())
    return [f"shared features' activations: largest |ours - theirs| / |theirs| {relative:.1e}"]


def node_keys(side: dict, layers: int) -> list[tuple]:
    """The graph's nodes in order: features, errors ``(layer, pos)``, tokens, logits."""
    n_pos = side["inputs"].shape[1]
    keys = [("feature", *row) for row in side["active_features"].tolist()]
    keys += [("error", layer, pos) for layer in range(layers) for pos in range(n_pos)]
    keys += [("token", pos) for pos in range(n_pos)]
    return keys + [("logit", token) for token in side["logit_tokens"].tolist()]


def adjacency_report(ours: dict, theirs: dict) -> list[str]:
    """The largest difference of the adjacencies over the nodes both graphs have, less the error
    nodes at a mismatched feature's (layer, pos): their values differ by that feature's output."""
    layers = ours["inputs"].shape[0]
    mismatched = {(layer, pos) for layer, pos, _ in feature_set(ours) ^ feature_set(theirs)}
    index_ours = {key: i for i, key in enumerate(node_keys(ours, layers))}
    pairs = [
        (index_ours[key], j)
        for j, key in enumerate(node_keys(theirs, layers))
        if key in index_ours and not (key[0] == "error" and key[1:] in mismatched)
    ]
    mine, other = (torch.tensor(side) for side in zip(*pairs))
    a = ours["adjacency_matrix"][mine][:, mine].double()
    b = theirs["adjacency_matrix"][other][:, other].double()
    what = (
        "all nodes"
        if len(pairs) == len(index_ours) == b.shape[0] == a.shape[0]
        else f"the {len(pairs)} shared nodes"
    )
    if len(pairs) != len(index_ours):
        what += f" (less {len(mismatched)} error nodes at the mismatched features)"
    difference, largest = float((a - b).abs().max()), float(b.abs().max())
    return [
        f"adjacency over {what}: largest difference from circuit-tracer's {difference:.3g} "
        f"(its largest entry {largest:.3g})"
    ]


def compare(folder: Path) -> list[str]:
    """The report's lines (empty when a side saved nothing: a graph over the save limit)."""
    sides = load_sides(folder)
    if sides is None:
        return []
    ours, theirs = sides
    lines = (
        mismatch_report(folder, ours, theirs) + activation_report(ours, theirs) + input_report(ours, theirs)
    )
    if torch.equal(ours["logit_tokens"], theirs["logit_tokens"]):
        return lines + adjacency_report(ours, theirs)
    return lines + ["adjacency: not compared: the logit tokens differ"]
