"""The Llama builder's rotary tables: one pair per kind of layer, computed or the caller's, checked.

A layer rotates its queries and keys with the tables of its kind: ``FULL`` (global attention,
``'t.a.c.rope_cos'``/``'t.a.c.rope_sin'``) or, in a config with a local rotary base (Gemma 3's
``rope_local_theta``), ``SLIDING`` for the sliding-window layers (``'t.a.c.rope_cos_local'``/
``'t.a.c.rope_sin_local'``).  The kinds are spelled as Hugging Face's ``layer_types``.  With
``rotary_dims`` (Phi-3's ``partial_rotary_factor``) only each head's first ``rotary_dims``
entries are rotated: the tables hold cos 1 and sin 0 beyond them, as GPT-NeoX's do.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from circuits.core.nodes import Array
from circuits.errors import ModelError, shown
from circuits.transformer import names

if TYPE_CHECKING:
    from circuits.models.llama import LlamaConfig

FULL, SLIDING = "full_attention", "sliding_attention"  #: the kinds of layer, as ``layer_types`` spells them
_TABLE_NAMES = {FULL: (names.ROPE_COS, names.ROPE_SIN), SLIDING: (names.ROPE_COS_LOCAL, names.ROPE_SIN_LOCAL)}


def rope_cos_sin(
    config: LlamaConfig, seq_len: int, dtype: torch.dtype = torch.float32, theta: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The default ("unscaled") rotary tables ``[seq_len, d_head]`` for positions 0..S-1.

    With base ``theta`` (default ``config.rope_theta``).  Computed in float32
    and then cast, exactly as Hugging Face's ``LlamaRotaryEmbedding`` does
    (also in float64 models), so the circuit reproduces its numbers.  With
    ``config.rotary_dims`` the angles are those of the rotated dims, padded
    with cos 1 and sin 0.
    """
    dim = rotated_dims(config)
    base = config.rope_theta if theta is None else theta
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    freqs = torch.arange(seq_len, dtype=torch.float)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return padded(config, emb.cos().to(dtype), emb.sin().to(dtype))


def rotated_dims(config: LlamaConfig) -> int:
    """How many of each head's dims are rotated: ``rotary_dims``, or all ``d_head``; refused unless even."""
    dims = config.head_size if config.rotary_dims is None else config.rotary_dims
    if dims % 2 or dims > config.head_size:
        raise ModelError(
            f"Llama: rotary embedding needs an even number of rotated dims up to d_head {config.head_size}, "
            f"got {dims}" + (" (rotary_dims)" if config.rotary_dims is not None else " (d_head)")
        )
    return dims


def padded(config: LlamaConfig, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables ``[S, rotary_dims]`` widened to ``[S, d_head]`` with cos 1 and sin 0 (already wide: as given)."""
    rest = config.head_size - cos.shape[-1]
    if rest <= 0:
        return cos, sin
    seq = cos.shape[0]
    ones, zeros = torch.ones(seq, rest, dtype=cos.dtype), torch.zeros(seq, rest, dtype=sin.dtype)
    return torch.cat((cos, ones), dim=-1), torch.cat((sin, zeros), dim=-1)


def layer_kinds(config: LlamaConfig) -> tuple[str, ...]:
    """Each layer's kind of rotary tables: ``SLIDING`` for the windowed layers of a config with a local
    rotary base (``sliding_layers``, every layer when None), ``FULL`` otherwise."""
    if config.rope_local_theta is None:
        return (FULL,) * config.n_layers
    local = range(config.n_layers) if config.sliding_layers is None else config.sliding_layers
    return tuple(SLIDING if layer in local else FULL for layer in range(config.n_layers))


def rope_arrays(
    config: LlamaConfig, rope: Any, seq: int, dtype: torch.dtype
) -> dict[str, tuple[Array, Array]]:
    """kind -> its ``(cos, sin)`` Arrays: private copies of the caller's tables (a later edit of theirs
    must not reach the circuit), else the default tables of the kind's base.

    ``rope`` is None, a pair ``(cos, sin)`` (the ``FULL`` layers' tables), or a mapping from kinds to
    pairs (a kind left out is computed).
    """
    kinds = set(layer_kinds(config)) | {FULL}
    given = _given(config, rope)
    out = {}
    for kind in sorted(kinds):
        if kind in given:
            cos_t, sin_t = _checked_tables(config, given[kind], seq, dtype, kind)
        else:
            theta = config.rope_local_theta if kind == SLIDING else None
            cos_t, sin_t = rope_cos_sin(config, seq, dtype, theta)
        cos_name, sin_name = _TABLE_NAMES[kind]
        out[kind] = (Array(cos_t, name=cos_name), Array(sin_t, name=sin_name))
    return out


def _given(config: LlamaConfig, rope: Any) -> dict[str, Any]:
    if rope is None:
        return {}
    if not isinstance(rope, Mapping):
        return {FULL: rope}
    allowed = (FULL, SLIDING) if config.rope_local_theta is not None else (FULL,)
    unknown = [kind for kind in rope if kind not in allowed]
    if unknown:
        raise ModelError(
            f"Llama: rope= has tables for {shown(repr(unknown))}; this config's layers rotate with "
            f"{' and '.join(map(repr, allowed))} tables"
            + (
                ""
                if config.rope_local_theta is not None
                else " (no local rotary base: rope_local_theta is None)"
            )
        )
    return dict(rope)


def _checked_tables(
    config: LlamaConfig, pair: Any, seq: int, dtype: torch.dtype, kind: str
) -> tuple[torch.Tensor, torch.Tensor]:
    try:
        cos, sin = pair
        tables = tuple(torch.as_tensor(t).detach() for t in (cos, sin))
    except Exception as error:
        raise ModelError(
            f"Llama: rope= must be a pair of tensors (cos, sin) or a mapping of layer kinds to pairs, "
            f"got {type(pair).__name__} for {kind!r}"
        ) from error
    if any(t.is_meta or not t.is_floating_point() for t in tables):
        raise ModelError(
            "Llama: rope tables must be floating tensors with values, got "
            + " and ".join(f"{'meta ' if t.is_meta else ''}{t.dtype}" for t in tables)
        )
    widths = sorted({config.head_size, rotated_dims(config)})
    shapes = {tuple(t.shape) for t in tables}
    if len(shapes) > 1 or any(t.ndim != 2 or t.shape[0] != seq or t.shape[1] not in widths for t in tables):
        expected = " or ".join(str([seq, w]) for w in widths)
        raise ModelError(
            f"Llama: rope tables ({kind}) have shapes {list(tables[0].shape)} and {list(tables[1].shape)}, "
            f"expected {expected} each ([seq_len, d_head]"
            + (", or [seq_len, rotary_dims])" if len(widths) > 1 else ")")
        )
    cos_t, sin_t = (t.to(dtype, copy=True) for t in tables)
    return padded(config, cos_t, sin_t)
