"""TransformerLens's residual-stream analyses on an ``ActivationCache``, and the folded unembedding.

``ActivationCache``'s methods of the same names call these.  Layouts, labels and argument meanings
are TransformerLens 3.x's (``[component, batch, pos, d_model]``, ``'0_pre'``, ``'L1H2'``, ``layer``
in ``[0, n_layers]`` with None or -1 the unembedding).  One difference, so that every number is
exact on our unfolded layer norms: ``apply_ln_to_stack`` centres and scales by the clean run's norm
scale (as TransformerLens does) and ``logit_attrs`` then reads the logit through the final norm's
weight folded into the unembedding, so each component's value is its true share of the logit; the
final norm's bias and the unembedding bias are no component's (``direct_logit_attribution`` shows
them as ``'bias'``).  TransformerLens gives these numbers on a model whose norms are folded
(``fold_ln=True``).  Every weight, scale and cap is the circuit's own node (``experiments.stream``:
Gemma's norms scale by ``1 + w``, Gemma 2's outputs pass post-norms, its logits a soft-cap, which
``logit_attrs`` refuses unless ``uncapped=True``).  docs/analyses.md has the details.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch

from circuits.transformer import names
from circuits.errors import ExperimentError
from circuits.experiments.stream import Readout, Writes, read_readout, read_writes
from circuits.core.nodes import Array, Circuit
from circuits.core.traversal import unique_nodes

if TYPE_CHECKING:
    from circuits.experiments.activations import ActivationCache

__all__ = [
    "ModelFacts",
    "accumulated_resid",
    "analysis_points",
    "apply_ln_to_stack",
    "decompose_resid",
    "direct_components",
    "final_norm",
    "head_results",
    "head_writes",
    "logit_attrs",
    "model_facts",
    "output_bias_logits",
    "softcapped",
    "stack_head_results",
    "token_ids",
    "unembed",
]


# ------------------------------------------------------------------ the model's shape


@dataclasses.dataclass(frozen=True)
class ModelFacts:
    """What the analyses need to know of a model circuit, read off its names."""

    n_layers: int
    norm: str  #: ``names.LN`` or ``names.RMS``
    pos_in_resid: bool  #: the position embeddings are added to the residual stream (GPT-2)
    has_mlp: bool
    split_heads: dict  #: layer -> the number of single-head branches (split layers only)
    batched: bool  #: the tokens are ``[batch, positions]``
    arrays: dict  #: name -> the one Array of that name (None where several nodes share it)
    readout: Readout  #: the final norm, unembedding and soft-cap, as the circuit's nodes
    writes: tuple[Writes, ...]  #: per layer, the nodes it adds to the residual stream


def model_facts(circuit: Circuit) -> ModelFacts:
    """The facts of ``circuit``; a circuit that is no model the builders make raises ``ExperimentError``."""
    named: dict[str, Circuit | None] = {}
    for node in unique_nodes([circuit]):
        if node.name is not None:
            named[node.name] = node if node.name not in named else None
    found = set(named)
    if names.FINAL_NORM not in found:
        raise ExperimentError(
            f"the analyses need a model circuit with a final norm {names.FINAL_NORM!r}; "
            f"{circuit.describe()} has none"
        )
    parsed = [p for p in map(names.parse, found) if p is not None]
    layers = {p.layer for p in parsed if p.kind == "block"}
    has_mlp = names.mlp_out(0) in found
    if named.get(names.LOGITS) is None:
        raise ExperimentError(
            f"the analyses need a model circuit with one logits node {names.LOGITS!r}; "
            f"{circuit.describe()} has {'several' if names.LOGITS in named else 'none'}"
        )
    heads: dict[int, int] = {}
    for p in parsed:
        if p.kind == "head" and p.heads[0] != p.heads[1]:
            raise ExperimentError(
                f"head branch {p.text!r} holds several heads; the analyses need one branch per head "
                f"(cc.passes.split_heads(c) without groups) or none"
            )
        if p.kind == "head":
            heads[p.layer] = heads.get(p.layer, 0) + 1
    return ModelFacts(
        n_layers=len(layers),
        norm=names.RMS if names.norm_weight(names.FINAL, "scale", names.RMS) in found else names.LN,
        pos_in_resid=names.EMBEDS in found,
        has_mlp=has_mlp,
        split_heads=heads,
        batched=named.get(names.TOKENS) is not None and named[names.TOKENS].rank == 2,
        arrays={name: node for name, node in named.items() if node is None or isinstance(node, Array)},
        readout=read_readout(named[names.LOGITS]),
        writes=tuple(read_writes(circuit, len(layers), has_mlp)),
    )


def _weight(cache: ActivationCache, name: str, like: torch.Tensor) -> torch.Tensor | None:
    """The model weight ``name`` (None if the circuit has none), on ``like``'s device and dtype."""
    arrays = cache.facts.arrays
    if name in arrays and arrays[name] is None:
        raise ExperimentError(f"weight {name!r}: several different nodes have this name")
    return arrays[name].evaluate(device=like.device).to(like) if name in arrays else None


def _value(node: Circuit | None, like: torch.Tensor) -> torch.Tensor | None:
    """A weight node's value (a weight, or Gemma's ``1 + w``) on ``like``'s device and dtype (computed
    there: Gemma's ``1 + w`` is not computed where the weight is, then copied)."""
    return None if node is None else node.evaluate(device=like.device).to(like)


# ------------------------------------------------------------------ arguments


def _layer(layer: Any, n_layers: int, what: str = "layer") -> int:
    """TransformerLens's layer argument: ``[0, n_layers]``, None or -1 for ``n_layers`` (the unembedding)."""
    if layer is None or layer == -1:
        return n_layers
    if isinstance(layer, bool) or not isinstance(layer, int) or not 0 <= layer <= n_layers:
        raise ExperimentError(
            f"{what}={layer!r}: the model has {n_layers} layers; give an int in [0, {n_layers}] "
            f"({n_layers}, -1 or None: the input of the unembedding)"
        )
    return layer


def _index(value: Any, size: int, what: str) -> Any:
    """TransformerLens's ``Slice`` input as an index: None all, an int one (the axis dropped),
    a slice or ``(start, stop[, step])``, or a list / tensor of ints."""
    if value is None:
        return slice(None)
    if isinstance(value, tuple):
        return slice(*value)
    if isinstance(value, slice):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        if not -size <= value < size:
            raise ExperimentError(f"{what}={value}: out of range for {size} entries")
        return value
    index = torch.as_tensor(value)
    if index.dtype.is_floating_point or index.dtype == torch.bool or index.ndim != 1:
        raise ExperimentError(
            f"{what}={value!r}: give None, an int, a slice, (start, stop) or a list of ints"
        )
    if index.numel() and not (-size <= int(index.min()) and int(index.max()) < size):
        raise ExperimentError(f"{what}={value!r}: out of range for {size} entries")
    return index


def _at_pos(cache: ActivationCache, value: torch.Tensor, pos_slice: Any) -> torch.Tensor:
    """``value`` (``[batch, pos, d]``, or ``[pos, d]`` broadcast to the batch) at ``pos_slice``."""
    batch, seq = cache.value.shape[0], value.shape[-2]
    if value.ndim == 2:
        value = value.expand(batch, *value.shape)
    return value[:, _index(pos_slice, seq, "pos_slice")]


def _stack(parts: list[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """``parts`` stacked on a new first axis; none: an empty stack of ``like``'s shape."""
    return torch.stack(parts) if parts else like.new_zeros((0, *like.shape))


def _facts(cache: ActivationCache) -> ModelFacts:
    """``cache.facts``, refused unless batched (the analyses' layouts have a batch axis); every
    point an analysis reads is fetched now, so a cache that lacks them is completed in one run."""
    if not cache.facts.batched:
        raise ExperimentError(
            "the analyses need a batched circuit (tokens [batch, positions]); build it with tokens[None]"
        )
    cache.values_at(analysis_points(cache.facts))
    return cache.facts


def analysis_points(facts: ModelFacts) -> list[tuple]:
    """Every point the analyses read on a model of ``facts``: ``run_with_cache``'s points for them."""
    points: list[tuple] = [("embed",), ("resid_final",), ("ln_final_scale",), ("logits",)]
    if facts.readout.softcap is not None:  # the logits before the cap: the final norm's output, unembedded
        points.append(("ln_final",))
    if facts.pos_in_resid:
        points.append(("pos_embed",))
    for layer in range(facts.n_layers):
        points += [("resid_pre", layer), ("attn_out", layer), ("ln1_scale", layer)]
        if facts.has_mlp:
            points += [("resid_mid", layer), ("mlp_out", layer), ("ln2_scale", layer)]
        n_heads = facts.split_heads.get(layer)
        points += [("z", layer)] if n_heads is None else [("head_out", layer, h) for h in range(n_heads)]
    return points


# ------------------------------------------------------------------ stacks


def accumulated_resid(
    cache: ActivationCache, layer: Any, incl_mid: bool, apply_ln: bool, pos_slice: Any, mlp_input: bool
) -> tuple[torch.Tensor, list[str]]:
    """The residual stream entering each layer ``<= layer`` (``'{l}_pre'``, ``'{l}_mid'``, ``'final_post'``).

    ``apply_ln`` at the unembedding normalizes each component on its own statistics (the logit
    lens; no weights, as TransformerLens's on a folded model); at a layer it uses that layer's
    cached scale (``apply_ln_to_stack``)."""
    facts = _facts(cache)
    layer = _layer(layer, facts.n_layers)
    if (incl_mid or mlp_input) and not facts.has_mlp:
        raise ExperimentError("incl_mid / mlp_input: this model has no MLPs, so no resid_mid")
    if mlp_input and layer == facts.n_layers:
        raise ExperimentError(
            f"mlp_input=True needs a layer below {facts.n_layers} (the unembedding has no MLP)"
        )
    keys, labels = [], []
    for at in range(layer + 1):
        if at == facts.n_layers:
            keys.append(("resid_final",))
            labels.append("final_post")
            continue
        keys.append(("resid_pre", at))
        labels.append(f"{at}_pre")
        if (incl_mid and at < layer) or (mlp_input and at == layer):
            keys.append(("resid_mid", at))
            labels.append(f"{at}_mid")
    stack = torch.stack([_at_pos(cache, v, pos_slice) for v in cache.values_at(keys)])
    if apply_ln and layer == facts.n_layers:
        stack = _normalized(stack, facts.readout.norm.centred, facts.readout.norm.eps)
    elif apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input, pos_slice, None, True)
    return stack, labels


def _attn_out(cache: ActivationCache, layer: int) -> torch.Tensor:
    """What layer ``layer``'s attention adds to the residual stream, as TransformerLens's
    ``hook_attn_out``: the ``attn_out`` point (Gemma 2: after its post-norm) and the output bias."""
    (out,) = cache.values_at([("attn_out", layer)])
    bias = _value(cache.facts.writes[layer].attn_bias, out)
    return out if bias is None else out + bias


def decompose_resid(
    cache: ActivationCache,
    layer: Any,
    mlp_input: bool,
    mode: str,
    apply_ln: bool,
    pos_slice: Any,
    incl_embeds: bool,
) -> tuple[torch.Tensor, list[str]]:
    """The outputs that sum to the residual stream entering ``layer``: ``'embed'``, ``'pos_embed'``
    (only where it is added to the stream), ``'{l}_attn_out'`` (with its bias), ``'{l}_mlp_out'``."""
    facts = _facts(cache)
    layer = _layer(layer, facts.n_layers)
    if mode not in ("all", "mlp", "attn"):
        raise ExperimentError(f"mode={mode!r}: give 'all', 'mlp' or 'attn'")
    if mlp_input and (layer == facts.n_layers or not facts.has_mlp):
        raise ExperimentError(f"mlp_input=True needs a model with MLPs and a layer below {facts.n_layers}")
    parts = _embeddings(cache, facts) if incl_embeds else []
    for at in range(layer):
        if mode != "mlp":
            parts.append((f"{at}_attn_out", _attn_out(cache, at)))
        if mode != "attn" and facts.has_mlp:
            parts.append((f"{at}_mlp_out", cache.values_at([("mlp_out", at)])[0]))
    if mlp_input and mode != "mlp":
        parts.append((f"{layer}_attn_out", _attn_out(cache, layer)))
    like = _at_pos(cache, cache.values_at([("embed",)])[0], pos_slice)
    stack = _stack([_at_pos(cache, value, pos_slice) for _, value in parts], like)
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, mlp_input, pos_slice, None, True)
    return stack, [label for label, _ in parts]


def head_results(cache: ActivationCache, layer: int) -> torch.Tensor:
    """Each head's output of ``layer``, ``[batch, head, pos, d_model]`` (without the output bias):
    the head branches' values on a split layer, else ``z`` times ``W_O`` (TransformerLens's
    ``compute_head_results``)."""
    n_heads = cache.facts.split_heads.get(layer)
    if n_heads is not None:
        return torch.stack(cache.values_at([("head_out", layer, h) for h in range(n_heads)]), dim=1)
    (z,) = cache.values_at([("z", layer)])
    w_o = _weight(cache, names.attn_weight(layer, "o"), z)
    if w_o is None:
        raise ExperimentError(f"layer {layer} has no output weight {names.attn_weight(layer, 'o')!r}")
    return torch.einsum("bhsc,hdc->bhsd", z, w_o)


def head_writes(cache: ActivationCache, layer: int) -> torch.Tensor:
    """Each head's share of what ``layer``'s attention adds to the residual stream, ``[batch, head,
    pos, d_model]``, summing to the ``attn_out`` point: its result (``head_results``), and where the
    output is normed before it joins the stream (Gemma 2's post-norm) that result through the norm
    with the clean run's scale ``1/sqrt(mean(x^2) + eps)`` (an RMSNorm) and the norm's weight.  Shares
    that miss the cached ``attn_out`` by more than float rounding raise ``ExperimentError``."""
    results = head_results(cache, layer)
    norm = cache.facts.writes[layer].attn_norm
    if norm is None:
        return results
    scale = _norm_scale(results.sum(1), False, norm.eps)
    shares = results * scale[:, None, :, None] * _value(norm.weight, results)
    (written,) = cache.values_at([("attn_out", layer)])
    miss = (shares.sum(1) - written).abs().max()
    if miss > torch.finfo(written.dtype).eps ** 0.5 * written.abs().max():
        raise ExperimentError(
            f"layer {layer}'s heads through its post-norm {norm.output.name!r} miss the attn_out point "
            f"by {float(miss):.3g}: the norm is not the RMSNorm of the heads' sum the analyses assume"
        )
    return shares


def _resid_entering(cache: ActivationCache, layer: int, n_layers: int) -> torch.Tensor:
    """The residual stream entering ``layer`` (the final one at ``n_layers``)."""
    return cache.values_at([("resid_final",) if layer == n_layers else ("resid_pre", layer)])[0]


def stack_head_results(
    cache: ActivationCache, layer: Any, incl_remainder: bool, pos_slice: Any, apply_ln: bool
) -> tuple[torch.Tensor, list[str]]:
    """Every head's output in the layers below ``layer`` (``'L{l}H{h}'``; Gemma 2: its share of the
    post-norm's output, ``head_writes``), and with ``incl_remainder`` the rest of the stream entering
    ``layer`` (``'remainder'``)."""
    n_layers = _facts(cache).n_layers
    layer = _layer(layer, n_layers)
    parts, labels = [], []
    for at in range(layer):
        results = head_writes(cache, at)
        seq = results.shape[-2]
        parts.extend(results[:, :, _index(pos_slice, seq, "pos_slice")].unbind(1))
        labels.extend(f"L{at}H{h}" for h in range(results.shape[1]))
    entering = _at_pos(cache, _resid_entering(cache, layer, n_layers), pos_slice)
    stack = _stack(parts, entering)
    if incl_remainder:
        stack = torch.cat([stack, (entering - stack.sum(0))[None]])
        labels.append("remainder")
    if apply_ln:
        stack = apply_ln_to_stack(cache, stack, layer, False, pos_slice, None, True)
    return stack, labels


def direct_components(cache: ActivationCache, pos_slice: Any) -> tuple[torch.Tensor, list[str]]:
    """Every direct path to the final residual, summing to it: ``'embed'``, ``'pos_embed'``, each
    head ``'L{l}H{h}'``, each attention bias ``'{l}_attn_bias'``, each ``'{l}_mlp_out'``."""
    facts = _facts(cache)
    parts, labels = [], []
    for label, value in _embeddings(cache, facts):
        parts.append(_at_pos(cache, value, pos_slice))
        labels.append(label)
    for at in range(facts.n_layers):
        results = head_writes(cache, at)
        parts.extend(results[:, :, _index(pos_slice, results.shape[-2], "pos_slice")].unbind(1))
        labels.extend(f"L{at}H{h}" for h in range(results.shape[1]))
        bias = _value(facts.writes[at].attn_bias, results)
        if bias is not None:
            parts.append(bias.expand_as(parts[-1]))
            labels.append(f"{at}_attn_bias")
        if facts.has_mlp:
            parts.append(_at_pos(cache, cache.values_at([("mlp_out", at)])[0], pos_slice))
            labels.append(f"{at}_mlp_out")
    return torch.stack(parts), labels


def _embeddings(cache: ActivationCache, facts: ModelFacts) -> list[tuple[str, torch.Tensor]]:
    embeds = [("embed", cache.values_at([("embed",)])[0])]
    if facts.pos_in_resid:
        embeds.append(("pos_embed", cache.values_at([("pos_embed",)])[0]))
    return embeds


# ------------------------------------------------------------------ norms and logits


def _norm_scale(x: torch.Tensor, centred: bool, eps: float) -> torch.Tensor:
    """A norm's ``1/sqrt(var + eps)`` of each vector of ``x``, ``x.shape[:-1]``."""
    if centred:
        x = x - x.mean(-1, keepdim=True)
    return torch.rsqrt(x.pow(2).mean(-1) + eps)


def _normalized(stack: torch.Tensor, centred: bool, eps: float) -> torch.Tensor:
    """Each vector normalized on its own statistics, without the norm's weights."""
    scale = _norm_scale(stack, centred, eps)[..., None]
    return (stack - stack.mean(-1, keepdim=True) if centred else stack) * scale


def _scale_key(layer: int, mlp_input: bool, n_layers: int) -> tuple:
    if layer == n_layers:
        return ("ln_final_scale",)
    return ("ln2_scale" if mlp_input else "ln1_scale", layer)


def apply_ln_to_stack(
    cache: ActivationCache,
    residual_stack: torch.Tensor,
    layer: Any,
    mlp_input: bool,
    pos_slice: Any,
    batch_slice: Any,
    has_batch_dim: bool,
) -> torch.Tensor:
    """``residual_stack`` as the input of ``layer``'s norm (the final norm for None, -1 or n_layers):
    centred (layer norm; RMSNorm does not centre) and times the clean run's ``1/sqrt(var + eps)``.
    The norm's weight and bias are not applied (TransformerLens's ``apply_ln_to_stack``)."""
    facts = _facts(cache)
    layer = _layer(layer, facts.n_layers)
    if mlp_input and (layer == facts.n_layers or not facts.has_mlp):
        raise ExperimentError(f"mlp_input=True needs a model with MLPs and a layer below {facts.n_layers}")
    (scale,) = cache.values_at([_scale_key(layer, mlp_input, facts.n_layers)])
    scale = scale[:, _index(pos_slice, scale.shape[-1], "pos_slice")]
    stack = _checked_stack(residual_stack, facts.readout.unembed.shape[-1])
    if batch_slice is None and not has_batch_dim:
        if scale.shape[0] != 1:
            raise ExperimentError(
                f"has_batch_dim=False but the cache has {scale.shape[0]} batch rows: "
                "give batch_slice= one row (an int)"
            )
        batch_slice = 0
    batch_index = _index(batch_slice, scale.shape[0], "batch_slice")
    scale = scale[batch_index]
    if has_batch_dim:
        stack = stack[:, batch_index]
    if stack.shape[1:-1] != scale.shape:
        raise ExperimentError(
            f"residual_stack of shape {list(residual_stack.shape)}: after pos_slice={pos_slice!r} and "
            f"batch_slice={batch_slice!r} the norm scale is {list(scale.shape)}, so the stack must be "
            f"[component, {', '.join(map(str, scale.shape))}, d_model]"
        )
    if facts.norm == names.LN:
        stack = stack - stack.mean(-1, keepdim=True)
    return stack * scale[..., None]


def _checked_stack(stack: Any, d_model: int) -> torch.Tensor:
    if not isinstance(stack, torch.Tensor) or stack.ndim < 2 or stack.shape[-1] != d_model:
        shape = list(stack.shape) if isinstance(stack, torch.Tensor) else type(stack).__name__
        raise ExperimentError(f"residual_stack {shape}: give a tensor [component, ..., d_model={d_model}]")
    return stack


def token_ids(tokens: Any, fits: torch.Size, vocab: int, what: str) -> torch.Tensor:
    """``tokens`` as an int tensor of shape ``()`` or ``fits`` (the batch, or batch and pos, axes)."""
    if isinstance(tokens, str):
        raise ExperimentError(f"{what}={tokens!r}: give token ids (this model has no tokenizer here)")
    try:
        ids = torch.as_tensor(tokens)
    except (TypeError, ValueError, RuntimeError) as error:
        raise ExperimentError(f"{what}: not token ids ({error})") from None
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ExperimentError(f"{what} have dtype {ids.dtype}: give integer token ids")
    if ids.shape not in (torch.Size(), fits):
        raise ExperimentError(
            f"{what} of shape {list(ids.shape)}: give one id, or ids of shape {list(fits)} "
            "(one per batch row, and per position if the stack has them)"
        )
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < vocab):
        raise ExperimentError(
            f"{what}: ids range over [{int(ids.min())}, {int(ids.max())}], the vocabulary has {vocab}"
        )
    return ids.to(torch.long)


def _final_weights(cache: ActivationCache, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The final norm's weight (the model's multiplier: Gemma's ``1 + w``) and bias (None for RMSNorm)."""
    norm = cache.facts.readout.norm
    return _value(norm.weight, like), _value(norm.bias, like)


def _directions(
    cache: ActivationCache, tokens: Any, incorrect_tokens: Any, fits: torch.Size, like: torch.Tensor
):
    """The folded unembedding rows ``weight * W_U[token]`` (minus the incorrect tokens'): ``[*fits, d_model]``."""
    unembedding = _value(cache.facts.readout.unembed, like)
    scale, _ = _final_weights(cache, like)
    ids = token_ids(tokens, fits, unembedding.shape[0], "tokens")
    directions = unembedding[ids] * scale
    if incorrect_tokens is not None:
        wrong = token_ids(incorrect_tokens, fits, unembedding.shape[0], "incorrect_tokens")
        if wrong.shape != ids.shape:
            raise ExperimentError(
                f"incorrect_tokens of shape {list(wrong.shape)} differ from tokens' {list(ids.shape)}"
            )
        directions = directions - unembedding[wrong] * scale
    return directions


def check_uncapped(facts: ModelFacts, uncapped: Any, what: str) -> None:
    """Refuse to split a soft-capped logit (Gemma 2's ``cap * tanh(x / cap)`` is not linear, so no
    parts add up to it) unless ``uncapped=True`` asks for the parts of ``x``, the logit before the cap."""
    if not isinstance(uncapped, bool):
        raise ExperimentError(f"{what}: uncapped={uncapped!r}; give True or False")
    cap = facts.readout.softcap
    if cap is not None and not uncapped:
        raise ExperimentError(
            f"{what}: this model soft-caps its logits ({cap:g} * tanh(x / {cap:g}), Gemma 2's "
            "final_logit_softcapping), which is not linear, so no components add up to a logit; "
            "pass uncapped=True to split x, the logit before the cap (what TransformerLens's "
            "logit_attrs gives)"
        )


def logit_attrs(
    cache: ActivationCache,
    residual_stack: torch.Tensor,
    tokens: Any,
    incorrect_tokens: Any,
    pos_slice: Any,
    batch_slice: Any,
    has_batch_dim: bool,
    uncapped: bool = False,
) -> torch.Tensor:
    """Each component's direct contribution to the logit of ``tokens`` (minus ``incorrect_tokens``),
    ``[component, *batch_and_pos]``: the component through the final norm (clean scale) and the
    unembedding with the norm's weight folded in.  The norm's and unembedding's biases are left out.
    A soft-capped model's logits are refused unless ``uncapped`` (``check_uncapped``)."""
    check_uncapped(cache.facts, uncapped, "logit_attrs")
    scaled = apply_ln_to_stack(cache, residual_stack, None, False, pos_slice, batch_slice, has_batch_dim)
    directions = _directions(cache, tokens, incorrect_tokens, scaled.shape[1:-1], scaled)
    return (scaled * directions).sum(-1)


def output_bias_logits(
    cache: ActivationCache, tokens: Any, incorrect_tokens: Any, fits: torch.Size
) -> torch.Tensor:
    """The part of the logit (difference) no component writes: the final norm's bias through the
    unembedding, plus the unembedding's bias; ``fits``-shaped."""
    unembedding = _value(cache.facts.readout.unembed, cache.value)
    _, norm_bias = _final_weights(cache, unembedding)
    out_bias = _value(cache.facts.readout.bias, unembedding)
    per_token = unembedding.new_zeros(unembedding.shape[0])
    if norm_bias is not None:
        per_token = per_token + unembedding @ norm_bias
    if out_bias is not None:
        per_token = per_token + out_bias
    ids = token_ids(tokens, fits, unembedding.shape[0], "tokens")
    value = per_token[ids]
    if incorrect_tokens is not None:
        value = value - per_token[token_ids(incorrect_tokens, fits, unembedding.shape[0], "incorrect_tokens")]
    return value.expand(fits)


def final_norm(cache: ActivationCache, stack: torch.Tensor) -> torch.Tensor:
    """The final norm recomputed on each vector of ``stack`` (its own statistics), with its weights."""
    norm = cache.facts.readout.norm
    scale, bias = _final_weights(cache, stack)
    normed = _normalized(stack, norm.centred, norm.eps) * scale
    return normed if bias is None else normed + bias


def unembed(cache: ActivationCache, normed: torch.Tensor) -> torch.Tensor:
    """The logits before any soft-cap of final-norm outputs ``normed``: ``normed @ W_U`` plus the
    unembedding bias if any."""
    readout = cache.facts.readout
    logits = normed @ _value(readout.unembed, normed).T
    out_bias = _value(readout.bias, normed)
    return logits if out_bias is None else logits + out_bias


def softcapped(cache: ActivationCache, logits: torch.Tensor) -> torch.Tensor:
    """``logits`` through the model's soft-cap, ``cap * tanh(logits / cap)`` (Gemma 2), if it has one."""
    cap = cache.facts.readout.softcap
    return logits if cap is None else cap * torch.tanh(logits / cap)
