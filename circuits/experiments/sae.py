"""Sparse autoencoders spliced into a circuit, and their features as activations to analyse.

``splice_sae(circuit, sae, point)`` rewrites the node at ``point`` (a ``Point``; by default the
hook the SAE was trained on) as ``recon + error``: ``recon = decode(encode(x))``, named
``'{tag}.sae.recon'``, over the feature activations ``'{tag}.sae.acts'`` ``[..., d_sae]``, and
``error = x - decode(encode(x))`` (``'{tag}.sae.error'``), computed by a copy of the SAE of its own
(``'{tag}.sae.error.*'``), so that editing the features changes the reconstruction and not the error,
as SAELens's ``use_error_term`` (whose error is taken without hooks).  ``tag`` is the point as
``'{kind}{layer}'`` (``'resid_pre1'``; ``SAENames`` spells every name).  With the error the
circuit's value is unchanged; ``error=False`` leaves it out: the SAE-substituted model.  A
transcoder reads its ``point`` and rewrites its ``point_out`` as its reconstruction (plus the error
of the node it replaces).  The spliced node keeps the name of the node it replaces (so the point
still finds it); the node it replaces is renamed ``'{tag}.sae.input'``.

The features are then nodes like any other, and points: ``Point('resid_pre.sae_acts', 1)`` (or
``Point('sae_acts', 1)``) in ``run_with_cache``, ``gradients``, ``attribution_patching`` and the
``act_patch_sae_features*`` grids; ``c.update(names.acts, ...)`` ablates or steers them;
``feature_values``, ``feature_patching`` and ``feature_attribution`` read, patch and attribute one
site's; ``reconstruction_metrics`` gives SAELens's metrics (docs/features.md).  Attribution graphs
over transcoder features are in ``ex.tracing``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple

import torch

from circuits.core.nodes import Add, Array, Circuit, Einsum, GeneralFunction, check_node
from circuits.core.traversal import unique_nodes
from circuits.errors import SAEError
from circuits.evaluation import compile_plan
from circuits.experiments.inputs import same_shape_inputs
from circuits.experiments.sae_metrics import reconstruction_metrics
from circuits.transformer.points import as_point, resolve_points, sae_node_name

if TYPE_CHECKING:  # models are imported where an SAE is checked: `import circuits` stays light
    from circuits.models.sae import SAE

__all__ = [
    "SAENames",
    "feature_attribution",
    "feature_logit_attrs",
    "feature_patching",
    "feature_values",
    "reconstruction_metrics",
    "sae_names",
    "splice_sae",
    "splice_saes",
    "unspliced",
]


class SAENames(NamedTuple):
    """The names ``splice_sae`` gives at a point: ``acts`` ``[..., d_sae]``, ``recon``, ``error``,
    ``pre`` (the encoder's output before the activation) and ``input`` (the node replaced)."""

    acts: str
    recon: str
    error: str
    pre: str
    input: str


def sae_names(point: Any) -> SAENames:
    """The names of the SAE spliced at ``point`` (a ``Point`` or its short spelling)."""
    point = as_point(point)
    return SAENames(*(sae_node_name(point, part) for part in SAENames._fields))


def splice_sae(circuit: Circuit, sae: SAE, point: Any = None, *, error: bool = True) -> Circuit:
    """``circuit`` with ``sae`` at ``point`` (default ``sae.point()``; a transcoder's output at
    ``sae.point_out()``): the node there becomes ``recon + error`` (``error=False``: ``recon``)."""
    check_node(circuit, "splice_sae: the circuit", SAEError)
    from circuits.models.sae import SAE

    if not isinstance(sae, SAE):
        raise SAEError(f"splice_sae: sae is a {type(sae).__name__}, not a circuits.models.sae.SAE (load_sae)")
    read = sae.point() if point is None else as_point(point)
    written = sae.point_out() if sae.is_transcoder else read
    if sae.is_transcoder and point is not None:
        raise SAEError("splice_sae: a transcoder's points are its hook_name and hook_name_out", "point")
    found = resolve_points(circuit, [read, written])
    x_in, out = found[read], found[written]
    for node, size, what in ((x_in, sae.d_in, "d_in"), (out, sae.d_out, "d_out")):
        if not node.shape or node.shape[-1] != size:
            raise SAEError(
                f"splice_sae: {sae.source or 'the SAE'} has {what}={size}, but the point's node "
                f"{node.describe()} is {list(node.shape)}",
                what,
            )
    names = sae_names(written)
    if names.acts in _names(circuit):
        raise SAEError(
            f"splice_sae: an SAE is already spliced at {written!r} ({names.acts} is there)", "point"
        )
    renamed = out.rename(names.input)
    source = renamed if x_in is out else x_in
    recon = _reconstruction(source, sae, names.acts.removesuffix(".acts"))
    if error:
        copy = _reconstruction(source, sae, names.error)
        spliced = Add(recon, Add.minus(renamed, copy, name=names.error), name=out.name)
    else:
        spliced = recon if out.name is None else Add(recon, name=out.name)
    return circuit.replace({out: spliced})


def splice_saes(circuit: Circuit, saes: Iterable[SAE | tuple[SAE, Any]], *, error: bool = True) -> Circuit:
    """``circuit`` with every SAE of ``saes`` spliced (each an ``SAE``, at its own point, or a
    ``(sae, point)`` pair), one after another: several layers, several points, at once."""
    for entry in saes:
        sae, point = entry if isinstance(entry, tuple) else (entry, None)
        circuit = splice_sae(circuit, sae, point, error=error)
    return circuit


def _names(circuit: Circuit) -> set[str]:
    return {node.name for node in unique_nodes([circuit]) if node.name is not None}


def _reconstruction(x: Circuit, sae: SAE, prefix: str) -> Circuit:
    """``decode(encode(x))`` as nodes named ``'{prefix}.pre'``, ``'.acts'``, ``'.recon'``."""
    weights = prefix.split(".sae")[0] + ".sae"
    w_enc, w_dec = Array(sae.W_enc, f"{weights}.W_enc"), Array(sae.W_dec, f"{weights}.W_dec")
    b_enc, b_dec = Array(sae.b_enc, f"{weights}.b_enc"), Array(sae.b_dec, f"{weights}.b_dec")
    if sae.apply_b_dec_to_input:
        x = Add(x, Array(-sae.b_dec, f"{weights}.neg_b_dec"), name=f"{prefix}.centered")
    pre = Add(Einsum.from_einsum_string("...i,ij->...j", x, w_enc), b_enc, name=f"{prefix}.pre")
    acts = _activation(pre, sae, weights, prefix)
    product = Einsum.from_einsum_string("...j,jo->...o", acts, w_dec)
    return Add(product, b_dec, name=f"{prefix}.recon")


def _activation(pre: Circuit, sae: SAE, weights: str, prefix: str) -> Circuit:
    """ReLU; JumpReLU: ReLU times ``step(pre - threshold)`` (1 where ``pre > threshold``, as SAELens's
    mask); TopK: ReLU of the ``k`` largest (SAELens's ``TopK``)."""
    if sae.architecture == "topk":
        kept = GeneralFunction(pre, spec=f"top_k_{sae.k}", name=f"{prefix}.top_k")
        return GeneralFunction(kept, spec="relu", name=f"{prefix}.acts")
    relu = GeneralFunction(pre, spec="relu", name=f"{prefix}.relu")
    if sae.threshold is None:
        return relu.rename(f"{prefix}.acts")
    above = Add(pre, Array(-sae.threshold, f"{weights}.neg_threshold"))
    gate = GeneralFunction(above, spec="step", name=f"{prefix}.gate")
    return Einsum.from_einsum_string("...j,...j->...j", relu, gate, name=f"{prefix}.acts")


Metric = Callable[[torch.Tensor], torch.Tensor]


def feature_values(
    circuit: Circuit, points: Iterable[Any], *, inputs: Mapping[Any, Any] | None = None, **run: Any
) -> dict[str, torch.Tensor]:
    """``{name: value}`` of the SAE nodes (``acts``, ``recon``, ``error``, ``pre``) spliced at
    ``points``, and ``'value'``: the circuit's, from one evaluation (``inputs``, ``device``,
    ``dtype`` as ``cc.evaluate``)."""
    by_name: dict[str, list[Circuit]] = {}
    for node in unique_nodes([circuit]):
        by_name.setdefault(node.name, []).append(node)
    wanted = {}
    for point in points:
        for name in sae_names(point)[:4]:
            found = by_name.get(name, [])
            if name.endswith((".acts", ".recon")) and not found:
                raise SAEError(
                    f"feature_values: no SAE is spliced at {as_point(point)!r} ({name} is not there)"
                )
            wanted.update({node.hash: name for node in found})
    plan = compile_plan([circuit], inputs, run.get("device"), run.get("dtype"))
    values: dict[str, torch.Tensor] = {}

    def keep(node: Circuit, value: torch.Tensor) -> None:
        if node.hash in wanted:
            values[wanted[node.hash]] = value

    for node, value in plan.initial_values():
        keep(node, value)
    values["value"] = plan.run(on_value=keep)[0]
    return values


def feature_patching(
    circuit: Circuit,
    point: Any,
    metric: Metric,
    *,
    clean_inputs: Mapping[Any, Any] | None = None,
    corrupted_inputs: Mapping[Any, Any],
    features: Iterable[int] | None = None,
    **run: Any,
) -> torch.Tensor:
    """``metric`` of the corrupted run with feature ``k``'s clean activations (every position)
    patched in, for each of ``features`` (default: all): ``[len(features)]``, as a patching grid
    over the SAE's features (``metric``: the circuit's value -> a number)."""
    names = sae_names(point)
    clean, corrupted, run_on = _two_runs(
        circuit, point, clean_inputs, corrupted_inputs, "feature_patching", run
    )
    acts = run_on.get_unique(names.acts)
    results = []
    for k in range(clean.shape[-1]) if features is None else features:
        patched = corrupted.clone()
        patched[..., k] = clean[..., k]
        value = run_on.replace({acts: Array(patched, names.acts)}).evaluate(**run)
        results.append(torch.as_tensor(metric(value)).detach())
    return torch.stack(results)


def feature_attribution(
    circuit: Circuit,
    point: Any,
    metric: Metric,
    *,
    clean_inputs: Mapping[Any, Any] | None = None,
    corrupted_inputs: Mapping[Any, Any],
    **run: Any,
) -> torch.Tensor:
    """Attribution patching to the features at ``point``: ``(clean - corrupted) * dmetric/dacts``
    on the corrupted run, ``[..., d_sae]`` (the acts' own shape), the gradient estimate of
    ``feature_patching`` per position (summed over the leading axes, it estimates each feature's)."""
    names = sae_names(point)
    clean, corrupted, run_on = _two_runs(
        circuit, point, clean_inputs, corrupted_inputs, "feature_attribution", run
    )
    tracked = corrupted.detach().clone().requires_grad_(True)
    replaced = run_on.replace({run_on.get_unique(names.acts): Array(tracked, names.acts)})
    (gradient,) = torch.autograd.grad(metric(replaced.evaluate(**run)), tracked)
    return (clean - corrupted) * gradient


def _two_runs(circuit, point, clean_inputs, corrupted_inputs, what: str, run: Mapping[str, Any]):
    """The features' clean and corrupted values, and the circuit on the corrupted inputs (each
    inputs mapping as the patching grids take it: node or name -> value of the same shape)."""
    clean_run = circuit if clean_inputs is None else same_shape_inputs(circuit, clean_inputs, what)
    corrupted_run = same_shape_inputs(circuit, corrupted_inputs, what)
    acts = sae_names(point).acts
    clean = feature_values(clean_run, [point], **run)[acts]
    return clean, feature_values(corrupted_run, [point], **run)[acts], corrupted_run


def feature_logit_attrs(
    circuit: Circuit,
    point: Any,
    tokens: Any,
    *,
    incorrect_tokens: Any = None,
    pos_slice: Any = None,
    inputs: Mapping[Any, Any] | None = None,
    **run: Any,
) -> torch.Tensor:
    """Each feature's direct contribution to the logit of ``tokens`` (minus ``incorrect_tokens``):
    its activation times its decoder row, through the final norm (the run's own scale) and the
    unembedding, as ``ActivationCache.logit_attrs`` reads a residual stack: ``[d_sae, *batch_and_pos]``.

    ``circuit`` is a whole model circuit (the final norm and unembedding are read off it); the
    SAE at ``point`` must write into the residual stream (a residual point, ``attn_out``,
    ``mlp_out``, or a transcoder writing one), and every SAE must be spliced with its error: the
    norm's scale and the readout are read from the circuit with the SAEs taken out
    (``unspliced``), which computes the same only then."""
    from circuits.experiments.activations import run_with_cache

    names = sae_names(point)
    acts = feature_values(circuit, [point], inputs=inputs, **run)[names.acts]
    decoder = circuit.get_unique(names.acts.removesuffix(".acts") + ".W_dec").evaluate(**run)
    cache = run_with_cache(unspliced(circuit), [], inputs=inputs, **run)
    if pos_slice is not None:
        acts = acts[:, pos_slice]
    stack = torch.einsum("...f,fd->f...d", acts, decoder.to(acts.dtype))
    return cache.logit_attrs(stack, tokens, incorrect_tokens, pos_slice=pos_slice)


def unspliced(circuit: Circuit) -> Circuit:
    """``circuit`` with every SAE spliced with its error taken out again (each ``recon + error``
    node back to the node it replaced, by its name); an SAE spliced without its error is refused,
    since nothing of the circuit computes what it replaced."""
    mapping = {}
    for node in unique_nodes([circuit]):
        names = [child.name or "" for child in node.children]
        if len(names) == 1 and names[0].endswith(".sae.recon"):
            raise SAEError(f"unspliced: the SAE at {node.name!r} was spliced without its error (error=False)")
        if (
            len(names) == 2
            and names[0].endswith(".sae.recon")
            and names[1] == names[0][: -len("recon")] + "error"
        ):
            mapping[node] = node.children[1].children[0].rename(node.name)
    return circuit.replace(mapping) if mapping else circuit
