"""How a model circuit writes its residual stream and reads the logits out of it, read off its own nodes.

The analyses that split the stream or a logit into parts (``residual``, ``logit_attribution``,
``path_terms``, ``composition``) take every weight and scale from the nodes the model computes
with, never from a formula of their own: a norm's scale is its multiplier node (Gemma's
``'rms.scale'``, ``1 + w``, where other families have the weight itself), the unembedding is the
Einsum's operand below the logits, the soft-cap is the logits' own ``cap * tanh(x / cap)``.  A
stream or readout of a shape the builders do not make is refused (``ExperimentError``) rather
than read wrongly, so a new family cannot make the parts silently miss the whole.
"""

from __future__ import annotations

import dataclasses
import functools

from circuits.transformer import names
from circuits.errors import ExperimentError
from circuits.transformer.points import POST_NORM, resolve_points
from circuits.core.nodes import Add, Circuit, Einsum, GeneralFunction, Scalar

__all__ = ["Norm", "Readout", "Writes", "read_norm", "read_readout", "read_writes"]


@dataclasses.dataclass(frozen=True)
class Norm:
    """A layer norm or RMSNorm of the circuit as its nodes: ``output = weight * (x - mean(x) if
    centred) * rsqrt + bias``."""

    output: Circuit
    input: Circuit
    rsqrt: Circuit  #: ``1/sqrt(var + eps)`` per position (the points ``ln1_scale`` etc.)
    weight: Circuit  #: what the normalized vector is multiplied by (Gemma: the Add ``1 + w``)
    bias: Circuit | None
    eps: float
    centred: bool  #: a layer norm (RMSNorm does not centre)


def _child(node: Circuit, name: str, where: Circuit) -> Circuit:
    """``node``'s one child named ``name``; anything else is not a norm the builders make."""
    found = [child for child in node.children if child.name == name]
    if len(found) != 1:
        raise ExperimentError(
            f"the norm {where.describe()} has no {name!r} below {node.describe()} where the builders "
            "put it, so the analyses cannot read its scale"
        )
    return found[0]


def _other(node: Circuit, name: str, where: Circuit) -> Circuit:
    """``node``'s one child other than its ``name`` child (a two-operand Einsum or Add)."""
    _child(node, name, where)
    others = [child for child in node.children if child.name != name]
    if len(others) != 1:
        raise ExperimentError(
            f"the norm {where.describe()}: {node.describe()} has {len(node.children)} operands, "
            "not the builders' two"
        )
    return others[0]


def _below_cast(node: Circuit, spec: str) -> Circuit:
    """The value below ``node`` where it is a ``spec`` cast (``'type_as'``, ``'upcast_float32'``): a
    bfloat16 or float16 model's norm computes in float32 between the two (``common.rms_norm``)."""
    if isinstance(node, GeneralFunction) and node.spec.name == spec:
        return node.children[0]
    return node


def read_norm(node: Circuit) -> Norm:
    """The norm whose output is ``node`` (``'final.call'``, ``'a3.norm'``, ``'b3.a.post_norm'``);
    in a bfloat16 or float16 model, its input is the value below ``'upcast_float32'``."""
    inner = _below_cast(node, "type_as")
    centred = isinstance(inner, Add)
    part = functools.partial(names.norm_node, names.LN if centred else names.RMS)
    bias = _other(inner, part("y_scaled"), node) if centred else None
    scaled = _child(inner, part("y_scaled"), node) if centred else inner
    if not isinstance(scaled, Einsum):
        raise ExperimentError(f"{node.describe()} is no norm the builders make (an Einsum or an Add)")
    rounded = not centred and any(child.name == part("rounded") for child in scaled.children)
    weight = _other(scaled, part("rounded" if rounded else "y"), node)
    y = (
        _below_cast(_child(scaled, part("rounded"), node), "type_as")
        if rounded
        else _child(scaled, part("y"), node)
    )
    rsqrt = _child(y, part("rsqrt"), node)
    x = _other(y, part("rsqrt"), node)
    if centred:
        x = _other(x, part("neg_mean"), node)
    x = _below_cast(x, "upcast_float32")
    eps = _child(_child(rsqrt, part("var_p_eps"), node), part("c.eps"), node)
    if not isinstance(eps, Scalar):
        raise ExperimentError(f"the norm {node.describe()}: its epsilon {eps.describe()} is no Scalar")
    return Norm(node, x, rsqrt, weight, bias, float(eps.value), centred)


@dataclasses.dataclass(frozen=True)
class Readout:
    """The logits as the model computes them from the final residual stream:
    ``softcap(unembed @ final_norm(x) + bias)``."""

    norm: Norm  #: the final norm
    unembed: Circuit  #: ``W_U``, ``[vocab, d_model]``
    bias: Circuit | None  #: the unembedding bias ``[vocab]``
    softcap: float | None  #: Gemma 2: the logits are ``softcap * tanh(x / softcap)``


def read_readout(logits: Circuit) -> Readout:
    """The readout below ``logits`` (``'t.call'``); any other shape raises ``ExperimentError``."""
    node, cap, bias = logits, None, None
    tanh = [child for child in node.children if child.name == f"{names.LOGITS}_tanh"]
    if tanh:
        cap, node = _softcap(logits, tanh[0])
    if isinstance(node, Add) and len(node.children) == 2:
        unembedded = [child for child in node.children if child.name == names.UNEMBED]
        if len(unembedded) == 1:
            bias = next(child for child in node.children if child is not unembedded[0])
            node = unembedded[0]
    final = [child for child in node.children if child.name == names.FINAL_NORM]
    if not isinstance(node, Einsum) or len(node.children) != 2 or len(final) != 1:
        raise ExperimentError(
            f"the logits {logits.describe()} are not the unembedding of the final norm "
            f"{names.FINAL_NORM!r} as the builders write it ({node.describe()} is in its place), "
            "so the analyses cannot split them"
        )
    unembed = next(child for child in node.children if child is not final[0])
    return Readout(read_norm(final[0]), unembed, bias, cap)


def _softcap(logits: Circuit, tanh: Circuit) -> tuple[float, Circuit]:
    """``cap * tanh(x * (1 / cap))``: the cap and ``x``."""
    caps = [child for child in logits.children if isinstance(child, Scalar)]
    inner = tanh.children[0] if isinstance(tanh, GeneralFunction) else None
    recips = [] if inner is None else [child for child in inner.children if isinstance(child, Scalar)]
    if len(caps) != 1 or len(recips) != 1 or len(inner.children) != 2:
        raise ExperimentError(f"the logits {logits.describe()}: a soft-cap not as the builders write it")
    cap = float(caps[0].value)
    if abs(float(recips[0].value) * cap - 1) > 1e-6:
        raise ExperimentError(
            f"the logits {logits.describe()}: soft-cap {cap} divides by 1/{1 / float(recips[0].value)}"
        )
    return cap, next(child for child in inner.children if child is not recips[0])


@dataclasses.dataclass(frozen=True)
class Writes:
    """What layer ``L`` adds to the residual stream: ``attn`` (the ``attn_out`` point: ``'b{L}.a'``, or
    Gemma 2's post-norm over it, ``attn_norm``), the attention output bias ``attn_bias`` where it is
    added to the stream itself (GPT-2, OPT, GPT-NeoX), ``mlp`` and ``mlp_norm`` likewise."""

    attn: Circuit
    attn_norm: Norm | None
    attn_bias: Circuit | None
    mlp: Circuit | None
    mlp_norm: Norm | None


def read_writes(circuit: Circuit, n_layers: int, has_mlp: bool) -> list[Writes]:
    """Each layer's ``Writes``; a stream node that adds anything else raises ``ExperimentError``."""
    keys = [("attn_out", layer, None) for layer in range(n_layers)]
    keys += [("mlp_out", layer, None) for layer in range(n_layers)] if has_mlp else []
    keys += [("resid_pre", layer, None) for layer in range(n_layers)] + [("resid_final", None, None)]
    keys += [("resid_mid", layer, None) for layer in range(n_layers)] if has_mlp else []
    found = resolve_points(circuit, keys)
    writes = []
    for layer in range(n_layers):
        attn, mlp = found[("attn_out", layer, None)], found.get(("mlp_out", layer, None))
        after = found[("resid_pre", layer + 1, None) if layer + 1 < n_layers else ("resid_final", None, None)]
        before = found[("resid_pre", layer, None)]
        middle = found.get(("resid_mid", layer, None))
        bias = _stream_bias(middle if has_mlp else after, names.attn_weight(layer, "o_bias"))
        _check_adds(after, {mlp, middle} if has_mlp else {attn, bias, before})
        if has_mlp:
            _check_adds(middle, {attn, bias, before})
        writes.append(Writes(attn, _post_norm(attn), bias, mlp, None if mlp is None else _post_norm(mlp)))
    return writes


def _stream_bias(node: Circuit, name: str) -> Circuit | None:
    """The child of the stream node ``node`` named ``name`` (the attention output bias), if any."""
    found = [child for child in node.children if child.name == name]
    return found[0] if len(found) == 1 else None


def _check_adds(node: Circuit, parts: set) -> None:
    """``node`` is an Add of ``parts`` (None among them: absent) and of nothing else."""
    parts.discard(None)
    children = set(node.children)
    if not isinstance(node, Add) or children != parts or len(node.children) != len(children):
        extra = [child.describe() for child in node.children if child not in parts] or ["none"]
        lacking = [repr(part.name) for part in parts if part not in children] or ["none"]
        raise ExperimentError(
            f"the residual stream {node.describe()} is not the Add of {sorted(p.name for p in parts)} "
            f"(once each) the analyses split it into (it also adds: {', '.join(extra)}; it lacks: "
            f"{', '.join(lacking)}), so its parts would not sum to it"
        )


def _post_norm(output: Circuit) -> Norm | None:
    """Gemma 2's sandwich norm, where ``output`` is one (``'b{L}.a.post_norm'``), else None."""
    suffix = POST_NORM.format("")
    if output.name is None or not output.name.endswith(suffix):
        return None
    norm = read_norm(output)
    inner = output.name.removesuffix(suffix)
    if norm.input.name != inner or norm.centred:
        raise ExperimentError(
            f"the post-norm {output.describe()} is not an RMSNorm of {inner!r} alone (it normalizes "
            f"{norm.input.describe()}), which the analyses split into heads"
        )
    return norm
