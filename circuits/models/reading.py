"""What the loaders share: a state-dict reader that reports every problem at once, and config-field checks.

Used by the Hugging Face loaders (``hf``, ``hf_gpt2``, ``hf_llama``, ``checkpoint``) and the
TransformerLens one (``transformer_lens``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from circuits.errors import ModelError, shown


def get_field(config: Any, key: str, default: Any = None) -> Any:
    """``config[key]`` (a dict) or ``config.key`` (an object); ``default`` when absent or None."""
    if isinstance(config, Mapping):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


#: The dtypes a weight may have: an int8, uint8 (packed 4-bit) or float8 tensor is a quantised one, whose
#: values mean nothing without its scales, and is refused.
WEIGHT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class Reader:
    """Takes tensors from a state dict, collecting every problem before raising.

    Detached unless ``attach``: then the tensors are the state dict's own
    (a model's parameters with ``state_dict(keep_vars=True)``).
    """

    def __init__(self, family: str, state_dict: Mapping[str, Any], attach: bool = False):
        self.family = family
        self.state = state_dict
        self.attach = attach
        self.used: set[str] = set()
        self.missing: list[str] = []  # what the message lists (a loader may add a hint)
        self.misshapen: list[str] = []
        self.missing_keys: list[str] = []  # the keys alone, for ModelError's fields
        self.mismatched_keys: list[str] = []

    def take(self, key: str, shape: tuple[int, ...], optional: bool = False) -> torch.Tensor | None:
        if key not in self.state:
            if not optional:
                self.missing.append(f"{key!r} {list(shape)}")
                self.missing_keys.append(key)
            return None
        self.used.add(key)
        tensor = self.state[key]
        if not isinstance(tensor, torch.Tensor):
            problem = f"is a {type(tensor).__name__}, not a tensor"
        elif tuple(tensor.shape) != tuple(shape):
            problem = f"has shape {list(tensor.shape)}, expected {list(shape)}"
        elif tensor.is_meta:
            problem = "is a meta tensor, which has a shape but no values"
        elif tensor.dtype not in WEIGHT_DTYPES:
            problem = (
                f"has dtype {str(tensor.dtype).removeprefix('torch.')}, not a weight dtype the builders "
                f"compute with ({', '.join(str(t).removeprefix('torch.') for t in WEIGHT_DTYPES)}): a quantised tensor?"
            )
        else:
            return tensor if self.attach else tensor.detach()
        self.misshapen.append(f"{key!r} {problem}")
        self.mismatched_keys.append(key)
        return None

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
            raise ModelError(
                f"{self.family} state dict does not fit the config:\n  " + "\n  ".join(problems),
                missing_keys=self.missing_keys,
                unexpected_keys=unknown,
                mismatched_keys=self.mismatched_keys,
            )

    def weights(self, out: Mapping[str, torch.Tensor | None]) -> dict[str, torch.Tensor]:
        """The converted weights: views of the state dict's tensors if attached, private copies if not."""
        return {name: t if self.attach else own_copy(t) for name, t in out.items() if t is not None}


def stored_unembedding(
    reader: Reader, key: str, shape: tuple[int, ...], embedding: torch.Tensor | None, tied: bool
) -> torch.Tensor | None:
    """The unembedding to build with: the stored ``key``, or None where the token embedding is it.

    ``tie_word_embeddings`` does not decide alone, as in Hugging Face:
    ``from_pretrained`` ties the head to the embedding only when the checkpoint
    lacks it or holds the same values (``PreTrainedModel.tie_weights`` keeps a
    differing stored head, with a warning), and a model in memory computes with
    whatever its head parameter is.  So a stored head is used unless it is the
    embedding: the same values, or with ``attach`` the same tensor (a distinct
    parameter must get its own gradient).  Untied (``tied`` false), the head
    must be there.
    """
    head = reader.take(key, shape, optional=tied)
    if head is None or embedding is None or not tied:
        return head
    return None if _same_matrix(head, embedding, reader.attach) else head


def _same_matrix(a: torch.Tensor, b: torch.Tensor, attach: bool) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.data_ptr() == b.data_ptr() and a.stride() == b.stride():
        return True
    return not attach and torch.equal(a, b)


def own_copy(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy: the circuit must not share storage with a model that may change."""
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def strip_prefix(state_dict: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    return {(k.removeprefix(prefix)): v for k, v in state_dict.items()}


def int_field(family: str, config: Any, key: str, default: Any = None, low: int = 1) -> int:
    """An int field ``>= low``: a str, float, bool or 0 in ``config.json`` would build a wrong model."""
    value = get_field(config, key, default)
    if value is None:
        raise ModelError(f"{family} config: no {key!r} (an int >= {low})")
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ModelError(f"{family} config: {key!r} is {shown(repr(value))}; expected an int >= {low}")
    return value


def optional_int(family: str, config: Any, key: str) -> int | None:
    return None if get_field(config, key) is None else int_field(family, config, key)


def number_field(family: str, config: Any, key: str, default: float, positive: bool = False) -> float:
    """A finite number (> 0 if ``positive``, else >= 0), as epsilons and rotary bases are."""
    value = get_field(config, key, default)
    bad = isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value)
    if bad or value < 0 or (positive and value == 0):
        raise ModelError(
            f"{family} config: {key!r} is {shown(repr(value))}; expected a finite number "
            f"{'> 0' if positive else '>= 0'}"
        )
    return float(value)


def typed_field(family: str, config: Any, key: str, default: Any, kind: type) -> Any:
    value = get_field(config, key, default)
    if not isinstance(value, kind):
        raise ModelError(f"{family} config: {key!r} is {shown(repr(value))}; expected a {kind.__name__}")
    return value


def hf_rope_parameters(family: str, config: Any) -> tuple[str, Mapping[str, Any]]:
    """``(key, parameters)``: the rotary parameters Hugging Face computes with, and the field they came from.

    transformers 5 reads ``rope_scaling`` (the 4.x name) when it is set and
    not empty, in place of ``rope_parameters`` (``convert_rope_params_to_dict``:
    ``rope_scaling or rope_parameters``), so a config.json with both uses
    ``rope_scaling``, and none of ``rope_parameters``'s keys.  (A config object
    of transformers 5 answers both names with the same mapping.)
    """
    chosen: tuple[str, Mapping[str, Any]] = ("rope_parameters", {})
    for key in ("rope_parameters", "rope_scaling"):
        params = get_field(config, key)
        if params is not None and not isinstance(params, Mapping):
            raise ModelError(
                f"{family} config: {key!r} is {shown(repr(params))}; expected an object (a mapping)"
            )
        if params:
            chosen = (key, params)
    return chosen


def rope_kind(family: str, params: Mapping[str, Any]) -> str:
    """The rotary variant of ``hf_rope_parameters``: ``rope_type``, else the 4.x ``type``, else ``'default'``."""
    return typed_field(family, params, "rope_type", typed_field(family, params, "type", "default", str), str)


def present_or_default(config: Any, defaults: Mapping[str, Any]) -> Any:
    """A ``config.json`` dict with the config class's defaults for the fields it lacks.

    A field that is absent takes Hugging Face's default, which is not always
    what an explicit ``null`` means (Mistral's absent ``sliding_window`` is
    4096, a ``null`` one none).  A config object has every field already.
    """
    return {**defaults, **config} if isinstance(config, Mapping) else config


def check_attach(attach: Any) -> bool:
    """``attach``, refused unless a bool: ``attach="no"`` would be true."""
    if not isinstance(attach, bool):
        raise ModelError(f"attach={shown(repr(attach))} is not a bool (True or False)")
    return attach
