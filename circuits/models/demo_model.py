"""The shipped demo model: a 2-layer attention-only transformer with induction heads.

``scripts/train_induction.py`` trains it on repeated random blocks of tokens
(see ``repeated_tokens``) and writes its weights to
``circuits/data/induction_2l.safetensors`` (named as in
``AttnOnlyConfig.weight_shapes()``) and its config, seed and losses to
``circuits/data/induction_2l.json``.  ``load_demo_model(tokens)`` builds it
as a circuit with ``build_attn_only``: causal, as it was trained, and unsplit,
as the builder gives it; to study heads, apply ``split_heads``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

import safetensors.torch
import torch

from circuits.errors import ModelError
from circuits.models.attn_only import AttnOnlyConfig, build_attn_only
from circuits.models.common import check_seed
from circuits.models.options import DEFAULT, NOT_ROTARY, ModelOptions, takes_model_options
from circuits.core.nodes import Circuit

#: The beginning-of-sequence token that starts every row of the task.
BOS = 0
WEIGHTS_FILE = "induction_2l.safetensors"
INFO_FILE = "induction_2l.json"
#: The folder of the shipped SAE (SAELens's format), trained by ``scripts/train_sae.py``.
DEMO_SAE_FOLDER = "induction_2l_sae"


def _data_file(name: str):
    return resources.files("circuits").joinpath("data", name)


@lru_cache(maxsize=1)
def demo_info() -> dict[str, Any]:
    """The shipped JSON: ``config``, ``seed``, ``task``, ``training`` and ``results``."""
    try:
        return json.loads(_data_file(INFO_FILE).read_text())
    except FileNotFoundError:
        raise ModelError(
            f"the demo model's {INFO_FILE} is missing from circuits/data; "
            "retrain it with: python scripts/train_induction.py"
        ) from None


def demo_config() -> AttnOnlyConfig:
    """The shipped model's ``AttnOnlyConfig``."""
    return AttnOnlyConfig(**demo_info()["config"])


def load_demo_weights() -> dict[str, torch.Tensor]:
    """The shipped weights (float32), by circuit name.  A fresh dict of fresh tensors each call."""
    try:
        data = _data_file(WEIGHTS_FILE).read_bytes()
    except FileNotFoundError:
        raise ModelError(
            f"the demo model's {WEIGHTS_FILE} is missing from circuits/data; "
            "retrain it with: python scripts/train_induction.py"
        ) from None
    return dict(safetensors.torch.load(data))


def load_demo_sae():
    """The shipped TopK SAE on the demo model's ``blocks.0.hook_attn_out`` (what layer 0's heads
    write), as ``load_sae`` reads it; its ``training.json`` has the settings and metrics."""
    from circuits.models.sae import load_sae

    folder = _data_file(DEMO_SAE_FOLDER)
    if not folder.joinpath("cfg.json").is_file():
        raise ModelError(
            f"the demo SAE's folder {DEMO_SAE_FOLDER} is missing from circuits/data; "
            "retrain it with: python scripts/train_sae.py"
        )
    return load_sae(str(folder))


@takes_model_options(NOT_ROTARY)
def load_demo_model(tokens: Any = None, options: ModelOptions = DEFAULT) -> Circuit:
    """The shipped induction model as a circuit whose root is the per-token loss ``'t.loss'``.

    ``tokens`` and the options are those of ``build_attn_only``: an int
    tensor ``[S+1]`` or ``[B,S+1]`` with ``S`` at most ``n_ctx``, e.g.
    ``repeated_tokens(...)``, or None with ``seq_len`` (and ``batch_size``).
    The circuit is causal (masked), as the model was trained; ``causal=False``
    builds the unmasked form.
    """
    return build_attn_only(demo_config(), load_demo_weights(), tokens, options)


def repeated_tokens(
    batch_size: int,
    block_len: int | torch.Tensor,
    seq_len: int | None = None,
    *,
    vocab_size: int | None = None,
    seed: int | None = 0,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Rows of the task: ``BOS``, then a random block of ``block_len`` tokens, repeated.

    Returns int64 tokens ``[batch_size, seq_len + 1]`` (the builder's default
    convention: ``seq_len`` model positions).  A block's tokens are distinct,
    drawn from ``1 .. vocab_size-1``; the block repeats until the row is
    full, so with the default ``seq_len = 2 * block_len`` a row is exactly
    ``BOS + block + block``.  ``block_len`` is an int or a tensor of one
    length per row.  The per-token loss at position ``s`` predicts token
    ``s + 1``; see ``repeat_mask`` for where that is predictable.
    """
    vocab_size = vocab_size or demo_config().vocab_size
    lengths = torch.as_tensor(block_len, dtype=torch.int64).expand(batch_size)
    longest = int(lengths.max())
    if int(lengths.min()) < 1 or longest > vocab_size - 1:
        raise ModelError(
            f"block_len must be in 1..{vocab_size - 1} (distinct non-BOS tokens), got {block_len}"
        )
    if seq_len is None:
        if lengths.unique().numel() != 1:
            raise ModelError("pass seq_len when rows have different block lengths")
        seq_len = 2 * longest
    if generator is None:
        generator = torch.Generator().manual_seed(0 if seed is None else check_seed(seed))
    blocks = torch.rand(batch_size, vocab_size - 1, generator=generator).argsort(dim=1) + 1
    where = torch.arange(seq_len).unsqueeze(0) % lengths.unsqueeze(1)
    bos = torch.full((batch_size, 1), BOS, dtype=torch.int64)
    return torch.cat([bos, blocks.gather(1, where)], dim=1)


def repeat_mask(block_len: int | torch.Tensor, batch_size: int, seq_len: int) -> torch.Tensor:
    """Bool ``[batch_size, seq_len]``: where the loss is predictable in ``repeated_tokens`` rows.

    Position ``s`` predicts token ``s + 1``.  That is predictable when the
    token at ``s`` is a repeat, so that the token after its previous
    occurrence comes next: ``s > block_len``.  (At ``s == block_len`` the
    block restarts, which the model cannot know.)
    """
    lengths = torch.as_tensor(block_len, dtype=torch.int64).expand(batch_size)
    return torch.arange(seq_len).unsqueeze(0) > lengths.unsqueeze(1)
