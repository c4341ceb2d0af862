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
array hashes stale) and converted to the builders' layouts.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from circuits.errors import ModelError
from circuits.models.attn_only import AttnOnlyConfig, build_attn_only
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
    """Takes tensors from a state dict, collecting every problem before raising."""

    def __init__(self, family: str, state_dict: Mapping[str, Any]):
        self.family = family
        self.state = state_dict
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
        return tensor.detach()

    def finish(self, ignore: Callable[[str], bool] = lambda key: False) -> None:
        unknown = sorted(k for k in self.state if k not in self.used and not ignore(k))
        problems = []
        if self.missing:
            problems.append("missing: " + ", ".join(self.missing))
        if self.misshapen:
            problems.append("misshapen: " + "; ".join(self.misshapen))
        if unknown:
            shown = ", ".join(repr(k) for k in unknown[:12]) + (f", ... ({len(unknown)} in all)" if len(unknown) > 12 else "")
            problems.append(f"not understood (another architecture or an unsupported option?): {shown}")
        if problems:
            raise ModelError(f"{self.family} state dict does not fit the config:\n  " + "\n  ".join(problems))


def _own(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy: the circuit must not share storage with a model that may change."""
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def _strip_prefix(state_dict: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {(k[len(prefix):] if k.startswith(prefix) else k): v for k, v in state_dict.items()}


# ------------------------------------------------------------------- GPT-2


def gpt2_config_from_hf(config: Any) -> GPT2Config:
    problems = []
    if not _get(config, "scale_attn_weights", True):
        problems.append("scale_attn_weights=False")
    if _get(config, "scale_attn_by_inverse_layer_idx", False):
        problems.append("scale_attn_by_inverse_layer_idx=True")
    if _get(config, "add_cross_attention", False):
        problems.append("add_cross_attention=True")
    if problems:
        raise ModelError(f"GPT-2 config options not supported: {', '.join(problems)}")
    return GPT2Config(
        n_layers=int(_get(config, "n_layer")),
        n_heads=int(_get(config, "n_head")),
        d_model=int(_get(config, "n_embd")),
        vocab_size=int(_get(config, "vocab_size")),
        n_ctx=int(_get(config, "n_positions")),
        d_mlp=_get(config, "n_inner"),
        ln_eps=float(_get(config, "layer_norm_epsilon", 1e-5)),
        act=str(_get(config, "activation_function", "gelu_new")),
        tie_word_embeddings=bool(_get(config, "tie_word_embeddings", True)),
    )


def gpt2_weights_from_hf(config: GPT2Config, state_dict: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Hugging Face GPT-2 (Conv1D ``[in, out]`` weights, fused ``c_attn``) -> the builder's names and layouts."""
    lm_head = state_dict.get("lm_head.weight")
    state = _strip_prefix({k: v for k, v in state_dict.items() if k != "lm_head.weight"}, "transformer.")
    if lm_head is not None:
        state["lm_head.weight"] = lm_head
    d, h, c, v, m = config.d_model, config.n_heads, config.d_head, config.vocab_size, config.mlp_size
    r = _Reader("GPT-2", state)
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
            split = qkv.T.reshape(3, h, c, d)
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
    return {name: _own(t) for name, t in out.items() if t is not None}


# ------------------------------------------------------------------- Llama


def _rope_type(config: Any) -> str:
    params = _get(config, "rope_parameters") or _get(config, "rope_scaling") or {}
    return str(params.get("rope_type", params.get("type", "default")))


def _rope_theta(config: Any) -> float:
    params = _get(config, "rope_parameters") or {}
    return float(params.get("rope_theta", _get(config, "rope_theta", 10000.0)))


def llama_config_from_hf(config: Any) -> LlamaConfig:
    problems = []
    for option in ("attention_bias", "mlp_bias"):
        if _get(config, option, False):
            problems.append(f"{option}=True")
    if problems:
        raise ModelError(f"Llama config options not supported: {', '.join(problems)}")
    heads = int(_get(config, "num_attention_heads"))
    return LlamaConfig(
        n_layers=int(_get(config, "num_hidden_layers")),
        n_heads=heads,
        n_kv_heads=int(_get(config, "num_key_value_heads", heads)),
        d_model=int(_get(config, "hidden_size")),
        d_head=_get(config, "head_dim"),
        d_mlp=int(_get(config, "intermediate_size")),
        vocab_size=int(_get(config, "vocab_size")),
        max_positions=_get(config, "max_position_embeddings"),
        rms_eps=float(_get(config, "rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(config),
        act=str(_get(config, "hidden_act", "silu")),
        tie_word_embeddings=bool(_get(config, "tie_word_embeddings", False)),
    )


def llama_weights_from_hf(config: LlamaConfig, state_dict: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Hugging Face Llama (``nn.Linear`` ``[out, in]`` weights) -> the builder's names and layouts."""
    d, h, g, c, v, m = (
        config.d_model,
        config.n_heads,
        config.kv_heads,
        config.head_size,
        config.vocab_size,
        config.d_mlp,
    )
    r = _Reader("Llama", state_dict)
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
    return {name: _own(t) for name, t in out.items() if t is not None}


def _hf_rope_tables(rotary_module: Any, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
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
        ) from None
    hf_config = HFLlamaConfig(**{k: v for k, v in config_dict.items() if k not in ("architectures", "model_type")})
    return _hf_rope_tables(LlamaRotaryEmbedding(hf_config), seq_len, dtype)


# ------------------------------------------------------------- entry points


def _positions(tokens: Any, seq_len: int | None, convention: str) -> int | None:
    from circuits.models.common import CONVENTIONS

    if tokens is None or convention not in CONVENTIONS:
        return seq_len
    return int(torch.as_tensor(tokens).shape[-1]) - CONVENTIONS[convention][0]


def _model_type(config: Any) -> str:
    model_type = _get(config, "model_type")
    if model_type not in SUPPORTED_HF:
        archs = _get(config, "architectures")
        raise ModelError(
            f"unsupported architecture: model_type {model_type!r}"
            + (f" ({', '.join(archs)})" if archs else "")
            + f"; supported: {', '.join(f'{t!r} ({c})' for t, c in SUPPORTED_HF.items())}"
        )
    return model_type


def hf_to_weights(config: Any, state_dict: Mapping[str, Any]) -> tuple[str, Any, dict[str, torch.Tensor]]:
    """``(family, builder config, weights)`` from a Hugging Face config (object or dict) and state dict."""
    model_type = _model_type(config)
    if model_type == "gpt2":
        ours = gpt2_config_from_hf(config)
        return "gpt2", ours, gpt2_weights_from_hf(ours, state_dict)
    ours = llama_config_from_hf(config)
    return "llama", ours, llama_weights_from_hf(ours, state_dict)


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
    ``convention``, ``causal``, ``neg_inf``.
    """
    family, ours, weights = hf_to_weights(config, state_dict)
    if family == "gpt2":
        if rope is not None:
            raise ModelError("rope= applies to Llama models only")
        return build_gpt2(ours, weights, tokens, **options)
    if rope is None and _rope_type(config) != "default":
        seq = _positions(tokens, options.get("seq_len"), options.get("convention", "default"))
        if seq is None:
            raise ModelError("pass tokens or seq_len= to build a model")
        config_dict = config if isinstance(config, Mapping) else config.to_dict()
        dtype = next(iter(weights.values())).dtype
        rope = _rope_from_transformers(config_dict, seq, dtype)
    return build_llama(ours, weights, tokens, rope=rope, **options)


def from_hf(model: Any, tokens: Any = None, **options: Any) -> Circuit:
    """A circuit equal to an in-memory ``GPT2LMHeadModel`` or ``LlamaForCausalLM``.

    ``tokens``: an int tensor ``[S+1]`` or ``[B,S+1]`` (inputs all but the
    last, targets all but the first), or None with ``seq_len=`` (and
    ``batch_size=``) for a placeholder.  Other options as in the builders:
    ``convention="golden"``, ``causal``, ``neg_inf``.  The root is the per-token
    loss ``'t.loss'``; the logits are ``'t.call'``.
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
    return from_hf_state_dict(config, model.state_dict(), tokens, rope=rope, **options)


def _read_checkpoint_tensors(directory: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = directory / "model.safetensors.index.json"
    if index.exists():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in directory.glob("*.safetensors"))
    if files:
        state: dict[str, torch.Tensor] = {}
        for name in files:
            state.update(load_file(str(directory / name)))
        return state
    bin_file = directory / "pytorch_model.bin"
    if bin_file.exists():
        return torch.load(bin_file, map_location="cpu", weights_only=True)
    raise ModelError(
        f"{directory} has no weights: expected model.safetensors, sharded *.safetensors with "
        "model.safetensors.index.json, or pytorch_model.bin"
    )


def load_hf_checkpoint(path: str | os.PathLike, tokens: Any = None, **options: Any) -> Circuit:
    """A circuit from a local Hugging Face checkpoint directory (``config.json`` + safetensors).

    Options as in ``from_hf``.  ``transformers`` is not needed (except for
    Llama checkpoints with a scaled rotary variant).
    """
    directory = Path(path)
    config_file = directory / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{directory} is not a checkpoint directory: no config.json")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ModelError(f"{config_file} is not valid JSON: {error}") from None
    _model_type(config)
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


def _tl_dims(state: Mapping[str, Any]) -> dict[str, int]:
    required = ("embed.W_E", "pos_embed.W_pos", "blocks.0.attn.W_Q")
    missing = [k for k in required if k not in state]
    if missing:
        raise ModelError(
            f"TransformerLens state dict: missing {', '.join(repr(k) for k in missing)}, needed to read the "
            f"model's dimensions; accepted keys: {', '.join(f'{k} {s}' for k, s in TRANSFORMER_LENS_KEYS.items())}"
        )
    vocab, d_model = state["embed.W_E"].shape
    n_ctx = state["pos_embed.W_pos"].shape[0]
    heads, _, d_head = state["blocks.0.attn.W_Q"].shape
    layers = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"blocks\.(\d+)\.", k)))
    return {"V": vocab, "d": d_model, "P": n_ctx, "H": heads, "c": d_head, "L": layers}


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
    the builders.
    """
    if family not in ("gpt2", "attn_only"):
        raise ModelError(f"from_transformer_lens: family {family!r} is not 'gpt2' or 'attn_only'")
    if not isinstance(state_dict, Mapping):
        raise ModelError(f"from_transformer_lens needs a state dict (a mapping), got {type(state_dict).__name__}")
    dims = _tl_dims(state_dict)
    V, d, P, H, c, L = (dims[k] for k in "VdPHcL")
    r = _Reader(f"TransformerLens {family}", state_dict)
    out: dict[str, Any] = {
        "t.w.tok_embeds": r.take("embed.W_E", (V, d)),
        "t.w.pos_embeds": r.take("pos_embed.W_pos", (P, d)),
    }
    d_mlp = None
    if family == "gpt2":
        if "blocks.0.mlp.W_in" not in state_dict:
            raise ModelError("TransformerLens gpt2: no 'blocks.0.mlp.W_in' [d,M]; an attention-only model? use family='attn_only'")
        d_mlp = state_dict["blocks.0.mlp.W_in"].shape[-1]
    nonzero_biases = []
    for layer in range(L):
        p = f"blocks.{layer}."
        out[f"a{layer}.ln.w.scale"] = r.take(p + "ln1.w", (d,))
        out[f"a{layer}.ln.w.bias"] = r.take(p + "ln1.b", (d,))
        for which in "qkv":
            weight = r.take(p + f"attn.W_{which.upper()}", (H, d, c))
            out[f"a{layer}.w.{which}"] = None if weight is None else weight.transpose(1, 2)
            bias = r.take(p + f"attn.b_{which.upper()}", (H, c), optional=family == "attn_only")
            if family == "gpt2":
                out[f"a{layer}.w.{which}_bias"] = None if bias is None else bias.reshape(H, 1, c)
            elif bias is not None and bool(bias.any()):
                nonzero_biases.append(p + f"attn.b_{which.upper()}")
        w_o = r.take(p + "attn.W_O", (H, c, d))
        out[f"a{layer}.w.o"] = None if w_o is None else w_o.transpose(1, 2)
        b_o = r.take(p + "attn.b_O", (d,), optional=family == "attn_only")
        if family == "gpt2":
            out[f"a{layer}.w.o_bias"] = b_o
            out[f"m{layer}.ln.w.scale"] = r.take(p + "ln2.w", (d,))
            out[f"m{layer}.ln.w.bias"] = r.take(p + "ln2.b", (d,))
            w_in = r.take(p + "mlp.W_in", (d, d_mlp))
            out[f"m{layer}.w.proj_in"] = None if w_in is None else w_in.T
            out[f"m{layer}.w.in_bias"] = r.take(p + "mlp.b_in", (d_mlp,))
            w_out = r.take(p + "mlp.W_out", (d_mlp, d))
            out[f"m{layer}.w.proj_out"] = None if w_out is None else w_out.T
            out[f"m{layer}.w.out_bias"] = r.take(p + "mlp.b_out", (d,))
        elif b_o is not None and bool(b_o.any()):
            nonzero_biases.append(p + "attn.b_O")
    out["final.ln.w.scale"] = r.take("ln_final.w", (d,))
    out["final.ln.w.bias"] = r.take("ln_final.b", (d,))
    w_u = r.take("unembed.W_U", (d, V))
    out["t.w.unembed"] = None if w_u is None else w_u.T
    b_u = r.take("unembed.b_U", (V,), optional=True)
    if b_u is not None and bool(b_u.any()):
        out["t.w.unembed_bias"] = b_u
    if r.missing and any(".ln1.w" in m or "ln_final.w" in m for m in r.missing):
        r.missing.append("(no layer-norm weights: a state dict with folded layer norms is not supported; "
                         "load with fold_ln=False / from_pretrained_no_processing)")
    r.finish(ignore=lambda k: bool(_TL_IGNORED.match(k)))
    if nonzero_biases:
        raise ModelError(
            "TransformerLens attn_only: the attention-only builder has no attention biases, but "
            f"{', '.join(repr(k) for k in nonzero_biases)} are not all zero"
        )
    weights = {name: _own(t) for name, t in out.items() if t is not None}
    if family == "gpt2":
        config = GPT2Config(
            n_layers=L, n_heads=H, d_model=d, vocab_size=V, n_ctx=P, d_mlp=d_mlp, ln_eps=ln_eps, act=act,
            tie_word_embeddings=False,
        )
        if H * c != d:
            raise ModelError(f"TransformerLens gpt2: {H} heads x d_head {c} != d_model {d}")
        return build_gpt2(config, weights, tokens, **options)
    config = AttnOnlyConfig(n_layers=L, n_heads=H, d_model=d, d_head=c, vocab_size=V, n_ctx=P, ln_eps=ln_eps)
    return build_attn_only(config, weights, tokens, **options)
