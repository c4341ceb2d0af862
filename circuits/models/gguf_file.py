"""GGUF checkpoints (llama.cpp's single-file format): ``from_gguf(path) -> GGUFModel``.

The file is read directly with the ``gguf`` package (ggml's own reader): its metadata
becomes a Hugging Face ``config.json`` dict, every tensor is dequantized to float32 by
``gguf.dequantize`` and renamed to the Hugging Face name, and the query and key rows
that llama.cpp's converter interleaves for its rotary kernel are put back in
Hugging Face's order.  The circuits are then ``from_hf_state_dict``'s, so a GGUF
model is checked and built as a Hugging Face one is.  Why not ``transformers``'
own GGUF loading (``from_pretrained(dir, gguf_file=...)``): it reads the file three
times and builds a torch model we would then convert; reading it once here is
several times faster (docs/models.md gives the figures), and ``transformers``'
model stays an independent reference for the tests.  ``from_gguf`` returns a ``GGUFModel``,
the file read once; its ``circuit(tokens, options, **fields)`` builds a circuit, taking the
``ModelOptions`` every model entry point takes.  The tokenizer is
``transformers``' (``PreTrainedTokenizerFast.from_pretrained(dir, gguf_file=...)``), built
from the vocabulary inside the file.

Architectures: ``'llama'`` (``SUPPORTED_GGUF``; llama.cpp writes Llama, Mistral
and SmolLM checkpoints so).  A file this module cannot build (another
architecture, a quantisation ``gguf`` cannot dequantize, a rotary scaling,
experts, a missing or malformed field, a tensor of the wrong shape) is a
``ModelError`` naming the file and the GGUF field or tensor at fault.
"""

from __future__ import annotations

import dataclasses
import math
from importlib import metadata as package_metadata
from types import MappingProxyType
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from circuits.core.nodes import Circuit
from circuits.errors import ModelError, shown
from circuits.models.hf import from_hf_state_dict
from circuits.models.hf_llama import llama_config_from_hf
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.models.text import is_text, to_str_tokens, to_tokens

__all__ = ["SUPPORTED_GGUF", "GGUFModel", "from_gguf"]

#: ``general.architecture`` values ``from_gguf`` builds, and the Hugging Face model_type of each.
SUPPORTED_GGUF = {"llama": "llama"}

INSTALL = "pip install 'circuits-interp[real]'"

# Hugging Face config field -> (GGUF key after '<arch>.', required).  Absent optional
# fields take Hugging Face's defaults (num_key_value_heads: the query heads).
_LLAMA_FIELDS = {
    "num_hidden_layers": ("block_count", True),
    "hidden_size": ("embedding_length", True),
    "intermediate_size": ("feed_forward_length", True),
    "num_attention_heads": ("attention.head_count", True),
    "num_key_value_heads": ("attention.head_count_kv", False),
    "head_dim": ("attention.key_length", False),
    "rms_norm_eps": ("attention.layer_norm_rms_epsilon", True),
    "rope_theta": ("rope.freq_base", False),
    "max_position_embeddings": ("context_length", False),
    "vocab_size": ("vocab_size", False),
}

# GGUF tensor name (``{L}``: the layer) -> Hugging Face state-dict key.
_LLAMA_TENSORS = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    "blk.{L}.attn_norm.weight": "model.layers.{L}.input_layernorm.weight",
    "blk.{L}.attn_q.weight": "model.layers.{L}.self_attn.q_proj.weight",
    "blk.{L}.attn_k.weight": "model.layers.{L}.self_attn.k_proj.weight",
    "blk.{L}.attn_v.weight": "model.layers.{L}.self_attn.v_proj.weight",
    "blk.{L}.attn_output.weight": "model.layers.{L}.self_attn.o_proj.weight",
    "blk.{L}.ffn_norm.weight": "model.layers.{L}.post_attention_layernorm.weight",
    "blk.{L}.ffn_gate.weight": "model.layers.{L}.mlp.gate_proj.weight",
    "blk.{L}.ffn_up.weight": "model.layers.{L}.mlp.up_proj.weight",
    "blk.{L}.ffn_down.weight": "model.layers.{L}.mlp.down_proj.weight",
}


@dataclasses.dataclass(frozen=True, eq=False)
class GGUFModel:
    """A GGUF checkpoint read once, to build circuits from for any tokens.

    ``config``: the Hugging Face ``config.json`` fields the metadata gives; ``state_dict``: float32
    tensors under Hugging Face's names (shared, read-only, by every circuit built: a change to
    one makes those circuits raise ``StaleTensorError``); ``tensor_types``: each GGUF tensor's
    stored type (``'Q4_1'``, ``'F32'``, ...); ``metadata``: the file's scalar fields;
    ``tokenizer``: ``transformers``' tokenizer from the file's vocabulary, or None.
    """

    path: Path
    config: Mapping[str, Any]
    state_dict: Mapping[str, torch.Tensor]
    tensor_types: Mapping[str, str]
    metadata: Mapping[str, Any]
    tokenizer: Any = None

    def __repr__(self) -> str:
        types = ", ".join(f"{n} {t}" for t, n in Counter(self.tensor_types.values()).most_common())
        c = self.config
        return (
            f"GGUFModel({self.path.name}: {c['model_type']}, {c['num_hidden_layers']} layers, d_model "
            f"{c['hidden_size']}, {c['num_attention_heads']} heads ({c['num_key_value_heads']} key/value), "
            f"vocab {c['vocab_size']}; tensors {types}; tokenizer {'none' if self.tokenizer is None else 'yes'})"
        )

    @takes_model_options(
        {
            "attach": "the circuits hold views of the tensors read (shared, read-only), never copies",
            "rope": "the rotary tables come from the file's metadata",
        }
    )
    def circuit(self, tokens: Any = None, options: ModelOptions = DEFAULT) -> Circuit:
        """The model as a circuit on ``tokens`` (an int tensor ``[S+1]`` or ``[B,S+1]``, or text); the
        options are ``from_hf_state_dict``'s (a ``ModelOptions`` and keyword overrides), and text is
        read with this file's tokenizer unless ``tokenizer=`` names another.  The weight arrays hold
        this object's tensors (no copy)."""
        if options.tokenizer is None:
            if is_text(tokens):
                self._needs_tokenizer()
            options = options.evolve(tokenizer=self.tokenizer)
        return from_hf_state_dict(self.config, self.state_dict, tokens, options.evolve(attach=True))

    def to_tokens(self, text: Any, *, prepend_bos: bool = True) -> torch.Tensor:
        """``models.to_tokens`` with this file's tokenizer."""
        return to_tokens(self._needs_tokenizer(), text, prepend_bos=prepend_bos)

    def to_str_tokens(self, tokens: Any) -> list[str] | list[list[str]]:
        """``models.to_str_tokens`` with this file's tokenizer."""
        return to_str_tokens(self._needs_tokenizer(), tokens)

    def _needs_tokenizer(self) -> Any:
        if self.tokenizer is None:
            raise ModelError(
                f"{self.path}: read without a tokenizer (the file has no vocabulary, or tokenizer=False): "
                "give token ids, not text"
            )
        return self.tokenizer


def from_gguf(path: str | Path, *, tokenizer: bool = True) -> GGUFModel:
    """Read a GGUF checkpoint: its config, its weights dequantized to float32, and its tokenizer.

    ``tokenizer=False`` skips the tokenizer (which needs ``transformers``); a file without a
    vocabulary has none either way.  It builds nothing: ``model.circuit(tokens, options, **fields)``
    does, with the ``ModelOptions`` of every entry point, for as many token sets as wanted from the
    one reading (the options depend on the tokens: ``convention``, ``seq_len``).
    """
    gguf = _gguf_package()
    path = Path(path)
    if not isinstance(tokenizer, bool):
        raise ModelError(
            f"from_gguf: tokenizer={shown(repr(tokenizer))} is not a bool (True or False)", "tokenizer"
        )
    reader = _reader(gguf, path)
    fields = _metadata(gguf, reader)
    architecture = _architecture(path, fields)
    tensors = {t.name: t for t in reader.tensors}
    _check_tensor_types(gguf, path, tensors)
    config = _llama_config(path, fields, tensors, architecture)
    state_dict = _llama_state_dict(gguf, path, tensors, config)
    has_vocabulary = "tokenizer.ggml.model" in reader.fields
    return GGUFModel(  # read-only views: every circuit built shares them
        path=path,
        config=MappingProxyType(config),
        state_dict=MappingProxyType(state_dict),
        tensor_types=MappingProxyType({name: t.tensor_type.name for name, t in tensors.items()}),
        metadata=MappingProxyType(fields),
        tokenizer=_tokenizer(path) if tokenizer and has_vocabulary else None,
    )


def _gguf_package() -> Any:
    try:
        import gguf
    except ImportError as error:
        raise ModelError(f"reading a GGUF file needs the gguf package: {INSTALL} ({error})") from error
    return gguf


def _version() -> str:
    try:
        return package_metadata.version("gguf")
    except package_metadata.PackageNotFoundError:  # pragma: no cover - imported, so installed
        return "?"


def _reader(gguf: Any, path: Path) -> Any:
    if not path.is_file():
        raise ModelError(f"{path}: no such GGUF file")
    try:
        return gguf.GGUFReader(path)
    except Exception as error:  # bad magic, truncated, an unknown ggml type id, a duplicate tensor
        raise ModelError(
            f"{path}: not a GGUF file the gguf package ({_version()}) can read: {shown(str(error))}"
        ) from error


def _metadata(gguf: Any, reader: Any) -> dict[str, Any]:
    """Every scalar field (numbers, strings, bools) by key; arrays (the vocabulary) are left out."""
    values = {}
    for key, field in reader.fields.items():
        kind = field.types[0] if field.types else None
        if kind is None or kind == gguf.GGUFValueType.ARRAY or not field.data:
            continue
        part = field.parts[field.data[0]]
        if kind == gguf.GGUFValueType.STRING:
            values[key] = bytes(part).decode("utf-8", errors="replace")
        else:
            value = part.tolist()[0]
            values[key] = bool(value) if kind == gguf.GGUFValueType.BOOL else value
    return values


def _architecture(path: Path, metadata: Mapping[str, Any]) -> str:
    architecture = metadata.get("general.architecture")
    if architecture not in SUPPORTED_GGUF:
        raise ModelError(
            f"{path}: 'general.architecture' is {shown(repr(architecture))}; from_gguf builds "
            f"{', '.join(map(repr, SUPPORTED_GGUF))}",
            "general.architecture",
        )
    return architecture


def _check_tensor_types(gguf: Any, path: Path, tensors: Mapping[str, Any]) -> None:
    """Refuse, before dequantizing anything, every tensor of a type ``gguf.dequantize`` cannot read."""
    unreadable = [name for name, t in tensors.items() if not _readable(gguf, t.tensor_type)]
    if unreadable:
        listed = ", ".join(f"{name!r} ({tensors[name].tensor_type.name})" for name in unreadable[:6])
        more = f", ... ({len(unreadable)} in all)" if len(unreadable) > 6 else ""
        raise ModelError(
            f"{path}: tensor type not readable: {listed}{more}; the gguf package "
            f"({_version()}) dequantizes none of these to float weights",
            mismatched_keys=unreadable,
        )


def _readable(gguf: Any, kind: Any) -> bool:
    """Whether ``gguf.dequantize`` reads this type as float weights: tried on one block of zeros."""
    if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return True
    try:
        _, size = gguf.GGML_QUANT_SIZES[kind]
        values = gguf.dequantize(np.zeros((1, size), dtype=np.uint8), kind)
    except (KeyError, NotImplementedError, ValueError, TypeError):
        return False
    return np.asarray(values).dtype.kind == "f"


def _field(path: Path, metadata: Mapping[str, Any], key: str, required: bool, number: bool = False) -> Any:
    """A positive int (or, ``number``, a positive finite number) field, or None when optional and absent."""
    value = metadata.get(key)
    if value is None:
        if required:
            raise ModelError(f"{path}: the metadata has no {key!r}", key)
        return None
    kinds = (int, float) if number else (int,)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) or value <= 0:
        what = "a positive finite number" if number else "a positive int"
        raise ModelError(f"{path}: {key!r} is {shown(repr(value))}; expected {what}", key)
    return value


def _llama_config(
    path: Path, metadata: Mapping[str, Any], tensors: Mapping[str, Any], arch: str
) -> dict[str, Any]:
    """The Hugging Face config dict of a ``llama`` GGUF, every field read checked and named."""
    _refuse_llama_options(path, metadata, arch)
    config: dict[str, Any] = {"model_type": SUPPORTED_GGUF[arch], "hidden_act": "silu"}
    for hf_key, (suffix, required) in _LLAMA_FIELDS.items():
        number = hf_key in ("rms_norm_eps", "rope_theta")
        value = _field(path, metadata, f"{arch}.{suffix}", required, number)
        if value is not None:
            config[hf_key] = float(value) if number else value
    config.setdefault("num_key_value_heads", config["num_attention_heads"])
    embedding = tensors.get("token_embd.weight")
    if "vocab_size" not in config and embedding is not None:  # older files: the embedding's rows
        config["vocab_size"] = int(embedding.shape[-1])
    config["tie_word_embeddings"] = "output.weight" not in tensors
    _check_with_builder(path, config, arch)
    head_dim = config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
    rotary = _field(path, metadata, f"{arch}.rope.dimension_count", False)
    if rotary is not None and rotary != head_dim:
        raise ModelError(
            f"{path}: {arch + '.rope.dimension_count'!r} is {rotary}, not the head size {head_dim}: "
            "a partial rotary embedding, which the Llama builder does not make",
            f"{arch}.rope.dimension_count",
        )
    value_dim = _field(path, metadata, f"{arch}.attention.value_length", False)
    if value_dim is not None and value_dim != head_dim:
        raise ModelError(
            f"{path}: {arch + '.attention.value_length'!r} is {value_dim}, not the key size {head_dim}",
            f"{arch}.attention.value_length",
        )
    return config


def _check_with_builder(path: Path, config: Mapping[str, Any], arch: str) -> None:
    """The Llama loader's own checks of the config (heads that divide, ...), its field names
    followed by the GGUF keys they were read from."""
    try:
        llama_config_from_hf(config, SUPPORTED_GGUF[arch])
    except ModelError as error:
        named = {
            hf_key: f"{arch}.{suffix}"
            for hf_key, (suffix, _) in _LLAMA_FIELDS.items()
            if f"'{hf_key}'" in str(error)
        }
        read = ", ".join(f"{hf_key} = {key!r}" for hf_key, key in named.items())
        read = f" (read from {read})" if named else ""
        field = next(iter(named.values())) if len(named) == 1 else None  # several: the message names them
        raise ModelError(f"{path}: {error}{read}", field) from error


def _refuse_llama_options(path: Path, metadata: Mapping[str, Any], arch: str) -> None:
    """Options of llama.cpp's Llama that the builder would silently get wrong."""
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ModelError(
            f"{path}: {arch + '.rope.scaling.type'!r} is {shown(repr(scaling))}; from_gguf builds unscaled "
            "rotary embeddings only",
            f"{arch}.rope.scaling.type",
        )
    experts = metadata.get(f"{arch}.expert_count")
    if experts not in (None, 0):
        raise ModelError(
            f"{path}: {arch + '.expert_count'!r} is {shown(repr(experts))}: a mixture of experts, which "
            "the Llama builder does not make",
            f"{arch}.expert_count",
        )


def _llama_state_dict(
    gguf: Any, path: Path, tensors: Mapping[str, Any], config: Mapping[str, Any]
) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to float32 under its Hugging Face name, queries and keys un-interleaved."""
    expected = _llama_shapes(config)
    missing = [name for name in expected if name not in tensors]
    unexpected = [name for name in tensors if name not in expected]
    misshapen = [
        name for name in expected if name in tensors and _torch_shape(tensors[name]) != expected[name]
    ]
    problems = [f"missing: {name!r} {list(expected[name])}" for name in missing]
    problems += [f"not understood: {name!r}" for name in unexpected]
    problems += [
        f"{name!r} has shape {list(_torch_shape(tensors[name]))}, expected {list(expected[name])}"
        for name in misshapen
    ]
    if problems:
        raise ModelError(
            f"{path}: the tensors do not fit the metadata:\n  " + "\n  ".join(problems),
            missing_keys=missing,
            unexpected_keys=unexpected,
            mismatched_keys=misshapen,
        )
    heads = {"attn_q": config["num_attention_heads"], "attn_k": config["num_key_value_heads"]}
    state = {}
    for name, tensor in tensors.items():
        values = torch.from_numpy(np.array(gguf.dequantize(tensor.data, tensor.tensor_type), np.float32))
        values = values.reshape(expected[name])
        kind = name.split(".")[-2]
        if kind in heads:
            values = _uninterleave(values, heads[kind])
        state[_hf_name(name)] = values
    return state


def _llama_shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """GGUF tensor name -> its shape in torch's order (``[out, in]``, as ``nn.Linear``)."""
    d, m, v = config["hidden_size"], config["intermediate_size"], config["vocab_size"]
    h, g = config["num_attention_heads"], config["num_key_value_heads"]
    c = config.get("head_dim", d // h)
    shapes = {"token_embd.weight": (v, d), "output_norm.weight": (d,)}
    if not config["tie_word_embeddings"]:
        shapes["output.weight"] = (v, d)
    per_layer = {
        "attn_norm": (d,),
        "attn_q": (h * c, d),
        "attn_k": (g * c, d),
        "attn_v": (g * c, d),
        "attn_output": (d, h * c),
        "ffn_norm": (d,),
        "ffn_gate": (m, d),
        "ffn_up": (m, d),
        "ffn_down": (d, m),
    }
    for layer in range(config["num_hidden_layers"]):
        shapes.update({f"blk.{layer}.{part}.weight": shape for part, shape in per_layer.items()})
    return shapes


def _torch_shape(tensor: Any) -> tuple[int, ...]:
    """A GGUF tensor's shape in torch's order (GGUF lists the fastest-varying axis first)."""
    return tuple(int(n) for n in reversed(tensor.shape.tolist()))


def _hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")
    if parts[0] != "blk":
        return _LLAMA_TENSORS[gguf_name]
    template = _LLAMA_TENSORS["blk.{L}." + ".".join(parts[2:])]
    return template.replace("{L}", parts[1])


def _uninterleave(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's query/key row order (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``).

    Hugging Face rotates each head's first half of dimensions with its second half; llama.cpp's
    kernel rotates adjacent pairs, so its converter writes each head's rows as
    ``(half, pair) -> (pair, half)``.  This is the inverse: rows ``[head, pair, half]`` back to
    ``[head, half, pair]``.
    """
    rows, columns = weight.shape
    return weight.reshape(heads, rows // heads // 2, 2, columns).transpose(1, 2).reshape(rows, columns)


def _tokenizer(path: Path) -> Any:
    """``transformers``' tokenizer built from the file's vocabulary (nothing is downloaded).

    ``PreTrainedTokenizerFast`` rather than ``AutoTokenizer``: the same conversion of the file's
    vocabulary, without the model config ``AutoTokenizer`` reads from the file first (half the time).
    """
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError as error:
        raise ModelError(
            f"the tokenizer of a GGUF file is read with transformers: {INSTALL}, or "
            f"from_gguf(path, tokenizer=False) ({error})"
        ) from error
    try:
        return PreTrainedTokenizerFast.from_pretrained(
            str(path.parent), gguf_file=path.name, local_files_only=True
        )
    except Exception as error:  # transformers' own complaint about the vocabulary
        raise ModelError(f"{path}: transformers cannot build the tokenizer: {shown(str(error))}") from error
