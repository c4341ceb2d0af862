"""Activation points: ``Point(kind, layer, head)``, the one value that names a spot in a model.

A ``Point`` is a small frozen value (a named tuple: ``Point("z", 1, 2) == ("z", 1, 2)``), and it is
accepted everywhere a spot is named: as a matcher (``c.get_unique(Point("attn_probs", 1))``,
``ex.patch(c, Point("resid_pre", 1), inputs)``, a ``sweep`` target: the transformer layer registers
it as a matcher form with ``circuits.rewriting.hints``) and as a key (``run_with_cache`` and
``gradients`` points, ``cache[Point("z", 1, 2)]``).  Every spelling of a key resolves through one
function, ``as_point`` (as TransformerLens's through ``get_act_name``): ``'logits'``,
``("attn_probs", 1)`` and ``("z", 1, 2)`` are short spellings of ``Point('logits')``,
``Point('attn_probs', 1)`` and ``Point('z', 1, 2)``.  ``Point(...).matcher()`` is the matcher
itself, for what only a matcher object has (``.then(...)``).

Attention and MLP internals have the same name in every layer (``'a.attn_probs'``, ``'m.act'``;
see ``circuits.transformer.names``), and a later layer's attention contains the earlier layers below its input
norm, so neither a name nor "below ``'b1.a'``" picks one layer's node.  A point searches from the
layer's own named node (``'b{L}.a'``, ``'b{L}.a.head{h}'``, ``'b{L}.m'``, a norm) down to the kind's
name and never below the layer's input: the walk stops at the residual stream and the norms
(``'b{L}'``, ``'b{L}.resid_mid'``, ``'a{L}.norm'``, ``'m{L}.norm'``, the embeddings).  It uses the
naming convention alone (no hashes), so one point fits every circuit the builders make, split or
not, masked or not.

- A layer point of a per-head kind (``q k v attn_scores attn_probs z``) finds the layer's node on
  an unsplit layer; on a split layer (``cc.passes.split_heads``) the layer has no such node, and the
  point finds every head branch's node (one per head or group; together they are the layer's).
- A head point (``head=h``) finds head ``h``'s node on a split layer.  On an unsplit layer (or one
  whose head ``h`` is inside a group branch) head ``h`` has no node of its own: using the point
  on it raises ``ExperimentError`` saying to ``split_heads`` first.
- After ``split_heads`` on grouped-query attention a head's keys and values are ``'a.k_kv'`` and
  ``'a.v_kv'`` (the head's Index moves below them); the ``k`` and ``v`` points find those.
- ``attn_out`` and ``mlp_out`` are what the layer adds to the residual stream, as
  TransformerLens's ``hook_attn_out`` and ``hook_mlp_out``: ``'b{L}.a'`` and ``'b{L}.m'``, or
  where those are normed before they join it (Gemma 2's sandwich norms) the norms' outputs
  ``'b{L}.a.post_norm'`` and ``'b{L}.m.post_norm'`` (``POST_NORM``).
- A point of a kind the circuit's family lacks (``mlp_out`` of an attention-only model) finds
  nothing.

- Used in ``ex.patch`` or an ablation, a point replaces its node at every use (activation
  patching, as a TransformerLens hook does): each point's search path covers every use of its
  node (``resid_pre`` of layer 0 is the topmost embeddings node, found from the root), and
  tests/test_points.py checks it against patching the node itself.

- A spliced SAE's nodes (``circuits.experiments.sae.splice_sae``) are points too:
  ``Point('resid_pre.sae_acts', 1)`` is the feature activations of the SAE spliced at
  ``Point('resid_pre', 1)`` (SAELens's ``blocks.1.hook_resid_pre.hook_sae_acts_post``), and
  ``'.sae_pre'``, ``'.sae_recon'``, ``'.sae_error'``, ``'.sae_input'`` its pre-activations,
  reconstruction, error and the node it replaced (``SAE_PARTS``); the site is any point kind, with
  its layer and head.  ``Point('sae_acts', 1)`` is the one SAE spliced in layer 1, wherever it sits
  (several there: refused, naming them).  They find the nodes by name (``sae_node_name``).

``TRANSFORMER_LENS_HOOKS`` gives TransformerLens's hook name for each kind; how our nodes differ
in shape or meaning from those hooks: docs/models.md.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Callable, Iterator, NamedTuple, Optional, Union

import torch

from circuits.transformer import names
from circuits.errors import ExperimentError, MissingPointError
from circuits.rewriting.matching import IterativeMatcher, Matcher, get
from circuits.core.nodes import Circuit
from circuits.core.traversal import unique_nodes

__all__ = [
    "HEAD_KINDS",
    "POINT_KINDS",
    "POST_NORM",
    "SAE_KINDS",
    "SAE_PARTS",
    "TRANSFORMER_LENS_HOOKS",
    "Point",
    "as_point",
    "resolve_points",
    "sae_node_name",
    "sae_site",
    "show_key",
]

#: Every kind a ``Point`` takes, in the order of a forward pass (``names.ACTIVATION_KINDS``).
POINT_KINDS = tuple(names.ACTIVATION_KINDS)

#: The parts of a spliced SAE a point names: ``acts`` (the features, ``[..., d_sae]``), ``pre`` (before
#: the activation function), ``recon``, ``error`` and ``input`` (the node the SAE replaced).
SAE_PARTS = ("acts", "pre", "recon", "error", "input")
#: The SAE kinds of no site: ``Point('sae_acts', L)`` is the one SAE spliced in layer ``L``.  With a
#: site, ``'{kind}.sae_acts'`` (``'resid_pre.sae_acts'``): the SAE spliced at that point.
SAE_KINDS = tuple(f"sae_{part}" for part in SAE_PARTS)

#: The kinds that take a head: the attention internals and ``head_out`` (which needs one).
HEAD_KINDS = ("q", "k", "v", "attn_scores", "attn_probs", "z", "head_out")

#: TransformerLens's hook for each kind (``{layer}`` filled in); None: TransformerLens has no hook
#: for it (the model's output).  docs/models.md says where the values differ.
TRANSFORMER_LENS_HOOKS: dict[str, str | None] = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "resid_pre": "blocks.{layer}.hook_resid_pre",
    "ln1": "blocks.{layer}.ln1.hook_normalized",
    "ln1_scale": "blocks.{layer}.ln1.hook_scale",
    "q": "blocks.{layer}.attn.hook_q",
    "k": "blocks.{layer}.attn.hook_k",
    "v": "blocks.{layer}.attn.hook_v",
    "attn_scores": "blocks.{layer}.attn.hook_attn_scores",
    "attn_probs": "blocks.{layer}.attn.hook_pattern",
    "z": "blocks.{layer}.attn.hook_z",
    "head_out": "blocks.{layer}.attn.hook_result",
    "attn_out": "blocks.{layer}.hook_attn_out",
    "resid_mid": "blocks.{layer}.hook_resid_mid",
    "ln2": "blocks.{layer}.ln2.hook_normalized",
    "ln2_scale": "blocks.{layer}.ln2.hook_scale",
    "mlp_pre": "blocks.{layer}.mlp.hook_pre",
    "mlp_post": "blocks.{layer}.mlp.hook_post",
    "mlp_out": "blocks.{layer}.hook_mlp_out",
    "resid_post": "blocks.{layer}.hook_resid_post",
    "resid_final": "blocks.{last}.hook_resid_post",
    "ln_final": "ln_final.hook_normalized",
    "ln_final_scale": "ln_final.hook_scale",
    "logits": None,
    "log_probs": None,
    "loss": None,
}

PointMatcher = Union[Matcher, IterativeMatcher]

# Where a shared kind's node is searched from: a node of the layer with a name of its own.
_FROM = {
    "ln1_scale": names.attn_norm,
    "ln2_scale": names.mlp_norm,
    "mlp_pre": names.mlp_out,
    "mlp_post": names.mlp_out,
    **{kind: names.attn_out for kind in HEAD_KINDS if kind != "head_out"},
}
# Other names of a kind's node: a grouped-query head's keys and values after split_heads.
_ALSO = {"k": (names.K_KV,), "v": (names.V_KV,)}
_EMBEDDINGS = frozenset({names.EMBEDS, names.TOKEN_EMBEDS})
_STREAM_KINDS = frozenset({"block", "resid_mid", "attn_norm", "mlp_norm"})


def _is_stream(node: Circuit) -> bool:
    """The residual stream and the norms of it: a layer's inputs, which a point never searches below."""
    if node.name is None:
        return False
    if node.name in _EMBEDDINGS:
        return True
    parsed = names.parse(node.name)
    return parsed is not None and parsed.kind in _STREAM_KINDS


def _is_residual(node: Circuit) -> bool:
    if node.name is None:
        return False
    parsed = names.parse(node.name)
    return node.name in _EMBEDDINGS or (parsed is not None and parsed.kind == "block")


_STREAM = Matcher.from_predicate(_is_stream, "Matcher(<residual stream or norm>)")
_RESIDUAL = Matcher.from_predicate(_is_residual, "Matcher(<residual stream>)")


class _Fields(NamedTuple):
    kind: str
    layer: Optional[int] = None
    head: Optional[int] = None


class Point(_Fields):
    """The activation ``kind`` of ``layer`` (and ``head``): one spot in a model; see the module docstring.

    ``kind`` is one of ``POINT_KINDS`` (``'resid_pre'``, ``'q'``, ``'attn_probs'``, ``'z'``,
    ``'head_out'``, ``'mlp_post'``, ``'logits'``, ...); ``layer`` is needed for every kind but the
    model-wide ones (``embed``, ``pos_embed``, ``resid_final``, ``ln_final``, ``ln_final_scale``,
    ``logits``, ``log_probs``, ``loss``), which take none; ``head`` only for ``HEAD_KINDS``
    (``head_out`` needs it).  Checked when made: a bad kind, layer or head is an ``ExperimentError``.
    A named tuple, so it equals (and hashes as) the ``(kind, layer, head)`` tuple.
    """

    __slots__ = ()

    def __new__(cls, kind: str, layer: int | None = None, head: int | None = None) -> Point:
        _checked(kind, layer, head)
        return super().__new__(cls, kind, layer, head)

    def __repr__(self) -> str:
        """As written: ``Point('z', 1, 2)``, ``Point('attn_probs', 1)``, ``Point('logits')``."""
        parts = [self.kind] if self.layer is None else [self.kind, self.layer]
        return f"Point({', '.join(map(repr, parts + ([] if self.head is None else [self.head])))})"

    def _replace(self, **changes: Any) -> Point:
        """A Point with ``changes`` (checked as a new one is)."""
        return Point(**{**self._asdict(), **changes})

    def matcher(self) -> PointMatcher:
        """The matcher that finds this point's node(s): a Matcher, or an IterativeMatcher to chain."""
        spec = _spec(*self)
        if spec.whole is not None:
            return spec.whole
        if spec.outermost:
            return IterativeMatcher(spec.start, stop_at_match=True)
        return spec.start if spec.tail is None else spec.tail(IterativeMatcher(spec.start))


class _Spec(NamedTuple):
    """A point as its stage 0 (a named node of the layer, found by name) and the stages below it.

    ``Point.matcher`` chains them into one matcher; ``resolve_points`` finds the stage-0 nodes by name
    and runs only the tail from each, instead of a walk of the whole circuit per point."""

    start: Matcher
    start_names: frozenset
    tail: Callable[[IterativeMatcher], IterativeMatcher] | None = None
    whole: IterativeMatcher | None = None  # a matcher searched from the root, used as it is
    outermost: bool = False  # only the start nodes not below another one (``stop_at_match``)


def _spec(kind: str, layer: int | None, head: int | None) -> _Spec:
    entry = _checked(kind, layer, head)
    if entry is None:  # a spliced SAE's node, found by its name
        site, part = sae_site(kind)
        sites = [site] if site is not None else _LAYER_SITES
        return _named(frozenset(sae_node_name((s, layer, head), part) for s in sites))
    if entry.scope == "model":
        return _model_spec(kind)
    if kind == "head_out":
        return _branch(kind, layer, head)
    if kind in _WRITTEN:
        return _written(kind, layer)
    if entry.shared:
        start = _named(_FROM[kind](layer)) if head is None else _branch(kind, layer, head)
        return start._replace(tail=_below(_kind_names(kind)))
    if kind == "resid_pre":
        if layer == 0:  # the topmost embeddings node ('embeds' over 'idxed_embeds'), every use of it
            return _Spec(
                Matcher(_EMBEDDINGS), _EMBEDDINGS, whole=IterativeMatcher(_EMBEDDINGS, stop_at_match=True)
            )
        return _named(names.block(layer - 1))
    return _named(_kind_names(kind, layer))


#: The kinds that are what a layer adds to the residual stream (TransformerLens's ``hook_attn_out``,
#: ``hook_mlp_out``): the output itself, or Gemma 2's sandwich norm over it, named ``POST_NORM``.
_WRITTEN = ("attn_out", "mlp_out")
POST_NORM = "{}.post_norm"  #: Gemma 2's norm of an output ``'b{L}.a'`` before it joins the stream


def _written(kind: str, layer: int) -> _Spec:
    """``'b{L}.a.post_norm'`` where the output ``'b{L}.a'`` is normed before it joins the residual
    stream (Gemma 2), else ``'b{L}.a'``: the outermost node of either name (``'b{L}.m'``: the MLP)."""
    plain = _kind_names(kind, layer)
    either = plain | frozenset(POST_NORM.format(name) for name in plain)
    return _Spec(Matcher(either), either, outermost=True)


def _named(form: str | frozenset) -> _Spec:
    return _Spec(Matcher(form), frozenset([form]) if isinstance(form, str) else form)


def _stop_at(form) -> Callable[[IterativeMatcher], IterativeMatcher]:
    return lambda start: start.then(form, stop_at_match=True)


def _checked(kind, layer, head) -> names.ActivationKind | None:
    """The kind's ``ActivationKind`` (None for an SAE kind), the layer and head checked."""
    sae = sae_site(kind)
    if sae is not None:
        return _checked_sae(kind, sae[0], layer, head)
    if not isinstance(kind, str) or kind not in names.ACTIVATION_KINDS:
        raise ExperimentError(
            f"Point: unknown activation kind {kind!r}; the kinds are {', '.join(POINT_KINDS)}, and a "
            f"spliced SAE's {', '.join(SAE_KINDS)} (of one site: 'resid_pre.sae_acts', ...)"
        )
    entry = names.ACTIVATION_KINDS[kind]
    where = f"Point({kind!r}, layer={layer!r}, head={head!r})"
    if entry.scope == "model":
        if layer is not None:
            raise ExperimentError(f"{where}: {kind!r} is one node for the whole model; give no layer")
    elif not _is_index(layer):
        raise ExperimentError(f"{where}: the layer must be an int >= 0, got {layer!r}")
    if head is not None:
        if kind not in HEAD_KINDS:
            raise ExperimentError(
                f"{where}: {kind!r} has no heads; the kinds with heads are {', '.join(HEAD_KINDS)}"
            )
        if not _is_index(head):
            raise ExperimentError(f"{where}: the head must be an int >= 0, got {head!r}")
    elif entry.scope == "head":
        raise ExperimentError(f"{where}: {kind!r} is one head's output; give head=")
    return entry


def _checked_sae(kind: str, site: str | None, layer, head) -> None:
    if site is not None:
        try:
            _checked(site, layer, head)  # the site's own layer and head
        except ExperimentError as error:
            raise ExperimentError(f"Point({kind!r}, ...) is the SAE at its site: {error}") from None
    elif not _is_index(layer) or head is not None:
        raise ExperimentError(
            f"Point({kind!r}, layer={layer!r}, head={head!r}): the SAE spliced in a layer takes the "
            "layer (an int >= 0) and no head; name its site for more: "
            f"Point('resid_pre.{kind}', {layer!r}) or Point('z.{kind}', layer, head)"
        )
    return None


def sae_site(kind: Any) -> tuple[str | None, str] | None:
    """``(site, part)`` of an SAE kind (``'resid_pre.sae_acts'`` -> ``('resid_pre', 'acts')``,
    ``'sae_acts'`` -> ``(None, 'acts')``); None for any other kind."""
    if not isinstance(kind, str):
        return None
    site, _, own = kind.rpartition(".")
    if own not in SAE_KINDS or (site and site not in names.ACTIVATION_KINDS):
        return None
    return (site or None), own.removeprefix("sae_")


def sae_node_name(site: Any, part: str) -> str:
    """The name ``splice_sae`` gives the ``part`` (``SAE_PARTS``) of the SAE it splices at the point
    ``site``: ``'{kind}{layer}[h{head}].sae.{part}'`` (``'resid_pre1.sae.acts'``)."""
    kind, layer, head = as_point(site)
    tag = f"{kind}{'' if layer is None else layer}{'' if head is None else f'h{head}'}"
    return f"{tag}.sae.{part}"


# The sites ``Point('sae_acts', L)`` looks at: every kind of a layer.
_LAYER_SITES = [kind for kind, entry in names.ACTIVATION_KINDS.items() if entry.scope == "layer"]
_SAE_NAME = re.compile(r"(?P<tag>[a-z0-9_]+)\.sae\.(?P<part>" + "|".join(SAE_PARTS) + ")")
_SITE_TAG = re.compile(r"(?P<layer>0|[1-9][0-9]*)?(?:h(?P<head>0|[1-9][0-9]*))?")


def _sae_point(name: str) -> Point | None:
    """The SAE point of a node named by ``sae_node_name`` (``'resid_pre1.sae.acts'``), or None."""
    found = _SAE_NAME.fullmatch(name)
    if found is None:
        return None
    tag = found["tag"]
    for site in sorted(names.ACTIVATION_KINDS, key=len, reverse=True):
        rest = _SITE_TAG.fullmatch(tag[len(site) :]) if tag.startswith(site) else None
        if rest is None:
            continue
        layer, head = (None if rest[g] is None else int(rest[g]) for g in ("layer", "head"))
        try:
            return Point(f"{site}.sae_{found['part']}", layer, head)
        except ExperimentError:
            continue
    return None


def _is_index(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _kind_names(kind: str, layer: int | None = None) -> frozenset:
    """Every family's name for ``kind`` (at ``layer``), and its other names (``_ALSO``)."""
    found = {names.activation_name(kind, family, layer) for family in names.FAMILIES}
    return frozenset(found - {None}) | frozenset(_ALSO.get(kind, ()))


def _below(kind_names: frozenset) -> Callable[[IterativeMatcher], IterativeMatcher]:
    """The nodes named ``kind_names`` below the start, but not below the residual stream or a norm.

    The first stage stops at the first kind node or stream node on each path (``stop_at_match``);
    the second keeps only the kind nodes (depth 0: the node the first stage stopped at)."""
    shown = ", ".join(repr(n) for n in sorted(kind_names))
    kind = Matcher(kind_names)
    first = Matcher.from_predicate(kind.predicate, "{" + shown + "}") | _STREAM
    return lambda start: start.then(first, stop_at_match=True).then(kind, min_depth=0, max_depth=0)


def _model_spec(kind: str) -> _Spec:
    if kind == "resid_final":  # the final norm's input: 'b{n-1}', or the embeddings
        return _named(names.FINAL_NORM)._replace(tail=_stop_at(_RESIDUAL))
    if kind == "ln_final_scale":
        return _named(names.FINAL_NORM)._replace(tail=_below(_kind_names(kind)))
    return _named(_kind_names(kind))


def _branch(kind: str, layer: int, head: int) -> _Spec:
    """Head ``head``'s branch ``'b{L}.a.head{h}'``; meeting layer ``L``'s attention without that
    branch (unsplit, or the head inside a group) raises ``ExperimentError``."""
    branch, out = names.head(layer, head), names.attn_out(layer)

    def predicate(node: Circuit) -> bool:
        if node.name == branch:
            return True
        if node.name == out:
            _check_split(node, kind, layer, head)
        return False

    return _Spec(Matcher.from_predicate(predicate, f"Matcher({branch!r})"), frozenset([branch, out]))


def _check_split(node: Circuit, kind: str, layer: int, head: int) -> None:
    groups = [names.parse_head_group(child.name) for child in node.children]
    groups = [g for g in groups if g is not None and g[0] == layer]
    if (layer, head, head) in groups:
        return
    where = f"Point({kind!r}, layer={layer}, head={head})"
    split = f"cc.passes.split_heads(c) (or cc.passes.split_heads(c, layers=[{layer}]))"
    if not groups:
        raise ExperimentError(
            f"{where}: layer {layer}'s heads are not split ({node.name!r} is one {node.kind} over every head), "
            f"so head {head} has no node of its own; split them first: {split}, or take "
            f"Point({kind!r}, layer={layer}) and index head {head} on its head axis"
        )
    within = [names.head(*g) for g in groups if g[1] <= head <= g[2]]
    if within:
        raise ExperimentError(
            f"{where}: head {head} is inside the branch {within[0]!r}, not a branch of its own; "
            f"split it alone: cc.passes.split_heads(c, layers=[{layer}], heads=...)"
        )
    raise ExperimentError(
        f"{where}: layer {layer} has no head {head}; its branches are "
        f"{', '.join(repr(names.head(*g)) for g in groups)}"
    )


def resolve_points(circuit: Circuit, keys: list | None = None) -> dict[Point, Circuit]:
    """``{Point: node}``: the one node each key's point (``as_point``) finds in ``circuit``.

    ``keys`` of None: every kind of every layer the circuit has that names one node (per-head
    kinds of a split layer are one node per head: ask for them with a head).  A key that finds
    no node, or several, raises ``ExperimentError`` naming it.
    """
    return _default_points(circuit) if keys is None else _resolve(circuit, [as_point(key) for key in keys])


def as_point(key: Any) -> Point:
    """The ``Point`` a key names: a ``Point`` as it is, ``'logits'``, ``('attn_probs', 1)`` or
    ``('z', 1, 2)``; the one function every key of the experiments resolves through."""
    return key if isinstance(key, Point) else Point(*_parts(key))


def _parts(key: Any) -> tuple:
    """``(kind, layer, head)`` of a key, unchecked beyond its shape (a lookup of an unknown kind
    finds nothing; ``Point`` checks the kind)."""
    parts = (key,) if isinstance(key, str) else tuple(key) if isinstance(key, tuple) else None
    if not parts or len(parts) > 3 or not isinstance(parts[0], str):
        raise ExperimentError(f"{key!r}: a point is a kind, (kind, layer) or (kind, layer, head)")
    return (parts[0], *parts[1:], *(None,) * (3 - len(parts)))


def show_key(key: tuple) -> str:
    """A point (or ``(kind, layer, head)``) as written: ``('z', 1, 2)``, ``('attn_probs', 1)``, ``'logits'``."""
    return repr(tuple(part for part in key if part is not None)) if key[1] is not None else repr(key[0])


class PointCollector:
    """``Plan.run``'s ``on_value`` callback keeping the values of resolved points (``resolve_points``):
    ``values[key]`` once run; ``by_hash`` tells whether a node is one of them (several keys may share it)."""

    def __init__(self, wanted: dict[tuple, Circuit]):
        self.by_hash: dict[bytes, list[tuple]] = {}
        for key, node in wanted.items():
            self.by_hash.setdefault(node.hash, []).append(key)
        self.values: dict[tuple, torch.Tensor] = {}

    def __call__(self, node: Circuit, value: torch.Tensor) -> None:
        for key in self.by_hash.get(node.hash, ()):
            self.values[key] = value


class ByPoint(Mapping):
    """Tensors by ``Point``, read-only: ``m[Point("z", 1, 2)]``, or ``m["logits"]``, ``m["attn_probs", 1]``,
    ``m["z", 1, 2]``.

    The base of ``ActivationCache`` and ``Gradients``; ``missing`` words the ``MissingPointError``
    (a ``KeyError``)."""

    missing = "not here; there are"

    def __init__(self, by_point: dict[tuple, torch.Tensor]):
        self._by_point = by_point

    def __getitem__(self, key: Any) -> torch.Tensor:
        try:
            normalized = _parts(key)  # equal to the Point keys held
        except ExperimentError as error:
            raise MissingPointError(str(error)) from None
        if normalized not in self._by_point:
            raise MissingPointError(f"{key!r}: {self.missing} {', '.join(map(show_key, self._by_point))}")
        return self._by_point[normalized]

    def __iter__(self) -> Iterator[tuple]:
        return iter(self._by_point)

    def __len__(self) -> int:
        return len(self._by_point)

    def shown(self, count: int = 6) -> str:
        """The first ``count`` points, as written."""
        more = ", ..." if len(self) > count else ""
        return ", ".join(map(show_key, list(self)[:count])) + more


def _resolve(circuit: Circuit, keys: list) -> dict:
    index = _by_name(circuit)
    resolved = {}
    for key in keys:
        try:
            nodes = _find(circuit, index, _spec(*key))
        except ExperimentError as error:
            raise ExperimentError(f"point {show_key(key)}: {error}") from None
        if len(nodes) != 1:
            what = "finds no node" if not nodes else f"finds {len(nodes)} nodes ({_several(key, nodes)})"
            raise ExperimentError(f"point {show_key(key)} {what} in {circuit.describe()}")
        resolved[key] = next(iter(nodes))
    return resolved


def _several(key: tuple, nodes: set) -> str:
    """Why a point finds several nodes: head branches, or SAEs at several sites of one layer."""
    if sae_site(key[0]) is None:
        return "one per head branch: give a head"
    spliced = sorted(node.name for node in nodes)
    sites = ", ".join(repr(_sae_point(name)) for name in spliced)
    return f"SAEs are spliced at several points of layer {key[1]}: name one, {sites}"


def _default_points(circuit: Circuit) -> dict:
    index = _by_name(circuit)
    layers = sorted({p.layer for p in map(names.parse, index) if p is not None and p.kind == "block"})
    resolved = {}
    for kind in POINT_KINDS:
        entry = names.ACTIVATION_KINDS[kind]
        if entry.scope == "head":
            continue
        for layer in [None] if entry.scope == "model" else layers:
            nodes = _find(circuit, index, _spec(kind, layer, None))
            if len(nodes) == 1:
                resolved[Point(kind, layer)] = next(iter(nodes))
    for name, nodes in index.items():  # the spliced SAEs' nodes, by their sites
        point = _sae_point(name) if ".sae." in name else None
        if point is not None and len(nodes) == 1:
            resolved[point] = nodes[0]
    return resolved


def _by_name(circuit: Circuit) -> dict[str, list[Circuit]]:
    index: dict[str, list[Circuit]] = {}
    for node in unique_nodes([circuit]):
        if node.name is not None:
            index.setdefault(node.name, []).append(node)
    return index


def _find(circuit: Circuit, index: dict[str, list[Circuit]], spec: _Spec) -> set[Circuit]:
    """What ``get(circuit, point)`` finds: the stage-0 nodes by name, then the tail from each."""
    if spec.whole is not None:
        return set(get(circuit, spec.whole))
    predicate = spec.start.predicate
    starts = [node for name in spec.start_names for node in index.get(name, ()) if predicate(node)]
    if spec.outermost:
        return _outermost(starts)
    if spec.tail is None:
        return set(starts)
    found: set[Circuit] = set()
    for start in starts:
        found |= get(start, spec.tail(IterativeMatcher(spec.start, max_depth=0)))
    return found


def _outermost(starts: list[Circuit]) -> set[Circuit]:
    """The ``starts`` not below another of them: each one's search stops at the residual stream."""
    if len(starts) < 2:
        return set(starts)
    hashes = {start.hash for start in starts}
    wanted = Matcher.from_predicate(lambda node: node.hash in hashes, "Matcher(<another start>)")
    below: set[Circuit] = set()
    for start in starts:
        search = IterativeMatcher(True, max_depth=0).then(wanted | _STREAM, stop_at_match=True)
        below |= set(get(start, search.then(wanted, min_depth=0, max_depth=0)))
    return set(starts) - below
