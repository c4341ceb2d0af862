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
        return {name: t if self.attach else own_copy(t) for name, t in out.items() if t is not None}


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


def check_attach(attach: Any) -> bool:
    """``attach``, refused unless a bool: ``attach="no"`` would be true."""
    if not isinstance(attach, bool):
        raise ModelError(f"attach={shown(repr(attach))} is not a bool (True or False)")
    return attach
