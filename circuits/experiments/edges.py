"""``edge_circuit``: a model circuit rewritten so that every edge between its components is explicit.

In a pre-norm transformer the residual stream a component reads is the sum of everything written
before it: the embeddings, each earlier head's output and each earlier MLP's output.  The rewrite
gives every *receiver* its own copy of that sum, a masked sum over its *senders*::

    'edges->b1.a.head0.q' Einsum s,sbpd->bpd          # the input of head 0's queries in layer 1
      'edges.mask->b1.a.head0.q' [5] Array            # one weight per sender, 1 = the edge is on
      'edges.senders<5' Concat 0                      # the senders, in the order of EdgeCircuit.senders
        ...

Receivers: each head's query input (``'b1.a.head0.q'``), key and value inputs (per key/value head:
``'b1.a.head0.k'``, or ``'b1.a.kv0.k'`` under grouped-query attention, which stays grouped), each
MLP's input (``'b1.m'``) and the logits (``'t.call'``, the final norm's input).  The norms stay
where the model has them: a receiver's input is the norm's input, each receiver with its own copy
of the norm (as ACDC and EAP-IG place receivers, at the residual-stream read).  Senders: the
embeddings (the stream before layer 0, ``'embeds'`` or ``'idxed_embeds'``), each head
(``'b0.a.head2'``) and each MLP (``'b0.m'``, its output bias included).  An edge is
``'b0.a.head2->b1.a.head0.q'``.

The attention output bias (GPT-2's ``b_O``) writes the same constant in every run: it is no
sender, it is added to each later receiver's input unmasked (as in EAP-IG, where an ablated edge
swaps one sender's activation and leaves the bias alone).  With every mask at 1 the circuit
computes what the model computes (up to the order of float additions).  A mask entry ``m`` scales
the sender's term: at 0 the sender's output is removed from that receiver's input alone (zero
ablation).  ``per_position=True`` makes each mask ``[senders, positions]``.

One mask Array per receiver, over its senders (in the global sender order; a receiver's senders
are a prefix of it): ``EdgeCircuit.with_masks`` rebinds them, ``EdgeCircuit.edges`` lists every
edge with its receiver and its index in that receiver's mask.  Heads are split first
(``split_heads``) where they are not.  docs/discovery.md has the conventions and an example.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping, NamedTuple

import torch

from circuits.core.nodes import Add, Array, Circuit, Concat, Einsum, Rearrange, Symbol, check_node
from circuits.core.traversal import unique_nodes
from circuits.errors import ExperimentError
from circuits.experiments.residual import model_facts
from circuits.experiments.stream import read_norm
from circuits.rewriting.rewrite import replace
from circuits.transformer import names
from circuits.rewriting.matching import Matcher
from circuits.transformer.attention import split_heads, split_layer, unsplit_layers
from circuits.transformer.points import resolve_points

__all__ = ["Edge", "EdgeCircuit", "Receiver", "edge_circuit"]

#: the names of the query, key and value nodes a head's path to its norm passes through
_ROLES = {"q": {names.Q}, "k": {names.K, names.K_KV}, "v": {names.V, names.V_KV}}


class Edge(NamedTuple):
    """One edge: ``sender`` writes into ``receiver``'s input; ``index`` is its entry in the
    receiver's mask (and the sender's place in ``EdgeCircuit.senders``).  A NamedTuple, immutable
    and cheap to make: GPT-2 small has 32,491 edges, made on every ``EdgeCircuit.edges``."""

    sender: str
    receiver: str
    index: int

    @property
    def name(self) -> str:
        return f"{self.sender}->{self.receiver}"


@dataclasses.dataclass(frozen=True)
class Receiver:
    """A receiver: ``name`` (``'b1.a.head0.q'``, ``'b1.m'``, ``'t.call'``), what it is (``kind``:
    ``'q'``, ``'k'``, ``'v'``, ``'mlp'`` or ``'logits'``), its ``layer`` (None: the logits) and head
    (the key/value head for ``'k'`` and ``'v'``), its input node ``input`` (``'edges->name'``) and
    mask ``mask`` (``'edges.mask->name'``), and how many senders it reads (``n_senders``)."""

    name: str
    kind: str
    layer: int | None
    head: int | None
    n_senders: int
    input: Circuit
    mask: Array | None  #: None in the unmasked form (``edge_circuit(masked=False)``)
    #: the unmasked form's: the receivers of one stream share one norm (the model's, over the
    #: rebuilt stream) and ``input`` is the receiver's own view of its output; the gradient at the
    #: stream is the norm's vector-Jacobian product of the gradient at ``input``.  None: masked
    norm: Circuit | None = None
    stream: Circuit | None = None  #: the unmasked form's: the rebuilt stream ``norm`` reads


@dataclasses.dataclass(frozen=True)
class EdgeCircuit:
    """The rewritten model (``circuit``, the same root as the model's), its ``senders`` (names, in
    mask order) with their nodes (``sender_nodes``), its ``receivers`` and ``edges``; ``model``: the
    model circuit it was built from, each head's output a node (named as the senders compute them:
    heads split, or in the unmasked form over unsplit heads one Einsum per head over the attention)."""

    circuit: Circuit
    senders: tuple[str, ...]
    sender_nodes: tuple[Circuit, ...]
    receivers: tuple[Receiver, ...]
    per_position: bool
    model: Circuit
    #: what a masked-off edge reads: ``"zero"``, ``"mean"`` or ``"resample"`` (``with_ablation``)
    ablation: str = "zero"
    #: the Array ``'edges.ablated'`` of every sender's ablated value (None under zero ablation)
    ablated: Array | None = None

    @property
    def edges(self) -> tuple[Edge, ...]:
        return tuple(
            Edge(self.senders[i], receiver.name, i)
            for receiver in self.receivers
            for i in range(receiver.n_senders)
        )

    def receiver(self, name: str) -> Receiver:
        """The receiver called ``name``; another name is an ``ExperimentError`` listing some."""
        for receiver in self.receivers:
            if receiver.name == name:
                return receiver
        shown = ", ".join(r.name for r in self.receivers[:8])
        raise ExperimentError(f"EdgeCircuit: no receiver {name!r}; receivers are {shown}, ...")

    def edge(self, name: str) -> Edge:
        """The edge called ``'sender->receiver'``; another name is an ``ExperimentError`` naming it."""
        sender, arrow, receiver_name = name.partition("->")
        receiver = self.receiver(receiver_name) if arrow else None
        if receiver is None or sender not in self.senders[: receiver.n_senders]:
            raise ExperimentError(
                f"EdgeCircuit: no edge {name!r}: an edge is 'sender->receiver' with a sender written "
                f"before the receiver reads (e.g. {self.edges[0].name!r})"
            )
        return Edge(sender, receiver.name, self.senders.index(sender))

    def with_masks(self, masks: Mapping[str, torch.Tensor]) -> EdgeCircuit:
        """The same circuit with the masks of the receivers named in ``masks`` rebound to the given
        tensors (``[n_senders]``, or ``[n_senders, positions]`` with ``per_position``)."""
        mapping, receivers = {}, {r.name: r for r in self.receivers}
        for name, value in masks.items():
            old = self.receiver(name).mask
            if old is None:
                raise ExperimentError("EdgeCircuit.with_masks: this edge circuit has no masks (masked=False)")
            value = torch.as_tensor(value, dtype=old.value.dtype)
            if tuple(value.shape) != tuple(old.shape):
                raise ExperimentError(
                    f"EdgeCircuit.with_masks: masks[{name!r}] has shape {list(value.shape)}, "
                    f"the receiver's mask {old.describe()} is {list(old.shape)}"
                )
            new = Array(value, name=old.name)
            mapping[old] = new
            receivers[name] = dataclasses.replace(receivers[name], mask=new)
        circuit = replace(self.circuit, mapping) if mapping else self.circuit
        found = {node.name: node for node in unique_nodes([circuit]) if isinstance(node, (Einsum, Add))}
        rebuilt = tuple(dataclasses.replace(r, input=found[r.input.name]) for r in receivers.values())
        senders = tuple(found.get(node.name, node) for node in self.sender_nodes)
        return dataclasses.replace(self, circuit=circuit, receivers=rebuilt, sender_nodes=senders)

    def with_ablation(self, ablation: str, corrupted_inputs: Mapping | None = None) -> EdgeCircuit:
        """This circuit with its masked-off edges reading ``ablation`` (``"zero"``, ``"mean"`` or
        ``"resample"``) values of their senders, computed on ``corrupted_inputs``: each receiver's
        input becomes ``sum_s m_s clean_s + (1 - m_s) ablated_s`` (``circuits.experiments.edge_ablation``)."""
        from circuits.experiments.edge_ablation import with_ablation

        return with_ablation(self, ablation, corrupted_inputs)

    def without_edges(self, edges: Iterable[str]) -> EdgeCircuit:
        """The masks of ``edges`` (names ``'sender->receiver'``) set to 0, every other one kept."""
        masks: dict[str, torch.Tensor] = {}
        for name in [edges] if isinstance(edges, str) else edges:
            edge = self.edge(name)
            mask = masks.get(edge.receiver, self.receiver(edge.receiver).mask.value.clone())
            mask[edge.index] = 0
            masks[edge.receiver] = mask
        return self.with_masks(masks)


def edge_circuit(
    circuit: Circuit,
    *,
    per_position: bool = False,
    masked: bool = True,
    ablation: str = "zero",
    corrupted_inputs: Mapping | None = None,
) -> EdgeCircuit:
    """``circuit`` (a model the builders make, heads split or not) with every edge explicit; see the
    module docstring.  ``ablation``: what a masked-off edge reads, ``"zero"`` (the default),
    ``"resample"`` (its sender's output on ``corrupted_inputs``) or ``"mean"`` (that output's mean
    over their batch): ``EdgeCircuit.with_ablation``.  A model whose heads cannot be separate senders (Gemma 2's post-norm over
    their sum) or whose stream is not the sum of its writes is an ``ExperimentError``.

    ``masked=False`` builds the same receivers without masks, the circuit ``edge_attribution``
    differentiates: the residual stream rebuilt from the senders (one Add per sublayer, not one sum
    per receiver), each norm computed once over it, as the model does, and each receiver reading
    its own view ``'edges.normed->r'`` of that norm's output (``Receiver.input``; the shared norm is
    ``Receiver.norm``).  The gradient at a receiver's input is the norm's vector-Jacobian product of
    the gradient at its view: the cost of a forward rather than of a norm per receiver.  Heads
    given unsplit stay one attention per layer, its query, key and value projections over the
    views stacked on the head axis (``'edges.heads->b1.a.q'``; GQA's keys and values on the
    key/value heads), each head's output one Einsum over it (``EdgeCircuit.model`` has the same
    head outputs); an attention of another form is split.  Its receivers' ``mask`` is None and
    ``with_masks`` refuses it."""
    check_node(circuit, "edge_circuit: circuit", ExperimentError)
    edges = None
    if not masked and unsplit_layers(circuit):
        try:
            edges = _Builder(circuit, _pre_norm_facts(circuit), per_position, masked, together=True).build()
            edges = dataclasses.replace(edges, model=_heads_apart(circuit))
        except _SplitHeads:
            edges = None
    if edges is None:
        if unsplit_layers(circuit):
            circuit = split_heads(circuit, sorted(unsplit_layers(circuit)))
        edges = _Builder(circuit, _pre_norm_facts(circuit), per_position, masked).build()
    if ablation == "zero" and corrupted_inputs is None:
        return edges
    if not masked:
        raise ExperimentError("edge_circuit: ablation= needs the masks (masked=True)")
    return edges.with_ablation(ablation, corrupted_inputs)


def _pre_norm_facts(circuit: Circuit):
    """``model_facts(circuit)``; a post-norm over a sublayer's writes is an ``ExperimentError``."""
    facts = model_facts(circuit)
    for layer, writes in enumerate(facts.writes):
        if writes.attn_norm is not None or writes.mlp_norm is not None:
            raise ExperimentError(
                f"edge_circuit: layer {layer} normalizes its writes after the sublayer (a post-norm), so "
                "its heads are no separate senders of the residual stream"
            )
    return facts


def _heads_apart(circuit: Circuit) -> Circuit:
    """``circuit`` with each unsplit layer's ``'b{L}.a'`` the Add of its heads' outputs, each one
    Einsum over the layer's attention at that head (``split_layer(push_down=False)``): the senders
    named, their queries, keys and values computed together as the model computes them."""
    layers = {node.name: layer for layer, node in unsplit_layers(circuit).items()}
    return circuit.update(
        Matcher(set(layers)) & Einsum, lambda node: split_layer(node, layers[node.name], push_down=False)
    )


class _SplitHeads(Exception):
    """A layer's attention is not the form the heads-together rewrite takes (``_Builder.together``):
    the heads are split instead.  Internal, always caught by ``edge_circuit``."""


class _Builder:
    """The rewrite, layer by layer from the embeddings up: each receiver's input is built over the
    senders written so far, then the components reading it are rebuilt over their inputs.
    ``together`` (the unmasked form over unsplit heads): each layer's heads stay one attention."""

    def __init__(self, circuit: Circuit, facts, per_position: bool, masked: bool, together: bool = False):
        self.circuit, self.facts, self.per_position, self.masked = circuit, facts, per_position, masked
        self.together = together
        layers = range(facts.n_layers)
        keys = [("resid_pre", layer) for layer in layers] + [("resid_final",)]
        keys += [("ln1", layer) for layer in layers]
        keys += (
            [key for layer in layers for key in (("ln2", layer), ("resid_mid", layer))]
            if facts.has_mlp
            else []
        )
        self.points = resolve_points(circuit, keys)
        embeds = self.points[("resid_pre", 0, None)]
        self.senders: list[tuple[str, Circuit]] = [(embeds.name or names.EMBEDS, embeds)]
        self.biases: list[Circuit] = []
        self.receivers: list[Receiver] = []
        self.new_senders: list[tuple[str, Circuit]] = []  #: this sublayer's, readable above it
        self.stacks: dict[int, Circuit] = {}
        self.shared_norms: dict[
            tuple[bytes, bytes], Circuit
        ] = {}  #: the unmasked form's, per norm and stream
        #: per stream node of the model (by hash): the senders, biases and rebuilt stream it holds
        self.streams: dict[bytes, tuple[int, tuple[Circuit, ...], Circuit]] = {embeds.hash: (1, (), embeds)}
        self.stream = embeds  #: the residual stream rebuilt from the senders (the unmasked form's)
        self.dtype = _float_dtype(circuit)

    def build(self) -> EdgeCircuit:
        for layer, writes in enumerate(self.facts.writes):
            after = (
                ("resid_pre", layer + 1, None)
                if layer + 1 < self.facts.n_layers
                else ("resid_final", None, None)
            )
            self.attention(layer, writes.attn)
            self.flush(
                writes.attn_bias, self.points[("resid_mid", layer, None) if writes.mlp is not None else after]
            )
            if writes.mlp is not None:
                norm = self.points[("ln2", layer, None)]
                mlp_norm = self.receiver_norm(norm, names.mlp_out(layer), "mlp", layer, None)
                self.new_senders.append((names.mlp_out(layer), _rewire(writes.mlp, norm, mlp_norm)))
                self.flush(None, self.points[after])
        final = self.facts.readout.norm.output
        new_final = self.receiver_norm(final, names.LOGITS, "logits", None, None)
        root = replace(self.circuit, {final: new_final})
        return EdgeCircuit(
            root,
            tuple(name for name, _ in self.senders),
            tuple(node for _, node in self.senders),
            tuple(self.receivers),
            self.per_position,
            self.circuit,
        )

    def attention(self, layer: int, attn: Circuit) -> None:
        """Layer ``layer``'s heads rebuilt, each query, key and value path on its receiver's norm."""
        if self.together:
            return self.heads_together(layer, attn)
        norm = self.points[("ln1", layer, None)]
        heads = _head_branches(attn, layer)
        n_kv = _kv_heads(heads[0], layer, len(heads))
        inputs: dict[str, Circuit] = {}
        for head, branch in enumerate(heads):
            kv = head // (len(heads) // n_kv)
            kv_label = names.head(layer, head) if n_kv == len(heads) else f"{names.attn_out(layer)}.kv{kv}"
            roles = {
                "q": (f"{names.head(layer, head)}.q", head),
                "k": (f"{kv_label}.k", kv),
                "v": (f"{kv_label}.v", kv),
            }
            for role, (name, index) in roles.items():
                if name not in inputs:
                    inputs[name] = self.receiver_norm(norm, name, role, layer, index)
            wired = {role: inputs[name] for role, (name, _) in roles.items()}
            self.new_senders.append((names.head(layer, head), _rewire_head(branch, norm, wired)))

    def heads_together(self, layer: int, attn: Circuit) -> None:
        """Layer ``layer``'s attention kept whole (TransformerLens's ``use_split_qkv_input``): each
        of its query, key and value projections reads its receivers' views stacked on the weight's
        head axis (``'edges.heads->b1.a.q'``, ``[heads, ...]``), one product per layer rather than
        one per head; each head's output, a sender, is one Einsum over the attention at that head."""
        if not isinstance(attn, Einsum) or attn.name != names.attn_out(layer):
            raise _SplitHeads
        norm = self.points[("ln1", layer, None)]
        slot = Symbol(norm.shape, name="edges.shared_norm")
        cut = replace(attn, {norm: slot})  # the walks below stay in the attention's own nodes
        projections = _projections(cut, slot, layer)
        n_heads, n_kv = projections["q"][1].shape[0], projections["k"][1].shape[0]
        if projections["v"][1].shape[0] != n_kv or n_heads % n_kv:
            raise _SplitHeads
        views: dict[str, list[Circuit]] = {"q": [], "k": [], "v": []}
        for head in range(n_heads):
            kv = head // (n_heads // n_kv)
            kv_label = names.head(layer, head) if n_kv == n_heads else f"{names.attn_out(layer)}.kv{kv}"
            roles = {
                "q": (f"{names.head(layer, head)}.q", head),
                "k": (f"{kv_label}.k", kv),
                "v": (f"{kv_label}.v", kv),
            }
            for role, (name, index) in roles.items():
                if len(views[role]) == index:
                    views[role].append(self.receiver_norm(norm, name, role, layer, index))
        rebuilt = {}
        for role, (einsum, weight, operand, x_axes, w_axes) in projections.items():
            parts = [
                Rearrange(view if operand == slot else replace(operand, {slot: view}), "... -> 1 ...")
                for view in views[role]
            ]
            stacked = Concat(*parts, axis=0, name=f"edges.heads->{names.attn_out(layer)}.{role}")
            rebuilt[einsum] = Einsum(
                (stacked, (w_axes[0], *x_axes)), (weight, w_axes), out_axes=einsum.out_axes, name=einsum.name
            )
        together = replace(cut, rebuilt)
        if any(node == slot for node in unique_nodes([together])):
            raise _SplitHeads  # the norm is read outside the three projections
        branches = split_layer(together, layer, push_down=False).children
        if len(branches) != n_heads:
            raise _SplitHeads
        self.new_senders += [(names.head(layer, head), branch) for head, branch in enumerate(branches)]

    def flush(self, bias: Circuit | None, model_stream: Circuit) -> None:
        """The senders of the sublayer just rebuilt (and its bias) join the stream: what the model's
        ``model_stream`` holds, for the receivers that read it."""
        n = len(self.senders) + len(self.new_senders)
        parts = [node for _, node in self.new_senders] + ([] if bias is None else [bias])
        self.stream = Add(self.stream, *parts, name=f"edges.stream<{n}")
        self.senders += self.new_senders
        self.new_senders = []
        if bias is not None:
            self.biases.append(bias)
        self.streams[model_stream.hash] = (n, tuple(self.biases), self.stream)

    def receiver_norm(self, norm: Circuit, name: str, kind: str, layer, head) -> Circuit:
        """A copy of ``norm`` reading receiver ``name``'s input: the masked sum of the senders the
        model's stream there holds (the unmasked form: a copy of that stream, rebuilt)."""
        stream = read_norm(norm).input
        if stream.hash not in self.streams:
            raise ExperimentError(
                f"edge_circuit: the norm {norm.describe()} reads {stream.describe()}, which is no residual "
                "stream the model's layers write (resid_pre, resid_mid)"
            )
        n, biases, rebuilt_stream = self.streams[stream.hash]
        rebuilt = self.stack(n) if self.masked else rebuilt_stream
        shape = tuple(rebuilt.shape[1:] if self.masked else rebuilt.shape)
        if stream.rank > 3 or shape != tuple(stream.shape):
            raise ExperimentError(
                f"edge_circuit: the stream {stream.describe()} {list(stream.shape)} the norm {norm.describe()} "
                f"reads is not shaped like its senders {list(shape)}"
            )
        axes = "bpd"[3 - stream.rank :]
        if not self.masked:
            key = (norm.hash, rebuilt.hash)
            if key not in self.shared_norms:
                self.shared_norms[key] = _rewire(norm, stream, rebuilt)
            shared = self.shared_norms[key]
            normed = Einsum((shared, axes), out_axes=axes, name=f"edges.normed->{name}")
            self.receivers.append(Receiver(name, kind, layer, head, n, normed, None, shared, rebuilt))
            return normed
        mask_shape = (n, stream.shape[-2]) if self.per_position else (n,)
        mask = Array(torch.ones(mask_shape, dtype=self.dtype), name=f"edges.mask->{name}")
        mask_axes = "s" + axes[-2] if self.per_position else "s"
        summed = f"edges.masked->{name}" if biases else f"edges->{name}"
        total = Einsum((mask, mask_axes), (rebuilt, "s" + axes), out_axes=axes, name=summed)
        if biases:  # the attention output biases: constant, always on
            total = Add(total, *biases, name=f"edges->{name}")
        self.receivers.append(Receiver(name, kind, layer, head, n, total, mask))
        return _rewire(norm, stream, total)

    def stack(self, n: int) -> Circuit:
        """The first ``n`` senders stacked on a new leading axis (one Concat per prefix length)."""
        if n not in self.stacks:
            parts = [
                Rearrange(node, "... -> 1 ...", name=f"{name}.stacked") for name, node in self.senders[:n]
            ]
            self.stacks[n] = Concat(*parts, axis=0, name=f"edges.senders<{n}")
        return self.stacks[n]


def _projections(cut: Circuit, slot: Symbol, layer: int) -> dict[str, tuple]:
    """Per role (``'q'``, ``'k'``, ``'v'``) the Einsum of the weight ``'a{L}.w.q'`` (``'.k'``,
    ``'.v'``; heads its leading axis) with one operand that reads ``slot`` (the layer's norm: the
    norm itself, or the norm plus the position embeddings as the shipped attention-only model's):
    ``(einsum, weight, the operand, its axes, the weight's axes)``; another form is ``_SplitHeads``."""
    weights = {names.attn_weight(layer, role): role for role in ("q", "k", "v")}
    found: dict[str, tuple] = {}
    for node in unique_nodes([cut]):
        at = [
            i for i, child in enumerate(node.children) if isinstance(child, Array) and child.name in weights
        ]
        if not isinstance(node, Einsum) or not at or not _reads(node, slot):
            continue  # (a weight read for its shape: GPT-2's head size)
        if len(node.children) != 2 or node.children[at[0]].rank < 2:
            raise _SplitHeads
        weight, w_axes = node.children[at[0]], tuple(node.operand_axes[at[0]])
        operand, x_axes = node.children[1 - at[0]], tuple(node.operand_axes[1 - at[0]])
        role = weights[weight.name]
        if role in found or w_axes[0] in x_axes or w_axes[0] not in node.out_axes:
            raise _SplitHeads
        found[role] = (node, weight, operand, x_axes, w_axes)
    if len(found) != 3:
        raise _SplitHeads
    return found


def _reads(node: Circuit, target: Circuit) -> bool:
    """Whether ``target`` is ``node`` or below it."""
    return any(found == target for found in unique_nodes([node]))


def _head_branches(attn: Circuit, layer: int) -> list[Circuit]:
    """Layer ``layer``'s head branches ``'b{L}.a.head{h}'``, in head order."""
    branches = {}
    for child in attn.children if isinstance(attn, Add) else ():
        parsed = names.parse(child.name) if child.name else None
        if parsed is not None and parsed.kind == "head" and parsed.layer == layer:
            branches[parsed.heads[0]] = child
    if not branches or sorted(branches) != list(range(len(branches))):
        raise ExperimentError(
            f"edge_circuit: the attention output {attn.describe()} of layer {layer} is not an Add of "
            "its head branches 'b{L}.a.head{h}' (split_heads without groups)"
        )
    return [branches[h] for h in range(len(branches))]


def _kv_heads(branch: Circuit, layer: int, n_heads: int) -> int:
    """How many key/value heads layer ``layer`` has: the leading axis of its key weight."""
    weight = names.attn_weight(layer, "k")
    found = [node for node in unique_nodes([branch]) if node.name == weight and isinstance(node, Array)]
    if not found or n_heads % found[0].shape[0]:
        raise ExperimentError(
            f"edge_circuit: {branch.describe()} has no key weight {weight!r} whose heads divide its {n_heads} heads"
        )
    return found[0].shape[0]


def _rewire(node: Circuit, old: Circuit, new: Circuit) -> Circuit:
    """``node`` reading ``new`` where it read ``old``; refused where it also reads what lies below
    ``old`` another way (then ``old`` is not the only way into it)."""
    cut_point = Symbol(old.shape, name="edges.cut")
    cut = replace(node, {old: cut_point})
    below = {child.hash for child in old.children}
    if any(n.hash in below for n in unique_nodes([cut])):
        raise ExperimentError(f"edge_circuit: {node.describe()} reads below {old.describe()} by another path")
    return replace(cut, {cut_point: new})


def _rewire_head(branch: Circuit, norm: Circuit, inputs: dict[str, Circuit]) -> Circuit:
    """A head branch whose query, key and value paths read ``inputs['q']``, ``['k']``, ``['v']``
    where each read the shared ``norm``."""
    shared = Symbol(norm.shape, name="edges.shared_norm")
    cut = replace(branch, {norm: shared})
    role_of = {name: role for role, role_names in _ROLES.items() for name in role_names}
    # each role reads a placeholder first: the check below walks the head's own nodes, not the
    # rebuilt model under its inputs (144 walks of the whole model for a GPT-2 small otherwise)
    slots = {role: Symbol(norm.shape, name=f"edges.{role}_input") for role in inputs}
    below = {
        node: replace(node, {shared: slots[role_of[node.name]]}, assert_all_found=False)
        for node in unique_nodes([cut])
        if node.name in role_of
    }
    rewired = replace(cut, below) if below else cut
    if any(node == shared for node in unique_nodes([rewired])):
        raise ExperimentError(
            f"edge_circuit: {branch.describe()} reads its norm {norm.describe()} outside its query, key "
            f"and value nodes {sorted(set().union(*_ROLES.values()))}"
        )
    return replace(rewired, {slots[role]: inputs[role] for role in slots}, assert_all_found=False)


def _float_dtype(circuit: Circuit) -> torch.dtype:
    """The dtype of the circuit's floating weights (the masks take it)."""
    for node in unique_nodes([circuit]):
        if isinstance(node, Array) and node.value is not None and node.value.is_floating_point():
            return node.value.dtype
    return torch.get_default_dtype()
