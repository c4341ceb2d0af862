"""Models compiled by tracr (RASP programs as transformer weights) as circuits.

tracr (Lindner et al. 2023; ``tracr-pypi``) compiles a RASP program to the weights of a small
transformer whose circuit is known by construction.  Its architecture: token and position
embeddings added to the residual stream (position 0, the BOS token's, embeds no index), then per
layer multi-head attention (no mask but the causal one when compiled ``causal=True``; scores
scaled by ``1/sqrt(key_size)``) and a ReLU MLP, each added to the stream, no layer norm anywhere,
and a readout projecting the stream on the output space (a categorical output is its argmax).

The builder writes it in GPT-2's names (``'embeds'``, ``'b{L}.a'``, ``'b{L}.m'``, ``'t.call'``), so
that ``split_heads``, the residual analyses and ``edge_circuit`` read it as they read GPT-2.  Where
GPT-2 has a layer norm, a tracr circuit has an *identity norm*: the builders' RMSNorm with no
variance term, ``x * rsqrt(1) * 1`` (``'rms.var_p_eps'`` is the epsilon 1 alone, the scale all
ones), exactly ``x`` in every dtype; so each receiver still reads the stream through a node of its
own.  The root is the readout ``'t.call'`` (``[batch, positions, outputs]``): tracr's inputs are
whole sequences (BOS first), with no next-token targets.

``tracr_weights`` turns tracr's haiku parameters (``model.params``, nested or flattened
``'module.param'``) into the builder's weights; ``load_tracr_export`` reads what
``scripts/tracr_export.py`` writes (weights, inputs, tracr's outputs, the true edges).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy
import safetensors.torch
import torch

from circuits.core.nodes import Add, Array, Circuit, Scalar
from circuits.errors import ModelError
from circuits.models import common
from circuits.models.common import einsum, fn
from circuits.models.gpt2 import attention_heads
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.models.text import token_ids
from circuits.transformer import names
from circuits.transformer.masks import causal_mask_array

__all__ = ["TracrConfig", "TracrExport", "build_tracr", "load_tracr_export", "tracr_weights"]

_NOT_TAKEN = {
    "rope": "its positions are learned embeddings, not rotary",
    "convention": "a tracr model reads whole sequences (BOS first) and has no next-token targets: its root "
    "is the readout 't.call'",
    "causal": "its mask is the one tracr compiled it with (TracrConfig.causal)",
}


@dataclasses.dataclass(frozen=True)
class TracrConfig:
    """A compiled model's shape: ``d_head`` is tracr's ``key_size`` (the value size too),
    ``d_mlp`` its ``mlp_hidden_size``, ``n_ctx`` the positions (max_seq_len + 1, BOS included),
    ``n_outputs`` the output space's dimensions (1 for a numerical output)."""

    n_layers: int
    n_heads: int
    d_model: int
    d_head: int
    d_mlp: int
    vocab_size: int
    n_ctx: int
    n_outputs: int
    causal: bool = False

    def __post_init__(self):
        common.check_config(
            self,
            ("n_heads", "d_model", "d_head", "d_mlp", "vocab_size", "n_ctx", "n_outputs"),
            flags=("causal",),
        )

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight the builder takes, by circuit name (GPT-2's, less the norms), with its shape."""
        d, h, c, m = self.d_model, self.n_heads, self.d_head, self.d_mlp
        shapes = {names.TOK_EMBEDS_WEIGHT: (self.vocab_size, d), names.POS_EMBEDS_WEIGHT: (self.n_ctx, d)}
        for layer in range(self.n_layers):
            for which in "qkv":
                shapes[names.attn_weight(layer, which)] = (h, c, d)
                shapes[names.attn_weight(layer, f"{which}_bias")] = (h, 1, c)
            shapes[names.attn_weight(layer, "o")] = (h, d, c)
            shapes[names.attn_weight(layer, "o_bias")] = (d,)
            shapes[names.mlp_weight(layer, "proj_in")] = (m, d)
            shapes[names.mlp_weight(layer, "in_bias")] = (m,)
            shapes[names.mlp_weight(layer, "proj_out")] = (d, m)
            shapes[names.mlp_weight(layer, "out_bias")] = (d,)
        shapes[names.UNEMBED_WEIGHT] = (self.n_outputs, d)
        return shapes


@takes_model_options(_NOT_TAKEN)
def build_tracr(
    config: TracrConfig, weights: Mapping[str, Any], tokens: Any = None, options: ModelOptions = DEFAULT
) -> Circuit:
    """A tracr model as a circuit whose root is the readout ``'t.call'``; ``weights`` as named by
    ``config.weight_shapes()`` (``tracr_weights`` makes them), ``tokens`` tracr's token ids
    ``[S]`` or ``[B, S]`` (BOS first; ``input_encoding`` of the export), or None with ``seq_len``."""
    if not isinstance(config, TracrConfig):
        raise ModelError(f"build_tracr needs a TracrConfig, got {type(config).__name__}")
    tokens = token_ids(tokens, options.tokenizer)
    tensors = common.check_weights(
        "tracr", weights, config.weight_shapes(), attach=options.attach, copy=options.copy
    )
    w = common.weight_arrays(tensors)
    options = options.evolve(convention="prompt")
    toks = common.make_tokens(tokens, options, vocab_size=config.vocab_size, max_positions=config.n_ctx)
    dtype = common.weights_dtype(tensors)
    mask = causal_mask_array(toks.seq_len, dtype) if config.causal else None
    identity = functools.partial(_identity_norm, dtype=dtype)

    idxed = common.embed(w[names.TOK_EMBEDS_WEIGHT], toks)
    resid: Circuit = Add(idxed, common.positions(w[names.POS_EMBEDS_WEIGHT], toks.seq_len), name=names.EMBEDS)
    for layer in range(config.n_layers):
        norm = identity(resid, names.attn_prefix(layer), names.attn_norm(layer))
        resid_mid = Add(
            attention_heads(w, norm, layer, mask, options.neg_inf),
            w[names.attn_weight(layer, "o_bias")],
            resid,
            name=names.resid_mid(layer),
        )
        norm = identity(resid_mid, names.mlp_prefix(layer), names.mlp_norm(layer))
        resid = Add(_mlp(w, norm, layer), resid_mid, name=names.block(layer))
    final = identity(resid, names.FINAL, names.FINAL_NORM)
    return common.loss_head(final, w[names.UNEMBED_WEIGHT], None)


def _identity_norm(x: Circuit, prefix: str, name: str, dtype: torch.dtype) -> Circuit:
    """``x`` in the builders' RMSNorm form with no variance term: ``x * rsqrt(1) * ones``."""
    part = functools.partial(names.norm_node, names.RMS)
    eps = Scalar(1.0, shape=tuple(x.shape[:-1]), name=part("c.eps"))
    rsqrt = fn("rsqrt", Add(eps, name=part("var_p_eps")), name=part("rsqrt"))
    y = einsum("ih,i->ih", x, rsqrt, name=part("y"))
    scale = Array(torch.ones(x.shape[-1], dtype=dtype), name=names.norm_weight(prefix, "scale", names.RMS))
    return einsum("ih,h->ih", y, scale, name=name)


def _mlp(w: Mapping[str, Circuit], norm: Circuit, layer: int) -> Add:
    """``'b{L}.m'``: layer ``L``'s ReLU MLP with its output bias."""
    pre = Add(
        einsum("sd,Md->sM", norm, w[names.mlp_weight(layer, "proj_in")], name=names.MLP_PROJ_IN),
        w[names.mlp_weight(layer, "in_bias")],
        name=names.MLP_PRE,
    )
    activated = fn("relu", pre, name=names.MLP_ACT)
    return Add(
        einsum("sM,dM->sd", activated, w[names.mlp_weight(layer, "proj_out")], name=names.MLP_PROJ_OUT),
        w[names.mlp_weight(layer, "out_bias")],
        name=names.mlp_out(layer),
    )


# ------------------------------------------------------------------ tracr's parameters


def tracr_weights(
    params: Mapping[str, Any],
    unembed: Any,
    n_heads: int,
    *,
    causal: bool = False,
    dtype: torch.dtype | None = None,
) -> tuple[TracrConfig, dict[str, torch.Tensor]]:
    """``(config, weights)`` for ``build_tracr`` from tracr's haiku parameters (``model.params``:
    ``{'transformer/layer_0/attn/query': {'w': ..., 'b': ...}, 'token_embed': {'embeddings': ...}}``,
    or flattened ``'module.param'``; numpy or jax arrays or tensors), the readout ``unembed``
    (``[d_model, outputs]``, the projection of the residual space on the output space) and the
    number of heads (tracr's ``model_config.num_heads``).  ``dtype``: the weights' (default: the
    parameters' own)."""
    flat = _flat(params)
    tensor = functools.partial(_tensor, flat, dtype=dtype)
    embed = tensor("token_embed.embeddings", 2)
    vocab_size, d_model = embed.shape
    layers = sorted(
        {int(key.split("/")[1].removeprefix("layer_")) for key in flat if key.startswith("transformer/")}
    )
    if layers != list(range(len(layers))):
        raise ModelError(f"tracr_weights: params: the layers found are {layers}, not 0 .. n-1", "params")
    query = tensor("transformer/layer_0/attn/query.w", 2) if layers else None
    if query is None or isinstance(n_heads, bool) or not isinstance(n_heads, int) or query.shape[1] % n_heads:
        raise ModelError(f"tracr_weights: n_heads={n_heads!r} does not divide the query width", "n_heads")
    out = torch.as_tensor(unembed).to(embed.dtype if dtype is None else dtype)
    if out.ndim != 2 or out.shape[0] != d_model:
        raise ModelError(
            f"tracr_weights: unembed {list(out.shape)} is not [d_model={d_model}, outputs]", "unembed"
        )
    d_head = query.shape[1] // n_heads
    weights = {names.TOK_EMBEDS_WEIGHT: embed, names.POS_EMBEDS_WEIGHT: tensor("pos_embed.embeddings", 2)}
    for layer in layers:
        weights.update(_layer_weights(tensor, layer, n_heads, d_head))
    weights[names.UNEMBED_WEIGHT] = out.T.contiguous()
    config = TracrConfig(
        n_layers=len(layers),
        n_heads=n_heads,
        d_model=d_model,
        d_head=d_head,
        d_mlp=weights[names.mlp_weight(0, "proj_in")].shape[0],
        vocab_size=vocab_size,
        n_ctx=weights[names.POS_EMBEDS_WEIGHT].shape[0],
        n_outputs=out.shape[1],
        causal=causal,
    )
    return config, weights


def _layer_weights(tensor, layer: int, n_heads: int, d_head: int) -> dict[str, torch.Tensor]:
    """One layer's weights, from haiku's ``[in, out]`` matrices to the builder's layouts."""
    attn, mlp = f"transformer/layer_{layer}/attn", f"transformer/layer_{layer}/mlp"
    out: dict[str, torch.Tensor] = {}
    for which, module in (("q", "query"), ("k", "key"), ("v", "value")):
        w = tensor(f"{attn}/{module}.w", 2)  # [d_model, heads * d_head]
        out[names.attn_weight(layer, which)] = (
            w.reshape(w.shape[0], n_heads, d_head).permute(1, 2, 0).contiguous()
        )
        out[names.attn_weight(layer, f"{which}_bias")] = tensor(f"{attn}/{module}.b", 1).reshape(
            n_heads, 1, d_head
        )
    w_o = tensor(f"{attn}/linear.w", 2)  # [heads * d_head, d_model]
    out[names.attn_weight(layer, "o")] = (
        w_o.reshape(n_heads, d_head, w_o.shape[1]).transpose(1, 2).contiguous()
    )
    out[names.attn_weight(layer, "o_bias")] = tensor(f"{attn}/linear.b", 1)
    out[names.mlp_weight(layer, "proj_in")] = tensor(f"{mlp}/linear_1.w", 2).T.contiguous()
    out[names.mlp_weight(layer, "in_bias")] = tensor(f"{mlp}/linear_1.b", 1)
    out[names.mlp_weight(layer, "proj_out")] = tensor(f"{mlp}/linear_2.w", 2).T.contiguous()
    out[names.mlp_weight(layer, "out_bias")] = tensor(f"{mlp}/linear_2.b", 1)
    return out


def _flat(params: Mapping[str, Any]) -> dict[str, Any]:
    if not isinstance(params, Mapping):
        raise ModelError(f"tracr_weights: params must be a mapping, got {type(params).__name__}", "params")
    flat: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}.{inner}": array for inner, array in value.items()})
        else:
            flat[key] = value
    return flat


def _tensor(flat: Mapping[str, Any], key: str, rank: int, dtype: torch.dtype | None) -> torch.Tensor:
    if key not in flat:
        raise ModelError(f"tracr_weights: params has no {key!r} (tracr's haiku names)", "params")
    value = torch.as_tensor(_numpy(flat[key]))
    if value.ndim != rank or not value.is_floating_point():
        raise ModelError(
            f"tracr_weights: params[{key!r}] is {value.dtype} {list(value.shape)}, not a float of rank {rank}",
            "params",
        )
    return value if dtype is None else value.to(dtype)


def _numpy(value: Any) -> Any:
    """A jax array as numpy (torch reads numpy); anything else as it is."""
    return value if isinstance(value, torch.Tensor) else numpy.asarray(value)


# ------------------------------------------------------------------ scripts/tracr_export.py's files


@dataclasses.dataclass(frozen=True)
class TracrExport:
    """A compiled program as ``scripts/tracr_export.py`` wrote it: ``config`` and ``weights`` for
    ``build_tracr``, the token ids ``inputs`` ``[batch, positions]``, tracr's own final residual
    stream ``tracr_output`` and readout ``tracr_unembedded`` on them, the ``true_edges`` (edge
    names of ``edge_circuit``) and the JSON as written (``info``)."""

    config: TracrConfig
    weights: dict[str, torch.Tensor]
    inputs: torch.Tensor
    tracr_output: torch.Tensor
    tracr_unembedded: torch.Tensor
    true_edges: tuple[str, ...]
    info: dict

    def circuit(self, tokens: Any = None, **options: Any) -> Circuit:
        """The model on ``tokens`` (default: the exported ``inputs``)."""
        return build_tracr(self.config, self.weights, self.inputs if tokens is None else tokens, **options)


def load_tracr_export(path: str | Path, dtype: torch.dtype = torch.float32) -> TracrExport:
    """The export at ``path`` (``.../reverse``, ``.../reverse.json`` or ``.safetensors``: both files
    are read), its weights in ``dtype``."""
    stem = Path(path)
    stem = stem.with_suffix("") if stem.suffix in (".json", ".safetensors") else stem
    try:
        info = json.loads(stem.with_suffix(".json").read_text())
        tensors = safetensors.torch.load_file(str(stem.with_suffix(".safetensors")))
    except FileNotFoundError as error:
        raise ModelError(
            f"load_tracr_export: {error.filename} is missing (run scripts/tracr_export.py)"
        ) from None
    config = info.get("config", {})
    if config.get("layer_norm") or config.get("activation") != "relu":
        raise ModelError(
            f"load_tracr_export: {stem}.json: only tracr's relu models without layer norm are built"
        )
    params = {
        k: v for k, v in tensors.items() if k not in ("unembed", "inputs") and not k.startswith("tracr.")
    }
    cfg, weights = tracr_weights(
        params, tensors["unembed"], config["num_heads"], causal=bool(config["causal"]), dtype=dtype
    )
    return TracrExport(
        cfg,
        weights,
        tensors["inputs"],
        tensors["tracr.output"],
        tensors["tracr.unembedded"],
        tuple(info["true_edges"]),
        info,
    )
