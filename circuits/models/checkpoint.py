"""Local Hugging Face checkpoint directories: ``load_hf_checkpoint(path, tokens)``.

A directory with ``config.json`` and ``*.safetensors`` (sharded or not;
``pytorch_model.bin`` as a fallback), e.g. written by
``model.save_pretrained(path)``.  Needs ``transformers`` only for Llama
checkpoints with a scaled rotary variant.  A broken ``config.json``, weights
file or shard index is a ``ModelError`` naming the file; shards the index
names outside the directory are refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from circuits.errors import ModelError, shown
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.models.hf import config_for, from_hf_state_dict
from circuits.models.reading import WEIGHT_DTYPES
from circuits.models.text import token_ids
from circuits.core.nodes import Circuit


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


def _config_dtype(config: Mapping[str, Any], config_file: Path) -> torch.dtype | None:
    """The dtype ``from_pretrained`` loads the weights in: ``dtype`` (transformers 5), else ``torch_dtype``
    (4.x), else None (the weights' own)."""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if value is None:
            continue
        dtype = getattr(torch, value, None) if isinstance(value, str) else None
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ModelError(
                f"{config_file}: {key!r} is {shown(repr(value))}; expected the name of a floating torch dtype "
                "('float32', 'bfloat16', ...)"
            )
        return dtype
    return None


def _in_dtype(state: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """The weights in ``dtype``; a quantised tensor (float8, int8) is left as it is, for the reader to refuse
    by name: converted, its values would look like weights without being them (its scales are elsewhere)."""
    if dtype is None:
        return state
    return {key: t.to(dtype) if t.dtype in WEIGHT_DTYPES else t for key, t in state.items()}


@takes_model_options(
    {"attach": "the weights read are the circuit's own", "rope": "computed from config.json"}
)
def load_hf_checkpoint(
    path: str | os.PathLike, tokens: Any = None, options: ModelOptions = DEFAULT
) -> Circuit:
    """A circuit from a local Hugging Face checkpoint directory (``config.json`` + safetensors).

    ``tokens`` and the options as in ``from_hf`` (but no ``attach``: the
    weights read are the circuit's own).  ``transformers`` is not needed (except for Llama
    checkpoints with a scaled rotary variant).  As ``from_pretrained`` does, the
    weights are converted to the config's ``dtype`` (``torch_dtype`` in 4.x) when
    it names one.  A broken ``config.json``, weights file or shard index is a
    ``ModelError`` naming the file; shards the index names outside the directory
    are refused.
    """
    tokens = token_ids(tokens, options.tokenizer)
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
        config_for(config)
    except ModelError as error:
        raise ModelError(f"{config_file}: {error}") from error
    dtype = _config_dtype(config, config_file)
    return from_hf_state_dict(
        config,
        _in_dtype(_read_checkpoint_tensors(directory), dtype),
        tokens,
        options.evolve(tokenizer=None),
    )
