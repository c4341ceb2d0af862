"""TransformerLens 4 as the tests' reference: bridges around Hugging Face models, built offline, and
their forward (logits, caches, hooks).

TransformerLens 4 has no ``HookedTransformer``: a model is a ``TransformerBridge``, around a Hugging
Face model (``bridge`` here: ``build_bridge_from_module``, what ``boot_transformers`` does after
loading; its tokenizer set-up would fetch files, so the bridges here have none) or around
TransformerLens's own small model (``boot_native``: ``factories.tl_model``).  ``compat=True`` turns on
compatibility mode, HookedTransformer's numerics: folded norms, centred writing weights and
unembedding, value biases folded into ``b_O``.  Importing TransformerLens takes seconds: callers import
this module inside slow tests or behind ``pytest.importorskip``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.model_bridge.sources import build_bridge_from_module


def bridge(model: Any, compat: bool = False, **processing: Any) -> TransformerBridge:
    """A bridge around the Hugging Face ``model`` (changed in place: the bridge takes its modules);
    ``processing``: ``enable_compatibility_mode``'s options."""
    wrapped = build_bridge_from_module(model, type(model).__name__, hf_config=model.config)
    if compat or processing:
        wrapped.enable_compatibility_mode(disable_warnings=True, **processing)
    return wrapped.eval()


def run_with_cache(model: TransformerBridge, tokens: torch.Tensor):
    """TransformerLens's logits and cache on the model's inputs ``tokens[..., :-1]``."""
    with torch.no_grad():
        return model.run_with_cache(tokens[..., :-1])


def logits(model: TransformerBridge, inputs: torch.Tensor, hooks=()) -> torch.Tensor:
    """TransformerLens's logits on ``inputs``, with forward hooks ``[(name, fn)]``."""
    with torch.no_grad():
        return model.run_with_hooks(inputs, fwd_hooks=list(hooks))


__all__ = ["TransformerBridge", "bridge", "logits", "run_with_cache"]
