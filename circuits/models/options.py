"""``ModelOptions``: the build options of every model entry point, in one frozen object.

The builders (``build_attn_only``, ``build_gpt2``, ``build_llama``, ``build_neox``) and the
loaders (``from_hf``, ``from_hf_state_dict``, ``load_hf_checkpoint``,
``from_transformer_lens``, ``load_demo_model``) take the same options, defined here only:
an entry point takes a ``ModelOptions`` after its tokens (``options=``) and keywords, each a
field that overrides the object's (``build_gpt2(config, weights, tokens, options, seq_len=4)``).
``takes_model_options`` gives each entry point that call form, its ``help()`` signature
(every field with its default) and its errors: an unknown keyword, a bad field value, or a
field the entry point cannot honour (``rope`` for ``from_hf``, which uses the model's own
tables) is a ``ModelError`` whose ``field`` names it.

``causal`` is True everywhere: every model here was trained with a causal mask, the shipped
demo model too; ``causal=False`` builds the unmasked form (the golden file's).
"""

from __future__ import annotations

import difflib
import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs
import torch

from circuits.errors import ModelError, shown
from circuits.models.common import CONVENTIONS
from circuits.transformer.masks import NEG_INF

__all__ = ["ModelOptions", "takes_model_options"]

#: ``takes_model_options``'s ``not_taken`` for the families without rotary tables.
NOT_ROTARY = {"rope": "its positions are not rotary (rope= is for Llama-style models)"}
#: ... and for GPT-NeoX, whose partial rotary tables come from its config.
NOT_ROTARY_TABLES = {"rope": "its rotary tables come from its config (rope= is for Llama-style models)"}

_F = TypeVar("_F", bound=Callable[..., Any])


def _flag(options: ModelOptions, attribute: attrs.Attribute, value: Any) -> None:
    """A bool option (``causal="no"`` would pass a truth test)."""
    if not isinstance(value, bool):
        raise ModelError(
            f"{attribute.name}={shown(repr(value))} is not a bool (True or False)", attribute.name
        )


def _positive_or_none(options: ModelOptions, attribute: attrs.Attribute, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ModelError(f"{attribute.name}={shown(repr(value))} is not a positive int", attribute.name)


def _convention(options: ModelOptions, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, str) or value not in CONVENTIONS:
        raise ModelError(f"convention {shown(repr(value))} is not one of {sorted(CONVENTIONS)}", "convention")


def _neg_inf(options: ModelOptions, attribute: attrs.Attribute, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not -math.inf < value < 0:
        raise ModelError(
            f"neg_inf={shown(repr(value))} is not a finite negative number (the masked form multiplies it "
            "by 0 where attention is allowed, so -inf would give NaN)",
            "neg_inf",
        )


def _same_tables(a: Any, b: Any) -> bool:
    """``rope`` equality: the same tables (tensors compare by value, not elementwise), per layer
    kind for the mapping form."""
    if a is b:
        return True
    if a is None or b is None:
        return False
    if isinstance(a, Mapping) or isinstance(b, Mapping):
        return (
            isinstance(a, Mapping)
            and isinstance(b, Mapping)
            and a.keys() == b.keys()
            and all(_same_tables(a[kind], b[kind]) for kind in a)
        )
    try:
        return len(a) == len(b) and all(
            torch.equal(torch.as_tensor(x), torch.as_tensor(y)) for x, y in zip(a, b)
        )
    except Exception:  # not tables at all: only the same object is equal
        return False


@attrs.frozen(kw_only=True, init=False, repr=False)
class ModelOptions:
    """How a model entry point builds its circuit (the defaults: a causal model of its tokens).

    ``seq_len`` (and ``batch_size``): the positions (and rows) of an all-zero token
    placeholder when no tokens are given, or checked against the tokens given.
    ``convention``: how the token array is cut into inputs and targets
    (``common.CONVENTIONS``: ``"default"`` ``[S+1]``, ``"golden"`` ``[S+2]``, ``"prompt"``
    ``[S]`` with the logits as root).  ``causal``: write the causal mask into every
    attention's scores (the masked form the ``causal_mask`` pass produces); False leaves
    attention unmasked.  ``neg_inf``: the masked scores' value (finite: the masked form
    multiplies it by 0).  ``rope``: a Llama-style model's rotary ``(cos, sin)`` tables
    ``[S, d_head]``, or a mapping from layer kinds (``'full_attention'``,
    ``'sliding_attention'``: Gemma 3's local layers) to such pairs (None: computed from the
    config; ``build_llama`` checks them).  ``attach``: keep the weight arrays in
    autograd (views of the given tensors) rather than detached.  ``tokenizer``: any Hugging
    Face tokenizer, to give the tokens as text (``models.to_tokens``).
    """

    seq_len: int | None = attrs.field(default=None, validator=_positive_or_none)
    batch_size: int | None = attrs.field(default=None, validator=_positive_or_none)
    convention: str = attrs.field(default="default", validator=_convention)
    causal: bool = attrs.field(default=True, validator=_flag)
    neg_inf: float = attrs.field(default=NEG_INF, validator=_neg_inf)
    rope: tuple[torch.Tensor, torch.Tensor] | Mapping[str, tuple[torch.Tensor, torch.Tensor]] | None = (
        attrs.field(default=None, eq=attrs.cmp_using(eq=_same_tables), hash=False)
    )
    attach: bool = attrs.field(default=False, validator=_flag)
    tokenizer: Any = attrs.field(default=None, eq=attrs.cmp_using(eq=lambda a, b: a is b), hash=False)

    def __init__(self, **fields: Any) -> None:
        _check_fields(fields, "ModelOptions")  # an unknown keyword is a ModelError, not a TypeError
        self.__attrs_init__(**fields)

    def evolve(self, **changes: Any) -> ModelOptions:
        """These options with some fields changed (checked as a new object is)."""
        _check_fields(changes, "ModelOptions.evolve")
        return attrs.evolve(self, **changes) if changes else self

    @classmethod
    def resolve(cls, options: Any, overrides: Mapping[str, Any], where: str) -> ModelOptions:
        """``options`` (None: the defaults) with the keyword ``overrides`` applied: what an
        entry point builds with.  Anything but a ModelOptions as ``options`` is a ModelError."""
        if options is None:
            options = DEFAULT
        elif not isinstance(options, cls):
            raise ModelError(
                f"{where}: options must be a models.ModelOptions or None, got {type(options).__name__} "
                f"{shown(repr(options), 80)}; options go as keywords (causal=False) or in one "
                "(models.ModelOptions(causal=False))",
                "options",
            )
        return options.evolve(**overrides)

    def changed(self) -> dict[str, Any]:
        """The fields set to other than their defaults, by name."""
        return {name: getattr(self, name) for name in FIELD_NAMES if not _is_default(self, name)}

    def __repr__(self) -> str:
        """The fields set, as a call would set them: ``ModelOptions(causal=False)``."""
        return "ModelOptions(" + ", ".join(f"{k}={v!r}" for k, v in self.changed().items()) + ")"


FIELDS: tuple[attrs.Attribute, ...] = attrs.fields(ModelOptions)
FIELD_NAMES: tuple[str, ...] = tuple(field.name for field in FIELDS)
#: ``help(ModelOptions)`` and ``inspect.signature`` show every field with its default.
ModelOptions.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
    [
        inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
        for f in FIELDS
    ]
)


def _check_fields(names: Iterable[str], where: str) -> None:
    """A ModelError naming the first keyword that is not a ModelOptions field (with the closest)."""
    for name in names:
        if name not in FIELD_NAMES:
            close = difflib.get_close_matches(name, FIELD_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ModelError(
                f"{where}: unknown option {shown(repr(name))}{hint}; the options: {', '.join(FIELD_NAMES)}",
                name,
            )


DEFAULT = ModelOptions()


def _is_default(options: ModelOptions, name: str) -> bool:
    value, default = getattr(options, name), getattr(DEFAULT, name)
    return value is default or (
        type(value) is type(default) and isinstance(value, (str, int, float)) and value == default
    )


# ---------------------------------------------------------------- entry points


def takes_model_options(not_taken: Mapping[str, str] | None = None) -> Callable[[_F], _F]:
    """Make ``function(..., options: ModelOptions)`` an entry point taking the options as keywords too.

    ``function`` has a parameter ``options``; the entry point accepts there a ModelOptions or
    None, and every field as a keyword-only override, and calls ``function`` with the options
    resolved (a ModelOptions, never None).  ``not_taken`` maps the fields the entry point
    cannot honour to why: given as a keyword, or set in the options object, each is a
    ModelError naming it.  An unknown keyword or a bad call is a ModelError listing what is
    accepted (Python's TypeError is no ``CircuitError`` and names no alternatives).
    """
    not_taken = dict(not_taken or {})

    def decorate(function: _F) -> _F:
        signature = inspect.signature(function)
        params = list(signature.parameters.values())
        own = {p.name for p in params}
        if "options" not in own or any(p.kind is p.VAR_KEYWORD for p in params) or own & set(FIELD_NAMES):
            raise TypeError(
                f"takes_model_options: {function.__name__} needs a parameter options, and no field"
            )
        fields = [f for f in FIELDS if f.name not in not_taken]
        public = [
            p.replace(default=None, annotation="ModelOptions | None") if p.name == "options" else p
            for p in params
        ]
        keyword_only = [p for p in public if p.kind is p.KEYWORD_ONLY]
        positional = [p for p in public if p.kind is not p.KEYWORD_ONLY]
        extra = [
            inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type)
            for f in fields
        ]
        shown_signature = signature.replace(parameters=positional + keyword_only + extra)
        accepted = [p.name for p in public if p.default is not p.empty or p.kind is p.KEYWORD_ONLY]
        accepted += [f.name for f in fields]
        where = function.__name__

        @functools.wraps(function)
        def entry(*args: Any, **kwargs: Any) -> Any:
            overrides = {k: kwargs.pop(k) for k in list(kwargs) if k in FIELD_NAMES and k not in not_taken}
            _refuse_unknown(where, [k for k in kwargs if k not in own], accepted, not_taken)
            try:
                bound = signature.bind(*args, **kwargs)
            except TypeError as error:
                raise ModelError(f"{where}: {error}; options accepted: {', '.join(accepted)}") from error
            options = ModelOptions.resolve(bound.arguments.get("options"), overrides, where)
            _refuse_unknown(
                where, [name for name in not_taken if not _is_default(options, name)], accepted, not_taken
            )
            bound.arguments["options"] = options
            return function(*bound.args, **bound.kwargs)

        entry.__signature__ = shown_signature  # type: ignore[attr-defined]
        return entry  # type: ignore[return-value]

    return decorate


def _refuse_unknown(
    where: str, unknown: list[str], accepted: list[str], not_taken: Mapping[str, str]
) -> None:
    """A ModelError naming the first of ``unknown``: a field the entry point does not take (and
    why), or an option it does not know (and the closest it does)."""
    if not unknown:
        return
    name, listing = unknown[0], ", ".join(accepted)
    if name in not_taken:
        raise ModelError(
            f"{where} does not take option {name!r}: {not_taken[name]}; accepted: {listing}", name
        )
    close = difflib.get_close_matches(name, accepted, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ModelError(
        f"{where}: unknown option {', '.join(repr(shown(k)) for k in unknown)}{hint}; accepted: {listing}",
        name,
    )
