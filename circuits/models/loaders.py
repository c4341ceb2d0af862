"""Weights from Hugging Face models and checkpoints, and TransformerLens state dicts.

- ``from_hf(model, tokens)``: an in-memory ``GPT2LMHeadModel`` or
  ``LlamaForCausalLM`` (the config is read from the model).
- ``load_hf_checkpoint(path, tokens)``: a local directory with
  ``config.json`` and ``*.safetensors`` (sharded or not; ``pytorch_model.bin``
  as a fallback), e.g. written by ``model.save_pretrained(path)``.  Needs
  ``transformers`` only for Llama checkpoints with a scaled rotary variant.
- ``from_hf_state_dict(config, state_dict, tokens)``: the same from a config
  (object or dict) and a state dict.
- ``from_transformer_lens(state_dict, tokens, family=...)``: a
  TransformerLens ``HookedTransformer`` state dict, for the ``"gpt2"`` and
  ``"attn_only"`` families (see ``TRANSFORMER_LENS_KEYS``).

Weights are copied (so later changes to the model do not make the circuit's
array hashes stale) and converted to the builders' layouts.  With
``attach=True`` (``from_hf``, ``from_hf_state_dict``,
``from_transformer_lens``) they are not copied: every weight array holds a
view of the model's parameter (a transpose, reshape or slice of it), so
``cc.evaluate(c).mean().backward()`` fills the parameters' ``.grad`` as the
model's own backward would (a tied embedding gets both uses' gradients).
The caveat: an in-place update of a parameter (an optimizer step) changes
the arrays' tensors, so evaluating the circuit raises ``StaleTensorError``;
rebuild it after each step.

Every mistake (an unknown option, a config field of the wrong kind, a broken
checkpoint file, weights that do not fit) is a ``ModelError`` naming the
option, field or file at fault.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from circuits.errors import ModelError, shown
from circuits.models.attn_only import AttnOnlyConfig, build_attn_only
from circuits.models.common import BUILD_OPTIONS, CONVENTIONS, checked_options
from circuits.models.gpt2 import GPT2Config, build_gpt2
from circuits.models.llama import LlamaConfig, build_llama
from circuits.nodes import Circuit

SUPPORTED_HF = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM"}


# ----------------------------------------------------------------- helpers


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


class _Reader:
    """Takes tensors from a state dict, collecting every problem before raising.

    Detached unless ``attach``: then the tensors are the state dict's own
    (a model's parameters with ``state_dict(keep_vars=True)``).
    """

    def __init__(self, family: str, state_dict: Mapping[str, Any], attach: bool = False):
        self.family = family
        self.state = state_dict
        self.attach = attach
        self.used: set[str] = set()
        self.missing: list[str] = []
        self.misshapen: list[str] = []

    def take(self, key: str, shape: tuple[int, ...], optional: bool = False) -> torch.Tensor | None:
        if key not in self.state:
            if not optional:
                self.missing.append(f"{key!r} {list(shape)}")
            return None
        self.used.add(key)
        tensor = self.state[key]
        if not isinstance(tensor, torch.Tensor):
            self.misshapen.append(f"{key!r} is a {type(tensor).__name__}, not a tensor")
            return None
        if tuple(tensor.shape) != tuple(shape):
            self.misshapen.append(f"{key!r} has shape {list(tensor.shape)}, expected {list(shape)}")
            return None
        if tensor.is_meta:
            self.misshapen.append(f"{key!r} is a meta tensor, which has a shape but no values")
            return None
        return tensor if self.attach else tensor.detach()

    def finish(self, ignore: Callable[[str], bool] = lambda key: False) -> None:
        unknown = sorted((k for k in self.state if k not in self.used and not ignore(k)), key=str)
        problems = []
        if self.missing:
            problems.append("missing: " + ", ".join(self.missing))
        if self.misshapen:
            problems.append("misshapen: " + "; ".join(self.misshapen))
        if unknown:
            listed = ", ".join(shown(repr(k)) for k in unknown[:12])
            listed += f", ... ({len(unknown)} in all)" if len(unknown) > 12 else ""
            problems.append(f"not understood (another architecture or an unsupported option?): {listed}")
        if problems:
            raise ModelError(f"{self.family} state dict does not fit the config:\n  " + "\n  ".join(problems))

    def weights(self, out: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """The converted weights: views of the state dict's tensors if attached, private copies if not."""
        return {name: t if self.attach else _own(t) for name, t in out.items() if t is not None}


def _own(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy: the circuit must not share storage with a model that may change."""
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def _strip_prefix(state_dict: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {(k.removeprefix(prefix)): v for k, v in state_dict.items()}


# ------------------------------------------------------------ config fields


def _int_field(family: str, config: Any, key: str, default: Any = None, low: int = 1) -> int:
    """An int field ``>= low``: a str, float, bool or 0 in ``config.json`` would build a wrong model."""
    value = _get(config, key, default)
    if value is None:
        raise ModelError(f"{family} config: no {key!r} (an int >= {low})")
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ModelError(f"{family} config: {key!r} is {shown(repr(value))}; expected an int >= {low}")
    return value


def _optional_int(family: str, config: Any, key: str) -> int | None:
    return None if _get(config, key) is None else _int_field(family, config, key)


def _number_field(family: str, config: Any, key: str, default: float, positive: bool = False) -> float:
    """A finite number (> 0 if ``positive``, else >= 0), as epsilons and rotary bases are."""
    value = _get(config, key, default)
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    if bad or value < 0 or (positive and value == 0):
        raise ModelError(
            f"{family} config: {key!r} is {shown(repr(value))}; expected a finite number "
            f"{'> 0' if positive else '>= 0'}"
        )
    return float(value)


def _typed_field(family: str, config: Any, key: str, default: Any, kind: type) -> Any:
    value = _get(config, key, default)
    if not isinstance(value, kind):
        raise ModelError(f"{family} config: {key!r} is {shown(repr(value))}; expected a {kind.__name__}")
    return value


# ------------------------------------------------------------------- GPT-2


def gpt2_config_from_hf(config: Any) -> GPT2Config:
    """Our ``GPT2Config`` from a Hugging Face one (object or ``config.json`` dict), each field checked."""
    family = "GPT-2"
    problems = []
    if not _typed_field(family, config, "scale_attn_weights", True, bool):
        problems.append("scale_attn_weights=False")
    for option in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if _typed_field(family, config, option, False, bool):
            problems.append(f"{option}=True")
    if problems:
        raise ModelError(f"GPT-2 config options not supported: {', '.join(problems)}")
    ours = GPT2Config(
        n_layers=_int_field(family, config, "n_layer", low=0),
        n_heads=_int_field(family, config, "n_head"),
        d_model=_int_field(family, config, "n_embd"),
        vocab_size=_int_field(family, config, "vocab_size"),
        n_ctx=_int_field(family, config, "n_positions"),
        d_mlp=_optional_int(family, config, "n_inner"),
        ln_eps=_number_field(family, config, "layer_norm_epsilon", 1e-5),
        act=_typed_field(family, config, "activation_function", "gelu_new", str),
        tie_word_embeddings=_typed_field(family, config, "tie_word_embeddings", True, bool),
    )
    if ours.d_model % ours.n_heads:
        raise ModelError(f"GPT-2 config: 'n_embd' {ours.d_model} is not divisible by 'n_head' {ours.n_heads}")
    return ours


def gpt2_weights_from_hf(
    config: GPT2Config, state_dict: Mapping[str, Any], attach: bool = False
) -> dict[str, torch.Tensor]:
    """Hugging Face GPT-2 (Conv1D ``[in, out]`` weights, fused ``c_attn``) -> the builder's names and layouts.

    Every conversion is a view (reshape of a contiguous tensor, permute,
    transpose), so that with ``attach`` no weight is copied.
    """
    lm_head = state_dict.get("lm_head.weight")
    state = _strip_prefix({k: v for k, v in state_dict.items() if k != "lm_head.weight"}, "transformer.")
    if lm_head is not None:
        state["lm_head.weight"] = lm_head
    d, h, c, v, m = config.d_model, config.n_heads, config.d_head, config.vocab_size, config.mlp_size
    r = _Reader("GPT-2", state, attach)
    out: dict[str, Any] = {
        "t.w.tok_embeds": r.take("wte.weight", (v, d)),
        "t.w.pos_embeds": r.take("wpe.weight", (config.n_ctx, d)),
    }
    for layer in range(config.n_layers):
        p = f"h.{layer}."
        out[f"a{layer}.ln.w.scale"] = r.take(p + "ln_1.weight", (d,))
        out[f"a{layer}.ln.w.bias"] = r.take(p + "ln_1.bias", (d,))
        qkv = r.take(p + "attn.c_attn.weight", (d, 3 * d))
        qkv_bias = r.take(p + "attn.c_attn.bias", (3 * d,))
        if qkv is not None:
            # output column (which * d + head * c + j) -> [which][head, j, input]
            split = qkv.reshape(d, 3, h, c).permute(1, 2, 3, 0)
            for i, which in enumerate("qkv"):
                out[f"a{layer}.w.{which}"] = split[i]
        if qkv_bias is not None:
            split_bias = qkv_bias.reshape(3, h, 1, c)
            for i, which in enumerate("qkv"):
                out[f"a{layer}.w.{which}_bias"] = split_bias[i]
        proj = r.take(p + "attn.c_proj.weight", (d, d))
        if proj is not None:  # [head * c + j, out] -> [head, out, j]
            out[f"a{layer}.w.o"] = proj.reshape(h, c, d).permute(0, 2, 1)
        out[f"a{layer}.w.o_bias"] = r.take(p + "attn.c_proj.bias", (d,))
        out[f"m{layer}.ln.w.scale"] = r.take(p + "ln_2.weight", (d,))
        out[f"m{layer}.ln.w.bias"] = r.take(p + "ln_2.bias", (d,))
        fc = r.take(p + "mlp.c_fc.weight", (d, m))
        out[f"m{layer}.w.proj_in"] = None if fc is None else fc.T
        out[f"m{layer}.w.in_bias"] = r.take(p + "mlp.c_fc.bias", (m,))
        fc_out = r.take(p + "mlp.c_proj.weight", (m, d))
        out[f"m{layer}.w.proj_out"] = None if fc_out is None else fc_out.T
        out[f"m{layer}.w.out_bias"] = r.take(p + "mlp.c_proj.bias", (d,))
    out["final.ln.w.scale"] = r.take("ln_f.weight", (d,))
    out["final.ln.w.bias"] = r.take("ln_f.bias", (d,))
    unembed = r.take("lm_head.weight", (v, d), optional=config.tie_word_embeddings)
    if unembed is not None and not config.tie_word_embeddings:
        out["t.w.unembed"] = unembed
    # attention-mask buffers that older transformers versions saved
    r.finish(ignore=lambda k: bool(re.fullmatch(r"h\.\d+\.attn\.(bias|masked_bias)", k)))
    return r.weights(out)


# ------------------------------------------------------------------- Llama


def _rope_params(config: Any) -> Mapping[str, Any]:
    """``rope_parameters`` (transformers 5) or ``rope_scaling`` (4.x), as a mapping."""
    for key in ("rope_parameters", "rope_scaling"):
        params = _get(config, key)
        if params is not None and not isinstance(params, Mapping):
            raise ModelError(
                f"Llama config: {key!r} is {shown(repr(params))}; expected an object (a mapping)"
            )
        if params:
            return params
    return {}


def _rope_type(config: Any) -> str:
    params = _rope_params(config)
    return _typed_field(
        "Llama", params, "rope_type", _typed_field("Llama", params, "type", "default", str), str
    )


def _rope_theta(config: Any) -> float:
    params = _get(config, "rope_parameters") or {}
    if "rope_theta" in params:
        return _number_field("Llama", params, "rope_theta", 10000.0, positive=True)
    return _number_field("Llama", config, "rope_theta", 10000.0, positive=True)


def llama_config_from_hf(config: Any) -> LlamaConfig:
    """Our ``LlamaConfig`` from a Hugging Face one (object or ``config.json`` dict), each field checked."""
    family = "Llama"
    problems = [
        f"{option}=True"
        for option in ("attention_bias", "mlp_bias")
        if _typed_field(family, config, option, False, bool)
    ]
    if problems:
        raise ModelError(f"Llama config options not supported: {', '.join(problems)}")
    _rope_params(config)
    heads = _int_field(family, config, "num_attention_heads")
    ours = LlamaConfig(
        n_layers=_int_field(family, config, "num_hidden_layers", low=0),
        n_heads=heads,
        n_kv_heads=_int_field(family, config, "num_key_value_heads", heads),
        d_model=_int_field(family, config, "hidden_size"),
        d_head=_optional_int(family, config, "head_dim"),
        d_mlp=_int_field(family, config, "intermediate_size"),
        vocab_size=_int_field(family, config, "vocab_size"),
        max_positions=_optional_int(family, config, "max_position_embeddings"),
        rms_eps=_number_field(family, config, "rms_norm_eps", 1e-6),
        rope_theta=_rope_theta(config),
        act=_typed_field(family, config, "hidden_act", "silu", str),
        tie_word_embeddings=_typed_field(family, config, "tie_word_embeddings", False, bool),
    )
    if heads % ours.kv_heads:
        raise ModelError(
            f"Llama config: 'num_attention_heads' {heads} is not a multiple of 'num_key_value_heads' {ours.kv_heads}"
        )
    if ours.d_head is None and ours.d_model % heads:
        raise ModelError(
            f"Llama config: 'hidden_size' {ours.d_model} is not divisible by 'num_attention_heads' {heads}"
        )
    return ours


def llama_weights_from_hf(
    config: LlamaConfig, state_dict: Mapping[str, Any], attach: bool = False
) -> dict[str, torch.Tensor]:
    """Hugging Face Llama (``nn.Linear`` ``[out, in]`` weights) -> the builder's names and layouts (views)."""
    d, h, g, c, v, m = (
        config.d_model,
        config.n_heads,
        config.kv_heads,
        config.head_size,
        config.vocab_size,
        config.d_mlp,
    )
    r = _Reader("Llama", state_dict, attach)
    out: dict[str, Any] = {"t.w.tok_embeds": r.take("model.embed_tokens.weight", (v, d))}
    for layer in range(config.n_layers):
        p = f"model.layers.{layer}."
        out[f"a{layer}.rms.w.scale"] = r.take(p + "input_layernorm.weight", (d,))
        for which, heads in (("q", h), ("k", g), ("v", g)):
            weight = r.take(p + f"self_attn.{which}_proj.weight", (heads * c, d))
            out[f"a{layer}.w.{which}"] = None if weight is None else weight.reshape(heads, c, d)
        o = r.take(p + "self_attn.o_proj.weight", (d, h * c))
        out[f"a{layer}.w.o"] = None if o is None else o.reshape(d, h, c).permute(1, 0, 2)
        out[f"m{layer}.rms.w.scale"] = r.take(p + "post_attention_layernorm.weight", (d,))
        out[f"m{layer}.w.gate"] = r.take(p + "mlp.gate_proj.weight", (m, d))
        out[f"m{layer}.w.up"] = r.take(p + "mlp.up_proj.weight", (m, d))
        out[f"m{layer}.w.down"] = r.take(p + "mlp.down_proj.weight", (d, m))
    out["final.rms.w.scale"] = r.take("model.norm.weight", (d,))
    unembed = r.take("lm_head.weight", (v, d), optional=config.tie_word_embeddings)
    if unembed is not None and not config.tie_word_embeddings:
        out["t.w.unembed"] = unembed
    r.finish(ignore=lambda k: k.endswith("rotary_emb.inv_freq"))
    return r.weights(out)


def _hf_rope_tables(
    rotary_module: Any, seq_len: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin ``[S, d_head]`` from a Hugging Face rotary-embedding module (any rope variant)."""
    device = next((b.device for b in rotary_module.buffers()), torch.device("cpu"))
    probe = torch.zeros(1, dtype=dtype, device=device)
    positions = torch.arange(seq_len, device=device)[None, :]
    with torch.no_grad():
        cos, sin = rotary_module(probe, positions)
    return cos[0].cpu(), sin[0].cpu()


def _rope_from_transformers(config_dict: Mapping[str, Any], seq_len: int, dtype: torch.dtype):
    try:
        from transformers import LlamaConfig as HFLlamaConfig
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    except ImportError as error:
        raise ModelError(
            f"this Llama checkpoint uses the {_rope_type(config_dict)!r} rotary variant, which is computed "
            f"with transformers; install it (pip install 'circuits[hf]'): {error}"
        ) from error
    try:
        hf_config = HFLlamaConfig(
            **{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")}
        )
        return _hf_rope_tables(LlamaRotaryEmbedding(hf_config), seq_len, dtype)
    except Exception as error:  # transformers' own complaint about the rope parameters
        raise ModelError(
            f"Llama: transformers cannot compute the {_rope_type(config_dict)!r} rotary tables from this config: "
            f"{shown(str(error))}"
        ) from error


# ------------------------------------------------------------- entry points


def _positions(tokens: Any, seq_len: int | None, convention: str) -> int | None:
    """Positions the tokens give (for the rotary tables); None to let the builder say what is wrong."""
    if not isinstance(convention, str) or convention not in CONVENTIONS:
        return None
    if tokens is None:
        positions = seq_len
    else:
        shape = getattr(tokens, "shape", None)
        if shape is None:
            try:
                shape = torch.as_tensor(tokens).shape
            except (TypeError, ValueError, RuntimeError):
                return None
        positions = int(shape[-1]) - CONVENTIONS[convention][0] if len(shape) else None
    return (
        positions
        if isinstance(positions, int) and not isinstance(positions, bool) and positions > 0
        else None
    )


def _model_type(config: Any) -> str:
    model_type = _get(config, "model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED_HF:
        archs = _get(config, "architectures")
        listed = ", ".join(map(str, archs)) if isinstance(archs, list) else archs
        raise ModelError(
            f"unsupported architecture: model_type {shown(repr(model_type))}"
            + (f" ({shown(str(listed))})" if listed else "")
            + f"; supported: {', '.join(f'{t!r} ({c})' for t, c in SUPPORTED_HF.items())}"
        )
    return model_type


def _config_for(config: Any) -> tuple[str, Any]:
    """``(family, builder config)`` from a Hugging Face config, every field checked."""
    if _model_type(config) == "gpt2":
        return "gpt2", gpt2_config_from_hf(config)
    return "llama", llama_config_from_hf(config)


def _attach(options: Mapping[str, Any]) -> bool:
    attach = options.get("attach", False)
    if not isinstance(attach, bool):
        raise ModelError(f"attach={shown(repr(attach))} is not a bool (True or False)")
    return attach


def hf_to_weights(
    config: Any, state_dict: Mapping[str, Any], attach: bool = False
) -> tuple[str, Any, dict[str, torch.Tensor]]:
    """``(family, builder config, weights)`` from a Hugging Face config (object or dict) and state dict.

    The weights are copies, or views of the state dict's tensors with ``attach``.
    """
    family, ours = _config_for(config)
    if not isinstance(state_dict, Mapping) or not all(isinstance(k, str) for k in state_dict):
        raise ModelError(f"a state dict must map str keys to tensors, got {type(state_dict).__name__}")
    if family == "gpt2":
        return family, ours, gpt2_weights_from_hf(ours, state_dict, attach)
    return family, ours, llama_weights_from_hf(ours, state_dict, attach)


@checked_options(*BUILD_OPTIONS)
def from_hf_state_dict(
    config: Any,
    state_dict: Mapping[str, Any],
    tokens: Any = None,
    *,
    rope: tuple[torch.Tensor, torch.Tensor] | None = None,
    **options: Any,
) -> Circuit:
    """A circuit from a Hugging Face config (object or ``config.json`` dict) and a state dict.

    ``options`` are the builder's: ``seq_len``, ``batch_size``,
    ``convention``, ``causal``, ``neg_inf``, ``attach`` (see the module
    docstring: with it, the arrays are views of the state dict's tensors).
    """
    family, ours, weights = hf_to_weights(config, state_dict, _attach(options))
    if family == "gpt2":
        if rope is not None:
            raise ModelError("rope= applies to Llama models only")
        return build_gpt2(ours, weights, tokens, **options)
    if rope is None and _rope_type(config) != "default":
        seq = _positions(tokens, options.get("seq_len"), options.get("convention", "default"))
        if seq is None:
            raise ModelError(
                f"this Llama model's {_rope_type(config)!r} rotary tables need the number of positions: pass "
                "tokens (an int tensor [S+1] or [B,S+1]) or seq_len= (a positive int), and a known convention"
            )
        config_dict = config if isinstance(config, Mapping) else config.to_dict()
        dtype = next(iter(weights.values())).dtype
        rope = _rope_from_transformers(config_dict, seq, dtype)
    return build_llama(ours, weights, tokens, rope=rope, **options)


@checked_options(*BUILD_OPTIONS)
def from_hf(model: Any, tokens: Any = None, **options: Any) -> Circuit:
    """A circuit equal to an in-memory ``GPT2LMHeadModel`` or ``LlamaForCausalLM``.

    ``tokens``: an int tensor ``[S+1]`` or ``[B,S+1]`` (inputs all but the
    last, targets all but the first; copied), or None with ``seq_len=`` (and
    ``batch_size=``) for a placeholder.  Other options as in the builders:
    ``convention="golden"``, ``causal``, ``neg_inf``, and ``attach=True`` to
    make every weight array a view of the model's parameter, so that a
    backward pass through the circuit fills ``model.parameters()``'s
    ``.grad`` (rebuild the circuit after an optimizer step: see the module
    docstring).  The root is the per-token loss ``'t.loss'``; the logits are
    ``'t.call'``.
    """
    config = getattr(model, "config", None)
    if config is None or not hasattr(model, "state_dict"):
        raise ModelError(f"from_hf needs a Hugging Face model with a .config, got {type(model).__name__}")
    model_type = _model_type(config)
    expected = SUPPORTED_HF[model_type]
    if type(model).__name__ != expected:
        raise ModelError(
            f"from_hf: got a {type(model).__name__} ({model_type}); expected {expected} (a model with its LM head)"
        )
    rope = None
    if model_type == "llama":
        seq = _positions(tokens, options.get("seq_len"), options.get("convention", "default"))
        rotary = getattr(getattr(model, "model", None), "rotary_emb", None)
        if seq is not None and rotary is not None:
            dtype = model.get_input_embeddings().weight.dtype
            rope = _hf_rope_tables(rotary, seq, dtype)
    state = model.state_dict(keep_vars=_attach(options))
    return from_hf_state_dict(config, state, tokens, rope=rope, **options)


# ------------------------------------------------------------- checkpoints


def _read_json(path: Path) -> Any:
    """A JSON file's value, or a ModelError naming the file and what is wrong with it."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as error:
        raise ModelError(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})") from error
    except OSError as error:
        raise ModelError(f"{path}: cannot be read ({error.strerror or error})") from error
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise ModelError(f"{path}: not valid JSON ({error})") from error


def _index_shards(index: Path, directory: Path) -> dict[str, list[str]]:
    """Shard file -> the tensor names ``model.safetensors.index.json`` puts in it.

    Every shard must be named by a path inside ``directory``: an index is
    data, and must not make us read another checkpoint's weights
    (``../other/model.safetensors``) or any other file.  Symlinks inside the
    directory are followed: they are the directory owner's doing, not the
    index's (a Hugging Face cache snapshot links every shard to ``../../blobs``).
    """
    value = _read_json(index)
    weight_map = value.get("weight_map") if isinstance(value, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        what = (
            "not a JSON object"
            if not isinstance(value, dict)
            else f"'weight_map' is {shown(repr(weight_map))}"
        )
        raise ModelError(f'{index}: {what}; expected {{"weight_map": {{tensor name: shard file, ...}}}}')
    shards: dict[str, list[str]] = {}
    for key, name in weight_map.items():
        if not isinstance(name, str):
            raise ModelError(
                f"{index}: weight_map[{shown(repr(key))}] is {shown(repr(name))}, not a file name"
            )
        shards.setdefault(name, []).append(key)
    for name in shards:
        path = directory / name
        inside = os.path.normpath(name)
        if Path(name).is_absolute() or inside == ".." or inside.startswith(".." + os.sep) or not name:
            raise ModelError(
                f"{index}: shard {shown(repr(name))} is outside the checkpoint directory {directory} "
                "(an absolute path or one through '..'); refused"
            )
        if not path.is_file():
            raise ModelError(f"{index}: names shard {shown(repr(name))}, which is missing from {directory}")
    return shards


def _read_safetensors(
    directory: Path,
    names: list[str],
    index: Path | None = None,
    shards: Mapping[str, list[str]] | None = None,
) -> dict[str, torch.Tensor]:
    """Every tensor of the files; a name in two files, or missing from the shard the index names, is refused."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    origin: dict[str, Path] = {}
    for name in names:
        path = directory / name
        try:
            tensors = load_file(str(path))
        except Exception as error:  # SafetensorError, OSError: truncated, garbage, unreadable
            raise ModelError(f"{path}: not a readable safetensors file ({shown(str(error))})") from error
        for key in (shards or {}).get(name, ()):
            if key not in tensors:
                raise ModelError(
                    f"{index}: puts {shown(repr(key))} in {shown(name)}, which has no such tensor"
                )
        for key in tensors:
            if key in origin:
                raise ModelError(
                    f"{path} and {origin[key]} both hold {shown(repr(key))}: which one is meant?"
                )
            origin[key] = path
        state.update(tensors)
    return state


def _read_checkpoint_tensors(directory: Path) -> dict[str, torch.Tensor]:
    index = directory / "model.safetensors.index.json"
    if index.exists():
        shards = _index_shards(index, directory)
        return _read_safetensors(directory, sorted(shards), index, shards)
    files = sorted(path.name for path in directory.glob("*.safetensors"))
    if files:
        return _read_safetensors(directory, files)
    bin_file = directory / "pytorch_model.bin"
    if bin_file.exists():
        try:
            state = torch.load(bin_file, map_location="cpu", weights_only=True)
        except Exception as error:  # unpickling errors of every kind
            raise ModelError(f"{bin_file}: not a readable torch state dict ({shown(str(error))})") from error
        if not isinstance(state, Mapping):
            raise ModelError(f"{bin_file}: holds a {type(state).__name__}, not a state dict")
        return dict(state)
    raise ModelError(
        f"{directory} has no weights: expected model.safetensors, sharded *.safetensors with "
        "model.safetensors.index.json, or pytorch_model.bin"
    )


@checked_options(*(option for option in BUILD_OPTIONS if option != "attach"))
def load_hf_checkpoint(path: str | os.PathLike, tokens: Any = None, **options: Any) -> Circuit:
    """A circuit from a local Hugging Face checkpoint directory (``config.json`` + safetensors).

    Options as in ``from_hf`` (but ``attach``: the weights read are the
    circuit's own).  ``transformers`` is not needed (except for Llama
    checkpoints with a scaled rotary variant).  A broken ``config.json``,
    weights file or shard index is a ``ModelError`` naming the file; shards
    the index names outside the directory are refused.
    """
    directory = Path(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{directory} is not a checkpoint directory: no config.json")
    config = _read_json(config_file)
    if not isinstance(config, dict):
        raise ModelError(
            f"{config_file}: not a JSON object of config fields (it holds {shown(repr(config), 60)})"
        )
    try:
        _config_for(config)
    except ModelError as error:
        raise ModelError(f"{config_file}: {error}") from error
    return from_hf_state_dict(config, _read_checkpoint_tensors(directory), tokens, **options)


# -------------------------------------------------------- TransformerLens

#: The TransformerLens ``HookedTransformer`` state-dict keys accepted, with
#: their shapes (H heads, d d_model, c d_head, M d_mlp, V vocab, P positions).
#: ``mlp.*`` keys are for ``family="gpt2"`` only; ``b_Q``/``b_K``/``b_V``/``b_O``
#: must be all zero for ``family="attn_only"`` (its builder has no attention
#: biases); ``unembed.b_U`` is optional.  Buffers (``attn.mask``,
#: ``attn.IGNORE``, ``hook_*``) are ignored.  Folded layer norms
#: (``fold_ln=True``, TransformerLens's default in ``from_pretrained``) have no
#: ``ln*.w``/``ln*.b`` keys and are refused: load with
#: ``from_pretrained_no_processing`` or ``fold_ln=False``.
TRANSFORMER_LENS_KEYS = {
    "embed.W_E": "[V,d]",
    "pos_embed.W_pos": "[P,d]",
    "blocks.{L}.ln1.w": "[d]",
    "blocks.{L}.ln1.b": "[d]",
    "blocks.{L}.attn.W_Q": "[H,d,c]",
    "blocks.{L}.attn.W_K": "[H,d,c]",
    "blocks.{L}.attn.W_V": "[H,d,c]",
    "blocks.{L}.attn.W_O": "[H,c,d]",
    "blocks.{L}.attn.b_Q": "[H,c]",
    "blocks.{L}.attn.b_K": "[H,c]",
    "blocks.{L}.attn.b_V": "[H,c]",
    "blocks.{L}.attn.b_O": "[d]",
    "blocks.{L}.ln2.w": "[d]",
    "blocks.{L}.ln2.b": "[d]",
    "blocks.{L}.mlp.W_in": "[d,M]",
    "blocks.{L}.mlp.b_in": "[M]",
    "blocks.{L}.mlp.W_out": "[M,d]",
    "blocks.{L}.mlp.b_out": "[d]",
    "ln_final.w": "[d]",
    "ln_final.b": "[d]",
    "unembed.W_U": "[d,V]",
    "unembed.b_U": "[V]",
}

_TL_IGNORED = re.compile(r"(.*\.)?(hook_[\w.]*|mask|IGNORE)$")


def _tl_dims(state: Mapping[str, Any], family: str) -> dict[str, int]:
    """The dimensions read off the tensors (``V d P H c L``, and ``M`` for GPT-2)."""
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise ModelError(
            f"from_transformer_lens needs a state dict (str keys to tensors), got {type(state).__name__}"
        )
    ranks = {"embed.W_E": 2, "pos_embed.W_pos": 2, "blocks.0.attn.W_Q": 3}
    if family == "gpt2":
        ranks["blocks.0.mlp.W_in"] = 2
    missing = [k for k in ranks if k not in state]
    if missing:
        hint = "; an attention-only model? use family='attn_only'" if missing == ["blocks.0.mlp.W_in"] else ""
        raise ModelError(
            f"TransformerLens {family}: missing {', '.join(repr(k) for k in missing)}, needed to read the "
            f"model's dimensions{hint}; accepted keys: "
            f"{', '.join(f'{k} {s}' for k, s in TRANSFORMER_LENS_KEYS.items())}"
        )
    for key, rank in ranks.items():
        if not isinstance(state[key], torch.Tensor) or state[key].ndim != rank:
            shape = (
                list(state[key].shape) if isinstance(state[key], torch.Tensor) else type(state[key]).__name__
            )
            raise ModelError(
                f"TransformerLens {family}: {key!r} is {shape}, expected {TRANSFORMER_LENS_KEYS[key]}"
            )
    dims = dict(zip("Vd", state["embed.W_E"].shape))
    dims["P"] = state["pos_embed.W_pos"].shape[0]
    dims["H"], _, dims["c"] = state["blocks.0.attn.W_Q"].shape
    dims["L"] = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
    dims["M"] = state["blocks.0.mlp.W_in"].shape[-1] if family == "gpt2" else 0
    return dims


def _tl_layer(r: _Reader, out: dict[str, Any], family: str, layer: int, dims: Mapping[str, int]) -> list[str]:
    """One block's weights into ``out`` (builder names); returns the attention biases that are not zero
    (the attention-only builder has none)."""
    d, H, c, M = dims["d"], dims["H"], dims["c"], dims["M"]
    p = f"blocks.{layer}."
    nonzero = []
    out[f"a{layer}.ln.w.scale"] = r.take(p + "ln1.w", (d,))
    out[f"a{layer}.ln.w.bias"] = r.take(p + "ln1.b", (d,))
    for which in "qkv":
        weight = r.take(p + f"attn.W_{which.upper()}", (H, d, c))
        out[f"a{layer}.w.{which}"] = None if weight is None else weight.transpose(1, 2)
        bias = r.take(p + f"attn.b_{which.upper()}", (H, c), optional=family == "attn_only")
        if family == "gpt2":
            out[f"a{layer}.w.{which}_bias"] = None if bias is None else bias.reshape(H, 1, c)
        elif bias is not None and bool(bias.any()):
            nonzero.append(p + f"attn.b_{which.upper()}")
    w_o = r.take(p + "attn.W_O", (H, c, d))
    out[f"a{layer}.w.o"] = None if w_o is None else w_o.transpose(1, 2)
    b_o = r.take(p + "attn.b_O", (d,), optional=family == "attn_only")
    if family != "gpt2":
        return nonzero + ([p + "attn.b_O"] if b_o is not None and bool(b_o.any()) else [])
    out[f"a{layer}.w.o_bias"] = b_o
    out[f"m{layer}.ln.w.scale"] = r.take(p + "ln2.w", (d,))
    out[f"m{layer}.ln.w.bias"] = r.take(p + "ln2.b", (d,))
    w_in = r.take(p + "mlp.W_in", (d, M))
    out[f"m{layer}.w.proj_in"] = None if w_in is None else w_in.T
    out[f"m{layer}.w.in_bias"] = r.take(p + "mlp.b_in", (M,))
    w_out = r.take(p + "mlp.W_out", (M, d))
    out[f"m{layer}.w.proj_out"] = None if w_out is None else w_out.T
    out[f"m{layer}.w.out_bias"] = r.take(p + "mlp.b_out", (d,))
    return nonzero


@checked_options(*BUILD_OPTIONS)
def from_transformer_lens(
    state_dict: Mapping[str, Any],
    tokens: Any = None,
    *,
    family: str,
    ln_eps: float = 1e-5,
    act: str = "gelu_new",
    **options: Any,
) -> Circuit:
    """A circuit from a TransformerLens ``HookedTransformer`` state dict.

    ``family`` is ``"gpt2"`` (standard positions, MLPs, biases) or
    ``"attn_only"`` (shortformer positions, as the golden file).  Dimensions
    are read off the tensors; ``ln_eps`` and ``act`` (GPT-2's MLP activation)
    are not in a state dict, so give them if they differ from the defaults.
    Accepted keys and shapes: ``TRANSFORMER_LENS_KEYS``.  Other options as in
    the builders; with ``attach=True`` the arrays are views of the state
    dict's tensors (pass ``model.state_dict(keep_vars=True)`` for gradients).
    """
    if family not in ("gpt2", "attn_only"):
        raise ModelError(f"from_transformer_lens: family {shown(repr(family))} is not 'gpt2' or 'attn_only'")
    dims = _tl_dims(state_dict, family)
    V, d, P, H, c, L = (dims[k] for k in "VdPHcL")
    r = _Reader(f"TransformerLens {family}", state_dict, _attach(options))
    out: dict[str, Any] = {
        "t.w.tok_embeds": r.take("embed.W_E", (V, d)),
        "t.w.pos_embeds": r.take("pos_embed.W_pos", (P, d)),
    }
    nonzero_biases = [key for layer in range(L) for key in _tl_layer(r, out, family, layer, dims)]
    out["final.ln.w.scale"] = r.take("ln_final.w", (d,))
    out["final.ln.w.bias"] = r.take("ln_final.b", (d,))
    w_u = r.take("unembed.W_U", (d, V))
    out["t.w.unembed"] = None if w_u is None else w_u.T
    b_u = r.take("unembed.b_U", (V,), optional=True)
    if b_u is not None and bool(b_u.any()):
        out["t.w.unembed_bias"] = b_u
    if r.missing and any(".ln1.w" in m or "ln_final.w" in m for m in r.missing):
        r.missing.append(
            "(no layer-norm weights: a state dict with folded layer norms is not supported; "
            "load with fold_ln=False / from_pretrained_no_processing)"
        )
    r.finish(ignore=lambda k: bool(_TL_IGNORED.match(k)))
    if nonzero_biases:
        raise ModelError(
            "TransformerLens attn_only: the attention-only builder has no attention biases, but "
            f"{', '.join(repr(k) for k in nonzero_biases)} are not all zero"
        )
    weights = r.weights(out)
    if family == "gpt2":
        if H * c != d:
            raise ModelError(f"TransformerLens gpt2: {H} heads x d_head {c} != d_model {d}")
        config = GPT2Config(
            n_layers=L,
            n_heads=H,
            d_model=d,
            vocab_size=V,
            n_ctx=P,
            d_mlp=dims["M"],
            ln_eps=ln_eps,
            act=act,
            tie_word_embeddings=False,
        )
        return build_gpt2(config, weights, tokens, **options)
    config = AttnOnlyConfig(n_layers=L, n_heads=H, d_model=d, d_head=c, vocab_size=V, n_ctx=P, ln_eps=ln_eps)
    return build_attn_only(config, weights, tokens, **options)
