"""Hugging Face BERT (``BertModel``): its config and state dict in ``build_bert``'s terms, and
``from_hf_bert(model, tokens)``.

A ``BertModel``'s keys (``embeddings.*``, ``encoder.layer.{L}.*``, ``pooler.dense.*``), or those of
a model with heads under ``bert.`` (``BertForMaskedLM`` etc.: the encoder alone is read).  Options
that make another model are refused by name: a decoder (``is_decoder``), cross-attention, relative
position embeddings.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from circuits.core.nodes import Circuit
from circuits.errors import ModelError, shown
from circuits.models.bert import NOT_ENCODER_OPTIONS, BertConfig, build_bert
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.models.reading import Reader, get_field, int_field, number_field, typed_field
from circuits.models.text import token_ids
from circuits.transformer import names

FAMILY = "BERT"
#: Buffers some checkpoints hold that carry no weight (positions 0..n-1, zero token types).
_BUFFERS = ("embeddings.position_ids", "embeddings.token_type_ids")


def bert_config_from_hf(config: Any) -> BertConfig:
    """Our ``BertConfig`` from a Hugging Face one (object or ``config.json`` dict), each field checked."""
    problems = [
        f"{option}=True"
        for option in ("is_decoder", "add_cross_attention")
        if typed_field(FAMILY, config, option, False, bool)
    ]
    positions = typed_field(FAMILY, config, "position_embedding_type", "absolute", str)
    if positions != "absolute":
        problems.append(f"position_embedding_type={shown(repr(positions))} (only 'absolute' is built)")
    if problems:
        raise ModelError(f"{FAMILY} config options not supported: {', '.join(problems)}")
    ours = BertConfig(
        n_layers=int_field(FAMILY, config, "num_hidden_layers", 12, low=0),
        n_heads=int_field(FAMILY, config, "num_attention_heads", 12),
        d_model=int_field(FAMILY, config, "hidden_size", 768),
        d_mlp=int_field(FAMILY, config, "intermediate_size", 3072),
        vocab_size=int_field(FAMILY, config, "vocab_size", 30522),
        n_positions=int_field(FAMILY, config, "max_position_embeddings", 512),
        type_vocab_size=int_field(FAMILY, config, "type_vocab_size", 2),
        ln_eps=number_field(FAMILY, config, "layer_norm_eps", 1e-12),
        act=typed_field(FAMILY, config, "hidden_act", "gelu", str),
    )
    if ours.d_model % ours.n_heads:
        raise ModelError(
            f"{FAMILY} config: 'hidden_size' {ours.d_model} is not divisible by 'num_attention_heads' {ours.n_heads}"
        )
    return ours


def bert_weights_from_hf(
    config: BertConfig, state_dict: Mapping[str, Any], attach: bool = False
) -> dict[str, torch.Tensor]:
    """Hugging Face BERT (``nn.Linear`` ``[out, in]`` weights) -> ``build_bert``'s names and layouts (views).

    The pooler's weights are taken when present (``BertModel(add_pooling_layer=False)`` has none)."""
    if any(key.startswith("bert.") for key in state_dict):
        state_dict = {k.removeprefix("bert."): v for k, v in state_dict.items() if k.startswith("bert.")}
    d, h, c, m = config.d_model, config.n_heads, config.d_head, config.d_mlp
    r = Reader(FAMILY, state_dict, attach)
    out: dict[str, Any] = {
        names.TOK_EMBEDS_WEIGHT: r.take("embeddings.word_embeddings.weight", (config.vocab_size, d)),
        names.POS_EMBEDS_WEIGHT: r.take("embeddings.position_embeddings.weight", (config.n_positions, d)),
        names.TOKEN_TYPE_EMBEDS_WEIGHT: r.take(
            "embeddings.token_type_embeddings.weight", (config.type_vocab_size, d)
        ),
        **_norm(r, "embeddings.LayerNorm.", names.EMBEDS, d),
    }
    for layer in range(config.n_layers):
        p = f"encoder.layer.{layer}."
        for which, key in (("q", "query"), ("k", "key"), ("v", "value")):
            weight = r.take(f"{p}attention.self.{key}.weight", (h * c, d))
            bias = r.take(f"{p}attention.self.{key}.bias", (h * c,))
            out[names.attn_weight(layer, which)] = None if weight is None else weight.reshape(h, c, d)
            out[names.attn_weight(layer, f"{which}_bias")] = None if bias is None else bias.reshape(h, 1, c)
        o = r.take(p + "attention.output.dense.weight", (d, h * c))
        out[names.attn_weight(layer, "o")] = None if o is None else o.reshape(d, h, c).permute(1, 0, 2)
        out[names.attn_weight(layer, "o_bias")] = r.take(p + "attention.output.dense.bias", (d,))
        out.update(_norm(r, p + "attention.output.LayerNorm.", names.attn_prefix(layer), d))
        out[names.mlp_weight(layer, "proj_in")] = r.take(p + "intermediate.dense.weight", (m, d))
        out[names.mlp_weight(layer, "in_bias")] = r.take(p + "intermediate.dense.bias", (m,))
        out[names.mlp_weight(layer, "proj_out")] = r.take(p + "output.dense.weight", (d, m))
        out[names.mlp_weight(layer, "out_bias")] = r.take(p + "output.dense.bias", (d,))
        out.update(_norm(r, p + "output.LayerNorm.", names.mlp_prefix(layer), d))
    out[names.POOLER_WEIGHT] = r.take("pooler.dense.weight", (d, d), optional=True)
    out[names.POOLER_BIAS_WEIGHT] = r.take(
        "pooler.dense.bias", (d,), optional=out[names.POOLER_WEIGHT] is None
    )
    r.finish(ignore=lambda key: key in _BUFFERS)
    return r.weights(out)


def _norm(r: Reader, key: str, prefix: str, d: int) -> dict[str, torch.Tensor | None]:
    return {
        names.norm_weight(prefix, "scale"): r.take(key + "weight", (d,)),
        names.norm_weight(prefix, "bias"): r.take(key + "bias", (d,)),
    }


@takes_model_options(NOT_ENCODER_OPTIONS)
def from_hf_bert(
    model: Any,
    tokens: Any = None,
    options: ModelOptions = DEFAULT,
    *,
    token_type_ids: Any = None,
    attention_mask: Any = None,
    pooling: str | None = None,
    normalize: bool = False,
) -> Circuit:
    """A circuit equal to an in-memory ``BertModel`` (or the encoder ``.bert`` of a ``BertFor*`` model).

    ``tokens`` are ``input_ids`` (``[S]`` or ``[B,S]``, every one an input), or text with
    ``tokenizer=``; the other options are ``build_bert``'s.  The root is the last hidden state
    (``last_hidden_state``); ``pooling="pooler"`` gives ``pooler_output``, ``"mean"`` with
    ``normalize=True`` a sentence-transformers embedding.
    """
    tokens = token_ids(tokens, options.tokenizer)
    options = options.evolve(tokenizer=None)  # the tokens are ids from here on
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "state_dict"):
        raise ModelError(f"from_hf_bert needs a Hugging Face BERT model, got {type(model).__name__}")
    if get_field(config, "model_type") != "bert":
        raise ModelError(
            f"from_hf_bert: got a {type(model).__name__} of model_type "
            f"{shown(repr(get_field(config, 'model_type')))}; expected 'bert'"
        )
    encoder = getattr(model, "bert", model)
    ours = bert_config_from_hf(config)
    weights = bert_weights_from_hf(ours, encoder.state_dict(keep_vars=options.attach), options.attach)
    return build_bert(
        ours,
        weights,
        tokens,
        options,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        pooling=pooling,
        normalize=normalize,
    )
