"""The local replacement model of an attribution graph: ``frozen_replacement(circuit, transcoders)``.

circuit-tracer's method (Ameisen et al. 2025, "Circuit tracing"), as a rewrite of the model circuit:

- every attention pattern (``'a.attn_probs'``) and every norm's scale (``'ln.rsqrt'``, ``'rms.rsqrt'``:
  the ``1/sqrt(var + eps)`` factor; a layer norm's mean subtraction stays, it is linear) becomes an
  Array of its value on the clean run, named after what it belongs to (``'b0.a.frozen_probs'``,
  ``'m0.norm.frozen_scale'``, ``'final.call.frozen_scale'``);
- each layer's transcoder replaces the node it writes (the MLP output) by
  ``acts @ W_dec + b_dec + error``: ``acts`` (``'{site}.sae.acts'``) and ``error``
  (``'{site}.sae.error'``, the output minus its reconstruction) are Arrays of their clean values, so
  that every feature's, error's and token embedding's effect on what lies above it is linear;
- the feature pre-activations (``'{site}.sae.pre'``, ``W_enc`` applied to the frozen stream the
  transcoder reads, plus ``b_enc``) are kept as circuits of their own: the graph's targets.

As circuit-tracer does, position 0 (the BOS token) has no feature nodes and a zero error: what the
layer writes there is the Array ``'{site}.sae.first_position'`` (``skip_first_position=False``:
features and error there too).  On the clean inputs the frozen circuit computes the model's value
(float rounding aside): the tests check it.  After a rewrite that reaches no frozen node it is the
replacement model, not the model: attention and norms no longer respond.

A node left on a path from the sources (token embeddings, features, errors) to a target that is not
linear in them (a GeneralFunction other than a cast, an Einsum of two such paths) means the family
is not one this freezing linearizes: ``ExperimentError`` naming the node.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import attrs
import torch

from circuits.core.nodes import (
    Add,
    Array,
    Circuit,
    Concat,
    Einsum,
    GeneralFunction,
    Index,
    Rearrange,
    check_node,
)
from circuits.core.traversal import postorder
from circuits.errors import ExperimentError, SAEError
from circuits.evaluation import compile_plan
from circuits.experiments.residual import model_facts
from circuits.experiments.sae import SAENames, sae_names
from circuits.transformer import names
from circuits.transformer.points import Point, as_point, resolve_points

__all__ = ["FrozenReplacement", "check_linear", "freeze_attention_and_norms", "frozen_replacement"]

_FROZEN_SCALES = frozenset(names.norm_node(norm, "rsqrt") for norm in (names.LN, names.RMS))
_SHARED_PREFIXES = ("a.", "m.", "ln.", "rms.")  # names every layer's attention, MLP and norm share
# Functions of a node's shape alone (their value is no function of the sources), and the linear ones.
_SHAPE_ONLY = ("last_dim_size",)
_LINEAR = ("upcast_float32", "type_as")


@dataclasses.dataclass(frozen=True, eq=False)
class FrozenReplacement:
    """The local replacement model: ``circuit`` (the model circuit rewritten, the same root), its
    ``logits`` (``'t.call'``), ``readout_input`` (the final norm's output, which the logits read
    linearly before any soft-cap), and per layer: ``feature_inputs`` (what the transcoder reads, in
    the frozen circuit), ``pre_activations`` (``[1, pos, d_sae]``), ``acts``, ``errors`` (the Arrays)
    and ``writes`` (the nodes that replaced the MLP outputs); ``token_embeds``, the token embeddings
    node; ``unembed``, the ``[vocab, d_model]`` weight the logits read; ``transcoders``, as computed
    with (in the run's dtype); ``input_tokens`` ``[pos]``; ``logits_value``, the clean logits."""

    circuit: Circuit
    logits: Circuit
    readout_input: Circuit
    feature_inputs: tuple[Circuit, ...]
    pre_activations: tuple[Circuit, ...]
    acts: tuple[Array, ...]
    errors: tuple[Array, ...]
    writes: tuple[Circuit, ...]
    token_embeds: Circuit
    unembed: Circuit
    transcoders: tuple[Any, ...]
    input_tokens: torch.Tensor
    logits_value: torch.Tensor
    skip_first_position: bool

    @property
    def n_layers(self) -> int:
        return len(self.writes)

    @property
    def n_pos(self) -> int:
        return int(self.input_tokens.shape[0])


@dataclasses.dataclass(frozen=True)
class _Site:
    """One layer's transcoder (cast to the run's dtype) and the nodes it reads and writes."""

    sae: Any
    read: Circuit
    write: Circuit
    names: SAENames


def frozen_replacement(
    circuit: Circuit,
    transcoders: Sequence[Any],
    *,
    skip_first_position: bool = True,
    device: torch.device | str | None = None,
    dtype: torch.dtype | None = None,
) -> FrozenReplacement:
    """``circuit`` (a model circuit of one prompt, ``[1, pos]`` tokens) as circuit-tracer's local
    replacement model with ``transcoders`` (one per layer, layer ``L``'s at index ``L``: a
    ``circuits.models.sae.SAE`` transcoder at its own points, or ``(sae, read, write)`` with the
    points, or node names, it reads and writes); module docstring.  ``device``, ``dtype``: of the
    clean run, and of the values frozen."""
    check_node(circuit, "frozen_replacement: circuit", ExperimentError)
    facts = model_facts(circuit)
    logits = circuit.get_unique(names.LOGITS)
    if logits.rank != 3 or logits.shape[0] != 1:
        raise ExperimentError(
            f"frozen_replacement: the circuit's logits are {list(logits.shape)}; an attribution graph is "
            "of one prompt: build the circuit on tokens of shape [1, pos] (the argument tokens)"
        )
    token_embeds = resolve_points(circuit, [Point("embed")])[Point("embed")]
    input_tokens = circuit.get_unique(names.INPUT_TOKENS)
    sites = _sites(circuit, transcoders, facts.n_layers, device, dtype)
    frozen_nodes = _nodes_to_freeze(
        [circuit] + [site.read for site in sites], {site.write.hash for site in sites}
    )
    clean = _clean_values(
        [logits, input_tokens, token_embeds]
        + [s.read for s in sites]
        + [s.write for s in sites]
        + frozen_nodes,
        device,
        dtype,
    )
    mapping = {
        node: Array(clean[node.hash], name=name) for node, name in _frozen_names(circuit, frozen_nodes)
    }
    acts, errors, writes = [], [], []
    for layer, site in enumerate(sites):
        values = _layer_values(site, clean[site.read.hash], clean[site.write.hash], skip_first_position)
        acts.append(Array(values["acts"], name=site.names.acts))
        errors.append(Array(values["error"], name=site.names.error))
        writes.append(_write(site, acts[-1], errors[-1], values.get("first")))
        mapping[site.write] = writes[-1]
    readout_input = facts.readout.norm.output
    roots = [circuit, logits, readout_input, token_embeds] + [site.read for site in sites]
    frozen_roots = _replace_all(roots, mapping)
    feature_inputs = frozen_roots[4:]
    pres = [_pre_activation(site, x) for site, x in zip(sites, feature_inputs)]
    check_linear(frozen_roots[2:3] + feature_inputs, [frozen_roots[3], *acts, *errors])
    return FrozenReplacement(
        circuit=frozen_roots[0],
        logits=frozen_roots[1],
        readout_input=frozen_roots[2],
        feature_inputs=tuple(feature_inputs),
        pre_activations=tuple(pres),
        acts=tuple(acts),
        errors=tuple(errors),
        writes=tuple(writes),
        token_embeds=frozen_roots[3],
        unembed=facts.readout.unembed,
        transcoders=tuple(site.sae for site in sites),
        input_tokens=clean[input_tokens.hash][0].detach(),
        logits_value=clean[logits.hash].detach(),
        skip_first_position=skip_first_position,
    )


def _sites(circuit: Circuit, transcoders: Any, n_layers: int, device, dtype) -> list[_Site]:
    """Each layer's ``_Site`` (its weights on ``device``, in ``dtype``, where given); transcoders that
    are not one transcoder per layer are refused."""
    from circuits.models.sae import SAE

    if isinstance(transcoders, (SAE, str, bytes)) or not isinstance(transcoders, Sequence):
        raise ExperimentError(
            f"transcoders: give a list of one transcoder per layer ({n_layers}), got {type(transcoders).__name__}"
        )
    if len(transcoders) != n_layers:
        raise ExperimentError(
            f"transcoders: the model has {n_layers} layers and {len(transcoders)} transcoders were given; "
            "the replacement model needs one transcoder per layer, layer L's at index L"
        )
    entries = []
    for layer, entry in enumerate(transcoders):
        sae, read, write = entry if isinstance(entry, tuple) and len(entry) == 3 else (entry, None, None)
        if not isinstance(sae, SAE) or not sae.is_transcoder:
            raise ExperimentError(
                f"transcoders[{layer}]: a {getattr(sae, 'architecture', type(sae).__name__)!r}; the replacement "
                "model takes transcoders (SAE architecture 'transcoder' or 'jumprelu_transcoder')"
            )
        read, write = _own_points(sae, layer) if read is None and write is None else (read, write)
        entries.append((sae, _spot(read, layer), _spot(write, layer)))
    found = _find(circuit, [spot for _, read, write in entries for spot in (read, write)])
    sites = []
    for layer, (sae, read, write) in enumerate(entries):
        for spot, size, what in ((read, sae.d_in, "d_in"), (write, sae.d_out, "d_out")):
            if found[spot].shape[-1:] != (size,):
                raise ExperimentError(
                    f"transcoders[{layer}]: {what}={size}, but the node {found[spot].describe()} is "
                    f"{list(found[spot].shape)}"
                )
        cast = {key: getattr(sae, key) for key in ("W_enc", "b_enc", "W_dec", "b_dec", "threshold")}
        cast = {
            k: v if v is None else v.to(device=device or v.device, dtype=dtype or v.dtype)
            for k, v in cast.items()
        }
        sites.append(_Site(attrs.evolve(sae, **cast), found[read], found[write], _site_names(write)))
    return sites


def _own_points(sae: Any, layer: int) -> tuple[Point, Point]:
    """The points of the transcoder's hooks; a hook no point stands for is refused with the way out."""
    try:
        return sae.point(), sae.point_out()
    except SAEError as error:
        raise ExperimentError(
            f"transcoders[{layer}]: {error}; or give (sae, read, write) with the points or node names it "
            f"reads and writes, e.g. (sae, ('ln2', {layer}), 'b{layer}.m') for circuit-tracer's "
            "mlp.hook_in and mlp.hook_out"
        ) from None


def _is_kind(text: str) -> bool:
    try:
        as_point(text)
        return True
    except ExperimentError:
        return False


def _spot(spot: Any, layer: int) -> Point | str:
    """A transcoder's point (of layer ``layer``, or refused) or node name (a string no point kind is)."""
    if isinstance(spot, str) and not _is_kind(spot):
        return spot
    point = as_point(spot)
    if point.layer != layer:
        raise ExperimentError(
            f"transcoders[{layer}]: it reads or writes {point!r}, not a point of layer {layer}; "
            "give layer L's transcoder at index L"
        )
    return point


def _find(circuit: Circuit, spots: list[Point | str]) -> dict[Point | str, Circuit]:
    """The node of each point and node name, in two walks of ``circuit`` at most."""
    points = [spot for spot in spots if isinstance(spot, Point)]
    found: dict[Point | str, Circuit] = dict(resolve_points(circuit, points)) if points else {}
    wanted = {spot for spot in spots if isinstance(spot, str)}
    if wanted:
        named: dict[str, set[Circuit]] = {name: set() for name in wanted}
        for node in postorder([circuit]):
            if node.name in named:
                named[node.name].add(node)
        for name, nodes in named.items():
            if len(nodes) != 1:
                raise ExperimentError(f"transcoders: {len(nodes)} nodes are named {name!r}, not one")
            found[name] = next(iter(nodes))
    return found


def _site_names(site: Any) -> SAENames:
    """``sae_names`` of a point; for a node name, the same parts under ``'{name}.sae'``."""
    if isinstance(site, Point):
        return sae_names(site)
    return SAENames(*(f"{site}.sae.{part}" for part in SAENames._fields))


def freeze_attention_and_norms(
    circuit: Circuit, *, device: torch.device | str | None = None, dtype: torch.dtype | None = None
) -> Circuit:
    """``circuit`` with every attention pattern and norm scale an Array of its value on the
    circuit's own inputs (named as ``frozen_replacement`` names them): run on other inputs, it attends
    and normalizes as on these (circuit-tracer's freezing for interventions, without transcoders)."""
    check_node(circuit, "freeze_attention_and_norms: circuit", ExperimentError)
    nodes = _nodes_to_freeze([circuit], set())
    if not nodes:
        return circuit
    clean = _clean_values(nodes, device, dtype)
    return circuit.replace(
        {node: Array(clean[node.hash], name=name) for node, name in _frozen_names(circuit, nodes)}
    )


def _nodes_to_freeze(roots: list[Circuit], replaced: set[bytes]) -> list[Circuit]:
    """The attention patterns and norm scales ``roots`` read: not below a node of ``replaced`` (the
    MLPs the transcoders replace) nor below another one."""
    stack, seen, found = list(roots), set(), []
    while stack:
        node = stack.pop()
        if node.hash in seen:
            continue
        seen.add(node.hash)
        if node.name == names.PROBS or node.name in _FROZEN_SCALES:
            found.append(node)
        elif node.hash not in replaced:
            stack.extend(node.children)
    return found


def _frozen_names(circuit: Circuit, frozen: list[Circuit]) -> list[tuple[Circuit, str]]:
    """Each frozen node and its Array's name: the nearest node above it with a name of its own
    (``'b0.a'``, ``'a0.norm'``), plus ``'.frozen_probs'`` or ``'.frozen_scale'``."""
    parents: dict[bytes, Circuit] = {}
    for node in postorder([circuit] + frozen):
        for child in node.children:
            parents.setdefault(child.hash, node)
    named = []
    for node in frozen:
        owner = parents.get(node.hash)
        while owner is not None and (owner.name is None or owner.name.startswith(_SHARED_PREFIXES)):
            owner = parents.get(owner.hash)
        base = "frozen" if owner is None else owner.name
        named.append((node, f"{base}.frozen_{'probs' if node.name == names.PROBS else 'scale'}"))
    return named


def _clean_values(nodes: list[Circuit], device, dtype) -> dict[bytes, torch.Tensor]:
    """The values of ``nodes`` on the clean run, by hash, from one evaluation."""
    wanted = {node.hash for node in nodes}
    values: dict[bytes, torch.Tensor] = {}

    def keep(node: Circuit, value: torch.Tensor) -> None:
        if node.hash in wanted:
            values[node.hash] = value.detach()

    plan = compile_plan(nodes, None, device, dtype)
    for node, value in plan.initial_values():
        keep(node, value)
    with torch.no_grad():
        plan.run(on_value=keep)
    return values


def _layer_values(
    site: _Site, x: torch.Tensor, out: torch.Tensor, skip_first: bool
) -> dict[str, torch.Tensor]:
    """The transcoder's activations on ``x`` and the error of its reconstruction of ``out`` (as
    circuit-tracer: position 0's activations and error zero, its output kept as ``first``)."""
    sae = site.sae
    acts = sae.encode(x.to(sae.W_enc.dtype)).to(out.dtype)
    if skip_first:
        acts[:, 0] = 0
    error = out - sae.decode(acts.to(sae.W_dec.dtype)).to(out.dtype)
    if not skip_first:
        return {"acts": acts, "error": error}
    first = torch.zeros_like(error)
    first[:, 0] = error[:, 0]
    error[:, 0] = 0
    return {"acts": acts, "error": error, "first": first}


def _write(site: _Site, acts: Array, error: Array, first: torch.Tensor | None) -> Circuit:
    """``acts @ W_dec + b_dec + error`` (``+ first``), named as the node it replaces."""
    prefix = site.names.acts.removesuffix(".acts")
    w_dec, b_dec = Array(site.sae.W_dec, f"{prefix}.W_dec"), Array(site.sae.b_dec, f"{prefix}.b_dec")
    recon = Add(Einsum.from_einsum_string("...j,jo->...o", acts, w_dec), b_dec, name=site.names.recon)
    parts = [recon, error] + ([] if first is None else [Array(first, name=f"{prefix}.first_position")])
    return Add(*parts, name=site.write.name)


def _pre_activation(site: _Site, x: Circuit) -> Circuit:
    """``(x - b_dec) @ W_enc + b_enc`` (``b_dec`` only with ``apply_b_dec_to_input``) over the frozen ``x``."""
    sae, prefix = site.sae, site.names.acts.removesuffix(".acts")
    if sae.apply_b_dec_to_input:
        x = Add(x, Array(-sae.b_dec, f"{prefix}.neg_b_dec"), name=f"{prefix}.centered")
    product = Einsum.from_einsum_string("...i,ij->...j", x, Array(sae.W_enc, f"{prefix}.W_enc"))
    return Add(product, Array(sae.b_enc, f"{prefix}.b_enc"), name=site.names.pre)


def _replace_all(roots: list[Circuit], mapping: dict[Circuit, Circuit]) -> list[Circuit]:
    """Each of ``roots`` with ``mapping`` applied, in one walk (shared subtrees rewritten once): the
    roots are gathered under one throwaway node (each summed to a number, never evaluated)."""
    bundle = Add(*(Einsum((root, tuple(range(root.rank))), out_axes=()) for root in roots))
    replaced = bundle.replace(mapping, assert_all_found=False)
    return [summed.children[0] for summed in replaced.children]


def check_linear(targets: list[Circuit], sources: list[Circuit]) -> None:
    """Refuse (``ExperimentError``) a node on a path from ``sources`` to ``targets`` that is not linear
    in the sources: a GeneralFunction other than a cast (a function of the shape alone is a
    constant), an Einsum with two operands on such paths."""
    depends = {node.hash for node in sources}
    for node in postorder(targets):
        if node.hash in depends:
            continue
        on_path = [child for child in node.children if child.hash in depends]
        if not on_path:
            continue
        if isinstance(node, GeneralFunction):
            if node.spec.name in _SHAPE_ONLY:
                continue
            linear = node.spec.name in _LINEAR or node.spec.name.startswith(("cast_from_", "gen_index"))
            if not linear or node.children.index(on_path[0]) != 0 or len(on_path) > 1:
                _refuse(node, "a function that is not linear")
        elif isinstance(node, Einsum) and len(on_path) > 1:
            _refuse(node, "a product of two of them")
        elif not isinstance(node, (Add, Einsum, Index, Rearrange, Concat)):
            _refuse(node, f"a {type(node).__name__}")
        depends.add(node.hash)


def _refuse(node: Circuit, what: str) -> None:
    raise ExperimentError(
        f"frozen_replacement: {node.describe()} is {what} of the token embeddings, features or errors, "
        "left after freezing the attention patterns and norm scales: this model's family is not one the "
        "attribution graph linearizes"
    )
