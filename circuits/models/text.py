"""Text in and out: token ids from strings, and tokens back as strings for labels.

Any Hugging Face tokenizer works (an object called as ``tokenizer(texts)``
that returns ``input_ids``, with ``decode`` and ``bos_token_id``); nothing
is downloaded here.  As TransformerLens's ``to_tokens`` does, a beginning
of sequence token is put in front by default, when the tokenizer has one
and has not added it already.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from circuits.errors import ModelError, shown

__all__ = ["is_text", "to_str_tokens", "to_tokens", "token_ids"]


def is_text(tokens: Any) -> bool:
    """A string, or a non-empty list or tuple of strings."""
    if isinstance(tokens, str):
        return True
    return isinstance(tokens, (list, tuple)) and bool(tokens) and all(isinstance(t, str) for t in tokens)


def to_tokens(tokenizer: Any, text: str | Sequence[str], *, prepend_bos: bool = True) -> torch.Tensor:
    """Token ids of ``text``: ``[S]`` for a string, ``[B,S]`` for a list of strings of equal token length."""
    if not is_text(text):
        raise ModelError(f"to_tokens: expected a string or a list of strings, got {type(text).__name__}")
    if tokenizer is None or not callable(tokenizer):
        raise ModelError(
            f"text {shown(repr(text), 60)} needs a tokenizer: pass tokenizer= (any Hugging Face tokenizer)"
        )
    texts = [text] if isinstance(text, str) else list(text)
    try:
        rows = [list(tokenizer(t)["input_ids"]) for t in texts]
    except Exception as error:
        raise ModelError(f"the tokenizer ({type(tokenizer).__name__}) failed: {error}") from error
    bos = getattr(tokenizer, "bos_token_id", None)
    if prepend_bos and bos is not None:
        rows = [row if row[:1] == [bos] else [bos, *row] for row in rows]
    lengths = sorted({len(row) for row in rows})
    if len(lengths) > 1:
        raise ModelError(
            f"the texts have {lengths} tokens per row; a batch needs one length (the circuits have no "
            "padding mask): give texts of equal token length, or one text at a time"
        )
    if lengths == [0]:
        raise ModelError("the text has no tokens")
    ids = torch.tensor(rows, dtype=torch.int64)
    return ids[0] if isinstance(text, str) else ids


def to_str_tokens(tokenizer: Any, tokens: Any) -> list[str] | list[list[str]]:
    """Each token id as its text, for plot labels: a list for ``[S]``, a list of lists for ``[B,S]``."""
    if not hasattr(tokenizer, "decode"):
        raise ModelError(f"to_str_tokens needs a tokenizer with .decode, got {type(tokenizer).__name__}")
    if is_text(tokens):
        tokens = to_tokens(tokenizer, tokens)
    ids = torch.as_tensor(tokens)
    if ids.ndim not in (1, 2) or ids.dtype.is_floating_point:
        raise ModelError(
            f"to_str_tokens: expected integer token ids [S] or [B,S], got shape {list(ids.shape)}"
        )
    if ids.ndim == 1:
        return [tokenizer.decode([int(i)]) for i in ids]
    return [[tokenizer.decode([int(i)]) for i in row] for row in ids]


def token_ids(tokens: Any, tokenizer: Any) -> Any:
    """``tokens`` as they are, or, if they are text, ``to_tokens(tokenizer, tokens)``."""
    return to_tokens(tokenizer, tokens) if is_text(tokens) else tokens
