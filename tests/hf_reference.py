"""What the tests of the Hugging Face model families share: random token rows, the model's own
logits (the independent reference), and the circuit's logits node."""

from __future__ import annotations

import torch

from circuits import names


def random_tokens(vocab: int, batched: bool, length: int = 13, seed: int = 1) -> torch.Tensor:
    """``[3, length]`` (or ``[length]``) token ids below ``vocab``, from a seeded generator."""
    shape = (3, length) if batched else (length,)
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def hf_logits(model, inputs: torch.Tensor) -> torch.Tensor:
    """The Hugging Face model's own logits on ``inputs`` (one row or a batch)."""
    with torch.no_grad():
        out = model(input_ids=inputs if inputs.ndim == 2 else inputs[None])
    return out.logits if inputs.ndim == 2 else out.logits[0]


def logits_of(circuit) -> torch.Tensor:
    """The circuit's logits, ``'t.call'``."""
    return circuit.get_unique(names.LOGITS).evaluate()
