"""TransformerLens 4 models for the tests, built offline with random weights (nothing downloaded).

TransformerLens 4 has no ``HookedTransformer``: a model is a ``TransformerBridge``, around a Hugging
Face model (``build_bridge_from_module``, what ``boot_transformers`` does after loading; its
tokenizer set-up would fetch files, so the bridges here have none) or around TransformerLens's own
small model (``boot_native``, from a ``TransformerBridgeConfig``).  ``compat=True`` turns on
compatibility mode, HookedTransformer's numerics: folded norms, centred writing weights and
unembedding, value biases folded into ``b_O``.  Importing TransformerLens takes seconds: callers import
this module inside slow tests or behind ``pytest.importorskip``.
"""

from __future__ import annotations

from typing import Any

import torch
from transformer_lens import TransformerBridgeConfig
from transformer_lens.model_bridge import TransformerBridge
from transformer_lens.model_bridge.sources import boot_native, build_bridge_from_module


def bridge(model: Any, compat: bool = False, **processing: Any) -> TransformerBridge:
    """A bridge around the Hugging Face ``model`` (changed in place: the bridge takes its modules);
    ``processing``: ``enable_compatibility_mode``'s options."""
    wrapped = build_bridge_from_module(model, type(model).__name__, hf_config=model.config)
    if compat or processing:
        wrapped.enable_compatibility_mode(disable_warnings=True, **processing)
    return wrapped.eval()


def native(
    masked: bool = True,
    seed: int = 0,
    compat: bool = False,
    n_layers: int = 2,
    dtype: torch.dtype = torch.float32,
    **fields: Any,
) -> TransformerBridge:
    """``boot_native``'s GPT-2 layout at odd dimensions (d_model 12, 3 heads of 4, d_mlp 20, vocab 17),
    every weight then moved by a seeded normal draw (biases and norms too), so wiring mistakes show."""
    options = dict(
        n_layers=n_layers,
        d_model=12,
        n_heads=3,
        d_head=4,
        d_mlp=20,
        d_vocab=17,
        n_ctx=16,
        act_fn="gelu_new",
        normalization_type="LN",
        attention_dir="causal" if masked else "bidirectional",
        seed=seed,
        dtype=dtype,
        device="cpu",
    )
    model = boot_native(TransformerBridgeConfig(**dict(options, **fields)), dtype=dtype)
    perturb(model.original_model, seed)
    if compat:
        model.enable_compatibility_mode(disable_warnings=True)
    return model.eval()


def perturb(module: torch.nn.Module, seed: int = 0) -> None:
    """Every parameter plus 0.3 times a seeded standard normal draw."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(module.named_parameters()):
            param.add_(0.3 * torch.randn(param.shape, generator=generator, dtype=param.dtype))


def run_with_cache(model: TransformerBridge, tokens: torch.Tensor):
    """TransformerLens's logits and cache on the model's inputs ``tokens[..., :-1]``."""
    with torch.no_grad():
        return model.run_with_cache(tokens[..., :-1])


def logits(model: TransformerBridge, inputs: torch.Tensor, hooks=()) -> torch.Tensor:
    """TransformerLens's logits on ``inputs``, with forward hooks ``[(name, fn)]``."""
    with torch.no_grad():
        return model.run_with_hooks(inputs, fwd_hooks=list(hooks))


__all__ = ["TransformerBridge", "bridge", "logits", "native", "perturb", "run_with_cache"]
